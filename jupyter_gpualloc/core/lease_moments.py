"""Leases filed by the next moment a rule of the tick could act on them.

A rule (a holder's heartbeat stopping, a lease idle past its timeout or its grace) gives each
lease a moment: the earliest time it could act on it, or None while it cannot (no time-to-live,
no idle timeout, a busy holder). `LeaseMoments` files each lease in the bucket of the second its
moment falls in, so a tick reads only the buckets whose second has come and the leases in them,
not every lease; a heartbeat or a touch moves a lease to another bucket in O(1).

The scheduler re-files a lease (`file`) wherever an input of its moment changes: its heartbeat,
activity, busy flag, grant, idle warning, GPU samples, and every time it is held again (added,
recovered, put back after an undone change). A moment that moves later and is not re-filed
costs only a look too early: `due` hands the leases of a past bucket back to the rule, which
checks its own condition exactly, and files them again at their current moment.
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

from .model import Lease

# How far past `now` a tick reads: a moment rounded up by a last bit still comes up when its rule's
# condition (`now - since > ttl`, computed otherwise) holds.
ROUNDING = 1e-9


class LeaseMoments:
    """Active leases by the second of their next moment (`moment(lease)`, None: not filed).

    `file` and `forget` are O(1) (O(log seconds filed) the first time a second is used); `due`
    is O((seconds passed + leases filed in them) x log)."""

    def __init__(self, moment: Callable[[Lease], float | None]):
        self._moment = moment
        self._second: dict[str, int] = {}  # lease id -> the second it is filed in
        self._buckets: dict[int, dict[str, Lease]] = {}  # second -> the leases filed in it
        self._seconds: list[int] = []  # heap of the buckets' seconds, each once

    def file(self, lease: Lease) -> None:
        """File a lease at its current moment (out of the index if it has none)."""
        moment = self._moment(lease)
        second = math.floor(moment) if moment is not None and math.isfinite(moment) else None
        filed = self._second.get(lease.id)
        if filed == second:
            return
        if filed is not None:
            del self._buckets[filed][lease.id]
        if second is None:
            del self._second[lease.id]
            return
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = {}
            heapq.heappush(self._seconds, second)
        bucket[lease.id] = lease
        self._second[lease.id] = second

    def forget(self, lease_id: str) -> None:
        """A lease is no longer active."""
        filed = self._second.pop(lease_id, None)
        if filed is not None:
            del self._buckets[filed][lease_id]

    def due(self, now: float) -> list[Lease]:
        """The leases whose moment may have come by `now` (a superset: each rule checks its own
        condition), each filed again at its current moment."""
        last = math.floor(now + ROUNDING * (1.0 + abs(now)))
        found: list[Lease] = []
        while self._seconds and self._seconds[0] <= last:
            for lease_id, lease in self._buckets.pop(heapq.heappop(self._seconds)).items():
                del self._second[lease_id]
                found.append(lease)
        for lease in found:
            self.file(lease)
        return found

    def second_of(self, lease_id: str) -> int | None:
        """The second a lease is filed in (None: not filed)."""
        return self._second.get(lease_id)
