"""Time-boxed leases: a granted lease may last its offer's or the policy's max_duration.

A lease gets its deadline when it is granted; `deadline_warning` seconds before it the holder is
warned (lease.deadline_warning), at it the lease is released like an idle one. The holder may
extend it by `extension` seconds at most `max_extensions` times, and, when policy says so, not
while other requests wait. Deadlines are stored, so a restart keeps them. Each change of one is
part of the scheduler's change that makes it: written by its commit, put back if it is undone.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Iterable

from .journal import SchedulerJournal
from .model import Lease
from .store import DeadlineRecord, Store
from .offers import Offers
from .usage import holder_kind


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

    def max_duration(self, lease: Lease) -> float | None:
        """Seconds this lease may last: its offer's max_duration, else the policy's for its holder kind."""
        return self._offers.max_duration(holder_kind(lease.holder), lease.spec)

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
        if record is None:
            del self._records[lease_id]
        else:
            self._records[lease_id] = record

    def check(self, leases: Iterable[Lease], now: float) -> list[DeadlineAction]:
        """Warn leases within deadline_warning of their deadline (once), release those past it."""
        actions = []
        for lease in leases:
            record = self._records.get(lease.id)
            if record is None:
                continue
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
