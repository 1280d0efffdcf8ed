"""The scheduler core: the only place where GPU allocations are decided.

A request (`submit`) becomes a Lease that is granted at once or queued. Waiting requests are
ordered by priority class (interactive before batch), then by fair share between users, then
by age; any later request that fits now is backfilled ahead of the ones that wait, unless it
would use a GPU reserved for a request that has waited longer than `reserve_after`. Queued
interactive requests may preempt preemptible batch leases. `tick(now)` ends leases whose holder
stopped heartbeating and, after a warning, leases idle past their timeout.

Every state change is written to the store before it is announced as an Event. Time is always
passed in by the caller.

MIG instances the core makes and unmakes follow two rules. Write-ahead: an intent naming the
instance's place is durable before the device is asked to create it (`_create_instance`), so a
crash in between leaves an intent that recovery resolves. Destroy after commit: an instance is
destroyed only once the store says nobody holds it (`_destroy_instance`); under group commit
(`Store.hold()`) an instance its holder released waits, unowned, until `commit_group()` has made
its group durable, and is then destroyed (a grant of the same profile in the meantime takes it
instead); one freed by an expiry or a preemption is destroyed at once, after writing the group.
A crash in between leaves an unowned instance the core made, which recovery destroys.
"""

from __future__ import annotations

import copy
import itertools
import math
import re
import secrets
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from . import mig, names
from .deadlines import Deadlines, ExtensionRefused
from .indexes import ActiveLeases, MigCapacity
from .devices.base import DeviceBackend, DeviceError
from .model import (
    MIB_PER_GIB,
    MILLI_PER_GPU,
    Event,
    Gpu,
    Lease,
    LeaseState,
    MigInstance,
    MigMode,
    MigProfile,
    Node,
    PriorityClass,
    Slice,
    SliceKind,
    SliceSpec,
    SpecError,
    check_name,
)
from .placement import ClusterView, Demand, NodeCapacity, get_policy
from .policy import SchedulerPolicy
from .store import MigIntent, Store, StoreError
from .usage import UsageLedger


class SchedulerError(Exception):
    """Base of the errors the core raises for requests it refuses."""


class NotFound(SchedulerError):
    pass


class StoreFailed(SchedulerError):
    """The store did not take a change: the core undid all of it, devices included, and carries on."""


class QuotaExceeded(SchedulerError):
    def __init__(self, scope: str, key: str, limit: float, message: str):
        super().__init__(message)
        self.scope = scope
        self.key = key
        self.limit = limit
        self.limit_text = ""  # 'at most 20 GiB': what an offer the quota never allows shows


def _amount(key: str, value: float) -> str:
    """A quota amount with its unit: '20 GiB', '79.6 GiB', '1 slice', '2 whole GPUs'."""
    if key == "memory_gib":
        return f"{value:.1f}".removesuffix(".0") + " GiB"
    unit = {"slices": "slice", "whole_gpus": "whole GPU"}[key]
    return f"{value:g} {unit}{'' if value == 1 else 's'}"


class HolderBusy(SchedulerError):
    """The holder already has an active lease."""

    def __init__(self, lease_id: str):
        super().__init__(f"this holder already has lease {lease_id}; release it first")
        self.lease_id = lease_id


@dataclass(frozen=True)
class _Plan:
    """One concrete way to satisfy a spec: a MIG profile, a share or whole GPUs of one model."""

    kind: SliceKind
    model: str
    memory_mib: int
    profile: MigProfile | None = None
    milli: int = MILLI_PER_GPU
    count: int = 1


@dataclass
class _ModelGroup:
    """The fleet's GPUs of one model and MIG-ness: how many sit on each node."""

    model: str
    is_mig: bool
    memory_mib: int
    profiles: dict[int, MigProfile]
    per_node: dict[str, int] = field(default_factory=dict)


@dataclass
class _GpuState:
    gpu: Gpu
    node_index: int
    slot: int
    profiles: dict[int, MigProfile]
    instances: dict[str, MigInstance] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # mig uuid -> lease id
    created: set[str] = field(default_factory=set)  # mig uuids this core created
    shares: dict[str, int] = field(default_factory=dict)  # lease id -> milli (non-MIG)
    drained: bool = False
    cached_layout: mig.Layout | None = None  # forgotten (set to None) whenever `instances` changes

    @property
    def is_mig(self) -> bool:
        return self.gpu.mig_mode is not MigMode.OFF

    def layout(self) -> mig.Layout:
        """The MIG layout of its instances, computed once per change of them."""
        if self.cached_layout is None:
            self.cached_layout = mig.Layout.of(self.instances.values(), self.profiles)
        return self.cached_layout

    def free_milli(self) -> int:
        return MILLI_PER_GPU - sum(self.shares.values())


@dataclass
class _Undo:
    """What changed since the last commit, as it was before: put back if the commit fails."""

    seq: int
    leases: dict[str, tuple[Lease | None, tuple[_Plan, ...] | None]] = field(default_factory=dict)
    gpus: dict[str, tuple] = field(default_factory=dict)
    view: list[Callable[[], None]] = field(default_factory=list)  # inverse placement-view changes
    made: list[tuple[_GpuState, MigInstance, str]] = field(default_factory=list)  # with the intent id


@dataclass
class _Staged:
    """A change committed into the store's waiting group: what commit_group() undoes if the group fails."""

    undo: _Undo
    dirty: dict[str, Lease]
    intents: list[str]
    now: float
    destroyed: list[tuple[tuple, Event]]  # removals of destroyed instances it carried (see Scheduler._destroyed)


@dataclass
class _Placement:
    slice: Slice
    plan: _Plan
    node_index: int
    gpus: tuple["_GpuState", ...]
    mig_uuid: str | None = None
    create_at: int | None = None  # start, when a MIG instance must be created


