"""The unit of work the core's stateful parts share: record, write in one transaction, announce, or put back.

A change records each record it touches before touching it (`UndoLog.record`), as it was; the
owner writes the records changed (`dirty`) in one transaction at the change's end, then
announces its events to the listeners; if anything fails on the way, every record is put back
as it was and no event is announced. `ChangeJournal` is that cycle for an owner whose write is
one call (jobs); `SchedulerJournal` is the scheduler's, whose changes also touch GPUs and MIG
instances and may wait in a group commit, and whose parts (usage, deadlines) hand it their
writes and the inverse of each change they make (`on_undo`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Iterator, Protocol, Sequence, TypeVar

from .devices.base import DeviceBackend, DeviceError
from .errors import StoreFailed
from .fleet_state import FleetState, GpuState
from .model import Event, Lease, MigInstance
from .placement import Demand
from .store import DeadlineRecord, Store, StoreError, TakenGroup, UsageSegment


class Record(Protocol):
    id: str


R = TypeVar("R", bound=Record)


class Listeners:
    """Who hears the events, and their announcement once the change that made them is stored."""

    def __init__(self, listeners: Sequence[Callable[[Event], None]] = ()):
        self._listeners: list[Callable[[Event], None]] = list(listeners)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every event after it is stored; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def announce(self, events: Iterable[Event]) -> None:
        for event in events:
            for listener in list(self._listeners):
                listener(event)


class UndoLog(Generic[R]):
    """The records changed since the last write, each as it was before (None: new), with what the
    owner keeps beside it (`extra`)."""

    def __init__(self) -> None:
        self.before: dict[str, tuple[R | None, Any]] = {}
        self.dirty: dict[str, R] = {}

    def record(self, record: R, *, known: bool, extra: Any = None) -> None:
        """Note a record about to change (`known`: it existed before this change): O(1)."""
        if record.id not in self.before:
            self.before[record.id] = (_shallow_copy(record) if known else None, extra)
        self.dirty[record.id] = record

    def put_back(self) -> list[tuple[R, R | None, Any]]:
        """Restore every changed record as it was; each (record, as before or None if new, extra)."""
        restored = []
        for record_id, (before, extra) in self.before.items():
            record = self.dirty[record_id]
            if before is not None:
                vars(record).update(vars(before))
            restored.append((record, before, extra))
        return restored


def _shallow_copy(record: R) -> R:
    """What copy.copy makes of a record (a plain dataclass), in a third of its time."""
    before = object.__new__(type(record))
    vars(before).update(vars(record))
    return before


class ChangeJournal(Generic[R]):
    """One change at a time over `UndoLog` records: `write(dirty)` at its end, then its events
    announced; `put_back(restored)` if anything fails. A change begun inside another is part of it."""

    def __init__(self, write: Callable[[list[R]], None], put_back: Callable[[list[tuple[R, R | None, Any]]], None],
                 listeners: Sequence[Callable[[Event], None]] = ()):
        self._write = write
        self._put_back = put_back
        self.listeners = Listeners(listeners)
        self.log: UndoLog[R] = UndoLog()
        self.events: list[Event] = []
        self._open = False

    def record(self, record: R, *, known: bool) -> None:
        self.log.record(record, known=known)

    @contextmanager
    def change(self) -> Iterator[None]:
        """Stored in one transaction at the end, then announced; undone entirely if anything fails."""
        if self._open:
            yield
            return
        self._open = True
        try:
            yield
            self._write(list(self.log.dirty.values()))
            self.log = UndoLog()
        except BaseException:
            restored, self.log, self.events = self.log.put_back(), UndoLog(), []
            self._put_back(restored)
            raise
        finally:
            self._open = False
        events, self.events = self.events, []
        self.listeners.announce(events)


def refused(err: Any, what: str = "the change") -> StoreFailed:
    """StoreFailed for a write the store refused (`err` a StoreError): nothing of it took effect."""
    return StoreFailed(f"the store refused {what} ({err.kind}); nothing of it took effect")


def unreadable(err: Any) -> StoreFailed:
    """StoreFailed for a read the store could not answer (`err` a StoreError)."""
    return StoreFailed(f"the store could not be read ({err.kind})")


@dataclass
class Undo:
    """What changed since the last commit, as it was before: put back if the commit fails."""

    seq: int
    leases: UndoLog[Lease] = field(default_factory=UndoLog)  # beside each: its plans
    gpus: dict[str, tuple] = field(default_factory=dict)  # GpuState.snapshot() by GPU UUID
    inverses: list[Callable[[], None]] = field(default_factory=list)  # placement view, usage, deadlines
    made: list[tuple[GpuState, MigInstance, str]] = field(default_factory=list)  # with the intent id


@dataclass
class _Pending:
    """What a change wrote and must be able to undo so far (set aside by SchedulerJournal.part)."""

    undo: Undo
    events: list[Event] = field(default_factory=list)
    instance_changes: list[tuple[str, str, MigInstance | None, bool]] = field(default_factory=list)
    drains: dict[str, bool] = field(default_factory=dict)
    returning_changes: dict[str, bool] = field(default_factory=dict)
    deadlines: dict[str, DeadlineRecord | None] = field(default_factory=dict)
    usage: list[UsageSegment] = field(default_factory=list)
    intents: list[str] = field(default_factory=list)

    def then(self, later: "_Pending") -> "_Pending":
        """This and `later` as one: each record as it was before the first of them touched it."""
        undo = self.undo
        for record_id, before in later.undo.leases.before.items():
            undo.leases.before.setdefault(record_id, before)
        undo.leases.dirty.update(later.undo.leases.dirty)
        for uuid, snapshot in later.undo.gpus.items():
            undo.gpus.setdefault(uuid, snapshot)
        undo.inverses += later.undo.inverses
        undo.made += later.undo.made
        return _Pending(undo, self.events + later.events, self.instance_changes + later.instance_changes,
                        {**self.drains, **later.drains}, {**self.returning_changes, **later.returning_changes},
                        {**self.deadlines, **later.deadlines}, self.usage + later.usage, self.intents + later.intents)


_PENDING = ("undo", "events", "instance_changes", "drains", "returning_changes", "deadlines", "usage", "intents")


@dataclass
class _Staged:
    """A change committed into the store's waiting group: what commit_group() undoes if the group fails."""

    undo: Undo
    intents: list[str]
    now: float
    destroyed: list[tuple[tuple, Event]]  # removals of destroyed instances it carried (see SchedulerJournal)


