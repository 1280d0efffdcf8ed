"""Changes to where slices may go: an admin's drain, and the cluster's changes. Outside holders take
and give back devices; a change of some nodes costs what those nodes cost: cordons drain a node's
GPUs, and a dynamic MIG GPU whose instances changed (DRA claims allocated or freed them) holds them
as they are, its node's outside uses again and ends the leases whose instance went. A node added,
deleted or reshaped reloads the fleet, holding every lease's slice and every outside use again.

A part of the scheduler's state machine (`Scheduler.drain`, `nodes_changed`, `outside_use`):
each change is one unit of work of its journal, leases whose slices the new fleet lacks end
through the scheduler's own `_end`, and what waits gets a scheduling pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Collection

from .errors import NotFound, StoreFailed
from .fleet_state import FleetState, placements
from .journal import SchedulerJournal
from .lease_book import LeaseBook
from .model import Lease, LeaseState, MigMode, Node, OutsideUse, SpecError
from .outside import OutsideHolds
from .plans import host_demand
from .recovery import reattach

if TYPE_CHECKING:
    from .scheduler import Scheduler


class FleetChanges:
    """Applies drains and node changes to the fleet, the leases on it and the outside holds."""

    def __init__(self, scheduler: "Scheduler", fleet: FleetState, book: LeaseBook, journal: SchedulerJournal):
        self._scheduler, self._fleet, self._book, self._journal = scheduler, fleet, book, journal
        self.outside = self._outside = OutsideHolds(fleet, journal)
        self._emit = scheduler._emit

    def drain(self, gpu_uuid: str, drained: bool, now: float) -> None:
        """An admin stops (or resumes) granting new slices on a GPU; existing leases stay."""
        gs = self._fleet.gpus.get(gpu_uuid)
        if gs is None:
            raise NotFound(f"no GPU {gpu_uuid}")
        with self._journal.atomic(now):
            self._journal.record_gpu(gs)
            gs.drained_by_admin = drained
            self._fleet.changed(gs)
            self._journal.drains[gpu_uuid] = drained
            self._emit("gpu.drained" if drained else "gpu.undrained", now, gpu=gpu_uuid)
        if not drained:
            self._scheduler._settle(now)

    def nodes_changed(self, nodes: list[Node], now: float, names: Collection[str] | None = None) -> None:
        """The nodes are these now: the whole fleet, or with `names` those of the named nodes that have
        GPUs (a named node not among them is gone; the others are as they were). A node cordoned or not
        Ready drains its GPUs until it is schedulable again; one whose dynamic MIG GPUs' instances changed
        holds them (see _repartition); a node added, deleted or reshaped reloads the fleet: the leases
        whose slices it no longer has end, saying why. O(the named nodes' GPUs), but for a reload."""
        given = {node.name: node for node in nodes}
        named = given.keys() | (self._fleet.node_index.keys() if names is None else set(names))
        if self._reshaped(named, given):
            self.reload(nodes if names is None else self._with(given, named), now)
            return
        with self._journal.atomic(now):
            reopened = self._cordon(nodes, now)
            room = self._repartition(nodes, now)
        if reopened or room:
            self._scheduler._settle(now)

    def reload(self, nodes: list[Node], now: float) -> None:
        """Hold these nodes as the whole fleet, loaded afresh (see _reload), then grant what fits."""
        scheduler = self._scheduler
        if scheduler.group_waiting:
            with contextlib.suppress(StoreFailed):
                scheduler.commit_group()
        with self._journal.atomic(now):
            self._reload(nodes, now)
            scheduler._schedule(now)

    def outside_use(self, key: str, use: OutsideUse | None, now: float) -> None:
        """The outside holder `key` holds `use` now, or ended (None)."""
        with self._journal.atomic(now):
            freed = self._outside.give_back(key)
            if use is not None and not use.is_empty():
                self._outside.take(use)
        if freed:
            self._scheduler._settle(now)

    def _reshaped(self, named: Collection[str], given: dict[str, Node]) -> bool:
        """Whether a named node came, went or changed its structure (FleetState.structure)."""
        fleet = self._fleet
        for name in named:
            known = fleet.nodes[fleet.node_index[name]] if name in fleet.node_index else None
            node = given.get(name)
            if known is None or node is None:
                if known is not node:
                    return True
            elif fleet.structure(known) != fleet.structure(node):
                return True
        return False

    def _with(self, given: dict[str, Node], named: Collection[str]) -> list[Node]:
        """The whole fleet: its nodes, the named ones as given (those gone left out, those new last), the
        others as held now (their dynamic GPUs with the instances they have)."""
        fleet = self._fleet
        nodes = [given[node.name] if node.name in given else dataclasses.replace(node, gpus=[
                     dataclasses.replace(gs.gpu, instances=list(gs.instances.values()))
                     for gs in fleet.on_node(node.name)])
                 for node in fleet.nodes if node.name in given or node.name not in named]
        return nodes + [node for name, node in given.items() if name not in fleet.node_index]

    def _cordon(self, nodes: list[Node], now: float) -> bool:
        """Drain the GPUs of nodes newly unschedulable, restore those schedulable again; whether
        any was restored (what waits may fit there now)."""
        reopened = False
        for node in nodes:
            known = self._fleet.nodes[self._fleet.node_index[node.name]]
            if known.unschedulable == node.unschedulable:
                continue
            known.unschedulable = node.unschedulable
            for gs in self._fleet.on_node(node.name):
                gs.cordoned = node.unschedulable
                self._fleet.changed(gs)
            reopened = reopened or node.unschedulable is None
            self._emit("node.cordoned" if node.unschedulable else "node.uncordoned", now,
                       node=node.name, reason=node.unschedulable)
        return reopened

    def _repartition(self, nodes: list[Node], now: float) -> bool:
        """Hold the instances the nodes' dynamic MIG GPUs have now (DRA claims allocated or freed them),
        as a reload would on those nodes alone: a node's outside uses are held again after its leases,
        and the leases whose instance went end. Whether room may have been made (an instance went,
        or outside uses were held again)."""
        room = False
        for node in nodes:
            changed = [(gs, gpu.instances) for gs, gpu in zip(self._fleet.on_node(node.name), node.gpus)
                       if gs.gpu.mig_mode is MigMode.DYNAMIC
                       and placements(gpu.instances) != placements(gs.instances.values())]
            if not changed:
                continue
            uses = self._outside.give_back_on(node.name)
            lost: set[str] = set()
            for gs, instances in changed:
                self._journal.record_gpu(gs)
                went = gs.instances.keys() - {i.uuid for i in instances}
                gs.instances = {i.uuid: i for i in instances}
                lost.update(gs.owner.pop(uuid) for uuid in went if uuid in gs.owner)
                gs.created &= gs.instances.keys()
                self._fleet.changed(gs)
                room = room or bool(went) or bool(uses)
            self._emit("node.repartitioned", now, node=node.name, gpus=[gs.gpu.uuid for gs, _ in changed])
            self._lose(lost, now)
            for use in uses:
                self._outside.take(use)
        if room:
            self._fleet.room_made()
        return room

    def _lose(self, lease_ids: set[str], now: float) -> None:
        """The leases whose instances went, no longer held: active ones end, returning ones return
        nothing (in a reload's order: active ones first, each by age)."""
        book = self._book
        leases = [book.by_id.get(lease_id) or book.returning[lease_id] for lease_id in lease_ids]
        for lease in sorted(leases, key=lambda l: (l.id not in book.by_id, l.seq)):
            self._journal.view_release(self._fleet.node_index[lease.slice.node], (), host_demand(lease.spec))
            if lease.id in book.by_id:
                self._slice_lost(lease, f"node {lease.slice.node} no longer has its slice", now)
            else:
                self._not_returning(lease)

    def _reload(self, nodes: list[Node], now: float) -> None:
        """Load the new nodes (admin drains kept, and which instances the core made, where they remain),
        then hold the leases and outside uses on them again."""
        drained = {uuid for uuid, gs in self._fleet.gpus.items() if gs.drained_by_admin}
        made = {uuid: set(gs.created) for uuid, gs in self._fleet.gpus.items() if gs.created}
        gone = set(self._fleet.node_index) - {n.name for n in nodes}
        uses = self._outside.forget_all()
        self._fleet.load(nodes)
        for uuid in drained & set(self._fleet.gpus):
            self._fleet.gpus[uuid].drained_by_admin = True
            self._fleet.changed(self._fleet.gpus[uuid])
        for uuid in made.keys() & set(self._fleet.gpus):
            gs = self._fleet.gpus[uuid]
            gs.created |= made[uuid] & set(gs.instances)
        self._scheduler._plan_fleet()
        self._scheduler.reservations.use(self._scheduler._plans, self._scheduler._fit)
        self._emit("fleet.reloaded", now, nodes=len(nodes), removed=sorted(gone))
        for lease in sorted(self._book.by_id.values(), key=lambda l: l.seq):
            self._reattach(lease, gone, now)
        for lease in sorted(self._book.returning.values(), key=lambda l: l.seq):
            if not reattach(lease, self._fleet):  # its holder's slice is gone with the node
                self._not_returning(lease)
        for use in uses:
            self._outside.take(use)

    def _reattach(self, lease: Lease, gone: set[str], now: float) -> None:
        """Hold an active lease on the reloaded fleet: a granted one's slice again (or it ends), a
        queued one's plans anew (its old ones stay while the fleet has no shape for its spec)."""
        with contextlib.suppress(SpecError):
            self._book.plans[lease.id] = self._scheduler._plans.of(lease.spec)
        if lease.state is not LeaseState.GRANTED or reattach(lease, self._fleet):
            return
        node = lease.slice.node
        self._slice_lost(lease, f"node {node} left the cluster" if node in gone
                         else f"node {node} no longer has its slice", now)

    def _slice_lost(self, lease: Lease, why: str, now: float) -> None:
        """A granted lease whose slice is gone ends, saying why (nothing of it is held)."""
        self._emit("reconcile.slice_lost", now, lease, slice=lease.slice.to_json())
        self._scheduler._end(lease, LeaseState.EXPIRED, now, why, holds=False)

    def _not_returning(self, lease: Lease) -> None:
        """A returning lease whose slice is gone: nothing of it is held, nor returned."""
        self._scheduler._record_lease(lease)
        lease.returning = False
        del self._book.returning[lease.id]
        self._journal.returning_changes[lease.id] = False
