"""The cluster's node changes applied to the fleet: cordons drain a node's GPUs, and a node added,
deleted or reshaped reloads the fleet, holding every lease's slice and every outside use again.

The scheduler calls these inside one of its journal's units of work (`Scheduler.nodes_changed`);
leases whose slices the new fleet lacks end through the scheduler's own `end`.
"""

from __future__ import annotations

import contextlib
from typing import Callable

from .fleet_state import FleetState
from .journal import SchedulerJournal
from .lease_book import LeaseBook
from .model import Lease, LeaseState, Node, SliceSpec, SpecError
from .outside import OutsideHolds
from .plans import Plan
from .recovery import reattach


class ClusterSync:
    """Applies node changes to the fleet, the leases on it and the outside holds."""

    def __init__(self, fleet: FleetState, book: LeaseBook, journal: SchedulerJournal, outside: OutsideHolds,
                 plan_fleet: Callable[[], object], plans_of: Callable[[SliceSpec], tuple[Plan, ...]],
                 emit: Callable[..., None], end: Callable[..., None], record_lease: Callable[[Lease], None]):
        self._fleet, self._book, self._journal, self._outside = fleet, book, journal, outside
        self._plan_fleet, self._plans_of = plan_fleet, plans_of
        self._emit, self._end, self._record_lease = emit, end, record_lease

    def cordon(self, nodes: list[Node], now: float) -> bool:
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

    def reload(self, nodes: list[Node], now: float) -> None:
        """Load the new nodes (admin drains kept), then hold the leases and outside uses on them again."""
        drained = {uuid for uuid, gs in self._fleet.gpus.items() if gs.drained_by_admin}
        gone = set(self._fleet.node_index) - {n.name for n in nodes}
        uses = self._outside.forget_all()
        self._fleet.load(nodes)
        for uuid in drained & set(self._fleet.gpus):
            self._fleet.gpus[uuid].drained_by_admin = True
            self._fleet.changed(self._fleet.gpus[uuid])
        self._plan_fleet()
        self._emit("fleet.reloaded", now, nodes=len(nodes), removed=sorted(gone))
        for lease in sorted(self._book.by_id.values(), key=lambda l: l.seq):
            self._reattach(lease, gone, now)
        for lease in sorted(self._book.returning.values(), key=lambda l: l.seq):
            if not reattach(lease, self._fleet):  # its holder's slice is gone with the node
                self._record_lease(lease)
                lease.returning = False
                del self._book.returning[lease.id]
                self._journal.returning_changes[lease.id] = False
        for use in uses:
            self._outside.take(use)

    def _reattach(self, lease: Lease, gone: set[str], now: float) -> None:
        """Hold an active lease on the reloaded fleet: a granted one's slice again (or it ends), a
        queued one's plans anew (its old ones stay while the fleet has no shape for its spec)."""
        with contextlib.suppress(SpecError):
            self._book.plans[lease.id] = self._plans_of(lease.spec)
        if lease.state is not LeaseState.GRANTED or reattach(lease, self._fleet):
            return
        node = lease.slice.node
        why = f"node {node} left the cluster" if node in gone else f"node {node} no longer has its slice"
        self._emit("reconcile.slice_lost", now, lease, slice=lease.slice.to_json())
        self._end(lease, LeaseState.EXPIRED, now, why, holds=False)
