"""Persistence of leases, jobs, MIG instances and drained GPUs (SQLAlchemy; SQLite by default).

The scheduler writes every state change here, in one transaction, before announcing it, and
rebuilds itself from `load()` when it starts again.

Group commit: while `hold()` is in effect the writes wait in a group, and `commit_group()` writes
the whole group in one transaction (one fsync). A write made outside `hold()` while a group waits
takes the group into its own transaction, so nothing is ever durable before a change it follows.
A group may also be taken (`take_group()`) and written on another thread (`write_taken()`) while
the next one gathers: a write on the owner's thread then waits for it, and is refused with it,
and the owner settles it (`settle_taken()`), which refuses the waiting group too if it was refused.
On a database server MIG intents have a connection of their own, so that they never wait for it.
Reads see only what has been written.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from functools import lru_cache, partial
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import msgspec
from sqlalchemy import (Boolean, Column, Float, Integer, MetaData, String, Table, Text, bindparam,
                        create_engine, delete, event, func, select)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from .model import Job, JobState, Lease, LeaseState, MigInstance, PriorityClass, Slice, SliceSpec
from .store_writes import DriverStatement, Group, Records

metadata = MetaData()

leases = Table(
    "leases", metadata,
    Column("id", String(64), primary_key=True),
    Column("user", String(255), nullable=False, index=True),
    Column("holder", String(255), nullable=False),
    Column("groups", Text, nullable=False, default="[]"),
    Column("spec", Text, nullable=False),
    Column("priority", String(16), nullable=False),
    Column("preemptible", Boolean, nullable=False, default=False),
    Column("state", String(16), nullable=False, index=True),
    Column("slice", Text),
    Column("created_at", Float, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("granted_at", Float),
    Column("ended_at", Float),
    Column("last_activity", Float),
    Column("busy", Boolean, nullable=False, default=False),
    Column("idle_warned_at", Float),
    Column("idle_timeout", Float),
    Column("reason", Text, nullable=False, default=""),
)

# Ended leases whose slices their holders still hold (Scheduler: "returning"): recovered as held.
returning_slices = Table(
    "returning_slices", metadata,
    Column("lease_id", String(64), primary_key=True),
)

mig_instances = Table(
    "mig_instances", metadata,
    Column("uuid", String(128), primary_key=True),
    Column("gpu_uuid", String(128), nullable=False),
    Column("profile_id", Integer, nullable=False),
    Column("start", Integer, nullable=False),
    Column("size", Integer, nullable=False),
    Column("gi_id", Integer, nullable=False, default=-1),
    Column("ci_id", Integer, nullable=False, default=-1),
    Column("created_by_core", Boolean, nullable=False, default=False),
)

drained_gpus = Table(
    "drained_gpus", metadata,
    Column("gpu_uuid", String(128), primary_key=True),
)

# Write-ahead for MIG instances: a row is written before the core asks a device for an instance
# and removed in the transaction that records the instance; a row found at start names an
# instance the core made but never recorded.
mig_intents = Table(
    "mig_intents", metadata,
    Column("id", String(64), primary_key=True),
    Column("gpu_uuid", String(128), nullable=False),
    Column("profile_id", Integer, nullable=False),
    Column("start", Integer, nullable=False),
)

meta = Table(
    "meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

# One row per lease, UTC day and stretch of accrual: [start, end) within that day, at a constant
# share of GPUs (`gpus`) and GiB of GPU memory (`gib`).
usage = Table(
    "usage", metadata,
    Column("lease_id", String(64), primary_key=True),
    Column("start", Float, primary_key=True),
    Column("end", Float, nullable=False),
    Column("day", String(10), nullable=False, index=True),
    Column("user", String(255), nullable=False, index=True),
    Column("groups", Text, nullable=False, default="[]"),
    Column("model", String(128), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("offer", String(255), nullable=False, default=""),
    Column("holder_kind", String(16), nullable=False),
    Column("gpus", Float, nullable=False),
    Column("gib", Float, nullable=False),
)

# GPU-seconds a lease's GPU was busy (utilisation samples), and GPU-seconds sampled, per UTC day.
gpu_busy = Table(
    "gpu_busy", metadata,
    Column("lease_id", String(64), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("user", String(255), nullable=False, index=True),
    Column("busy", Float, nullable=False),
    Column("sampled", Float, nullable=False),
)

# The deadline of each time-boxed granted lease (see core/deadlines.py).
lease_deadlines = Table(
    "lease_deadlines", metadata,
    Column("lease_id", String(64), primary_key=True),
    Column("deadline", Float, nullable=False),
    Column("extensions", Integer, nullable=False, default=0),
    Column("warned_at", Float),
)


jobs = Table(
    "jobs", metadata,
    Column("id", String(64), primary_key=True),
    Column("user", String(255), nullable=False, index=True),
    Column("state", String(16), nullable=False, index=True),
    Column("created_at", Float, nullable=False),
    Column("data", Text, nullable=False),
)

# Reservations of capacity for a window (see core/reservations.py), one JSON record each.
reservations = Table(
    "reservations", metadata,
    Column("name", String(64), primary_key=True),
    Column("data", Text, nullable=False),
)


@dataclass
class InstanceRecord:
    gpu_uuid: str
    instance: MigInstance
    created_by_core: bool


@dataclass(frozen=True)
class DeadlineRecord:
    """When a time-boxed lease ends, how often it was extended, and when its holder was warned."""

    lease_id: str
    deadline: float
    extensions: int
    warned_at: float | None


@dataclass(frozen=True)
class UsageSegment:
    """Accrual of one lease over [start, end) within one UTC day."""

    lease_id: str
    start: float
    end: float
    day: str
    user: str
    groups: tuple[str, ...]
    model: str
    kind: str
    offer: str
    holder_kind: str
    gpus: float
    gib: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class MigIntent:
    """The core is about to create (or has created, unrecorded) an instance of `profile_id` at `start`."""

    id: str
    gpu_uuid: str
    profile_id: int
    start: int


@dataclass
class StoredState:
    leases: list[Lease] = field(default_factory=list)
    instances: list[InstanceRecord] = field(default_factory=list)
    intents: list[MigIntent] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    seq: int = 0
    returning: list[Lease] = field(default_factory=list)  # ended leases whose slices are still held


def sqlite_url(path: str | Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


class TakenGroup:
    """A group taken to be written off the owner's thread (Store.take_group): `written` is set once
    write_taken() is done, `refusal` its StoreError if the store refused it."""

    def __init__(self, group: Group):
        self.group = group
        self.written = threading.Event()
        self.refusal: StoreError | None = None


class StoreError(Exception):
    """The database did not take a write or answer a read (unreachable, a value it cannot encode,
    a table gone): nothing of that transaction was written. `kind` names the driver's error; the cause is chained."""

    def __init__(self, cause: BaseException):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.kind = type(cause).__name__


