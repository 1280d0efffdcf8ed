"""Time-boxed leases: a granted lease may last its offer's or the policy's max_duration.

A lease gets its deadline when it is granted; `deadline_warning` seconds before it the holder is
warned (lease.deadline_warning), at it the lease is released like an idle one. The holder may
extend it by `extension` seconds at most `max_extensions` times, and, when policy says so, not
while other requests wait. Deadlines are stored, so a restart keeps them. Each change of one is
part of the scheduler's change that makes it: written by its commit, put back if it is undone.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import partial
from typing import Callable

from .journal import SchedulerJournal
from .model import Lease
from .store import DeadlineRecord, Store
from .offers import Offers
from .holders import kind_of


class ExtensionRefused(Exception):
    """A lease cannot be extended; the message says why."""


@dataclass(frozen=True)
class DeadlineAction:
    """What a tick decided for a lease near or past its deadline: a warning, or its release."""

    lease: Lease
    record: DeadlineRecord
    release: bool
    limit: float

    @property
    def reason(self) -> str:
        return f"reached its maximum duration of {describe_seconds(self.limit)}"

    def warning(self, extensions_left: int) -> dict:
        """The data of the lease.deadline_warning event."""
        return {"deadline": self.record.deadline, "release_at": self.record.deadline,
                "extensions_left": extensions_left}


def describe_seconds(seconds: float) -> str:
    """'4h', '90m', '1h 30m', '45s'."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{secs}s" if secs else ""]
    return " ".join(p for p in parts if p) or "0s"


class Deadlines:
    """The deadlines of granted leases, decided from policy and offers, kept in the store."""

    def __init__(self, store: Store, policy, offers: Offers, journal: SchedulerJournal):
        """`offers`: the scheduler's, whose terms give each lease its time limit; `journal`: the
        scheduler's, whose changes give, move and end deadlines."""
        self._journal = journal
        self.policy = policy
        self._offers = offers
        self._records: dict[str, DeadlineRecord] = {r.lease_id: r for r in store.load_deadlines()}
        # (deadline, lease id) of every record put, earliest first; an entry whose record has
        # gone or moved is skipped when it comes up (check), and all are rebuilt once most are such
        self._by_deadline: list[tuple[float, str]] = [(r.deadline, r.lease_id) for r in self._records.values()]
        heapq.heapify(self._by_deadline)

    def max_duration(self, lease: Lease) -> float | None:
        """Seconds this lease may last: its offer's max_duration, else the policy's for its holder kind."""
        return self._offers.max_duration(kind_of(lease.holder), lease.spec)

    def of(self, lease_id: str) -> DeadlineRecord | None:
        return self._records.get(lease_id)

    def describe(self, lease_id: str) -> dict | None:
        """A lease's deadline for the API: when, extensions used and left, when it was warned; None if none."""
        record = self._records.get(lease_id)
        if record is None:
            return None
        return {"at": record.deadline, "extensions": record.extensions,
                "extensions_left": self.extensions_left(lease_id), "warned_at": record.warned_at}

    def extensions_left(self, lease_id: str) -> int:
        record = self._records.get(lease_id)
        return max(0, self.policy.max_extensions - record.extensions) if record else 0

    def start(self, lease: Lease, now: float) -> None:
        """Give a lease just granted its deadline; a recovered lease keeps the one it had."""
        if lease.id in self._records:
            return
        limit = self.max_duration(lease)
        if limit is None:
            return
        record = DeadlineRecord(lease.id, now + limit, 0, None)
        self._keep(lease.id, record)

    def cap(self, lease: Lease, at: float) -> None:
        """End a granted lease by `at` at the latest (a reservation's window end), extensions kept."""
        record = self._records.get(lease.id)
        if record is not None and record.deadline <= at:
            return
        self._keep(lease.id, DeadlineRecord(lease.id, at, record.extensions if record else 0, None))

    def stop(self, lease: Lease) -> None:
        if lease.id in self._records:
            self._keep(lease.id, None)

    def _keep(self, lease_id: str, record: DeadlineRecord | None) -> None:
        """A lease's new deadline record (None: none), written by the change's commit, put back if it is undone."""
        self._journal.on_undo(partial(self._put, lease_id, self._records.get(lease_id)))
        self._put(lease_id, record)
        self._journal.write_deadline(lease_id, record)

    def _put(self, lease_id: str, record: DeadlineRecord | None) -> None:
        """O(log records) amortised."""
        if record is None:
            del self._records[lease_id]
            return
        self._records[lease_id] = record
        if len(self._by_deadline) > 2 * len(self._records) + 64:
            self._by_deadline = [(r.deadline, r.lease_id) for r in self._records.values()]
            heapq.heapify(self._by_deadline)
        else:
            heapq.heappush(self._by_deadline, (record.deadline, lease_id))

    def check(self, granted: Callable[[str], Lease | None], place: Callable[[str], int],
              now: float) -> list[DeadlineAction]:
        """Warn granted leases within deadline_warning of their deadline (once), release those past
        it, in `place` order (the order of the scheduler's leases). `granted`: the lease of an id if
        it is granted, else None. O((leases within deadline_warning of their deadline + records
        changed since the last check) x log records), not O(leases): only those come up in the heap."""
        due: dict[str, DeadlineRecord] = {}
        heap = self._by_deadline
        while heap and now >= heap[0][0] - self.policy.deadline_warning:
            deadline, lease_id = heapq.heappop(heap)
            record = self._records.get(lease_id)
            if record is not None and record.deadline == deadline and granted(lease_id) is not None:
                due[lease_id] = record
        for lease_id, record in due.items():  # each stays in the heap until its record goes or moves
            heapq.heappush(heap, (record.deadline, lease_id))
        actions = []
        for lease in sorted((granted(lease_id) for lease_id in due), key=lambda lease: place(lease.id)):
            record = due[lease.id]
            held = record.deadline - (lease.granted_at or 0.0)
            if now >= record.deadline:
                actions.append(DeadlineAction(lease, record, True, held))
            elif now >= record.deadline - self.policy.deadline_warning and record.warned_at is None:
                record = DeadlineRecord(record.lease_id, record.deadline, record.extensions, now)
                self._keep(lease.id, record)
                actions.append(DeadlineAction(lease, record, False, held))
        return actions

    def extend(self, lease: Lease, now: float, *, others_wait: bool) -> DeadlineRecord:
        """Move the deadline `extension` seconds later (from now or from the deadline, whichever is later)."""
        record = self._records.get(lease.id)
        if record is None:
            raise ExtensionRefused("this lease has no deadline to extend")
        if record.extensions >= self.policy.max_extensions:
            raise ExtensionRefused(f"this lease has used its {self.policy.max_extensions} extension(s); "
                                   f"it ends at its deadline")
        if others_wait and not self.policy.extend_while_others_wait:
            raise ExtensionRefused("others are waiting for GPUs, so leases are not extended now")
        record = DeadlineRecord(lease.id, max(now, record.deadline) + self.policy.extension,
                                record.extensions + 1, None)
        self._keep(lease.id, record)
        return record
