"""The scheduler core's public interface and its state machine: the only place where GPU allocations are decided.

A request (`submit`) becomes a Lease that is granted at once or queued. Waiting requests are
ordered by priority class, fair share and age (queue_order.py); any later request that fits now
is backfilled ahead of the ones that wait, unless it would use a GPU reserved for a request that
has waited longer than `reserve_after`. Queued interactive requests may preempt preemptible
batch leases (preemption.py). `tick(now)` ends leases whose holder stopped heartbeating and,
after a warning, leases idle past their timeout.

The state machine (grant, end, free, the scheduling pass, recovery) lives here; the searches it
runs are dry runs in modules of their own: plans.py (what shapes a spec can take), fit.py (where
a plan fits now), preemption.py (which leases to end), quotas.py (what a quota allows). Every
change goes through the journal (journal.py): written to the store before it is announced as an
Event, or undone entirely. MIG instances are made and unmade by mig_instances.py; under group
commit (`hold_group()`) an instance its holder released waits, unowned, until `commit_group()`
has made its group durable, and is then destroyed (a grant of the same profile in the meantime
takes it instead). Time is always passed in by the caller. The errors the interface raises
(errors.py) are importable from here.
"""

from __future__ import annotations

import math
import secrets
from contextlib import contextmanager
from typing import Any, Callable, Collection, ContextManager, Iterable, Iterator, Mapping, Sequence

from . import mig, preemption
from .deadlines import Deadlines, ExtensionRefused
from .devices.base import DeviceBackend
from .errors import HolderBusy, NotFound, QuotaExceeded, StoreFailed
from .fit import Fit, FitSearch, PassMemo, shape
from .fleet_state import FleetState, GpuState
from .holders import JOB, KERNEL, parse_holder
from .inventory import inventory, offers
from .lease_book import LeaseBook
from .lease_moments import LeaseMoments
from .journal import GroupWrite, Listeners, SchedulerJournal, unreadable
from .model import Event, Lease, LeaseState, MigMode, Node, OutsideUse, PriorityClass, SliceKind, SliceSpec, \
    SpecError, check_holder, check_name
from .placement import get_policy
from .plans import Plan, Plans, demand, host_demand, slice_demand
from .policy import SchedulerPolicy
from .mig_instances import MigInstances
from .offers import Offer, Offers
from .fleet_changes import FleetChanges
from .queue_order import QueueOrder
from .quotas import quota_block
from .recovery import reconcile_instances, recover_leases, recover_returning
from .reservations import Reservations
from .store import Store, StoreError
from .tick_faults import TickFaults
from .usage import UsageLedger

DRAINED = "drained"  # how the reason of a request refused as its GPUs are drained begins
NO_HEARTBEAT = "no heartbeat from"  # how the reason of a lease ended as its holder stopped heartbeating begins
# Why a holder of each kind gets no slice on a backend where a running process cannot gain a device.
NOT_IN_A_POD = {
    KERNEL: "on Kubernetes a kernel cannot get a GPU slice: a running pod cannot gain a device, and GPU kernels "
            "need kernel pods of their own, which are not available here (c.GpuAllocService.kernel_pods); start "
            "your server with a GPU instead",
    JOB: "on Kubernetes a background job cannot get a GPU slice: it would run in your server's pod, which cannot "
         "gain a device; an administrator can run jobs in Kubernetes Jobs of their own "
         "(c.GpuAllocService.job_pods = True)",
}
# Why a running kernel gets no slice where GPU kernels run in kernel pods of their own.
IN_A_KERNEL_POD = {
    KERNEL: "on Kubernetes a running kernel cannot get a GPU slice: a running pod cannot gain a device. A GPU "
            "kernel runs in a pod of its own, so this kernel would restart and lose its variables: to do that, "
            "add --restart to %gpu request (or start a kernel named \"(GPU ...)\" from Kernel > Change Kernel)",
}


