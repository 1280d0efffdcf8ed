"""Changes to where slices may go: an admin's drain, and the cluster's changes. Outside holders take
and give back devices, cordons drain a node's GPUs, and a node added, deleted or reshaped reloads
the fleet, holding every lease's slice and every outside use again.

A part of the scheduler's state machine (`Scheduler.drain`, `nodes_changed`, `outside_use`):
each change is one unit of work of its journal, leases whose slices the new fleet lacks end
through the scheduler's own `_end`, and what waits gets a scheduling pass.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from .errors import NotFound, StoreFailed
from .fleet_state import FleetState, node_shapes
from .journal import SchedulerJournal
from .lease_book import LeaseBook
from .model import Lease, LeaseState, Node, OutsideUse, SpecError
from .outside import OutsideHolds
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

    def nodes_changed(self, nodes: list[Node], now: float) -> None:
        """A node cordoned or not Ready drains its GPUs until it is schedulable again; a node added,
        deleted or reshaped reloads the fleet: the leases whose slices it no longer has end, saying why."""
        scheduler = self._scheduler
        if node_shapes(nodes) == self._fleet.shape:
            with self._journal.atomic(now):
                reopened = self._cordon(nodes, now)
            if reopened:
                scheduler._settle(now)
            return
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
                self._scheduler._record_lease(lease)
                lease.returning = False
                del self._book.returning[lease.id]
                self._journal.returning_changes[lease.id] = False
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
        why = f"node {node} left the cluster" if node in gone else f"node {node} no longer has its slice"
        self._emit("reconcile.slice_lost", now, lease, slice=lease.slice.to_json())
        self._scheduler._end(lease, LeaseState.EXPIRED, now, why, holds=False)
