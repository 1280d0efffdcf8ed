"""The waiting requests' order, and the capacity held back for those at its head.

Requests wait ordered by priority class (interactive before batch), then, with fair share, by
their user's GPU memory in use, then by age. A request that has waited longer than policy
`reserve_after` holds back the GPUs it will most likely fit on first (its reservation of
capacity), so later requests that fit now are backfilled only elsewhere.
"""

from __future__ import annotations

from typing import Callable, Sequence

from .fit import FitSearch
from .fleet_state import FleetState, GpuState
from .indexes import ActiveLeases
from .model import Lease, MigMode, SliceKind
from .plans import Plan, Plans
from .policy import SchedulerPolicy


class QueueOrder:
    """Order, positions and reservations of capacity over the queue (lease ids) the scheduler keeps."""

    def __init__(self, policy: SchedulerPolicy, active: ActiveLeases, fleet: FleetState, plans: Plans,
                 fit: FitSearch, lease_plans: dict[str, tuple[Plan, ...]]):
        self.policy = policy
        self.active = active
        self.fleet = fleet
        self.plans = plans
        self.fit = fit
        self.lease_plans = lease_plans

    def key(self) -> Callable[[Lease], tuple]:
        """A lease's place in the queue: priority class, then (with fair share) its user's GPU
        memory in use, then age. O(1) per lease: that memory is a counter kept as leases are
        granted and end."""
        held = self.active.held_mib if self.policy.fair_share else {}
        return lambda lease: (lease.priority.rank, held.get(lease.user, 0), lease.seq)

    def ordered(self, queue: Sequence[str]) -> list[str]:
        order_key = self.key()
        return sorted(queue, key=lambda i: order_key(self.active.by_id[i]))

    def position(self, queue: Sequence[str], lease: Lease) -> int:
        """1-based place of a queued lease: O(queue), no sorting."""
        order_key = self.key()
        key = order_key(lease)
        return 1 + sum(1 for i in queue if order_key(self.active.by_id[i]) < key)

    def reserved(self, queue: Sequence[str], now: float, before: Lease) -> set[str]:
        """GPUs held back for requests that wait ahead of `before` longer than reserve_after
        (O(queue) when none has waited that long, as in a queue that moves)."""
        reserved: set[str] = set()
        leases = self.active.by_id
        if not any(now - leases[i].created_at >= self.policy.reserve_after for i in queue):
            return reserved
        order_key = self.key()
        before_key = order_key(before)
        for lease_id in self.ordered(queue):
            lease = leases[lease_id]
            if order_key(lease) > before_key:
                break
            if now - lease.created_at >= self.policy.reserve_after:
                reserved |= self.reservation(lease, reserved)
        return reserved

    def reservation(self, lease: Lease, taken: set[str]) -> set[str]:
        """The GPUs this waiting request will most likely fit on first."""
        plan = self.lease_plans[lease.id][0]
        hosts = self.plans.host_nodes(plan, lease.spec)  # never a GPU on a node too small for the request
        if plan.kind is SliceKind.MIG:
            cands = [gs for gs in self.fit.mig_candidates(plan, lease.spec, taken)
                     if gs.gpu.mig_mode is MigMode.DYNAMIC and gs.node_index in hosts]
            if not cands:
                return set()
            best = max(cands, key=lambda gs: (gs.layout().free_memory_slices, -gs.slot))
            return {best.gpu.uuid}
        by_node: dict[int, list[GpuState]] = {}
        for gs in self.fleet.gpus.values():
            if (not gs.is_mig and not gs.drained and gs.gpu.model == plan.model and gs.takes(plan.kind)
                    and gs.gpu.uuid not in taken
                    and gs.node_index in hosts):
                by_node.setdefault(gs.node_index, []).append(gs)
        best_set: list[GpuState] = []
        best_free = -1
        for gpus in by_node.values():
            if len(gpus) < plan.count:
                continue
            chosen = sorted(gpus, key=lambda g: -g.free_milli())[:plan.count]
            free = sum(g.free_milli() for g in chosen)
            if free > best_free:
                best_set, best_free = chosen, free
        return {g.gpu.uuid for g in best_set}