class Scheduler:
    """Queue, placement, quotas, fair share, preemption and expiry over one fleet."""

    def __init__(self, backend: DeviceBackend, store: Store, policy: SchedulerPolicy | None = None,
                 *, now: float = 0.0, listeners: Sequence[Callable[[Event], None]] = ()):
        """Load the fleet, then recover from the store (`listeners` hear the recovery's events too)."""
        self.backend = backend
        self.store = store
        self.policy = policy or SchedulerPolicy()
        self._listeners: list[Callable[[Event], None]] = list(listeners)
        self._active_leases = ActiveLeases()  # by user, group and preemptibility; users' held memory
        self._leases: dict[str, Lease] = self._active_leases.by_id
        # Ended leases whose holders still hold their slices (policy wait_for_holders): the slice
        # stays in its GPU's owner/shares until holders_gone(), a release with holder_gone, or
        # the holder's heartbeats stop; `_returning_changes` is what the next commit writes of it.
        self._returning: dict[str, Lease] = {}
        self._returning_changes: dict[str, bool] = {}
        self._generation = 0  # bumped by every change that can alter what a scheduling pass grants
        self._pass_done: tuple[int, float] | None = None  # (generation, valid until) of the last idle pass
        self._no_room: set[tuple] | None = None  # placements that failed during the current pass
        self._plans: dict[str, tuple[_Plan, ...]] = {}
        self._queue: list[str] = []
        self._seq = 0
        self._pending_events: list[Event] = []
        self._dirty: dict[str, Lease] = {}
        self._instance_changes: list[tuple[str, str, MigInstance | None, bool]] = []
        self._drains: dict[str, bool] = {}
        self._intents: list[str] = []  # MIG intents written since the last commit, which drops them
        # Instances released in the waiting group, destroyed once it is durable (commit_group),
        # unless granted again meanwhile: mig uuid -> its GPU.
        self._to_destroy: dict[str, _GpuState] = {}
        # Instances destroyed after a group's commit: (their record's removal, mig.destroyed), which
        # the next commit writes and then announces.
        self._destroyed: list[tuple[tuple, Event]] = []
        self._undo = _Undo(self._seq)
        self._staged: list[_Staged] = []  # changes committed into the store's waiting group (store.hold())
        self._staged_events: list[Event] = []
        self._group_callbacks: list[Callable[[StoreFailed | None], None]] = []
        self._activity_unwritten: set[str] = set()  # leases whose touches are in memory only (write_activity)
        self._load_fleet()
        for unusable in self.backend.unusable_nodes():
            self._emit("gpu.node_unusable", now, node=unusable.name, reason=unusable.reason)
        self._placement = get_policy(self.policy.placement, typical=self._typical_demands())
        self._mig_placer = mig.get_mig_placer(self.policy.mig_placement)
        self.usage = UsageLedger(store, self.policy, self.policy.offers or self._derived_offers(), now=now)
        self.deadlines = Deadlines(store, self.policy, self.usage.offer_of)
        self._recover(now)

    # ------------------------------------------------------------------ fleet
    def _load_fleet(self) -> None:
        self.nodes: list[Node] = self.backend.discover()
        self._node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self._gpus: dict[str, _GpuState] = {}
        capacities = []
        for ni, node in enumerate(self.nodes):
            capacities.append(NodeCapacity(node.name, node.cpu_milli, node.memory_mib,
                                           tuple(g.model for g in node.gpus)))
            for slot, gpu in enumerate(node.gpus):
                if gpu.mig_mode is not MigMode.OFF and self.policy.mig_changes == "static":
                    gpu.mig_mode = MigMode.STATIC
                if gpu.mig_mode is MigMode.DYNAMIC and not self.backend.can_change_mig:
                    gpu.mig_mode = MigMode.STATIC
                profiles = self.backend.mig_profiles(gpu.uuid) if gpu.mig_mode is not MigMode.OFF else {}
                gs = _GpuState(gpu, ni, slot, profiles, {i.uuid: i for i in gpu.instances})
                self._gpus[gpu.uuid] = gs
        self.view = ClusterView(capacities)
        groups: dict[tuple[str, bool], _ModelGroup] = {}
        for gs in self._gpus.values():
            key = (gs.gpu.model, gs.is_mig)
            if key not in groups:
                groups[key] = _ModelGroup(gs.gpu.model, gs.is_mig, gs.gpu.memory_mib, gs.profiles)
            per_node = groups[key].per_node
            per_node[gs.gpu.node] = per_node.get(gs.gpu.node, 0) + 1
        self._model_groups = list(groups.values())
        self._mig_gpus: dict[str, list[_GpuState]] = {}  # model -> its MIG GPUs, in fleet order
        self._hosts_known: dict[tuple, frozenset[int]] = {}  # see _host_nodes
        self._plans_known: dict[SliceSpec, tuple[_Plan, ...]] = {}  # see _plans_for
        for gs in self._gpus.values():
            if gs.is_mig:
                self._mig_gpus.setdefault(gs.gpu.model, []).append(gs)
        self._mig_capacity = MigCapacity(gs for gs in self._gpus.values() if gs.is_mig)
        for gs in self._gpus.values():
            self._sync_view(gs)

    def _sync_view(self, gs: _GpuState, reserved: bool = False) -> None:
        self.view.set_gpu_enabled(gs.node_index, gs.slot, not (gs.is_mig or gs.drained or reserved))

    def _typical_demands(self) -> list[tuple[Demand, float]]:
        """The workload a fragmentation-aware policy plans for: the non-MIG offers, equally weighted."""
        typical = []
        for _, spec, plans in self._offer_plans():
            plain = [p for p in plans if p.kind is not SliceKind.MIG]
            if plain:
                typical.append((self._demand(plain[0], spec), 1.0))
        return typical

    # ----------------------------------------------------------------- events
    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every event after it is stored; returns an unsubscribe function."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _emit(self, type_: str, now: float, lease: Lease | None = None, **data) -> None:
        if lease is not None:
            data.setdefault("state", lease.state.value)
            data.setdefault("holder", lease.holder)
        self._pending_events.append(Event(type_, now, lease.id if lease else None,
                                          lease.user if lease else None, data))

    def _commit(self, now: float = 0.0) -> None:
        """Write every change since the last commit in one transaction, then announce its events.

        StoreFailed when the store refuses; `_atomic` then undoes the changes. While the store
        holds writes for a group commit, the change waits in the group: commit_group() writes it,
        then announces it, or undoes it."""
        destroyed = self._destroyed
        if self._dirty or self._instance_changes or self._drains or self._intents or self._returning_changes \
                or destroyed:
            try:
                self.store.save(list(self._dirty.values()), self._instance_changes + [c for c, _ in destroyed],
                                self._seq, drains=self._drains, intents_done=self._intents,
                                returning=self._returning_changes)
            except StoreError as err:
                raise StoreFailed(f"the store refused the change ({err.kind}); nothing of it took effect") from err
        events, self._pending_events = [e for _, e in destroyed] + self._pending_events, []
        self._destroyed = []
        if self.store.holding:
            self._staged.append(_Staged(self._undo, dict(self._dirty), list(self._intents), now, destroyed))
            self._staged_events += events
            events = []
        self._dirty.clear()
        self._instance_changes.clear()
        self._drains.clear()
        self._returning_changes.clear()
        self._intents.clear()
        self._undo = _Undo(self._seq)
        if self._staged and not self.store.holding:  # written above, with the group before it
            self._staged_events += events  # announced after the group's own
            events = []
            self._write_group(settle=False)  # inside a change: its caller schedules
        for event in events:
            for listener in list(self._listeners):
                listener(event)

    @property
    def group_waiting(self) -> bool:
        """Whether anything waits for commit_group(): a write, an event, a callback or an instance to destroy."""
        return bool(self._staged or self._staged_events or self._group_callbacks or self._to_destroy
                    or self.store.waiting)

    def after_group(self, callback: Callable[[StoreFailed | None], None]) -> None:
        """Call `callback(None)` once the waiting group is written, or `callback(StoreFailed)` once it is undone."""
        self._group_callbacks.append(callback)

    def commit_group(self) -> None:
        """Write the changes waiting in the store's group in one transaction, announce them, then
        destroy the MIG instances the group released (their records' removal is written by the
        next commit) and, if that made room while requests wait, grant what now fits; if the
        store refuses, undo every change, newest first (the released instances stay, with their
        leases), and raise StoreFailed."""
        self._write_group(settle=True)

    def _write_group(self, settle: bool) -> None:
        """commit_group(); from inside a change (`settle` False) without the scheduling pass."""
        staged, self._staged = self._staged, []
        events, self._staged_events = self._staged_events, []
        callbacks, self._group_callbacks = self._group_callbacks, []
        to_destroy, self._to_destroy = self._to_destroy, {}
        try:
            self.store.commit_group()
        except StoreError as err:
            failed = StoreFailed(f"the store refused the change ({err.kind}); nothing of it took effect")
            for change in reversed(staged):
                self._undo, self._dirty, self._intents = change.undo, change.dirty, change.intents
                self._rollback(change.now)
                self._destroyed[:0] = change.destroyed  # still to be written
            for callback in callbacks:
                callback(failed)
            raise failed from err
        for event in events:
            for listener in list(self._listeners):
                listener(event)
        for callback in callbacks:
            callback(None)
        if to_destroy:
            self._destroy_released(to_destroy, staged[-1].now if staged else 0.0, settle)

    def _destroy_released(self, to_destroy: dict[str, _GpuState], now: float, settle: bool) -> None:
        """Destroy the instances a durable group released and nobody took since: O(those instances).
        Room was made on their GPUs, so a waiting queue gets a scheduling pass (if `settle`)."""
        for mig_uuid, gs in to_destroy.items():
            if mig_uuid in gs.owner or mig_uuid not in gs.created:
                continue  # granted again in the group, or destroyed meanwhile
            destroyed = self._unmake_instance(gs, mig_uuid, now)
            if destroyed is not None:
                self._destroyed.append(((gs.gpu.uuid, mig_uuid, None, False), destroyed))
        self._generation += 1
        if settle and self._queue:
            self._settle(now)

    @contextmanager
    def _atomic(self, now: float) -> Iterator[None]:
        """One change: stored in one transaction at the end, or undone entirely if anything fails."""
        try:
            yield
            self._commit(now)
        except BaseException:
            self._rollback(now)
            raise

    def _settle(self, now: float) -> None:
        """Grant what the queue can now have, as a change of its own: if the store fails there,
        the caller's committed change stands and the next tick grants (and reports the failure)."""
        try:
            with self._atomic(now):
                self._schedule(now)
        except StoreFailed:
            pass

    def _rollback(self, now: float) -> None:
        """Put back everything changed since the last commit; destroy the MIG instances made for it."""
        undo = self._undo
        for inverse in reversed(undo.view):
            inverse()
        for uuid, (instances, owner, created, shares, drained) in undo.gpus.items():
            gs = self._gpus[uuid]
            gs.instances, gs.owner, gs.created, gs.shares, gs.drained = instances, owner, created, shares, drained
            gs.cached_layout = None
            self._mig_capacity.changed(gs)
            self._sync_view(gs)
        self._generation += 1
        for lease_id, (before, plans) in undo.leases.items():
            lease = self._dirty[lease_id]
            self._drop_active(lease_id)
            self._plans.pop(lease_id, None)
            if lease_id in self._queue:
                self._queue.remove(lease_id)
            self._returning.pop(lease_id, None)
            if before is not None:
                vars(lease).update(vars(before))
                if lease.returning:
                    self._returning[lease_id] = lease
                    continue
                self._add_active(lease)
                self._plans[lease_id] = plans
                if lease.state is LeaseState.QUEUED:
                    self._queue.append(lease_id)
        for lease_id in undo.leases:
            self.usage.resync(lease_id, self._leases.get(lease_id), now)
            self.deadlines.resync(lease_id, self._leases.get(lease_id))
        self._seq = undo.seq
        made = {inst.uuid for _, inst, _ in undo.made}
        self._instance_changes = [c for c in self._instance_changes if c[1] not in made]
        self._dirty.clear()
        self._drains.clear()
        self._returning_changes.clear()
        self._pending_events.clear()
        self._undo = _Undo(self._seq)
        kept: set[str] = set()  # intents of instances the device would not destroy: recorded next commit
        for gs, inst, intent in reversed(undo.made):
            try:
                self.backend.destroy_mig_instance(gs.gpu.uuid, inst.uuid)
            except DeviceError as err:
                gs.instances[inst.uuid] = inst
                gs.cached_layout = None
                self._mig_capacity.changed(gs)
                gs.created.add(inst.uuid)
                self._instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
                self._emit("device.error", now, gpu=gs.gpu.uuid, instance=inst.uuid, error=str(err))
                kept.add(intent)
        done = [i for i in self._intents if i not in kept]
        if done:
            try:
                self.store.clear_intents(done)
                self._intents = [i for i in self._intents if i in kept]
            except StoreError:
                pass  # they stay listed, and the next commit drops them

    def _stored_lease(self, lease_id: str) -> Lease | None:
        """A lease as the store has it (ended ones live only there); StoreFailed if it cannot be read."""
        try:
            return self.store.load_lease(lease_id)
        except StoreError as err:
            raise StoreFailed(f"the store could not be read ({err.kind})") from err

    def _touch_lease(self, lease: Lease) -> None:
        """Mark a lease changed, before changing it: stored at the next commit, put back if that fails."""
        if lease.id not in self._undo.leases:
            before = copy.copy(lease) if lease.id in self._leases or lease.id in self._returning else None
            self._undo.leases[lease.id] = (before, self._plans.get(lease.id))
        self._dirty[lease.id] = lease

    def _touch_gpu(self, gs: _GpuState) -> None:
        """Remember a GPU's instances, owners and shares before they change."""
        if gs.gpu.uuid not in self._undo.gpus:
            self._undo.gpus[gs.gpu.uuid] = (dict(gs.instances), dict(gs.owner), set(gs.created),
                                            dict(gs.shares), gs.drained)

    def _add_active(self, lease: Lease) -> None:
        """Hold an active lease, indexed by user, group and preemptibility: O(its groups)."""
        self._active_leases.add(lease)
        self._generation += 1

    def _drop_active(self, lease_id: str) -> None:
        """Forget an active lease and its index entries: O(its groups)."""
        if self._active_leases.drop(lease_id) is not None:
            self._generation += 1

    def _view_allocate(self, node_index: int, slots: tuple[int, ...], demand: Demand) -> None:
        self.view.allocate(node_index, slots, demand)
        self._undo.view.append(lambda: self.view.release(node_index, slots, demand))

    def _view_release(self, node_index: int, slots: tuple[int, ...], demand: Demand) -> None:
        self.view.release(node_index, slots, demand)
        self._undo.view.append(lambda: self.view.allocate(node_index, slots, demand))

    # ------------------------------------------------------------------- API
    def submit(self, user: str, holder: str, spec: SliceSpec,
               priority: PriorityClass = PriorityClass.INTERACTIVE, *, now: float,
               groups: Sequence[str] = (), preemptible: bool | None = None, wait: bool = True,
               lease_id: str | None = None, idle_timeout: float | None = None) -> Lease:
        """Ask for a slice: the lease comes back granted, queued (wait) or rejected (no wait).

        O(the user's and its groups' leases) for the holder and quota checks, O(1) for its plans
        (after the first lease of the spec), one placement (see `_place`) and the store's write;
        a request that waits adds O(queue) for its position and a scheduling pass (`_schedule`)."""
        _check_holder(holder)
        check_name(user, "user")
        for active in self._active_leases.of_user(user):
            if active.holder == holder:
                raise HolderBusy(active.id)
        if lease_id is not None and (lease_id in self._leases or self._stored_lease(lease_id)):
            raise SpecError("id", f"lease {lease_id} already exists")
        plans = self._plans_for(spec)
        if preemptible is None:
            preemptible = priority is PriorityClass.BATCH and self.policy.batch_preemptible
        self._seq += 1
        lease = Lease(
            id=lease_id or secrets.token_hex(8), user=user, holder=holder, spec=spec,
            priority=priority, state=LeaseState.QUEUED, created_at=now, seq=self._seq,
            groups=tuple(groups), preemptible=preemptible, heartbeat_at=now, last_activity=now,
            idle_timeout=self.policy.idle_timeout_for(holder, idle_timeout))
        never = self._quota_block(lease, plans, assume_empty=True)
        if never is not None:
            raise never
        used_up = self.usage.refusal(user, lease.groups, now)
        if used_up is not None:
            raise QuotaExceeded(used_up.scope, "gpu_hours", used_up.limit, used_up.sentence())
        blocked = self._quota_block(lease, plans)
        if blocked is not None and (priority is PriorityClass.INTERACTIVE or not wait):
            raise blocked
        with self._atomic(now):
            self._touch_lease(lease)
            self._add_active(lease)
            self._plans[lease.id] = plans
            placement = None if blocked else self._place(lease, plans, self._reserved_gpus(now, before=lease))
            if placement is not None:
                self._grant(lease, placement, now)
            elif not wait:
                reason = "drained" if self._all_drained(plans) else "no capacity"
                self._end(lease, LeaseState.REJECTED, now, f"{reason} for a {spec.describe()} now")
            else:
                self._queue.append(lease.id)
                lease.reason = str(blocked) if blocked else f"waiting for a {spec.describe()}"
                self._emit("lease.queued", now, lease, position=self.position(lease.id))
        if lease.state is LeaseState.QUEUED:
            self._settle(now)
        return lease

    def release(self, lease_id: str, *, now: float, reason: str = "released by holder",
                holder_gone: bool = False) -> Lease:
        """Give a slice back (or withdraw a queued request): O(the lease's groups) and the store's
        write, then a scheduling pass (`_schedule`), O(1) when the queue is empty. A MIG instance
        the core made is destroyed after the write (while the store holds a group: after the
        group's, by commit_group()).

        The slice returns to the pool at once only if `holder_gone` (the caller knows the holder
        no longer uses the GPU) or policy `wait_for_holders` is off; otherwise it is returning
        until holders_gone() names the holder or its heartbeats stop. `holder_gone` on a lease
        that ended and is returning gives its slice back."""
        returning = self._returning.get(lease_id)
        if returning is not None and holder_gone:
            with self._atomic(now):
                self._return_slice(returning, now, reason)
            self._settle(now)
            return returning
        lease = self._active(lease_id)
        with self._atomic(now):
            if lease.state is LeaseState.QUEUED:
                self._end(lease, LeaseState.CANCELLED, now, reason)
            else:
                self._end(lease, LeaseState.RELEASED, now, reason, destroy_later=True, holder_gone=holder_gone)
        self._settle(now)
        return lease

    def holders_gone(self, user: str, holders: Iterable[str], *, now: float,
                     reason: str = "its holder ended") -> list[Lease]:
        """The user's `holders` ended (a server stopped, a kernel's or job's process exited): their
        active leases end and every slice they held returns to the pool. The leases whose slices
        returned; O(the user's leases + returning leases), then a scheduling pass."""
        gone = set(holders)
        for holder in gone:
            _check_holder(holder)
        returned: list[Lease] = []
        with self._atomic(now):
            for lease in [l for l in self._active_leases.of_user(user) if l.holder in gone]:
                if lease.state is LeaseState.GRANTED:
                    returned.append(lease)
                    self._end(lease, LeaseState.RELEASED, now, reason, destroy_later=True, holder_gone=True)
                else:
                    self._end(lease, LeaseState.CANCELLED, now, reason)
            for lease in [l for l in self._returning.values() if l.user == user and l.holder in gone]:
                self._return_slice(lease, now, reason)
                returned.append(lease)
        if returned:
            self._settle(now)
        return returned

    def returning(self, user: str | None = None) -> list[Lease]:
        """Ended leases whose holders still hold their slices, of one user or all, oldest first."""
        return sorted((l for l in self._returning.values() if user is None or l.user == user), key=lambda l: l.seq)

    def cancel(self, lease_id: str, *, now: float) -> Lease:
        """Withdraw a request; a granted lease is released."""
        return self.release(lease_id, now=now, reason="cancelled")

    def extend(self, lease_id: str, *, now: float) -> Lease:
        """Move a granted, time-boxed lease's deadline later; ExtensionRefused says why not."""
        lease = self._active(lease_id)
        if lease.state is not LeaseState.GRANTED:
            raise ExtensionRefused("only a granted lease can be extended")
        with self._atomic(now):
            self._touch_lease(lease)
            record = self.deadlines.extend(lease, now, others_wait=bool(self._queue))
            self._emit("lease.extended", now, lease, deadline=record.deadline, extensions=record.extensions,
                       extensions_left=self.deadlines.extensions_left(lease.id))
        return lease

    def sample_gpu(self, lease_id: str, *, now: float, sm_percent: float) -> Lease:
        """Record a granted lease's GPU utilisation; an active GPU clears a GPU-idle warning."""
        lease = self._active(lease_id)
        with self._atomic(now):
            self._touch_lease(lease)
            active = self.usage.sample(lease, sm_percent, now)
            if active and lease.idle_warned_at is not None and self.policy.idle_signal != "activity":
                lease.idle_warned_at = None
                self._emit("lease.idle_cleared", now, lease)
        return lease

    def touch(self, lease_id: str, *, now: float, last_activity: float | None = None,
              busy: bool | None = None) -> Lease:
        """Record the holder's activity (and whether it is busy); clears an idle warning.

        A touch that only moves the activity and the heartbeat (no busy change, no warning to
        clear) stays in memory until write_activity(): a restart goes on from the last written one."""
        lease = self._active(lease_id)
        if (busy is None or busy == lease.busy) and lease.idle_warned_at is None:
            if last_activity is not None:
                lease.last_activity = max(lease.last_activity or 0.0, min(last_activity, now))
            lease.heartbeat_at = now
            self._activity_unwritten.add(lease.id)
            return lease
        with self._atomic(now):
            self._touch_lease(lease)
            if last_activity is not None:
                lease.last_activity = max(lease.last_activity or 0.0, min(last_activity, now))
            if busy is not None:
                lease.busy = busy
            lease.heartbeat_at = now
            if lease.idle_warned_at is not None and not self.usage.gpu_decides(lease) \
                    and (busy or (lease.last_activity or 0) > lease.idle_warned_at):
                lease.idle_warned_at = None
                self._emit("lease.idle_cleared", now, lease)
            self.usage.accrue([lease], now)
        return lease

    def write_activity(self, now: float) -> None:
        """Store the activity touches kept in memory, with those leases' accrual, as one change: O(those
        leases). If the store refuses, they stay unwritten (in memory) for the next call."""
        due = [self._leases[i] for i in self._activity_unwritten if i in self._leases]
        self._activity_unwritten.clear()
        if not due:
            return
        try:
            with self._atomic(now):
                for lease in due:
                    self._touch_lease(lease)
                self.usage.accrue(due, now)
        except (StoreFailed, StoreError):
            self._activity_unwritten.update(lease.id for lease in due)

    def heartbeat(self, user: str, holders: Iterable[str] | None = None, *, now: float) -> list[Lease]:
        """Mark the user's holders alive (all of the user's leases when holders is None).

        Heartbeats live in memory only: after a restart every holder gets a full TTL again. The
        accrual is stored; while the store is out of order it waits in memory and the lease lives on.
        """
        wanted = set(holders) if holders is not None else None
        alive = []
        for lease in self._active_leases.of_user(user):
            if wanted is None or lease.holder in wanted:
                lease.heartbeat_at = now
                alive.append(lease)
        for lease in self._returning.values():  # a holder still alive keeps its slice returning
            if lease.user == user and (wanted is None or lease.holder in wanted):
                lease.heartbeat_at = now
        self.usage.accrue(alive, now, keep_if_refused=True)
        return alive

    def tick(self, now: float) -> list[Event]:
        """End dead and idle leases, grant what the queue can now have; returns the events.

        O(active leases) for heartbeats, idle time, usage and time limits, then a scheduling
        pass (`_schedule`). Writes the activity touches kept in memory first (write_activity)."""
        self.write_activity(now)
        ttl = self.policy.heartbeat_ttl
        announced: list[Event] = []
        unsubscribe = self.subscribe(announced.append)  # a tick may commit more than once
        try:
            self._tick(now, ttl)
        finally:
            unsubscribe()
        return announced

    def _tick(self, now: float, ttl: float) -> None:
        """The tick as one change: return the slices of holders whose heartbeats stopped; end leases
        past their heartbeat, idle, usage or time limits; grant."""
        with self._atomic(now):
            for lease in list(self._returning.values()):
                if ttl and now - (lease.heartbeat_at or lease.ended_at or 0.0) > ttl:
                    self._return_slice(lease, now, f"no heartbeat from {lease.holder} for {ttl:g} s")
            for lease in list(self._leases.values()):
                if ttl and now - (lease.heartbeat_at or lease.created_at) > ttl:
                    self._end(lease, LeaseState.EXPIRED, now, f"no heartbeat from {lease.holder} for {ttl:g} s",
                              holder_gone=True)  # presumed dead
                elif lease.state is LeaseState.GRANTED and lease.idle_timeout:
                    self._check_idle(lease, now)
            granted = [l for l in self._leases.values() if l.state is LeaseState.GRANTED]
            for action in self.usage.enforce(granted, now):
                self._emit(action.event, now, action.lease, **action.status.to_json())
                if action.release:
                    self._end(action.lease, LeaseState.EXPIRED, now,
                              f"usage quota used up: {action.status.sentence()}")
            for action in self.deadlines.check([l for l in granted if l.state is LeaseState.GRANTED], now):
                if action.release:
                    self._end(action.lease, LeaseState.EXPIRED, now, action.reason)
                else:
                    self._emit("lease.deadline_warning", now, action.lease,
                               **action.warning(self.deadlines.extensions_left(action.lease.id)))
            self._schedule(now)

    def drain(self, gpu_uuid: str, drained: bool = True, *, now: float) -> None:
        """Stop (or resume) granting new slices on a GPU; existing leases stay."""
        gs = self._gpus.get(gpu_uuid)
        if gs is None:
            raise NotFound(f"no GPU {gpu_uuid}")
        with self._atomic(now):
            self._touch_gpu(gs)
            self._generation += 1
            gs.drained = drained
            self._mig_capacity.changed(gs)
            self._sync_view(gs)
            self._drains[gpu_uuid] = drained
            self._emit("gpu.drained" if drained else "gpu.undrained", now, gpu=gpu_uuid)
        if not drained:
            self._settle(now)

    def lease(self, lease_id: str) -> Lease:
        """An active lease, or an ended one from the store."""
        lease = self._leases.get(lease_id) or self._returning.get(lease_id) or self._stored_lease(lease_id)
        if lease is None:
            raise NotFound(f"no lease {lease_id}")
        return lease

    def leases(self, user: str | None = None) -> list[Lease]:
        """Active leases (queued and granted), of one user or all, oldest first."""
        return sorted(self._leases.values() if user is None else self._active_leases.of_user(user),
                      key=lambda l: l.seq)

    def position(self, lease_id: str) -> int | None:
        """1-based place in the queue, or None if not queued: O(queue), no sorting."""
        lease = self._leases.get(lease_id)
        if lease is None or lease_id not in self._queue:
            return None
        order_key = self._order_key()
        key = order_key(lease)
        return 1 + sum(1 for i in self._queue if order_key(self._leases[i]) < key)

    def queue(self) -> list[Lease]:
        return [self._leases[i] for i in self._queue_order()]

    def inventory(self) -> dict:
        """Every node and GPU: MIG layout with owners, shares, free capacity per profile and kind."""
        nodes = []
        for ni, node in enumerate(self.nodes):
            gpus = []
            for gpu in node.gpus:
                gs = self._gpus[gpu.uuid]
                entry = {"uuid": gpu.uuid, "index": gpu.index, "model": gpu.model,
                         "memory_mib": gpu.memory_mib, "mig_mode": gpu.mig_mode.value,
                         "drained": gs.drained}
                if gs.is_mig:
                    layout = gs.layout()
                    entry["instances"] = [
                        {"uuid": i.uuid, "profile": gs.profiles[i.profile_id].name, "start": i.start,
                         "size": i.size, "lease_id": gs.owner.get(i.uuid),
                         "returning": gs.owner.get(i.uuid) in self._returning}
                        for i in sorted(gs.instances.values(), key=lambda i: i.start)]
                    entry["memory_slices"] = layout.geometry.memory_slices
                    entry["compute_slices"] = layout.geometry.compute_slices
                    entry["free_memory_slices"] = layout.free_memory_slices
                    entry["free_compute_slices"] = layout.free_compute_slices
                    entry["free_profiles"] = self._free_profiles(gs, layout)
                else:
                    held = sorted((self._leases.get(l) or self._returning[l] for l in gs.shares), key=lambda l: l.seq)
                    used = sum(l.slice.memory_mib for l in held if l.slice.kind is SliceKind.SHARED)
                    whole = [l for l in held if l.slice.kind is SliceKind.WHOLE]
                    entry["shares"] = [{"lease_id": l.id, "memory_mib": l.slice.memory_mib,
                                        "kind": l.slice.kind.value, "returning": l.returning} for l in held]
                    entry["free_memory_mib"] = 0 if whole else gpu.memory_mib - used
                    entry["free_milli"] = gs.free_milli()
                    entry["whole_free"] = not gs.shares
                gpus.append(entry)
            free_cpu, free_mem = self._node_free(ni)
            nodes.append({"name": node.name, "cpu_milli": node.cpu_milli, "memory_mib": node.memory_mib,
                          "free_cpu_milli": free_cpu, "free_memory_mib": free_mem, "gpus": gpus})
        waiting = [self._leases[i].priority for i in self._queue]
        return {"nodes": nodes, "queue": {p.value: waiting.count(p) for p in PriorityClass},
                "unusable_nodes": [{"name": u.name, "reason": u.reason} for u in self.backend.unusable_nodes()]}

    def offers(self, user: str | None = None, groups: Sequence[str] = ()) -> list[dict]:
        """The slice choices policy offers this user, with how many could be granted now."""
        out = []
        for offer, spec, plans in self._offer_plans():
            allowed = offer.get("groups")
            if allowed and not set(allowed) & set(groups):
                continue
            never = self._quota_check(user, groups, plans, None, assume_empty=True) if user else None
            out.append({"name": offer["name"], "label": offer.get("label", offer["name"]),
                        "spec": spec.to_json(), "idle_timeout": offer.get("idle_timeout"),
                        "max_duration": self.deadlines.for_offer(offer),
                        "available": self._count_available(plans),
                        "over_quota": never.limit_text if never else None})
        return out

    def _offer_plans(self) -> list[tuple[dict, SliceSpec, tuple[_Plan, ...]]]:
        """Each configured (or derived) offer with its parsed spec and plans; unsatisfiable ones left out."""
        out = []
        for offer in self.policy.offers or self._derived_offers():
            spec = SliceSpec.from_json(offer["spec"])
            try:
                out.append((offer, spec, self._plans_for(spec)))
            except SpecError:
                continue
        return out

    def _derived_offers(self) -> list[dict]:
        """Without configured offers: every MIG profile, the policy's share sizes and whole GPUs, per model."""
        offers, seen = [], set()
        for gs in self._gpus.values():
            model = gs.gpu.model
            if (model, gs.is_mig) in seen:
                continue
            seen.add((model, gs.is_mig))
            slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
            if gs.is_mig:
                for p in sorted(gs.profiles.values(), key=lambda p: (p.memory_mib, p.compute_slices)):
                    if not p.media_extensions:
                        offers.append({"name": f"mig-{p.name}-{slug}", "label": f"MIG {p.name} on {model}",
                                       "spec": {"kind": "mig", "profile": p.name, "model": model}})
                continue
            for gib in self.policy.shared_offer_gib:
                if gib * MIB_PER_GIB < gs.gpu.memory_mib:
                    offers.append({"name": f"shared-{gib:g}gb-{slug}", "label": f"Shared {gib:g} GiB on {model}",
                                   "spec": {"kind": "shared", "memory_gib": gib, "model": model}})
            offers.append({"name": f"whole-{slug}", "label": f"Whole {model}",
                           "spec": {"kind": "whole", "model": model}})
        return offers

    # ------------------------------------------------------------- internals
    def _node_free(self, node_index: int) -> tuple[int, int]:
        node = self.nodes[node_index]
        held = [l for l in self._leases.values() if l.state is LeaseState.GRANTED and l.slice.node == node.name]
        return (node.cpu_milli - sum(l.spec.cpu_milli for l in held),
                node.memory_mib - sum(l.spec.host_memory_mib for l in held))

    def _active(self, lease_id: str) -> Lease:
        lease = self._leases.get(lease_id)
        if lease is None:
            if self._stored_lease(lease_id) is not None:
                raise NotFound(f"lease {lease_id} has already ended")
            raise NotFound(f"no lease {lease_id}")
        return lease

    def _check_idle(self, lease: Lease, now: float) -> None:
        idle_since = self.usage.idle_since(lease, max(lease.last_activity or 0.0, lease.granted_at or 0.0))
        if idle_since is None:
            return
        if lease.idle_warned_at is None:
            if now - idle_since >= lease.idle_timeout:
                self._touch_lease(lease)
                lease.idle_warned_at = now
                self._emit("lease.idle_warning", now, lease, idle_s=now - idle_since,
                           release_at=now + self.policy.idle_grace)
        elif now - lease.idle_warned_at >= self.policy.idle_grace:
            self._end(lease, LeaseState.EXPIRED, now, f"idle for {now - idle_since:.0f} s")

    def _end(self, lease: Lease, state: LeaseState, now: float, reason: str, holds: bool = True,
             destroy_later: bool = False, holder_gone: bool = False) -> None:
        """End a lease, freeing its slice (unless `holds` is False: nothing of it is held here),
        or, under policy wait_for_holders and unless `holder_gone`, keeping it returning until
        its holder is gone. `destroy_later`: while the store holds a group, the slice's MIG
        instance is left to commit_group() (a release; an expiry or a preemption makes its room at once)."""
        self.usage.stop(lease, now)
        self.deadlines.stop(lease)
        self._touch_lease(lease)
        frees = lease.state is LeaseState.GRANTED and holds
        if lease.id in self._queue:
            self._queue.remove(lease.id)
        lease.state = state
        lease.ended_at = now
        lease.reason = reason
        self._drop_active(lease.id)
        self._plans.pop(lease.id, None)
        if frees and self.policy.wait_for_holders and not holder_gone:
            lease.returning = True
            self._returning[lease.id] = lease
            self._returning_changes[lease.id] = True
            self._emit(f"lease.{state.value}", now, lease, reason=reason, returning=True)
            return
        self._emit(f"lease.{state.value}", now, lease, reason=reason)
        if frees:
            self._free(lease, now, destroy_later)

    def _return_slice(self, lease: Lease, now: float, reason: str) -> None:
        """An ended lease's holder is gone: its slice returns to the pool."""
        self._touch_lease(lease)
        lease.returning = False
        del self._returning[lease.id]
        self._returning_changes[lease.id] = False
        self._emit("lease.slice_returned", now, lease, reason=reason, slice=lease.slice.to_json())
        self._free(lease, now, destroy_later=True)

    def _free(self, lease: Lease, now: float, destroy_later: bool = False) -> None:
        sl = lease.slice
        self._generation += 1
        if self._no_room:
            self._no_room.clear()  # room was made: what failed in this pass may fit now
        node_index = self._node_index[sl.node]
        if sl.kind is SliceKind.MIG:
            gs = self._gpus[sl.gpu_uuids[0]]
            self._touch_gpu(gs)
            gs.owner.pop(sl.mig_uuid, None)
            self._mig_capacity.changed(gs)
            self._view_release(node_index, (), self._host_demand(lease.spec))
            if sl.mig_uuid in gs.created and gs.gpu.mig_mode is MigMode.DYNAMIC:
                if destroy_later and self.store.holding:
                    self._to_destroy[sl.mig_uuid] = gs  # once the group is durable: commit_group()
                else:
                    self._destroy_instance(gs, sl.mig_uuid, now)
        else:
            gpus = tuple(self._gpus[u] for u in sl.gpu_uuids)
            for gs in gpus:
                self._touch_gpu(gs)
                gs.shares.pop(lease.id, None)
            self._view_release(node_index, tuple(g.slot for g in gpus), self._slice_demand(lease))

    def _destroy_instance(self, gs: _GpuState, mig_uuid: str, now: float) -> None:
        """Destroy an instance the core made once the store says nobody holds it: commit first,
        so a crash or a refusal leaves an unowned instance of the core's, which recovery destroys.
        While the store holds a group, the group is written first (a release leaves its instance
        to commit_group() instead)."""
        self._commit(now)
        if self.store.holding:  # durable before the device changes, with the group it waits in
            self._write_group(settle=False)
        destroyed = self._unmake_instance(gs, mig_uuid, now)
        if destroyed is None:
            return
        self._instance_changes.append((gs.gpu.uuid, mig_uuid, None, False))
        self._pending_events.append(destroyed)
        try:
            self._commit()
        except StoreFailed:
            pass  # the record's removal stays pending for the next commit; a restart finds it gone anyway

    def _unmake_instance(self, gs: _GpuState, mig_uuid: str, now: float) -> Event | None:
        """Have the device destroy an instance and drop it from the GPU's state and indexes: its
        `mig.destroyed` event, to announce once the record's removal is written; None (and a
        `device.error`) if the device refused, the instance then staying as it was."""
        try:
            self.backend.destroy_mig_instance(gs.gpu.uuid, mig_uuid)
        except DeviceError as err:
            self._emit("device.error", now, gpu=gs.gpu.uuid, instance=mig_uuid, error=str(err))
            return None
        inst = gs.instances.pop(mig_uuid)
        gs.cached_layout = None
        self._mig_capacity.changed(gs)
        gs.created.discard(mig_uuid)
        return Event("mig.destroyed", now, None, None, {"gpu": gs.gpu.uuid, "instance": mig_uuid,
                                                         "profile": gs.profiles[inst.profile_id].name,
                                                         "start": inst.start})

    def _create_instance(self, gs: _GpuState, profile: MigProfile, start: int, now: float) -> MigInstance:
        """Write the intent, then ask the device: a crash in between leaves an intent, which
        recovery resolves, and never an instance nobody knows the core made."""
        intent = MigIntent(secrets.token_hex(8), gs.gpu.uuid, profile.profile_id, start)
        try:
            self.store.record_intent(intent)
        except StoreError as err:
            raise StoreFailed(f"the store refused a MIG intent ({err.kind}); nothing was changed") from err
        self._intents.append(intent.id)
        inst = self.backend.create_mig_instance(gs.gpu.uuid, profile.profile_id, start)
        self._touch_gpu(gs)
        gs.instances[inst.uuid] = inst
        gs.cached_layout = None
        self._mig_capacity.changed(gs)
        gs.created.add(inst.uuid)
        self._undo.made.append((gs, inst, intent.id))
        self._instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
        self._emit("mig.created", now, gpu=gs.gpu.uuid, instance=inst.uuid, profile=profile.name, start=inst.start)
        return inst

    def _grant(self, lease: Lease, placement: _Placement, now: float) -> None:
        gs0 = placement.gpus[0]
        self._touch_lease(lease)
        for gs in placement.gpus:
            self._touch_gpu(gs)
        if placement.create_at is not None:
            inst = self._create_instance(gs0, placement.plan.profile, placement.create_at, now)
            placement.slice.mig_uuid = inst.uuid
        sl = placement.slice
        if sl.kind is SliceKind.MIG:
            gs0.owner[sl.mig_uuid] = lease.id
            self._mig_capacity.changed(gs0)
            self._view_allocate(placement.node_index, (), self._host_demand(lease.spec))
        else:
            for gs in placement.gpus:
                gs.shares[lease.id] = sl.milli
            self._view_allocate(placement.node_index, tuple(g.slot for g in placement.gpus),
                               self._demand(placement.plan, lease.spec))
        if lease.id in self._queue:
            self._queue.remove(lease.id)
        self._generation += 1
        lease.state = LeaseState.GRANTED
        lease.slice = sl
        self._active_leases.count_held(lease)
        lease.granted_at = now
        self.usage.start(lease, now)
        self.deadlines.start(lease, now)
        lease.last_activity = max(lease.last_activity or 0.0, now)
        lease.reason = ""
        self._emit("lease.granted", now, lease, slice=sl.to_json(), waited_s=now - lease.created_at)

    # ------------------------------------------------------------ placement
    def _plans_for(self, spec: SliceSpec) -> tuple[_Plan, ...]:
        """Every concrete way to satisfy a spec in this fleet, preferred first; SpecError if none.

        The fleet is fixed once loaded, so a spec's plans are found once and shared by every
        lease asking the same: O(1) after the first (a spec refused is looked at again)."""
        plans = self._plans_known.get(spec)
        if plans is None:
            if len(self._plans_known) >= 4096:  # requests of many odd sizes: start over
                self._plans_known.clear()
            plans = self._plans_known[spec] = tuple(self._find_plans(spec))
        return plans

    def _find_plans(self, spec: SliceSpec) -> list[_Plan]:
        if spec.node and not any(spec.node in g.per_node for g in self._model_groups):
            raise SpecError("spec.node", f"no node {spec.node!r} with GPUs in this fleet")
        models = names.models_named(spec.model, [g.model for g in self._model_groups]) if spec.model else None
        groups = [g for g in self._model_groups
                  if (models is None or g.model in models)
                  and (not spec.node or spec.node in g.per_node)]
        if spec.profile:
            where = (f" on {spec.model}" if spec.model else "") + (f" on node {spec.node}" if spec.node else "")
            names.check_profile(spec.profile, {g.model: [p.name for p in g.profiles.values()]
                                               for g in groups if g.is_mig}, where)
        plans: list[_Plan] = []
        if spec.kind in (SliceKind.MIG, SliceKind.ANY):
            for g in groups:
                if g.is_mig:
                    profile = self._pick_profile(g.profiles, spec)
                    if profile is not None:
                        plans.append(_Plan(SliceKind.MIG, g.model, profile.memory_mib, profile=profile))
        plain = [g for g in groups if not g.is_mig and spec.memory_mib <= g.memory_mib]
        if spec.kind in (SliceKind.SHARED, SliceKind.ANY) and spec.count == 1 and spec.memory_mib \
                and not spec.profile:
            for g in plain:
                milli = math.ceil(spec.memory_mib * MILLI_PER_GPU / g.memory_mib)
                plans.append(_Plan(SliceKind.SHARED, g.model, spec.memory_mib, milli=milli))
        if spec.kind is SliceKind.WHOLE or (spec.kind is SliceKind.ANY and not spec.memory_mib
                                             and not spec.profile):
            for g in plain:
                counts = [g.per_node[spec.node]] if spec.node else g.per_node.values()
                if max(counts) >= spec.count:
                    plans.append(_Plan(SliceKind.WHOLE, g.model, g.memory_mib * spec.count, count=spec.count))
        if not plans:
            raise SpecError(_unmet_field(spec, groups), f"no GPU in this fleet can provide a {spec.describe()}")
        hosted = [p for p in plans if self._host_nodes(p, spec)]
        if not hosted:
            raise self._no_host(plans, spec)
        plans = hosted
        kind_rank = {SliceKind.MIG: 0, SliceKind.SHARED: 1, SliceKind.WHOLE: 2}
        plans.sort(key=lambda p: (kind_rank[p.kind], p.memory_mib))
        return plans

    def _host_nodes(self, plan: _Plan, spec: SliceSpec, *, host: bool = True) -> frozenset[int]:
        """Nodes with enough GPUs of the plan's model and (when `host`) enough CPU and host
        memory in all to hold the request, busy or not. The fleet is fixed once loaded, so each
        answer is kept: O(nodes) the first time for a (plan, node, host demand), O(1) after."""
        key = (plan, spec.node, spec.cpu_milli, spec.host_memory_mib, host)
        found = self._hosts_known.get(key)
        if found is None:
            if len(self._hosts_known) >= 4096:  # requests of many odd sizes: start over
                self._hosts_known.clear()
            found = self._hosts_known[key] = frozenset(self._find_host_nodes(plan, spec, host))
        return found

    def _find_host_nodes(self, plan: _Plan, spec: SliceSpec, host: bool) -> set[int]:
        is_mig = plan.kind is SliceKind.MIG
        group = next(g for g in self._model_groups if g.model == plan.model and g.is_mig == is_mig)
        found = set()
        for name, gpus in group.per_node.items():
            node = self.nodes[self._node_index[name]]
            if gpus >= plan.count and (not spec.node or name == spec.node) and (not host or (
                    node.cpu_milli >= spec.cpu_milli and node.memory_mib >= spec.host_memory_mib)):
                found.add(self._node_index[name])
        return found

    def _no_host(self, plans: Sequence[_Plan], spec: SliceSpec) -> SpecError:
        """Why no node could ever hold the request beside a fitting GPU, blaming CPU or host memory."""
        nodes = [self.nodes[i] for p in plans for i in self._host_nodes(p, spec, host=False)]
        most_cpu = max(n.cpu_milli for n in nodes)
        most_memory = max(n.memory_mib for n in nodes)
        what = f"a {spec.describe()}"
        if spec.cpu_milli > most_cpu:
            return SpecError("spec.cpu_milli", f"{spec.cpu_milli} milli-CPU is more than any node with {what} "
                                               f"has (at most {most_cpu})")
        if spec.host_memory_mib > most_memory:
            return SpecError("spec.host_memory_mib", f"{spec.host_memory_mib} MiB of host memory is more than any "
                                                     f"node with {what} has (at most {most_memory})")
        return SpecError("spec.cpu_milli", f"no node with {what} has both {spec.cpu_milli} milli-CPU and "
                                           f"{spec.host_memory_mib} MiB of host memory")

    @staticmethod
    def _pick_profile(profiles: dict[int, MigProfile], spec: SliceSpec) -> MigProfile | None:
        if spec.profile:
            return next((p for p in profiles.values() if p.name == spec.profile), None)
        # A profile serves the size in its name: 1g.10gb answers a 10 GB request, though the
        # driver reports 9.50 GiB for it on A100-80GB (9.75 on H100 80GB).
        fitting = [p for p in profiles.values() if not p.media_extensions
                   and max(p.memory_mib, _nominal_mib(p)) >= spec.memory_mib]
        return min(fitting, key=lambda p: (_nominal_mib(p), p.memory_mib, p.compute_slices), default=None)

    @staticmethod
    def _host_demand(spec: SliceSpec) -> Demand:
        return Demand(cpu_milli=spec.cpu_milli, memory_mib=spec.host_memory_mib)

    def _demand(self, plan: _Plan, spec: SliceSpec) -> Demand:
        num_gpu = plan.count if plan.kind is SliceKind.WHOLE else 1
        return Demand(cpu_milli=spec.cpu_milli, memory_mib=spec.host_memory_mib, num_gpu=num_gpu,
                      gpu_milli=plan.milli if plan.kind is SliceKind.SHARED else MILLI_PER_GPU,
                      models=frozenset({plan.model}))

    def _slice_demand(self, lease: Lease) -> Demand:
        sl = lease.slice
        return Demand(cpu_milli=lease.spec.cpu_milli, memory_mib=lease.spec.host_memory_mib,
                      num_gpu=len(sl.gpu_uuids), gpu_milli=sl.milli, models=frozenset({sl.model}))

    def _node_mask(self, spec: SliceSpec) -> np.ndarray | None:
        if spec.node is None:
            return None
        mask = np.zeros(len(self.nodes), dtype=bool)
        if spec.node in self._node_index:
            mask[self._node_index[spec.node]] = True
        return mask

    def _place(self, lease: Lease, plans: Sequence[_Plan], reserved: set[str]) -> _Placement | None:
        """The first plan that fits now (outside reserved GPUs) and within quota, or None.

        During a pass, a plan that found no room is not searched again for the same host demand
        until room is made: grants only take room and reservations only grow within a pass, so
        a pass searches the fleet once per distinct (plan, node, host demand), not per request."""
        for plan in plans:
            if self._quota_block(lease, [plan]) is not None:
                continue
            shape = _shape(plan, lease.spec)
            if self._no_room is not None and shape in self._no_room:
                continue
            found = self._place_mig(lease, plan, reserved) if plan.kind is SliceKind.MIG \
                else self._place_plain(lease, plan, reserved)
            if found is not None:
                return found
            if self._no_room is not None:
                self._no_room.add(shape)
        return None

    def _mig_candidates(self, plan: _Plan, spec: SliceSpec, reserved: set[str]) -> list[_GpuState]:
        """The plan model's MIG GPUs that may take it, in fleet order: O(MIG GPUs of that model),
        or O(the node's GPUs) when the spec names a node."""
        host = self._host_demand(spec)
        fits: dict[int, bool] = {}  # per node: room for the host demand
        out = []
        if spec.node is not None:
            node = self.nodes[self._node_index[spec.node]] if spec.node in self._node_index else None
            gpus = [self._gpus[g.uuid] for g in node.gpus] if node else []
            gpus = [gs for gs in gpus if gs.is_mig and gs.gpu.model == plan.model]
        else:
            gpus = self._mig_gpus.get(plan.model, ())
        for gs in gpus:
            if gs.drained or gs.gpu.uuid in reserved or (spec.node is not None and gs.gpu.node != spec.node):
                continue
            if gs.node_index not in fits:
                fits[gs.node_index] = self.view.fits(gs.node_index, host)
            if fits[gs.node_index]:
                out.append(gs)
        return out

    def _place_mig(self, lease: Lease, plan: _Plan, reserved: set[str]) -> _Placement | None:
        """An existing free instance of the profile, else a new one where the MIG placer says.

        Without a node asked for, it reads the MIG capacity index: O(GPUs holding a free
        instance of the profile) for the first step and O(distinct layouts of the model) for
        the second (plus, per layout, the GPUs passed over as reserved or on full nodes);
        with a node, O(the node's GPUs)."""
        spec = lease.spec
        pid = plan.profile.profile_id
        host = self._host_demand(spec)
        fits: dict[int, bool] = {}  # per node: room for the host demand

        def usable(gs: _GpuState) -> bool:
            if gs.gpu.uuid in reserved or (spec.node is not None and gs.gpu.node != spec.node):
                return False
            if gs.node_index not in fits:
                fits[gs.node_index] = self.view.fits(gs.node_index, host)
            return fits[gs.node_index]

        if spec.node is not None:
            candidates = self._mig_candidates(plan, spec, reserved)
            with_free = [gs for gs in candidates if any(
                i.profile_id == pid and i.uuid not in gs.owner for i in gs.instances.values())]
            groups = [(gs.layout(), iter([gs])) for gs in candidates if gs.gpu.mig_mode is MigMode.DYNAMIC]
        else:
            with_free = [gs for gs in self._mig_capacity.with_free(plan.model, pid) if usable(gs)]
            groups = self._mig_capacity.layouts(plan.model)
        # An existing free instance of the profile is used before any new one is made:
        # prefer the GPU with the fewest free slices, so emptier GPUs stay whole.
        existing = [(gs.layout().free_memory_slices, gs.gpu.uuid, gs, inst)
                    for gs in with_free for inst in gs.instances.values()
                    if inst.profile_id == pid and inst.uuid not in gs.owner]
        if existing:
            _, _, gs, inst = min(existing, key=lambda e: (e[0], e[1], e[3].start))
            return _Placement(self._mig_slice(gs, plan, inst.start, inst.uuid), plan,
                              gs.node_index, (gs,), mig_uuid=inst.uuid)
        # The placer sees each distinct layout once, at its first usable GPU in fleet order: it
        # gives ties to the earliest GPU of a layout anyway, so this only spares it the repeats.
        first: dict[mig.Layout, _GpuState] = {}
        for layout, gpus in groups:
            if layout not in first:
                gs = next((g for g in gpus if usable(g)), None)
                if gs is not None:
                    first[layout] = gs
        if not first:
            return None
        dynamic = sorted(first.values(), key=lambda gs: (gs.node_index, gs.slot))
        first = {gs.layout(): gs for gs in dynamic}
        choice = self._mig_placer.choose(list(first), plan.profile, dynamic[0].profiles)
        if choice is None:
            return None
        gs = dynamic[choice[0]]
        return _Placement(self._mig_slice(gs, plan, choice[1], None), plan, gs.node_index, (gs,),
                          create_at=choice[1])

    def _mig_slice(self, gs: _GpuState, plan: _Plan, start: int, mig_uuid: str | None) -> Slice:
        return Slice(kind=SliceKind.MIG, node=gs.gpu.node, gpu_uuids=(gs.gpu.uuid,),
                     memory_mib=plan.profile.memory_mib, profile=plan.profile.name, start=start,
                     mig_uuid=mig_uuid, milli=MILLI_PER_GPU, model=gs.gpu.model,
                     gpu_memory_mib=gs.gpu.memory_mib)

    def _place_plain(self, lease: Lease, plan: _Plan, reserved: set[str]) -> _Placement | None:
        disabled = [self._gpus[u] for u in reserved if not self._gpus[u].is_mig]
        for gs in disabled:
            self._sync_view(gs, reserved=True)
        try:
            choice = self._placement.choose(self.view, self._demand(plan, lease.spec),
                                            self._node_mask(lease.spec))
        finally:
            for gs in disabled:
                self._sync_view(gs)
        if choice is None:
            return None
        node_index, slots = choice
        node = self.nodes[node_index]
        gpus = tuple(self._gpus[node.gpus[s].uuid] for s in slots)
        memory = plan.memory_mib if plan.kind is SliceKind.SHARED else gpus[0].gpu.memory_mib
        sl = Slice(kind=plan.kind, node=node.name, gpu_uuids=tuple(g.gpu.uuid for g in gpus),
                   memory_mib=memory, milli=plan.milli if plan.kind is SliceKind.SHARED else MILLI_PER_GPU,
                   model=plan.model, gpu_memory_mib=gpus[0].gpu.memory_mib)
        return _Placement(sl, plan, node_index, gpus)

    def _all_drained(self, plans: Sequence[_Plan]) -> bool:
        models = {p.model for p in plans}
        gpus = [gs for gs in self._gpus.values() if gs.gpu.model in models]
        return bool(gpus) and all(gs.drained for gs in gpus)

    def _free_profiles(self, gs: _GpuState, layout: mig.Layout) -> dict[str, int]:
        """How many instances of each profile this GPU could still hand out (each counted alone)."""
        out = {}
        for p in gs.profiles.values():
            free_existing = sum(1 for i in gs.instances.values()
                                if i.profile_id == p.profile_id and i.uuid not in gs.owner)
            new = mig.room_for(layout, p) if gs.gpu.mig_mode is MigMode.DYNAMIC else 0
            out[p.name] = 0 if gs.drained else free_existing + new
        return out

    def _count_available(self, plans: Sequence[_Plan]) -> int:
        """How many slices of the first plans' kind could be granted now, one after another."""
        total = 0
        for plan in plans:
            if plan.kind is SliceKind.MIG:
                total += sum(self._free_profiles(gs, gs.layout()).get(plan.profile.name, 0)
                             for gs in self._gpus.values()
                             if gs.is_mig and gs.gpu.model == plan.model)
                continue
            per_node: dict[int, int] = {}
            for gs in self._gpus.values():
                if gs.is_mig or gs.drained or gs.gpu.model != plan.model:
                    continue
                if plan.kind is SliceKind.SHARED:
                    total += gs.free_milli() // plan.milli
                elif not gs.shares:
                    per_node[gs.node_index] = per_node.get(gs.node_index, 0) + 1
            total += sum(n // plan.count for n in per_node.values())
        return total

    # ------------------------------------------------------------ queueing
    def _order_key(self) -> Callable[[Lease], tuple]:
        """A lease's place in the queue: priority class, then (with fair share) its user's GPU
        memory in use, then age. O(1) per lease: that memory is a counter kept as leases are
        granted and end."""
        held = self._active_leases.held_mib if self.policy.fair_share else {}
        return lambda lease: (lease.priority.rank, held.get(lease.user, 0), lease.seq)

    def _queue_order(self) -> list[str]:
        order_key = self._order_key()
        return sorted(self._queue, key=lambda i: order_key(self._leases[i]))

    def _reserved_gpus(self, now: float, before: Lease) -> set[str]:
        """GPUs held back for requests that wait ahead of `before` longer than reserve_after
        (O(queue) when none has waited that long, as in a queue that moves)."""
        reserved: set[str] = set()
        if not any(now - self._leases[i].created_at >= self.policy.reserve_after for i in self._queue):
            return reserved
        order_key = self._order_key()
        before_key = order_key(before)
        for lease_id in self._queue_order():
            lease = self._leases[lease_id]
            if order_key(lease) > before_key:
                break
            if now - lease.created_at >= self.policy.reserve_after:
                reserved |= self._reservation(lease, reserved)
        return reserved

    def _reservation(self, lease: Lease, taken: set[str]) -> set[str]:
        """The GPUs this waiting request will most likely fit on first."""
        plan = self._plans[lease.id][0]
        hosts = self._host_nodes(plan, lease.spec)  # never a GPU on a node too small for the request
        if plan.kind is SliceKind.MIG:
            cands = [gs for gs in self._mig_candidates(plan, lease.spec, taken)
                     if gs.gpu.mig_mode is MigMode.DYNAMIC and gs.node_index in hosts]
            if not cands:
                return set()
            best = max(cands, key=lambda gs: (gs.layout().free_memory_slices, -gs.slot))
            return {best.gpu.uuid}
        by_node: dict[int, list[_GpuState]] = {}
        for gs in self._gpus.values():
            if (not gs.is_mig and not gs.drained and gs.gpu.model == plan.model and gs.gpu.uuid not in taken
                    and gs.node_index in hosts):
                by_node.setdefault(gs.node_index, []).append(gs)
        best_set: list[_GpuState] = []
        best_free = -1
        for gpus in by_node.values():
            if len(gpus) < plan.count:
                continue
            chosen = sorted(gpus, key=lambda g: -g.free_milli())[:plan.count]
            free = sum(g.free_milli() for g in chosen)
            if free > best_free:
                best_set, best_free = chosen, free
        return {g.gpu.uuid for g in best_set}

    def _schedule(self, now: float) -> None:
        """Grant every waiting request that fits, in queue order, honouring reservations.

        A pass is skipped when nothing it depends on changed since the last one (no lease came or
        went, nothing was granted or freed, no GPU drained, no request reached `reserve_after`,
        no usage quotas, whose use moves with time): O(1) then. Otherwise it costs
        O(queue log queue) to order; O(its plans) for each request whose every plan this pass
        already found no room for (`_nothing_fits`); for the others, O(the user's and groups'
        leases) for quotas; and one fleet search per distinct request shape (see `_place`)."""
        if self._pass_done is not None and self._pass_done[0] == self._generation \
                and now < self._pass_done[1] and not self.policy.usage_quotas:
            return
        self._no_room = set()
        try:
            self._schedule_pass(now)
        finally:
            self._no_room = None

    def _schedule_pass(self, now: float) -> None:
        start = self._generation
        reserved: set[str] = set()
        usage_known: dict = {}
        until = math.inf  # when the next waiting request reaches reserve_after
        reserve_after, preemption = self.policy.reserve_after, self.policy.preemption
        for lease_id in self._queue_order():
            lease = self._leases.get(lease_id)
            if lease is None or lease.state is not LeaseState.QUEUED:
                continue
            plans = self._plans[lease_id]
            waited = now - lease.created_at >= reserve_after
            if not waited and self._nothing_fits(lease, plans, preemption):
                until = min(until, lease.created_at + reserve_after)
                continue
            blocked = self._quota_block(lease, plans)
            used_up = None if blocked else self.usage.refusal(lease.user, lease.groups, now, usage_known)
            if used_up is not None:
                blocked = QuotaExceeded(used_up.scope, "gpu_hours", used_up.limit, used_up.sentence())
            placement = None if blocked else self._place(lease, plans, reserved)
            if placement is None and blocked is None and lease.priority is PriorityClass.INTERACTIVE \
                    and self.policy.preemption:
                placement = self._preempt_for(lease, plans, reserved, now)
            if placement is not None:
                self._grant(lease, placement, now)
                continue
            if blocked is not None and lease.reason != str(blocked):
                self._touch_lease(lease)
                lease.reason = str(blocked)
            if waited:
                reserved |= self._reservation(lease, reserved)
            else:
                until = min(until, lease.created_at + self.policy.reserve_after)
        self._pass_done = (start, until) if self._generation == start else None  # skippable if it changed nothing

    def _nothing_fits(self, lease: Lease, plans: Sequence[_Plan], preemption: bool) -> bool:
        """Whether this pass already found no room for every plan of the request (same host
        demand) and it cannot preempt: then it is passed over in O(plans), without quota checks,
        as its placement could only fail again. Its quota reason is refreshed once room is made."""
        if preemption and lease.priority is PriorityClass.INTERACTIVE and self._active_leases.preemptible:
            return False
        return all(_shape(plan, lease.spec) in self._no_room for plan in plans)

    def _preempt_for(self, lease: Lease, plans: Sequence[_Plan], reserved: set[str],
                     now: float) -> _Placement | None:
        """Preempt the fewest, newest preemptible batch leases that make room; then place. While
        a preempted lease's slice is still returning, nothing more is preempted.

        O(1) when no preemptible lease is active; otherwise it searches only the GPUs (and, for
        whole GPUs, the nodes) that hold one."""
        if not self._active_leases.preemptible:
            return None
        if any(l.state is LeaseState.PREEMPTED for l in self._returning.values()):
            return None  # the room preempted before is still being given back: no more victims meanwhile
        held = {u for i in self._active_leases.preemptible if self._leases[i].state is LeaseState.GRANTED
                for u in self._leases[i].slice.gpu_uuids}
        if not held:
            return None
        gpus = sorted((self._gpus[u] for u in held), key=lambda gs: (gs.node_index, gs.slot))
        best: list[Lease] | None = None
        for plan in plans:
            victims = self._victims_for(lease, plan, reserved, gpus)
            if victims is not None and (best is None or len(victims) < len(best)):
                best = victims
        if not best:
            return None
        for victim in best:
            self._end(victim, LeaseState.PREEMPTED, now, "preempted for an interactive request")
        return self._place(lease, plans, reserved)

    def _preemptible_on(self, gs: _GpuState) -> list[Lease]:
        """The preemptible batch leases holding part of `gs`, newest grant first; leases granted
        at the same time go newest request (highest seq) first, so the order never depends on
        set iteration (string hashing)."""
        holders = set(gs.owner.values()) | set(gs.shares)
        leases = [self._leases[h] for h in holders if h in self._leases]  # not those returning
        return sorted((l for l in leases if l.preemptible and l.priority is PriorityClass.BATCH),
                      key=lambda l: (-(l.granted_at or 0), -l.seq))

    def _mig_victims(self, gs: _GpuState, profile: MigProfile) -> list[Lease] | None:
        """The fewest (then newest) preemptible leases on a MIG GPU whose end makes room for `profile`."""
        victims = self._preemptible_on(gs)
        dynamic = gs.gpu.mig_mode is MigMode.DYNAMIC
        for victim in victims:  # an instance of the very profile, kept as it is, is handed over
            inst = gs.instances[victim.slice.mig_uuid]
            if inst.profile_id == profile.profile_id and not (dynamic and inst.uuid in gs.created):
                return [victim]
        if not dynamic:
            return None
        destroyable = [v for v in victims if v.slice.mig_uuid in gs.created]
        layout = gs.layout()
        for size in range(1, len(destroyable) + 1):
            for chosen in itertools.combinations(destroyable, size):
                after = layout
                for victim in chosen:
                    inst = gs.instances[victim.slice.mig_uuid]
                    after = after.without_instance(gs.profiles[inst.profile_id], inst.start)
                if mig.legal_starts(after, profile):
                    return list(chosen)
        return None

    def _victims_for(self, lease: Lease, plan: _Plan, reserved: set[str],
                     held: list[_GpuState]) -> list[Lease] | None:
        """The fewest victims making room for `plan`, among the GPUs in `held` (those holding a
        preemptible lease, in fleet order) and, for plain GPUs, the other GPUs of their nodes."""
        spec = lease.spec
        best: list[Lease] | None = None
        if plan.kind is SliceKind.MIG:
            for gs in held:
                if not (gs.is_mig and gs.gpu.model == plan.model and not gs.drained
                        and gs.gpu.uuid not in reserved and (spec.node is None or gs.gpu.node == spec.node)):
                    continue
                chosen = self._mig_victims(gs, plan.profile)
                if chosen is None:
                    continue
                if best is None or len(chosen) < len(best):
                    best = chosen
            return best
        per_node: dict[int, list[_GpuState]] = {}
        nodes = sorted({gs.node_index for gs in held})
        for gs in (self._gpus[g.uuid] for ni in nodes for g in self.nodes[ni].gpus):
            if (not gs.is_mig and gs.gpu.model == plan.model and not gs.drained
                    and gs.gpu.uuid not in reserved and (spec.node is None or gs.gpu.node == spec.node)):
                per_node.setdefault(gs.node_index, []).append(gs)
        for gpus in per_node.values():
            if plan.kind is SliceKind.SHARED:
                options = []
                for gs in gpus:
                    free, chosen = gs.free_milli(), []
                    for victim in self._preemptible_on(gs):
                        if free >= plan.milli:
                            break
                        free += gs.shares[victim.id]
                        chosen.append(victim)
                    if free >= plan.milli:
                        options.append(chosen)
            else:
                costs = []
                for gs in gpus:
                    victims = self._preemptible_on(gs)
                    if len(victims) == len(gs.shares):
                        costs.append(victims)
                options = []
                if len(costs) >= plan.count:
                    costs.sort(key=lambda vs: (len(vs), -max((v.granted_at or 0 for v in vs), default=0)))
                    options.append([v for vs in costs[:plan.count] for v in vs])
            for chosen in options:
                if chosen and (best is None or len(chosen) < len(best)):
                    best = chosen
        return best

    # ---------------------------------------------------------------- quotas
    def _quota_block(self, lease: Lease, plans: Sequence[_Plan], *,
                     assume_empty: bool = False) -> QuotaExceeded | None:
        """The quota that granting the cheapest of `plans` would break (even with nothing else
        held, when assume_empty), or None."""
        return self._quota_check(lease.user, lease.groups, plans, lease.id, assume_empty=assume_empty)

    def _quota_check(self, user: str, groups: Sequence[str], plans: Sequence[_Plan], lease_id: str | None, *,
                     assume_empty: bool = False) -> QuotaExceeded | None:
        plan = min(plans, key=lambda p: p.memory_mib)
        ask = {"slices": 1, "memory_gib": plan.memory_mib / MIB_PER_GIB,
               "whole_gpus": plan.count if plan.kind is SliceKind.WHOLE else 0}
        scopes = [("user", user, self.policy.user_quota(user), self._active_leases.of_user(user))]
        for group in groups:
            limits = self.policy.group_quotas.get(group)
            if limits:
                scopes.append(("group", group, limits, self._active_leases.of_group(group)))
        for scope, who, limits, held in scopes:
            if not limits:
                continue  # no quota here: nothing to count
            held = [] if assume_empty else [l for l in held if l.state is LeaseState.GRANTED and l.id != lease_id]
            used = {"slices": len(held),
                    "memory_gib": sum(l.slice.memory_mib for l in held) / MIB_PER_GIB,
                    "whole_gpus": sum(len(l.slice.gpu_uuids) for l in held if l.slice.kind is SliceKind.WHOLE)}
            for key, limit in limits.items():
                if ask[key] and used[key] + ask[key] > limit + 1e-9:
                    at_most = f"at most {_amount(key, limit)}"
                    what = " of GPU memory" if key == "memory_gib" else ""
                    if assume_empty:
                        detail = f"{at_most}{what}, and this request alone needs {_amount(key, ask[key])}"
                    else:
                        detail = (f"{at_most}{what} ({_amount(key, used[key])} in use; "
                                  f"this request needs {_amount(key, ask[key])})")
                    error = QuotaExceeded(scope, key, limit, f"{scope} quota for {who}: {detail}")
                    error.limit_text = at_most
                    return error
        return None

    # -------------------------------------------------------------- recovery
    def _recover(self, now: float) -> None:
        """Rebuild leases (and the slices of ended ones still returning) and MIG ownership from
        the store and reconcile with the devices.

        An instance the store does not know is the administrator's, unless a MIG intent names its
        place: then the core made it before a crash and destroys it, as no lease was recorded for it."""
        state = self.store.load()
        self._seq = state.seq
        self._undo = _Undo(self._seq)
        first_start = state.seq == 0 and not state.instances and not state.intents
        intents = {(i.gpu_uuid, i.profile_id, i.start): i.id for i in state.intents}
        self._intents = [i.id for i in state.intents]
        for gpu_uuid in state.drained:
            if gpu_uuid in self._gpus:
                self._gpus[gpu_uuid].drained = True
                self._mig_capacity.changed(self._gpus[gpu_uuid])
                self._sync_view(self._gpus[gpu_uuid])
        recorded = {r.instance.uuid: r for r in state.instances}
        for gs in self._gpus.values():
            for inst in gs.instances.values():
                record = recorded.pop(inst.uuid, None)
                made_by_core = record is None and intents.pop((gs.gpu.uuid, inst.profile_id, inst.start), None)
                if made_by_core:
                    self._instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
                    gs.created.add(inst.uuid)
                elif record is None:
                    self._instance_changes.append((gs.gpu.uuid, inst.uuid, inst, False))
                    if not first_start:
                        self._emit("reconcile.instance_found", now, gpu=gs.gpu.uuid, instance=inst.uuid,
                                   profile=gs.profiles[inst.profile_id].name, start=inst.start)
                elif record.created_by_core:
                    gs.created.add(inst.uuid)
        for record in recorded.values():
            self._instance_changes.append((record.gpu_uuid, record.instance.uuid, None, False))
            self._emit("reconcile.instance_vanished", now, gpu=record.gpu_uuid, instance=record.instance.uuid)
        for lease in sorted(state.leases, key=lambda l: l.seq):
            lease.heartbeat_at = now
            self._add_active(lease)
            try:
                self._plans[lease.id] = self._plans_for(lease.spec)
            except SpecError as err:
                self._end(lease, LeaseState.EXPIRED, now, f"fleet changed: {err.message}", holds=False)
                continue
            if lease.state is LeaseState.QUEUED:
                self._queue.append(lease.id)
            elif not self._reattach(lease):
                self._emit("reconcile.slice_lost", now, lease, slice=lease.slice.to_json() if lease.slice else None)
                self._end(lease, LeaseState.EXPIRED, now, "its slice no longer exists on the device", holds=False)
            else:
                self.usage.start(lease, now)
                self.deadlines.start(lease, now)
        for lease in sorted(state.returning, key=lambda l: l.seq):
            lease.heartbeat_at = now  # its holder gets a full TTL to be seen again, as active ones do
            if self._reattach(lease):
                self._returning[lease.id] = lease
            else:
                lease.returning = False
                self._returning_changes[lease.id] = False
        for gs in self._gpus.values():
            if gs.gpu.mig_mode is MigMode.DYNAMIC:
                for mig_uuid in [u for u in gs.created if u not in gs.owner]:
                    self._destroy_instance(gs, mig_uuid, now)
        self._schedule(now)
        self._commit()

    def _reattach(self, lease: Lease) -> bool:
        sl = lease.slice
        if sl is None or sl.node not in self._node_index:
            return False
        gpus = [self._gpus.get(u) for u in sl.gpu_uuids]
        if any(g is None for g in gpus):
            return False
        node_index = self._node_index[sl.node]
        if sl.kind is SliceKind.MIG:
            gs = gpus[0]
            if sl.mig_uuid not in gs.instances or sl.mig_uuid in gs.owner:
                return False
            gs.owner[sl.mig_uuid] = lease.id
            self._mig_capacity.changed(gs)
            self.view.allocate(node_index, (), self._host_demand(lease.spec))
            return True
        if any(g.is_mig or g.free_milli() < sl.milli for g in gpus):
            return False
        for gs in gpus:
            gs.shares[lease.id] = sl.milli
        self.view.allocate(node_index, tuple(g.slot for g in gpus), self._slice_demand(lease))
        return True


def _shape(plan: _Plan, spec: SliceSpec) -> tuple:
    """What decides whether a plan finds room: the plan, the node asked for and the host demand."""
    return (plan, spec.node, spec.cpu_milli, spec.host_memory_mib)


def _nominal_mib(profile: MigProfile) -> int:
    """The memory a profile's name promises ('3g.40gb' -> 40 GiB)."""
    found = re.search(r"\.(\d+)gb", profile.name)
    return int(found.group(1)) * MIB_PER_GIB if found else profile.memory_mib


def _check_holder(holder: str) -> None:
    check_name(holder, "holder")
    if not (holder == "server" or any(holder.startswith(p) and len(holder) > len(p)
                                      for p in ("server:", "kernel:", "job:"))):
        raise SpecError("holder", "must be 'server', 'server:<name>', 'kernel:<id>' or 'job:<id>'")


def _unmet_field(spec: SliceSpec, groups: list) -> str:
    """The spec field to blame when nothing fits: the first constraint no candidate GPU meets."""
    if spec.profile:
        return "spec.profile"
    if not groups:
        return "spec.node" if spec.node else "spec.model" if spec.model else "spec.kind"
    if spec.count > 1:
        return "spec.count"
    return "spec.memory_mib" if spec.memory_mib else "spec.kind"
