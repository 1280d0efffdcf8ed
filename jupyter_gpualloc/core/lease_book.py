"""The scheduler's leases: the active ones indexed, each one's plans, the queue, and the returning ones."""

from __future__ import annotations

from typing import Any, Iterable

from .fleet_state import FleetState
from .indexes import ActiveLeases
from .lease_moments import LeaseMoments
from .model import Lease, LeaseState
from .plans import Plan


class LeaseBook:
    """Active leases (queued and granted) by id, user, group and preemptibility, with their plans;
    the queue of waiting lease ids; and the ended leases whose holders still hold their slices
    (policy wait_for_holders: the slice stays with its GPU until holders_gone(), a release with
    holder_gone, or the holder's heartbeats stop). Active leases are also filed in `moments`, the
    tick's indexes by the moment each of its rules could act on them (set by the scheduler)."""

    def __init__(self, fleet: FleetState):
        self._fleet = fleet
        self.active = ActiveLeases()
        self.by_id: dict[str, Lease] = self.active.by_id
        self.plans: dict[str, tuple[Plan, ...]] = {}
        self.queue: list[str] = []
        self.returning: dict[str, Lease] = {}
        self.moments: tuple[LeaseMoments, ...] = ()

    def knows(self, lease_id: str) -> bool:
        """Whether the lease is active or returning (held in memory, not only stored)."""
        return lease_id in self.by_id or lease_id in self.returning

    def add(self, lease: Lease) -> None:
        """Hold an active lease, indexed by user, group and preemptibility and by its moments: O(its groups)."""
        self.active.add(lease)
        self.refile(lease)
        self._fleet.moved()

    def drop(self, lease_id: str) -> None:
        """Forget an active lease and its index entries: O(its groups)."""
        for moments in self.moments:
            moments.forget(lease_id)
        if self.active.drop(lease_id) is not None:
            self._fleet.moved()

    def refile(self, lease: Lease) -> None:
        """File an active lease at its moments as they are now (see LeaseMoments.file): O(1)."""
        for moments in self.moments:
            moments.file(lease)

    def put_back(self, restored: Iterable[tuple[Lease, Lease | None, Any]]) -> None:
        """The leases of an undone change, as they were (UndoLog.put_back(), each with its plans):
        in the indexes, the queue and returning again, or gone if new."""
        for lease, before, plans in restored:
            self.drop(lease.id)
            self.plans.pop(lease.id, None)
            if lease.id in self.queue:
                self.queue.remove(lease.id)
            self.returning.pop(lease.id, None)
            if before is None:
                continue
            if lease.returning:
                self.returning[lease.id] = lease
                continue
            self.add(lease)
            self.plans[lease.id] = plans
            if lease.state is LeaseState.QUEUED:
                self.queue.append(lease.id)