@dataclass
class GroupWrite:
    """A group taken to be written off the owner's thread (SchedulerJournal.take_group)."""

    staged: list[_Staged]
    events: list[Event]
    callbacks: list[Callable[[StoreFailed | None], None]]
    to_destroy: dict[str, GpuState]
    store: Store
    taken: TakenGroup | None  # the store's writes; None: the group wrote nothing

    def write(self) -> None:
        """Write the group's transaction, on any thread; SchedulerJournal.settle_group() tells the outcome."""
        if self.taken is not None:
            self.store.write_taken(self.taken)


class SchedulerJournal:
    """The scheduler's unit of work over leases, GPUs, MIG instances and drains.

    A change records what it touches (`record_lease`, `record_gpu`, the instances it made, and
    through `on_undo` the inverse of each other change: the view's, the usage ledger's, the
    deadlines', whose writes it takes too: `write_usage`, `write_deadline`); `commit` writes it
    in one transaction and announces its events, or, while the store holds a group
    (`Store.hold()`), stages it for `write_group`, which writes the group, announces it, or
    undoes every staged change, newest first. A group may also be written on another thread
    (`take_group`, `GroupWrite.write`, then `settle_group` here) while the next one gathers; if
    the store refuses it, the changes staged since are undone with it. A `part` of a change is
    undone alone if it raises, the rest of the change going on. `rollback` puts a change back: the
    fleet and the inverses here, the leases by the owner's `put_back_leases(restored)` (see
    UndoLog.put_back); `on_released(instances, now, settle)` hears of the MIG instances a settled
    group released (a refused one's are back with their leases, but for those carried).
    """

    def __init__(self, store: Store, backend: DeviceBackend, fleet: FleetState, listeners: Listeners,
                 put_back_leases: Callable[[list[tuple[Lease, Lease | None, Any]]], None],
                 on_released: Callable[[dict[str, GpuState], float, bool], None]):
        self.store = store
        self.backend = backend
        self.fleet = fleet
        self.listeners = listeners
        self._put_back_leases = put_back_leases
        self._on_released = on_released
        self.seq = 0
        self.events: list[Event] = []
        self.instance_changes: list[tuple[str, str, MigInstance | None, bool]] = []
        self.drains: dict[str, bool] = {}
        self.returning_changes: dict[str, bool] = {}  # what the next commit writes of returning slices
        self.deadlines: dict[str, DeadlineRecord | None] = {}  # leases' deadlines the next commit writes
        self.usage: list[UsageSegment] = []  # accrual the next commit writes
        self.intents: list[str] = []  # MIG intents written since the last commit, which drops them
        # Instances released in the waiting group, destroyed once it is durable (write_group),
        # unless granted again meanwhile: mig uuid -> its GPU.
        self.to_destroy: dict[str, GpuState] = {}
        # Instances destroyed after a group's commit: (their record's removal, mig.destroyed), which
        # the next commit writes and then announces.
        self.destroyed: list[tuple[tuple, Event]] = []
        self.undo = Undo(self.seq)
        self._staged: list[_Staged] = []  # changes committed into the store's waiting group
        self._staged_events: list[Event] = []
        self._group_callbacks: list[Callable[[StoreFailed | None], None]] = []
        self._in_flight: GroupWrite | None = None  # taken, not yet settled (take_group)
        # Instances a durable group released that a change still staged took again: the settle of its
        # group destroys them if that change is undone (MigInstances.destroy_released).
        self.carried: dict[str, GpuState] = {}
        self._aside: list[_Pending] = []  # what the change did before each part now open, outermost first

    def restart(self, seq: int, intents: list[str]) -> None:
        """Go on from the stored sequence number and the MIG intents still listed (recovery)."""
        self.seq = seq
        self.undo = Undo(seq)
        self.intents = intents

    # ---------------------------------------------------------------- recording
    def record_lease(self, lease: Lease, *, known: bool, plans: tuple | None) -> None:
        """Note a lease about to change: stored at the next commit, put back (with its plans) if that fails."""
        self.undo.leases.record(lease, known=known, extra=plans)

    def record_gpu(self, gs: GpuState) -> None:
        """Remember a GPU's instances, owners and holders before they change."""
        if gs.gpu.uuid not in self.undo.gpus:
            self.undo.gpus[gs.gpu.uuid] = gs.snapshot()

    def on_undo(self, inverse: Callable[[], None]) -> None:
        """Call `inverse` if the change being made is undone (the inverses of a change run newest first)."""
        self.undo.inverses.append(inverse)

    def write_deadline(self, lease_id: str, record: DeadlineRecord | None) -> None:
        """A lease's deadline (None: it has none) for the next commit to write."""
        self.deadlines[lease_id] = record

    def write_usage(self, segments: Iterable[UsageSegment]) -> None:
        """Usage segments for the next commit to write (new, or moving the end of one stored)."""
        self.usage.extend(segments)

    def view_allocate(self, node_index: int, slots: tuple[int, ...], taken: Demand, check: bool = True) -> None:
        self.fleet.views.allocate(node_index, slots, taken, check)
        self.undo.inverses.append(lambda: self.fleet.views.release(node_index, slots, taken))

    def view_release(self, node_index: int, slots: tuple[int, ...], taken: Demand) -> None:
        self.fleet.views.release(node_index, slots, taken)
        self.undo.inverses.append(lambda: self.fleet.views.allocate(node_index, slots, taken))

    # ------------------------------------------------------------------ writing
    def atomic(self, now: float) -> "_Atomic":
        """One change: stored in one transaction at the end, or undone entirely if anything fails."""
        return _Atomic(self, now)

    @contextmanager
    def part(self, now: float) -> Iterator[None]:
        """A part of the change being made, undone alone if it raises (then the error is raised):
        what it changed is put back, the MIG instances it made destroyed, and what the change did
        before it stays. A commit inside a part writes the whole change so far, which stays."""
        before = self._set_aside()
        self._aside.append(before)
        try:
            yield
        except BaseException:
            self.rollback(now)
            raise
        finally:
            self._aside.pop()
            self._take(before.then(self._set_aside()))

    def _set_aside(self) -> _Pending:
        """What the change did so far, taken out: the journal goes on from nothing pending."""
        pending = _Pending(*(getattr(self, name) for name in _PENDING))
        self._take(_Pending(Undo(self.seq)))
        return pending

    def _take(self, pending: _Pending) -> None:
        for name in _PENDING:
            setattr(self, name, getattr(pending, name))

    def commit(self, now: float = 0.0) -> None:
        """Write every change since the last commit in one transaction, then announce its events.

        StoreFailed when the store refuses; `atomic` then undoes the changes. While the store
        holds writes for a group commit, the change waits in the group: write_group() writes it,
        then announces it, or undoes it. Inside parts (`part`), what each set aside is written too."""
        if self._aside:
            whole = self._aside[0]
            for later in [*self._aside[1:], self._set_aside()]:
                whole = whole.then(later)
            for aside in self._aside:
                vars(aside).update(vars(_Pending(Undo(self.seq))))
            self._take(whole)
        destroyed, dirty = self.destroyed, self.undo.leases.dirty
        if dirty or self.instance_changes or self.drains or self.intents or self.returning_changes or destroyed \
                or self.deadlines or self.usage:
            changes = self.instance_changes + [c for c, _ in destroyed] if destroyed else self.instance_changes
            try:
                self.store.save(list(dirty.values()), changes, self.seq, drains=self.drains,
                                intents_done=self.intents, returning=self.returning_changes,
                                deadlines=self.deadlines, usage=self.usage)
            except StoreError as err:
                raise refused(err) from err
        events, self.events = [e for _, e in destroyed] + self.events if destroyed else self.events, []
        self.destroyed = []
        if self.store.holding:
            self._staged.append(_Staged(self.undo, list(self.intents), now, destroyed))
            self._staged_events += events
            events = []
        self.instance_changes.clear()
        self.drains.clear()
        self.returning_changes.clear()
        self.deadlines.clear()
        self.usage.clear()
        self.intents.clear()
        self.undo = Undo(self.seq)
        if (self._staged or self._in_flight) and not self.store.holding:  # written above, with the group before it
            self._staged_events += events  # announced after the group's own
            events = []
            self.write_group(settle=False)  # inside a change: its caller schedules
        self.listeners.announce(events)

    @property
    def group_waiting(self) -> bool:
        """Whether anything waits for write_group(): a write, an event, a callback or an instance to destroy."""
        return bool(self._staged or self._staged_events or self._group_callbacks or self.to_destroy
                    or self.store.waiting)

    def after_group(self, callback: Callable[[StoreFailed | None], None]) -> None:
        """Call `callback(None)` once the waiting group is written, or `callback(StoreFailed)` once it is undone."""
        self._group_callbacks.append(callback)

    def write_group(self, settle: bool) -> None:
        """Write the waiting group now, on this thread, after settling the one being written elsewhere
        (see settle_group); StoreFailed, everything staged undone, if the store refuses either."""
        if self._in_flight is not None:
            self.settle_group(self._in_flight, settle=False)
        write = self.take_group()
        write.write()
        self.settle_group(write, settle)

    def take_group(self) -> GroupWrite:
        """Take the waiting group (its staged changes, events, callbacks, released instances and the
        store's writes) for GroupWrite.write(), on any thread, while the next group gathers; the
        owner then calls settle_group(). One group at a time is taken."""
        if self._in_flight is not None:
            raise RuntimeError("the group taken before is not settled")
        write = GroupWrite(self._staged, self._staged_events, self._group_callbacks, self.to_destroy,
                           self.store, self.store.take_group())
        self._staged, self._staged_events, self._group_callbacks, self.to_destroy = [], [], [], {}
        self._in_flight = write
        return write

    def settle_group(self, write: GroupWrite, settle: bool) -> None:
        """Finish a taken group, on the owner's thread, once written (it waits for that): announce it,
        call its callbacks, then pass on the instances it released (`settle`: the owner may run a
        scheduling pass). If the store refused it, undo it and every change staged since, newest
        first, call every callback with the failure and raise StoreFailed. Nothing if settled before."""
        if self._in_flight is not write:
            return
        self._in_flight = None
        released, self.carried = {**self.carried, **write.to_destroy}, {}
        try:
            if write.taken is not None:
                self.store.settle_taken(write.taken)  # refused: the store drops the writes staged since too
        except StoreError as err:
            failed = refused(err)
            staged, self._staged, self._staged_events = write.staged + self._staged, [], []
            callbacks, self._group_callbacks = write.callbacks + self._group_callbacks, []
            released.update(self.to_destroy)
            self.to_destroy = {}
            for change in reversed(staged):
                self.undo, self.intents = change.undo, change.intents
                self.rollback(change.now)
                self.destroyed[:0] = change.destroyed  # still to be written
            for callback in callbacks:
                callback(failed)
            if released:  # given back to their leases, or, released by a durable group and taken again by an undone change, free
                self._on_released(released, staged[-1].now if staged else 0.0, settle)
            raise failed from err
        self.listeners.announce(write.events)
        for callback in write.callbacks:
            callback(None)
        if released:
            self._on_released(released, write.staged[-1].now if write.staged else 0.0, settle)

    @property
    def gathering(self) -> bool:
        """Whether changes wait, staged, for a group commit (none of them durable yet)."""
        return bool(self._staged)

    # ---------------------------------------------------------------- undoing
    def rollback(self, now: float) -> None:
        """Put back everything changed since the last commit; destroy the MIG instances made for it."""
        undo = self.undo
        for inverse in reversed(undo.inverses):
            inverse()
        for uuid, snapshot in undo.gpus.items():
            gs = self.fleet.gpus[uuid]
            gs.restore(snapshot)
            self.fleet.changed(gs)
        self.fleet.moved()
        self._put_back_leases(undo.leases.put_back())
        self.seq = undo.seq
        made = {inst.uuid for _, inst, _ in undo.made}
        self.instance_changes = [c for c in self.instance_changes if c[1] not in made]
        self.drains.clear()
        self.returning_changes.clear()
        self.deadlines.clear()
        self.usage.clear()
        self.events.clear()
        self.undo = Undo(self.seq)
        self._unmake_made(undo.made, now)

    def _unmake_made(self, made: list[tuple[GpuState, MigInstance, str]], now: float) -> None:
        """Destroy the MIG instances an undone change made, newest first, and drop their intents; an
        instance the device will not destroy stays, recorded (with its intent) by the next commit."""
        kept: set[str] = set()
        for gs, inst, intent in reversed(made):
            try:
                self.backend.destroy_mig_instance(gs.gpu.uuid, inst.uuid)
            except DeviceError as err:
                gs.instances[inst.uuid] = inst
                gs.created.add(inst.uuid)
                self.fleet.changed(gs)
                self.instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
                self.events.append(Event("device.error", now, None, None, {
                    "gpu": gs.gpu.uuid, "instance": inst.uuid, "error": str(err)}))
                kept.add(intent)
        done = [i for i in self.intents if i not in kept]
        if done:
            try:
                self.store.clear_intents(done)
                self.intents = [i for i in self.intents if i in kept]
            except StoreError:
                pass  # they stay listed, and the next commit drops them


class _Atomic:
    """Journal.atomic's block: a plain class, as a generator-based context manager costs several
    times more, and every change of every request runs in one."""

    __slots__ = ("journal", "now")

    def __init__(self, journal: SchedulerJournal, now: float):
        self.journal, self.now = journal, now

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if kind is None:
            try:
                self.journal.commit(self.now)
            except BaseException:
                self.journal.rollback(self.now)
                raise
        else:
            self.journal.rollback(self.now)
        return False