def _upsert(insert_of: Callable[[Table], Any], dialect: Any, table: Table, key: list[str],
            changes: Callable[[Any], dict] | None = None) -> DriverStatement:
    """INSERT, or on a row with the same `key` UPDATE its other columns (or `changes(excluded)`)."""
    insert = insert_of(table)
    set_ = (changes(insert.excluded) if changes else
            {c.name: insert.excluded[c.name] for c in table.c if c.name not in key})
    return DriverStatement(insert.on_conflict_do_update(index_elements=key, set_=set_), dialect,
                            [c.key for c in table.c])


def _delete_by(dialect: Any, table: Table, column: str) -> DriverStatement:
    return DriverStatement(delete(table).where(table.c[column] == bindparam(column)), dialect, [column])


def _insert_into(dialect: Any, table: Table) -> DriverStatement:
    return DriverStatement(table.insert(), dialect, [c.key for c in table.c])


class Store:
    """A database of the core's state; `url` is any SQLAlchemy URL (sqlite:///PATH by default)."""

    def __init__(self, url: str, *, sqlite_synchronous: str = "NORMAL", sqlite_autocheckpoint: bool = True):
        """`sqlite_synchronous`: NORMAL (WAL synced at checkpoints) or FULL (at every commit); see
        docs/reliability.md for what a power loss can take with NORMAL. `sqlite_autocheckpoint`
        False: no commit checkpoints the WAL; the owner calls checkpoint() (from another thread)."""
        if sqlite_synchronous not in ("NORMAL", "FULL"):
            raise ValueError("sqlite_synchronous must be NORMAL or FULL")
        self.url = url
        is_sqlite = url.startswith("sqlite")
        # pool_pre_ping: a server restart or a dropped connection costs a reconnect, not an error.
        self.engine = create_engine(url, connect_args={"timeout": 30} if is_sqlite else {},
                                    pool_pre_ping=not is_sqlite)
        self._insert = sqlite_insert if is_sqlite else pg_insert
        # MIG intents' connections: on a server, each intent one statement committed by itself, without
        # waiting for the WAL's flush (see record_intent): one round trip, where a transaction took four.
        # SQLite's intents share the writer connection: a second writer would make each connection drop
        # its page cache whenever the other wrote.
        self._intent_engine = self.engine
        self._intent_writer_name = "_writer" if is_sqlite else "_intent_writer"
        if not is_sqlite:
            self._intent_engine = create_engine(url, pool_pre_ping=True, isolation_level="AUTOCOMMIT")
            event.listen(self._intent_engine, "connect", _commits_without_flush)
        if is_sqlite:
            event.listen(self.engine, "connect", partial(_sqlite_pragmas, sqlite_synchronous, sqlite_autocheckpoint))
        metadata.create_all(self.engine)  # connects first, so the dialect knows its server when compiling
        # Every write is compiled once, here, to this dialect's SQL (see DriverStatement).
        dialect = self.engine.dialect
        upsert = partial(_upsert, self._insert, dialect)
        delete_by = partial(_delete_by, dialect)
        insert = partial(_insert_into, dialect)
        self._upsert_leases = upsert(leases, ["id"])
        self._add_busy = upsert(gpu_busy, ["lease_id", "day"], lambda excluded: {
            "busy": gpu_busy.c.busy + excluded.busy, "sampled": gpu_busy.c.sampled + excluded.sampled})
        self._upsert_usage = upsert(usage, ["lease_id", "start"], lambda excluded: {"end": excluded.end})
        self._upsert_meta_row = upsert(meta, ["key"])
        self._upsert_jobs = upsert(jobs, ["id"])
        self._upsert_reservations = upsert(reservations, ["name"])
        self._delete_reservation = delete_by(reservations, "name")
        self._upsert_instance = upsert(mig_instances, ["uuid"])
        self._delete_instance = delete_by(mig_instances, "uuid")
        self._delete_returning = delete_by(returning_slices, "lease_id")
        self._insert_returning = insert(returning_slices)
        self._delete_drain = delete_by(drained_gpus, "gpu_uuid")
        self._insert_drain = insert(drained_gpus)
        self._delete_deadline = delete_by(lease_deadlines, "lease_id")
        self._insert_deadline = insert(lease_deadlines)
        self._insert_intent = insert(mig_intents)
        self._delete_intent = delete_by(mig_intents, "id")  # one id a row (executemany), not an expanding IN
        self._select_lease = select(leases).where(leases.c.id == bindparam("id"))
        self._held = 0
        self._group = Group()
        # Writes go through one connection kept open: a pool checkout per transaction cost about as much
        # CPU as the transaction's statements on SQLite, and a pre-ping round trip on a server.
        self._writer: Connection | None = None
        self._intent_writer: Connection | None = None  # MIG intents': see record_intent
        self._taken: TakenGroup | None = None  # a group being written by write_taken()

    def close(self) -> None:
        for name in ("_writer", "_intent_writer"):
            conn = getattr(self, name)
            if conn is not None:
                conn.close()
                setattr(self, name, None)
        self.engine.dispose()
        self._intent_engine.dispose()

    def checkpoint(self) -> None:
        """SQLite: sync the WAL and copy it into the database file (PASSIVE: never waits for a writer,
        and a write never waits for it), on a connection of its own, so any thread may call it;
        other databases: nothing. StoreError if SQLite refuses."""
        if self.url.startswith("sqlite"):
            with self._read() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")

    # -------------------------------------------------------------- writes
    def hold(self) -> "_Holding":
        """Writes made inside wait in the group until commit_group() (nestable)."""
        return _Holding(self)

    @property
    def holding(self) -> bool:
        return self._held > 0

    @property
    def waiting(self) -> bool:
        """Whether writes wait in the group for commit_group()."""
        return bool(self._group)

    def commit_group(self) -> None:
        """Write the waiting group in one transaction. StoreError, and nothing of it written, if that
        fails; the group is dropped either way (its changes are the caller's to undo)."""
        taken = self.take_group()
        if taken is not None:
            self.write_taken(taken)
            self.settle_taken(taken)

    def take_group(self) -> TakenGroup | None:
        """The waiting group, taken out for write_taken() (None if nothing waits); the writes after
        it wait in a new group. Until settle_taken(), a write on this thread first waits for it."""
        if self._taken is not None:
            raise RuntimeError("the group taken before is not settled")
        group, self._group = self._group, Group()
        if not group:
            return None
        self._taken = TakenGroup(group)
        return self._taken

    def write_taken(self, taken: TakenGroup) -> None:
        """Write a taken group in one transaction, on any thread; settle_taken() tells the outcome."""
        try:
            self._in_transaction(partial(taken.group.write, store=self), after_taken=False)
        except Exception as err:  # anything but a refusal is a bug, and refuses the group all the same
            taken.refusal = err if isinstance(err, StoreError) else StoreError(err)
        finally:
            taken.written.set()

    def settle_taken(self, taken: TakenGroup) -> None:
        """On the owner's thread, once write_taken() ran (it waits for that): nothing if the group is
        written; if it was refused, the group and every write waiting after it are dropped, newest
        first (their changes are the caller's to undo), and StoreError."""
        taken.written.wait()
        if self._taken is taken:
            self._taken = None
        if taken.refusal is not None:
            waiting, self._group = self._group, Group()
            for undo in [*reversed(waiting.refused), *reversed(taken.group.refused)]:
                undo()
            raise taken.refusal

    def if_refused(self, undo: Callable[[], None]) -> None:
        """While held: call `undo` if the waiting group is refused (what the write it follows changed in memory)."""
        if self._held:
            self._group.refused.append(undo)

    def _apply(self, write: Callable[[Connection], None] | None, lease_rows: Sequence[dict] = (),
               seq: int | None = None, usage_rows: Sequence[dict] = (), records: Records | None = None) -> None:
        """One write: into the group while held, else now, in one transaction with the waiting group
        (which stays waiting, without this write, if that transaction fails)."""
        group = self._group if self._held else self._group.copy()
        group.add(write, lease_rows, seq, usage_rows, records)
        if not self._held:
            self._in_transaction(partial(group.write, store=self))
            self._group = Group()

    def _in_transaction(self, write: Callable[[Connection], None], *, after_taken: bool = True,
                        writer: str = "_writer") -> None:
        """Call `write` in one transaction on the kept connection `writer`, committed when it returns;
        the driver's refusals come out as StoreError. `after_taken`: first wait for a group being
        written elsewhere, refused (StoreError) if it was. A kept connection that failed is rolled back by
        begin(), and one the driver invalidated reconnects at its next use. A connection found dead
        before the commit (a database server restarted, an idle connection dropped) costs one
        reconnect and a second try, not an error: nothing of the first try was committed."""
        taken = self._taken if after_taken else None
        if taken is not None:
            taken.written.wait()
            if taken.refusal is not None:
                raise taken.refusal
        for last_try in (False, True):
            written = False  # once True, a failure came at the commit, whose outcome is unknown: no second try
            try:
                conn = getattr(self, writer)
                if conn is None:
                    conn = (self._intent_engine if writer == "_intent_writer" else self.engine).connect()
                    setattr(self, writer, conn)
                with conn.begin():
                    write(conn)
                    written = True
                return
            except DBAPIError as err:
                if err.connection_invalidated and not written and not last_try:
                    continue
                raise StoreError(err) from err
            except (SQLAlchemyError, UnicodeEncodeError) as err:  # a lone surrogate fails before the driver
                raise StoreError(err) from err

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        """A connection to read with; the driver's refusals come out as StoreError."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except SQLAlchemyError as err:
            raise StoreError(err) from err

    def save(self, changed: list[Lease], instance_changes: list[tuple[str, str, MigInstance | None, bool]],
             seq: int, *, drains: Mapping[str, bool] | None = None, intents_done: Sequence[str] = (),
             returning: Mapping[str, bool] | None = None,
             deadlines: Mapping[str, DeadlineRecord | None] | None = None,
             usage: Sequence[UsageSegment] = ()) -> None:
        """One transaction: upsert leases, add/remove MIG instance records, set GPUs' drain marks,
        mark or unmark ended leases whose slices are still held (`returning`), drop fulfilled MIG
        intents, set or (None) delete leases' deadlines, add or move usage segments, remember the
        sequence. StoreError, and nothing written, if any part fails.
        The rows are taken now; in a group, a lease, an instance, a drain or returning mark or a
        deadline written twice is written once, as it was last (see Group)."""
        records = Records()
        records.instances.update((mig_uuid, inst and {
            "uuid": inst.uuid, "gpu_uuid": gpu_uuid, "profile_id": inst.profile_id, "start": inst.start,
            "size": inst.size, "gi_id": inst.gi_id, "ci_id": inst.ci_id, "created_by_core": created})
            for gpu_uuid, mig_uuid, inst, created in instance_changes)
        records.drains.update(drains or {})
        records.returning.update(returning or {})
        records.intents_done.update(dict.fromkeys(intents_done))
        records.deadlines.update((lease_id, record and {
            "lease_id": record.lease_id, "deadline": record.deadline, "extensions": record.extensions,
            "warned_at": record.warned_at}) for lease_id, record in (deadlines or {}).items())
        self._apply(None, [_lease_row(l) for l in changed], seq, [_usage_row(seg) for seg in usage],
                    records=records)

    def _write_records(self, conn: Connection, records: Records) -> None:
        """The records `save` keeps by key, one executemany per statement: returning and drain marks
        deleted then inserted where set, instances deleted or upserted, fulfilled intents deleted,
        deadlines deleted then inserted where set."""
        marked = ((records.returning, self._delete_returning, self._insert_returning, "lease_id"),
                  (records.drains, self._delete_drain, self._insert_drain, "gpu_uuid"))
        for marks, unmark, mark, key in marked:
            unmark.run_many(conn, [{key: name} for name in marks])
            mark.run_many(conn, [{key: name} for name, on in marks.items() if on])
        self._delete_instance.run_many(conn, [{"uuid": uuid} for uuid, row in records.instances.items()
                                              if row is None])
        self._upsert_instance.run_many(conn, [row for row in records.instances.values() if row is not None])
        self._delete_intent.run_many(conn, [{"id": intent_id} for intent_id in records.intents_done])
        self._delete_deadline.run_many(conn, [{"lease_id": lease_id} for lease_id in records.deadlines])
        self._insert_deadline.run_many(conn, [row for row in records.deadlines.values() if row is not None])

    def record_intent(self, intent: MigIntent) -> None:
        """Write, in its own transaction (never in a group), that the core is about to create a MIG
        instance: on a server, on a connection of its own, never waiting for a group being written
        elsewhere (no group writes this row); on SQLite, after it (see _write_intents). On PostgreSQL without waiting for the WAL's flush (`synchronous_commit` off on the
        intents' connections only): the intent survives the service's crash at once, and a crash of the
        database server only once the next durable commit (the group's, which records the instance)
        has flushed it, as SQLite's NORMAL keeps every commit (docs/reliability.md)."""
        row = {"id": intent.id, "gpu_uuid": intent.gpu_uuid, "profile_id": intent.profile_id, "start": intent.start}
        self._write_intents(partial(self._insert_intent.run, row=row))

    def clear_intents(self, intent_ids: Sequence[str]) -> None:
        """Forget intents whose instance was destroyed again before any commit recorded it (own transaction)."""
        rows = [{"id": intent_id} for intent_id in intent_ids]
        self._write_intents(partial(self._delete_intent.run_many, rows=rows))

    def _write_intents(self, write: Callable[[Connection], None]) -> None:
        """On a server, on the intents' own connection, never waiting for a group being written; on
        SQLite, on the writer connection, after it."""
        shared = self._intent_writer_name == "_writer"
        self._in_transaction(write, after_taken=shared, writer=self._intent_writer_name)

    def save_jobs(self, changed: list[Job]) -> None:
        """One transaction: upsert job records. StoreError, and nothing written, if it fails."""
        if not changed:
            return
        rows = [{"id": j.id, "user": j.user, "state": j.state.value, "created_at": j.created_at,
                 "data": _json(j.to_json())} for j in changed]
        self._apply(partial(self._upsert_jobs.run_many, rows=rows))

    def save_reservations(self, changed: Sequence[Any]) -> None:
        """One transaction: upsert reservation records, delete the deleted ones. StoreError if it fails."""
        rows = [{"name": r.name, "data": _json(r.to_json())} for r in changed if not r.deleted]
        gone = [{"name": r.name} for r in changed if r.deleted]

        def write(conn: Connection) -> None:
            if rows:
                self._upsert_reservations.run_many(conn, rows)
            if gone:
                self._delete_reservation.run_many(conn, gone)
        self._apply(write)

    def load_reservations(self) -> list[dict]:
        """Every reservation record, as the JSON object it was saved as (core/reservations.py)."""
        with self._read() as conn:
            return [json.loads(r[0]) for r in conn.execute(select(reservations.c.data))]

    # --------------------------------------------------------------- reads
    def load(self) -> StoredState:
        """Active leases, ended ones whose slices are still held, recorded MIG instances and intents,
        drained GPUs, the last sequence number."""
        state = StoredState()
        with self.engine.connect() as conn:
            active = [LeaseState.QUEUED.value, LeaseState.GRANTED.value]
            for row in conn.execute(select(leases).where(leases.c.state.in_(active))).mappings():
                state.leases.append(_lease_from_row(row))
            held = select(leases).join(returning_slices, returning_slices.c.lease_id == leases.c.id)
            for row in conn.execute(held).mappings():
                lease = _lease_from_row(row)
                lease.returning = True
                state.returning.append(lease)
            for row in conn.execute(select(mig_instances)).mappings():
                state.instances.append(InstanceRecord(row["gpu_uuid"], MigInstance(
                    uuid=row["uuid"], profile_id=row["profile_id"], start=row["start"], size=row["size"],
                    gi_id=row["gi_id"], ci_id=row["ci_id"]), row["created_by_core"]))
            state.intents = [MigIntent(r["id"], r["gpu_uuid"], r["profile_id"], r["start"])
                             for r in conn.execute(select(mig_intents)).mappings()]
            state.drained = [r[0] for r in conn.execute(select(drained_gpus.c.gpu_uuid))]
            seq = conn.execute(select(meta.c.value).where(meta.c.key == "seq")).scalar()
            state.seq = int(seq) if seq else 0
        return state

    def load_lease(self, lease_id: str) -> Lease | None:
        """One lease, active or ended; StoreError when the database cannot be read."""
        try:
            with self.engine.connect() as conn:
                row = conn.execute(self._select_lease, {"id": lease_id}).mappings().first()
        except SQLAlchemyError as err:
            raise StoreError(err) from err
        return _lease_from_row(row) if row else None

    def load_jobs(self, *, user: str | None = None, active_only: bool = False, limit: int | None = None) -> list[Job]:
        """Job records, newest first (of one user, and only queued or running ones, when asked);
        StoreError when the database cannot be read."""
        query = select(jobs.c.data).order_by(jobs.c.created_at.desc())
        if user is not None:
            query = query.where(jobs.c.user == user)
        if active_only:
            query = query.where(jobs.c.state.in_([JobState.QUEUED.value, JobState.RUNNING.value]))
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            rows = [row[0] for row in conn.execute(query)]
        return [Job.from_json(json.loads(raw)) for raw in rows]

    def load_job(self, job_id: str) -> Job | None:
        """One job record; StoreError when the database cannot be read."""
        with self._read() as conn:
            raw = conn.execute(select(jobs.c.data).where(jobs.c.id == job_id)).scalar()
        return Job.from_json(json.loads(raw)) if raw else None

    def save_usage(self, segments: list[UsageSegment]) -> None:
        """One transaction: insert each segment, or move the end of one already stored."""
        if segments:
            self._apply(None, usage_rows=[_usage_row(seg) for seg in segments])

    def load_usage(self, since: float, until: float, user: str | None = None) -> list[UsageSegment]:
        """Segments that overlap [since, until), of one user or everyone, oldest first."""
        query = select(usage).where(usage.c.end > since, usage.c.start < until)
        if user is not None:
            query = query.where(usage.c.user == user)
        with self._read() as conn:
            rows = conn.execute(query.order_by(usage.c.start, usage.c.lease_id)).mappings().all()
        return [_usage_from_row(row) for row in rows]

    def usage_totals(self) -> list[tuple[str, str, str, str, float]]:
        """(user, groups as JSON, model, kind, GPU-seconds) over every stored segment."""
        gpu_seconds = func.sum((usage.c.end - usage.c.start) * usage.c.gpus)
        query = select(usage.c.user, usage.c.groups, usage.c.model, usage.c.kind, gpu_seconds).group_by(
            usage.c.user, usage.c.groups, usage.c.model, usage.c.kind)
        with self._read() as conn:
            return [tuple(row) for row in conn.execute(query)]

    def add_busy(self, lease_id: str, day: str, user: str, busy: float, sampled: float) -> None:
        """Add busy and sampled GPU-seconds to a lease's day."""
        row = {"lease_id": lease_id, "day": day, "user": user, "busy": busy, "sampled": sampled}
        self._apply(partial(self._add_busy.run, row=row))

    def load_busy(self, first_day: str, last_day: str, user: str | None = None) -> dict[str, float]:
        """Busy GPU-seconds per lease over the UTC days first_day..last_day."""
        query = select(gpu_busy.c.lease_id, func.sum(gpu_busy.c.busy)).where(
            gpu_busy.c.day >= first_day, gpu_busy.c.day <= last_day).group_by(gpu_busy.c.lease_id)
        if user is not None:
            query = query.where(gpu_busy.c.user == user)
        with self._read() as conn:
            return {lease_id: busy for lease_id, busy in conn.execute(query)}

    def load_deadlines(self) -> list[DeadlineRecord]:
        with self._read() as conn:
            rows = conn.execute(select(lease_deadlines)).mappings().all()
        return [DeadlineRecord(r["lease_id"], r["deadline"], r["extensions"], r["warned_at"]) for r in rows]


def _sqlite_pragmas(synchronous: str, autocheckpoint: bool, dbapi_conn, _record) -> None:
    """WAL; synchronous NORMAL: a commit survives the process's death (SIGKILL) and the file stays
    consistent, but a power loss can take the commits since the last checkpoint; FULL: each commit
    syncs the WAL (one fsync per group commit). docs/reliability.md has the analysis. Without
    `autocheckpoint` the commit that takes the WAL past 1,000 pages does not checkpoint it."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA synchronous={synchronous}")
    cur.execute("PRAGMA busy_timeout=30000")
    if not autocheckpoint:
        cur.execute("PRAGMA wal_autocheckpoint=0")
    cur.close()


def _commits_without_flush(dbapi_conn, _record) -> None:
    """PostgreSQL: this session's commits do not wait for the WAL's flush (see Store.record_intent)."""
    with dbapi_conn.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO OFF")
    dbapi_conn.commit()


_ENCODER = msgspec.json.Encoder()


def _json(value: Any) -> str:
    """A record's JSON text as the store keeps it (msgspec: compact, and several times json.dumps's speed)."""
    return _ENCODER.encode(value).decode()


@lru_cache(maxsize=4096)
def _json_text(value: SliceSpec | tuple[str, ...]) -> str:
    """A spec's or a groups tuple's JSON as a lease row keeps it, worked out once (few distinct ones)."""
    return _json(value.to_json() if isinstance(value, SliceSpec) else list(value))


def _lease_row(lease: Lease) -> dict:
    return {
        "id": lease.id, "user": lease.user, "holder": lease.holder,
        "groups": _json_text(lease.groups), "spec": _json_text(lease.spec),
        "priority": lease.priority.value, "preemptible": lease.preemptible, "state": lease.state.value,
        "slice": _json(lease.slice.to_json()) if lease.slice else None,
        "created_at": lease.created_at, "seq": lease.seq, "granted_at": lease.granted_at,
        "ended_at": lease.ended_at, "last_activity": lease.last_activity, "busy": lease.busy,
        "idle_warned_at": lease.idle_warned_at, "idle_timeout": lease.idle_timeout, "reason": lease.reason,
    }


def _lease_from_row(row) -> Lease:
    return Lease(
        id=row["id"], user=row["user"], holder=row["holder"], groups=tuple(json.loads(row["groups"])),
        spec=SliceSpec.from_json(json.loads(row["spec"])), priority=PriorityClass(row["priority"]),
        preemptible=row["preemptible"], state=LeaseState(row["state"]),
        slice=Slice.from_json(json.loads(row["slice"])) if row["slice"] else None,
        created_at=row["created_at"], seq=row["seq"], granted_at=row["granted_at"],
        ended_at=row["ended_at"], last_activity=row["last_activity"], busy=row["busy"],
        idle_warned_at=row["idle_warned_at"], idle_timeout=row["idle_timeout"], reason=row["reason"],
    )


def _usage_row(seg: UsageSegment) -> dict:
    return {"lease_id": seg.lease_id, "start": seg.start, "end": seg.end, "day": seg.day, "user": seg.user,
            "groups": _json_text(seg.groups), "model": seg.model, "kind": seg.kind, "offer": seg.offer,
            "holder_kind": seg.holder_kind, "gpus": seg.gpus, "gib": seg.gib}


def _usage_from_row(row) -> UsageSegment:
    return UsageSegment(
        lease_id=row["lease_id"], start=row["start"], end=row["end"], day=row["day"], user=row["user"],
        groups=tuple(json.loads(row["groups"])), model=row["model"], kind=row["kind"], offer=row["offer"],
        holder_kind=row["holder_kind"], gpus=row["gpus"], gib=row["gib"])


class _Holding:
    """Store.hold's block (a plain class: one wraps every request's change)."""

    __slots__ = ("store",)

    def __init__(self, store: Store):
        self.store = store

    def __enter__(self) -> None:
        self.store._held += 1

    def __exit__(self, *exc_info) -> None:
        self.store._held -= 1