class Scheduler:
    """Queue, placement, quotas, fair share, preemption and expiry over one fleet."""

    def __init__(self, backend: DeviceBackend, store: Store, policy: SchedulerPolicy | None = None,
                 *, now: float = 0.0, listeners: Sequence[Callable[[Event], None]] = ()):
        """Load the fleet, then recover from the store (`listeners` hear the recovery's events too)."""
        self.backend = backend
        self.store = store
        self.policy = policy or SchedulerPolicy()
        self._listeners = Listeners(listeners)
        # the holder kinds the service runs in pods of their own (KERNEL, JOB), set by the service
        self.own_pod_holders: frozenset[str] = frozenset()
        self._pass_done: tuple[int, float] | None = None  # (fleet version, valid until) of the last idle pass
        self._memo: PassMemo | None = None  # what the current scheduling pass found no room for
        self._activity_unwritten: set[str] = set()  # leases whose touches are in memory only (write_activity)
        self._faults = TickFaults()  # the rules of tick() that raise
        self._fleet = FleetState(backend, static_mig=self.policy.mig_changes == "static")
        self._book = LeaseBook(self._fleet)
        self._journal = SchedulerJournal(store, backend, self._fleet, self._listeners, self._book.put_back,
                                         self._destroy_released)
        self._instances = MigInstances(store, backend, self._fleet, self._journal)
        self._changes = FleetChanges(self, self._fleet, self._book, self._journal)
        for unusable in self.backend.unusable_nodes():
            self._emit("gpu.node_unusable", now, node=unusable.name, reason=unusable.reason)
        self._offers = Offers(self.policy)
        self._mig_placer = mig.get_mig_placer(self.policy.mig_placement)  # one for good: it learns the requests' mix
        self._plan_fleet()
        self.usage = UsageLedger(store, self.policy, self._offers, self._journal, now=now)
        self.deadlines = Deadlines(store, self.policy, self._offers, self._journal)
        self.reservations = Reservations(store, self._fleet, self._plans, self._fit, self._book, self.deadlines,
                                         self._listeners)
        self.subscribe(self.reservations.on_lease_event)
        # the tick's heartbeat and idle rules read only the leases whose moment has come
        self._heartbeats = LeaseMoments(self._heartbeat_moment)
        self._idle = LeaseMoments(self._idle_moment)
        self._book.moments = (self._heartbeats, self._idle)
        self._recover(now)

    def _plan_fleet(self) -> None:
        """What shapes requests take on the fleet as loaded, the offers on it (configured, or derived
        from the fleet), the searches over it and the queue's order (their typical demands come from
        the offers)."""
        self._plans = Plans(self._fleet.nodes, self._fleet.profiles())
        configured = [Offer.from_config(entry) for entry in self.policy.offers]
        self._offers.replace(configured or self._plans.derived_offers(self.policy.shared_offer_gib))
        placement_policy = get_policy(self.policy.placement, typical=self._plans.typical_demands(self._offers))
        self._fit = FitSearch(self._fleet, placement_policy, self._mig_placer)
        self._order = QueueOrder(self.policy, self._book.active, self._fleet, self._plans, self._fit, self._book.plans)

    # ------------------------------------------------------- change journal
    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Call `listener` with every event after it is stored; returns an unsubscribe function."""
        return self._listeners.subscribe(listener)

    def _emit(self, type_: str, now: float, lease: Lease | None = None, **data) -> None:
        if lease is not None:
            data.setdefault("state", lease.state.value)
            data.setdefault("holder", lease.holder)
        self._journal.events.append(Event(type_, now, lease.id if lease else None,
                                          lease.user if lease else None, data))

    @property
    def group_waiting(self) -> bool:
        """Whether anything waits for commit_group(): a write, an event, a callback or an instance to destroy."""
        return self._journal.group_waiting

    def hold_group(self) -> ContextManager[None]:
        """Inside it, each change's writes wait in one group, written by commit_group()."""
        return self.store.hold()

    def after_group(self, callback: Callable[[StoreFailed | None], None]) -> None:
        """Call `callback(None)` once the waiting group is written, or `callback(StoreFailed)` once it is undone."""
        self._journal.after_group(callback)

    def commit_group(self) -> None:
        """Write the changes waiting in the store's group in one transaction, announce them, then
        destroy the MIG instances the group released (their records' removal is written by the
        next commit) and, if that made room while requests wait, grant what now fits; if the
        store refuses, undo every change, newest first (the released instances stay, with their
        leases), and raise StoreFailed."""
        self._journal.write_group(settle=True)

    def take_group(self) -> GroupWrite:
        """The waiting group, taken to be written off this thread (`write()` on any thread) while the
        next one gathers; `settle_group()` finishes it. Changes made meanwhile stand on it: if the
        store refuses it, they are undone with it."""
        return self._journal.take_group()

    def settle_group(self, write: GroupWrite) -> None:
        """Finish a written group as commit_group() does (waiting for its write): announce it,
        destroy what it released, grant what now fits; if the store refused it, undo it and every
        change staged since, newest first, and raise StoreFailed. Nothing if settled before."""
        self._journal.settle_group(write, settle=True)

    def _destroy_released(self, to_destroy: dict[str, GpuState], now: float, settle: bool) -> None:
        """A settled group released these instances: destroy them (MigInstances.destroy_released).
        Room was made on their GPUs, so a waiting queue gets a scheduling pass (if `settle`)."""
        self._instances.destroy_released(to_destroy, now)
        self._fleet.moved()
        if settle:
            self._settle(now)

    def _settle(self, now: float) -> None:
        """Grant what the queue can now have, as a change of its own: if the store fails there,
        the caller's committed change stands and the next tick grants (and reports the failure).
        O(1) with nothing queued: a pass over no requests would change nothing."""
        if not self._book.queue:
            return
        try:
            with self._journal.atomic(now):
                self._schedule(now)
        except StoreFailed:
            pass

    def _stored_lease(self, lease_id: str) -> Lease | None:
        """A lease as the store has it (ended ones live only there); StoreFailed if it cannot be read."""
        try:
            return self.store.load_lease(lease_id)
        except StoreError as err:
            raise unreadable(err) from err

    def _record_lease(self, lease: Lease) -> None:
        """Note a lease about to change: stored at the next commit, put back (with its plans) if that fails."""
        self._journal.record_lease(lease, known=self._book.knows(lease.id), plans=self._book.plans.get(lease.id))

    # ------------------------------------------------------------------- API
    def submit(self, user: str, holder: str, spec: SliceSpec,
               priority: PriorityClass = PriorityClass.INTERACTIVE, *, now: float,
               groups: Sequence[str] = (), preemptible: bool | None = None, wait: bool = True,
               lease_id: str | None = None, idle_timeout: float | None = None, own_pod: bool = False) -> Lease:
        """Ask for a slice: the lease comes back granted, queued (wait) or rejected (no wait). `own_pod`:
        the holder will run in a pod made for the lease (a kernel pod), so no kind of holder is refused.
        Its terms are the policy's for its offer (`Offers.terms`): `idle_timeout` and `preemptible`
        may only ask for less; a spec that is an offer only some groups may take is refused to others.

        O(the user's and its groups' leases) for the holder and quota checks, O(1) for its plans
        (after the first lease of the spec), one placement search (see `_find_fit`) and the store's
        write; a request that waits adds O(queue) for its position and a scheduling pass (`_schedule`)."""
        check_holder(holder)
        check_name(user, "user")
        refused = None if own_pod else self.refused_holders().get(parse_holder(holder).kind)
        if refused:
            raise SpecError("holder", refused)
        for active in self._book.active.of_user(user):
            if active.holder == holder:
                raise HolderBusy(active.id)
        if lease_id is not None and (lease_id in self._book.by_id or self._stored_lease(lease_id)):
            raise SpecError("id", f"lease {lease_id} already exists")
        plans = self._plans.of(spec)
        self._offers.check_open(self._offers.of_spec(spec), groups)
        terms = self._offers.terms(holder, spec, priority, idle_timeout=idle_timeout, preemptible=preemptible)
        self._journal.seq += 1
        lease = Lease(
            id=lease_id or secrets.token_hex(8), user=user, holder=holder, spec=spec,
            priority=priority, state=LeaseState.QUEUED, created_at=now, seq=self._journal.seq,
            groups=tuple(groups), preemptible=terms.preemptible, heartbeat_at=now, last_activity=now,
            idle_timeout=terms.idle_timeout)
        blocked = self._admit(lease, plans, now, wait)
        with self._journal.atomic(now):
            self._record_lease(lease)
            self._book.add(lease)
            self._book.plans[lease.id] = plans
            fit = None if blocked else self._find_fit(lease, plans, self._order.reserved(self._book.queue, now, lease), now)
            if fit is not None:
                self._grant(lease, fit, now)
            elif not wait:
                reason = DRAINED if self._fit.all_drained(plans) else "no capacity"
                self._end(lease, LeaseState.REJECTED, now, f"{reason} for {spec.describe(article=True)} now")
            else:
                self._book.queue.append(lease.id)
                lease.reason = str(blocked) if blocked else f"waiting for {spec.describe(article=True)}"
                self._emit("lease.queued", now, lease, position=self.position(lease.id))
        if lease.state is LeaseState.QUEUED:
            self._settle(now)
        return lease

    def _admit(self, lease: Lease, plans: Sequence[Plan], now: float, wait: bool) -> QuotaExceeded | None:
        """Raise the quota a new request breaks (one it would break alone; a usage quota used up;
        one it breaks now, unless it is a batch request that waits); else the quota it waits for, or None."""
        never = self._quota_block(lease, plans, assume_empty=True)
        if never is not None:
            raise never
        used_up = self.usage.refusal(lease.user, lease.groups, now)
        if used_up is not None:
            raise QuotaExceeded(used_up.scope, "gpu_hours", used_up.limit, used_up.sentence())
        blocked = self._quota_block(lease, plans)
        if blocked is not None and (lease.priority is PriorityClass.INTERACTIVE or not wait):
            raise blocked
        return blocked

    @staticmethod
    def retry_later(lease: Lease) -> bool:
        """Whether a rejected lease was refused because the GPUs it could use are drained (not for want of room)."""
        return lease.state is LeaseState.REJECTED and lease.reason.startswith(DRAINED)

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
        returning = self._book.returning.get(lease_id)
        if returning is not None and holder_gone:
            with self._journal.atomic(now):
                self._return_slice(returning, now, reason)
            self._settle(now)
            return returning
        lease = self._active(lease_id)
        with self._journal.atomic(now):
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
            check_holder(holder)
        returned: list[Lease] = []
        with self._journal.atomic(now):
            for lease in [l for l in self._book.active.of_user(user) if l.holder in gone]:
                if lease.state is LeaseState.GRANTED:
                    returned.append(lease)
                    self._end(lease, LeaseState.RELEASED, now, reason, destroy_later=True, holder_gone=True)
                else:
                    self._end(lease, LeaseState.CANCELLED, now, reason)
            for lease in [l for l in self._book.returning.values() if l.user == user and l.holder in gone]:
                self._return_slice(lease, now, reason)
                returned.append(lease)
        if returned:
            self._settle(now)
        return returned

    def returning(self, user: str | None = None) -> list[Lease]:
        """Ended leases whose holders still hold their slices, of one user or all, oldest first."""
        return sorted((l for l in self._book.returning.values() if user is None or l.user == user), key=lambda l: l.seq)

    def extend(self, lease_id: str, *, now: float) -> Lease:
        """Move a granted, time-boxed lease's deadline later; ExtensionRefused says why not."""
        lease = self._active(lease_id)
        if lease.state is not LeaseState.GRANTED:
            raise ExtensionRefused("only a granted lease can be extended")
        with self._journal.atomic(now):
            self._record_lease(lease)
            record = self.deadlines.extend(lease, now, others_wait=bool(self._book.queue))
            self._emit("lease.extended", now, lease, deadline=record.deadline, extensions=record.extensions,
                       extensions_left=self.deadlines.extensions_left(lease.id))
        return lease

    def sample_gpu(self, lease_id: str, *, now: float, sm_percent: float) -> Lease:
        """Record a granted lease's GPU utilisation; an active GPU clears a GPU-idle warning."""
        lease = self._active(lease_id)
        with self._journal.atomic(now):
            self._record_lease(lease)
            active = self.usage.sample(lease, sm_percent, now)
            if active and lease.idle_warned_at is not None and self.policy.idle_signal != "activity":
                lease.idle_warned_at = None
                self._emit("lease.idle_cleared", now, lease)
            self._idle.file(lease)  # a first sample may make it idle since its grant
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
            self._book.refile(lease)
            self._activity_unwritten.add(lease.id)
            return lease
        with self._journal.atomic(now):
            self._record_lease(lease)
            if last_activity is not None:
                lease.last_activity = max(lease.last_activity or 0.0, min(last_activity, now))
            if busy is not None:
                lease.busy = busy
            lease.heartbeat_at = now
            if lease.idle_warned_at is not None and not self.usage.gpu_decides(lease) \
                    and (busy or (lease.last_activity or 0) > lease.idle_warned_at):
                lease.idle_warned_at = None
                self._emit("lease.idle_cleared", now, lease)
            self._book.refile(lease)  # a holder no longer busy may be idle since long ago
            self.usage.accrue([lease], now)
        return lease

    def write_activity(self, now: float) -> None:
        """Store the activity touches kept in memory, with those leases' accrual, as one change: O(those
        leases). If the store refuses, they stay unwritten (in memory) for the next call."""
        due = [self._book.by_id[i] for i in self._activity_unwritten if i in self._book.by_id]
        self._activity_unwritten.clear()
        if not due:
            return
        try:
            with self._journal.atomic(now):
                for lease in due:
                    self._record_lease(lease)
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
        for lease in self._book.active.of_user(user):
            if wanted is None or lease.holder in wanted:
                lease.heartbeat_at = now
                self._heartbeats.file(lease)
                alive.append(lease)
        for lease in self._book.returning.values():  # a holder still alive keeps its slice returning
            if lease.user == user and (wanted is None or lease.holder in wanted):
                lease.heartbeat_at = now
        self.usage.accrue(alive, now, keep_if_refused=True)
        return alive

    def tick(self, now: float) -> list[Event]:
        """End dead and idle leases, grant what the queue can now have; returns the events.

        O(returning leases) for their holders' heartbeats; O((seconds passed + leases whose
        heartbeat or idle moment has come) x log) for the active leases' heartbeats and idle time
        (LeaseMoments.due); O(granted leases) for usage quotas (when there are any); O((leases
        near their time limit) x log) for time limits (Deadlines.check); then a scheduling pass
        (`_schedule`).
        Writes the activity touches kept in memory first (write_activity)."""
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
        """The tick as one change, each rule a part of it (see _rule): return the slices of holders
        whose heartbeats stopped and end their leases; end leases idle, past their usage quotas or
        time limits, or displaced by a reservation's window; grant."""
        self._faults.begin()
        with self._journal.atomic(now):
            with self._rule("dead holders", now):
                for lease in list(self._book.returning.values()):
                    if ttl and now - (lease.heartbeat_at or lease.ended_at or 0.0) > ttl:
                        self._return_slice(lease, now, f"{NO_HEARTBEAT} {lease.holder} for {ttl:g} s")
                for lease in self._due(self._heartbeats, now):
                    if now - (lease.heartbeat_at or lease.created_at) > ttl:
                        self._end(lease, LeaseState.EXPIRED, now, f"{NO_HEARTBEAT} {lease.holder} for {ttl:g} s",
                                  holder_gone=True)  # presumed dead
            with self._rule("idle release", now):
                for lease in self._due(self._idle, now):
                    if lease.state is LeaseState.GRANTED:
                        self._check_idle(lease, now)
            active = self._book.active
            with self._rule("usage quotas", now):
                granted = (l for l in self._book.by_id.values() if l.state is LeaseState.GRANTED)
                for action in self.usage.enforce(granted, now):
                    self._emit(action.event, now, action.lease, **action.status.to_json())
                    if action.release:
                        self._end(action.lease, LeaseState.EXPIRED, now,
                                  f"usage quota used up: {action.status.sentence()}")
            with self._rule("time limits", now):
                for action in self.deadlines.check(active.granted, active.place, now):
                    if action.release:
                        self._end(action.lease, LeaseState.EXPIRED, now,
                                  self.reservations.end_reason(action.lease, action.record.deadline) or action.reason)
                    else:
                        self._emit("lease.deadline_warning", now, action.lease,
                                   **action.warning(self.deadlines.extensions_left(action.lease.id)))
            displaced: list[tuple[Lease, LeaseState, str]] = []
            for name in self.reservations.names():
                with self._rule(f"reservation {name}", now, kind="reservation"):
                    displaced += self.reservations.due(name, now)
            with self._rule("reservation displacement", now):
                for lease, state, reason in displaced:
                    self._end(lease, state, now, reason)
            with self._rule("scheduling pass", now):
                self._schedule(now)
        self._faults.end()

    @contextmanager
    def _rule(self, rule: str, now: float, kind: str = "") -> Iterator[None]:
        """One rule of the tick, a part of its change: if it raises, what it changed is undone, the
        failure noted (TickFaults: logged once, shown by broken_rules) and the tick goes on. A store
        that refuses or cannot be read is no broken rule: the whole tick is undone, as any change."""
        try:
            with self._journal.part(now):
                yield
        except (StoreFailed, StoreError):
            raise
        except Exception as err:
            self._faults.failed(rule, kind or rule, err, now)
        else:
            self._faults.worked(rule)

    def broken_rules(self) -> list[dict]:
        """The rules of tick() failing now (each undone alone at every tick while the others go on):
        rule, kind, last error, since when and how many ticks it failed."""
        return [broken.to_json() for broken in self._faults.broken.values()]

    def tick_failures(self) -> dict[str, int]:
        """How often each rule of tick() has failed since the start."""
        return dict(self._faults.failures)

    def drain(self, gpu_uuid: str, drained: bool = True, *, now: float) -> None:
        """Stop (or resume) granting new slices on a GPU; existing leases stay."""
        self._changes.drain(gpu_uuid, drained, now)

    # ------------------------------------------------- the cluster's changes
    def nodes_changed(self, nodes: list[Node], *, now: float, names: Collection[str] | None = None) -> None:
        """The nodes are these now (a backend that watches its cluster says so): all of them, or with
        `names`, those of the named nodes that have GPUs; see FleetChanges.nodes_changed."""
        self._changes.nodes_changed(nodes, now, names)

    def outside_use(self, key: str, use: OutsideUse | None, *, now: float) -> None:
        """A workload the allocator did not place (`key`, never a lease id) holds `use` now, or
        ended (None): its devices leave the free pool, or return to it."""
        self._changes.outside_use(key, use, now)

    def lease(self, lease_id: str) -> Lease:
        """An active lease, or an ended one from the store."""
        lease = self._book.by_id.get(lease_id) or self._book.returning.get(lease_id) or self._stored_lease(lease_id)
        if lease is None:
            raise NotFound(f"no lease {lease_id}")
        return lease

    def leases(self, user: str | None = None) -> list[Lease]:
        """Active leases (queued and granted), of one user or all, oldest first."""
        return sorted(self._book.by_id.values() if user is None else self._book.active.of_user(user),
                      key=lambda l: l.seq)

    def position(self, lease_id: str) -> int | None:
        """1-based place in the queue, or None if not queued: O(queue), no sorting."""
        lease = self._book.by_id.get(lease_id)
        if lease is None or lease_id not in self._book.queue:
            return None
        return self._order.position(self._book.queue, lease)

    def queue(self) -> list[Lease]:
        return [self._book.by_id[i] for i in self._order.ordered(self._book.queue)]

    def inventory(self) -> dict:
        """Every node and GPU: MIG layout with owners, shares, free capacity per profile and kind."""
        book = self._book
        return inventory(self._fleet, book.by_id, book.returning, book.queue, self.backend.unusable_nodes(),
                         self._changes.outside.unplaced())

    def gpu_count(self) -> int:
        """How many GPUs the fleet has."""
        return len(self._fleet.gpus)

    def offers(self, user: str | None = None, groups: Sequence[str] = (), *, now: float | None = None) -> list[dict]:
        """The slice choices policy offers this user, with how many could be granted now, the quota
        that never allows one (`over_quota`), how often a time-boxed one may be extended, and (at
        `now`) the usage quota that would refuse a request now (`over_usage_quota`)."""
        used_up = self.usage.refusal(user, groups, now) if user and now is not None else None
        return offers(self._plans.offer_plans(self._offers), self._fleet, self.policy, self._book.active,
                      self._offers, user, groups, used_up)

    def refused_holders(self) -> dict[str, str]:
        """Each kind of holder that can get no slice on this backend, with why (empty where every kind can):
        on a backend that cannot give a running process a device, those not run in pods of their own."""
        if self.backend.serves_running_processes:
            return {}
        refused = {kind: why for kind, why in NOT_IN_A_POD.items() if kind not in self.own_pod_holders}
        return {**refused, **{kind: IN_A_KERNEL_POD[kind] for kind in self.own_pod_holders & IN_A_KERNEL_POD.keys()}}

    def requested_spec(self, request: Mapping[str, Any], groups: Sequence[str] = ()) -> SliceSpec:
        """The spec a request (a REST body) asks for: its offer's, by name, or its own; SpecError naming the field."""
        return self._offers.spec_of(request, groups)

    def deadline(self, lease_id: str) -> dict | None:
        """A time-boxed lease's deadline, extensions used and left (None without a time limit)."""
        return self.deadlines.describe(lease_id)

    def idle_release(self, lease_id: str) -> dict | None:
        """When idle release takes a granted lease back if its holder stays idle: `since` (idle from),
        `warn_at`, `release_at` and the policy's `grace` between them; `warned` once it is. None for a
        lease without idle release, or whose holder counts as active now (busy)."""
        lease = self._book.by_id.get(lease_id)
        if lease is None or lease.state is not LeaseState.GRANTED or not lease.idle_timeout:
            return None
        since = self.usage.idle_since(lease, max(lease.last_activity or 0.0, lease.granted_at or 0.0))
        if since is None:
            return None
        warn_at = lease.idle_warned_at if lease.idle_warned_at is not None else since + lease.idle_timeout
        return {"since": since, "warn_at": warn_at, "release_at": warn_at + self.policy.idle_grace,
                "grace": self.policy.idle_grace, "warned": lease.idle_warned_at is not None}

    # ------------------------------------------------------------- internals

    def _active(self, lease_id: str) -> Lease:
        lease = self._book.by_id.get(lease_id)
        if lease is None:
            if self._stored_lease(lease_id) is not None:
                raise NotFound(f"lease {lease_id} has already ended")
            raise NotFound(f"no lease {lease_id}")
        return lease

    def _due(self, moments: LeaseMoments, now: float) -> list[Lease]:
        """The leases whose moment in `moments` may have come, in the order of the scheduler's leases."""
        place = self._book.active.place
        return sorted(moments.due(now), key=lambda lease: place(lease.id))

    def _heartbeat_moment(self, lease: Lease) -> float | None:
        """When the heartbeat rule could first end a lease: heartbeat_ttl after its last heartbeat."""
        ttl = self.policy.heartbeat_ttl
        return (lease.heartbeat_at or lease.created_at) + ttl if ttl else None

    def _idle_since(self, lease: Lease) -> float | None:
        return self.usage.idle_since(lease, max(lease.last_activity or 0.0, lease.granted_at or 0.0))

    def _idle_moment(self, lease: Lease) -> float | None:
        """When the idle rule could first act on a granted lease: warn it its idle timeout after it
        became idle, release it idle_grace after the warning (None while its holder is busy)."""
        if lease.state is not LeaseState.GRANTED or not lease.idle_timeout:
            return None
        idle_since = self._idle_since(lease)
        if idle_since is None:
            return None
        if lease.idle_warned_at is None:
            return idle_since + lease.idle_timeout
        return lease.idle_warned_at + self.policy.idle_grace

    def _check_idle(self, lease: Lease, now: float) -> None:
        idle_since = self._idle_since(lease)
        if idle_since is None:
            return
        if lease.idle_warned_at is None:
            if now - idle_since >= lease.idle_timeout:
                self._record_lease(lease)
                lease.idle_warned_at = now
                self._idle.file(lease)
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
        self._record_lease(lease)
        frees = lease.state is LeaseState.GRANTED and holds
        if lease.id in self._book.queue:
            self._book.queue.remove(lease.id)
        lease.state = state
        lease.ended_at = now
        lease.reason = reason
        self._book.drop(lease.id)
        self._book.plans.pop(lease.id, None)
        if frees and self.policy.wait_for_holders and not holder_gone:
            lease.returning = True
            self._book.returning[lease.id] = lease
            self._journal.returning_changes[lease.id] = True
            self._emit(f"lease.{state.value}", now, lease, reason=reason, returning=True)
            return
        self._emit(f"lease.{state.value}", now, lease, reason=reason)
        if frees:
            self._free(lease, now, destroy_later)

    def _return_slice(self, lease: Lease, now: float, reason: str) -> None:
        """An ended lease's holder is gone: its slice returns to the pool."""
        self._record_lease(lease)
        lease.returning = False
        del self._book.returning[lease.id]
        self._journal.returning_changes[lease.id] = False
        self._emit("lease.slice_returned", now, lease, reason=reason, slice=lease.slice.to_json())
        self._free(lease, now, destroy_later=True)

    def _free(self, lease: Lease, now: float, destroy_later: bool = False) -> None:
        sl = lease.slice
        self._fleet.room_made()
        node_index = self._fleet.node_index[sl.node]
        if sl.kind is SliceKind.MIG:
            gs = self._fleet.gpus[sl.gpu_uuids[0]]
            self._journal.record_gpu(gs)
            gs.owner.pop(sl.mig_uuid, None)
            self._fleet.changed(gs)
            self._journal.view_release(node_index, (), host_demand(lease.spec))
            if sl.mig_uuid in gs.created and gs.gpu.mig_mode is MigMode.DYNAMIC:
                if destroy_later and self.store.holding:
                    self._journal.to_destroy[sl.mig_uuid] = gs  # once the group is durable: commit_group()
                else:
                    self._instances.destroy(gs, sl.mig_uuid, now)
        else:
            gpus = tuple(self._fleet.gpus[u] for u in sl.gpu_uuids)
            for gs in gpus:
                self._journal.record_gpu(gs)
                gs.holders.pop(lease.id, None)
                self._fleet.changed(gs)
            self._journal.view_release(node_index, tuple(g.slot for g in gpus), slice_demand(lease))

    def _grant(self, lease: Lease, fit: Fit, now: float) -> None:
        gs0 = fit.gpus[0]
        self._record_lease(lease)
        for gs in fit.gpus:
            self._journal.record_gpu(gs)
        if fit.create_at is not None:
            inst = self._instances.create(gs0, fit.plan.profile, fit.create_at, now)
            fit.slice.mig_uuid = inst.uuid
        sl = fit.slice
        if sl.kind is SliceKind.MIG:
            gs0.owner[sl.mig_uuid] = lease.id
            self._fleet.changed(gs0)
            self._journal.view_allocate(fit.node_index, (), host_demand(lease.spec))
        else:
            for gs in fit.gpus:
                gs.holders[lease.id] = sl.milli
                self._fleet.changed(gs)
            self._journal.view_allocate(fit.node_index, tuple(g.slot for g in fit.gpus),
                               demand(fit.plan, lease.spec))
        if lease.id in self._book.queue:
            self._book.queue.remove(lease.id)
        self._fleet.moved()
        lease.state = LeaseState.GRANTED
        lease.slice = sl
        self._book.active.count_held(lease)
        lease.granted_at = now
        self.usage.start(lease, now)
        self.deadlines.start(lease, now)
        self.reservations.granted(lease, now)
        lease.last_activity = max(lease.last_activity or 0.0, now)
        lease.reason = ""
        self._idle.file(lease)
        self._emit("lease.granted", now, lease, slice=sl.to_json(), waited_s=now - lease.created_at)

    # ------------------------------------------------------ scheduling pass
    def _find_fit(self, lease: Lease, plans: Sequence[Plan], reserved: set[str], now: float) -> Fit | None:
        """Where the first of `plans` within quota fits now, outside `reserved` GPUs and those that
        reservations withhold from it (see FitSearch.find and Reservations.place)."""
        return self.reservations.place(lease, plans, reserved, now, self._memo,
                                       lambda plan: self._quota_block(lease, [plan]) is None,
                                       lambda chosen: self._preempt(chosen, now, "reclaimed for its reservation"))

    def _schedule(self, now: float) -> None:
        """Grant every waiting request that fits, in queue order, honouring reservations.

        A pass is skipped when nothing it depends on changed since the last one (no lease came or
        went, nothing was granted or freed, no GPU drained, no request reached `reserve_after`,
        no usage quotas, whose use moves with time): O(1) then. Otherwise it costs
        O(queue log queue) to order; O(its plans) for each request whose every plan this pass
        already found no room for (`_nothing_fits`); for the others, O(the user's and groups'
        leases) for quotas; and one fleet search per distinct request shape (see FitSearch.find)."""
        if self._pass_done is not None and self._pass_done[0] == self._fleet.version \
                and now < self._pass_done[1] and not self.policy.usage_quotas:
            return
        self._memo = PassMemo(self._fleet)
        try:
            self._schedule_pass(now)
        finally:
            self._memo = None

    def _schedule_pass(self, now: float) -> None:
        start = self._fleet.version
        reserved: set[str] = set()
        usage_known: dict = {}
        until = math.inf  # when the next waiting request reaches reserve_after
        reserve_after, preemption = self.policy.reserve_after, self.policy.preemption
        for lease_id in self.reservations.first(self._order.ordered(self._book.queue), now):
            lease = self._book.by_id.get(lease_id)
            if lease is None or lease.state is not LeaseState.QUEUED:
                continue
            plans = self._book.plans[lease_id]
            waited = now - lease.created_at >= reserve_after
            if not waited and self._nothing_fits(lease, plans, preemption, now):
                until = min(until, lease.created_at + reserve_after)
                continue
            blocked = self._quota_block(lease, plans)
            used_up = None if blocked else self.usage.refusal(lease.user, lease.groups, now, usage_known)
            if used_up is not None:
                blocked = QuotaExceeded(used_up.scope, "gpu_hours", used_up.limit, used_up.sentence())
            fit = None if blocked else self._find_fit(lease, plans, reserved, now)
            if fit is None and blocked is None and lease.priority is PriorityClass.INTERACTIVE and preemption:
                fit = self._preempt_for(lease, plans, reserved, now)
            if fit is not None:
                self._grant(lease, fit, now)
                continue
            if blocked is not None and lease.reason != str(blocked):
                self._record_lease(lease)
                lease.reason = str(blocked)
            if waited:
                reserved |= self._order.reservation(lease, reserved)
            else:
                until = min(until, lease.created_at + reserve_after)
        until = min(until, self.reservations.next_change(now))
        self._pass_done = (start, until) if self._fleet.version == start else None  # skippable if it changed nothing

    def _nothing_fits(self, lease: Lease, plans: Sequence[Plan], preemption: bool, now: float) -> bool:
        """Whether this pass already found no room for every plan of the request (same host
        demand) and it cannot preempt: then it is passed over in O(plans), without quota checks,
        as its placement could only fail again (not one a reservation serves, searched there alone).
        Its quota reason is refreshed once room is made."""
        if preemption and lease.priority is PriorityClass.INTERACTIVE and self._book.active.preemptible \
                or self.reservations.serves(lease, now):
            return False
        return all(self._memo.no_room(shape(plan, lease.spec)) for plan in plans)

    def _preempt_for(self, lease: Lease, plans: Sequence[Plan], reserved: set[str], now: float) -> Fit | None:
        """End the victims preemption picks for the request (see preemption.victims), then place it."""
        chosen = preemption.victims(lease, plans, reserved | self.reservations.withheld(lease, now), self._fleet,
                                    self._book.active, self._book.returning.values())
        if not chosen:
            return None
        self._preempt(chosen, now, "preempted for an interactive request")
        return self._find_fit(lease, plans, reserved, now)

    def _preempt(self, chosen: Sequence[Lease], now: float, reason: str) -> None:
        for victim in chosen:
            self._end(victim, LeaseState.PREEMPTED, now, reason)

    def _quota_block(self, lease: Lease, plans: Sequence[Plan], *,
                     assume_empty: bool = False) -> QuotaExceeded | None:
        """The quota that granting the cheapest of `plans` would break (even with nothing else
        held, when assume_empty), or None."""
        return quota_block(self.policy, self._book.active, lease.user, lease.groups, plans, lease.id,
                           assume_empty=assume_empty)

    def _running(self, lease: Lease, now: float) -> None:
        """A recovered granted lease runs again: its usage and time limit count from `now`."""
        self.usage.start(lease, now)
        self.deadlines.start(lease, now)

    # -------------------------------------------------------------- recovery
    def _recover(self, now: float) -> None:
        """Rebuild leases (and the slices of ended ones still returning) and MIG ownership from
        the store and reconcile with the devices; then grant what fits."""
        state = self.store.load()
        self._journal.restart(state.seq, [i.id for i in state.intents])
        for gpu_uuid in state.drained:
            if gpu_uuid in self._fleet.gpus:
                self._fleet.gpus[gpu_uuid].drained_by_admin = True
                self._fleet.changed(self._fleet.gpus[gpu_uuid])
        reconcile_instances(state, self._fleet, self._journal, now, self._emit, self.backend)
        recover_leases(state, self._book, self._plans.of, self._fleet, now, end=self._end, emit=self._emit,
                       running=self._running)
        recover_returning(state, self._fleet, self._book, self._journal, now)
        for gs in self._fleet.gpus.values():
            if gs.gpu.mig_mode is MigMode.DYNAMIC:
                for mig_uuid in [u for u in gs.created if u not in gs.owner]:
                    self._instances.destroy(gs, mig_uuid, now)
        self._schedule(now)
        self._journal.commit()
