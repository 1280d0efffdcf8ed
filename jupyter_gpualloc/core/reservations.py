"""Reservations: capacity held for a group of users in a time window (a class on Tuesdays 10:00-12:00).

A reservation holds `count` slices of one spec for its members (users and groups) in a window,
once or weekly. Its capacity is a set of GPUs chosen whenever the fleet changes (`held`): the
GPUs of the spec's first plan, those without work that would still run at the window's start
first, in fleet order, until they hold `count` slices; reservations whose windows overlap never
share a GPU. What the scheduler's fit may not use for a lease (`withheld`):

- before `start - lead`: only preemptible batch work, and work whose time limit ends before the
  start, may be placed on held GPUs;
- from `start - lead` to `start`: nothing but the members' own (preemptible work placed before is
  displaced by `due`, and interactive work only with `preempt_interactive`, warned first, ended at
  the start);
- in the window: members' matching requests are served there first (`place`), ahead of the queue
  (`serves`), up to `count`; what they leave is lent to preemptible work only and reclaimed by
  preemption when a member asks. A lease granted from a reservation ends at the window's end (its
  deadline, see deadlines.py).

Records are stored through a `journal.ChangeJournal`, as jobs are, and recovered on start; time
is always passed in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence

from . import mig, preemption
from .deadlines import Deadlines
from .errors import NotFound, SchedulerError, StoreFailed
from .fit import Fit, FitSearch, PassMemo
from .fleet_state import FleetState, GpuState
from .journal import ChangeJournal, Listeners, refused
from .lease_book import LeaseBook
from .model import MAX_EPOCH, MIN_EPOCH, Event, Lease, LeaseState, MigMode, PriorityClass, SliceKind, SliceSpec, \
    SpecError, check_name
from .plans import Plan, Plans
from .store import Store, StoreError
from .usage import gpu_share

WEEK = 7 * 86400.0
DEFAULT_LEAD = 600.0
FIELDS = {"name", "users", "groups", "spec", "count", "start", "end", "weekly", "lead_seconds",
          "preempt_interactive"}
ENDINGS = {f"lease.{state.value}" for state in LeaseState if not state.active}


class ReservationConflict(SchedulerError):
    """A reservation the fleet cannot hold (or one that exists already): `field` and how many fit."""

    def __init__(self, field_name: str, message: str, fits: int | None = None):
        super().__init__(message)
        self.field = field_name
        self.fits = fits


@dataclass
class Reservation:
    """Who may use what, when: `count` slices of `spec` for `users` and `groups` in [start, end), weekly or once."""

    name: str
    owner: str
    users: tuple[str, ...]
    groups: tuple[str, ...]
    spec: SliceSpec
    count: int
    start: float
    end: float
    weekly: bool = False
    lead: float = DEFAULT_LEAD
    preempt_interactive: bool = False
    created_at: float = 0.0
    leases: dict[str, list[float]] = field(default_factory=dict)  # lease id -> [granted at, GPUs it amounts to]
    gpu_seconds: float = 0.0  # used inside it by leases that ended
    started: float | None = None  # start of the last window announced started
    ended: float | None = None  # start of the last window announced ended
    served: list[str] = field(default_factory=list)  # every lease granted from it (usage by reservation)
    deleted: bool = False

    @property
    def id(self) -> str:
        return self.name

    def window(self, now: float) -> tuple[float, float] | None:
        """The window in progress at `now`, else the next one; None once it will never hold again."""
        if now < self.end:
            return self.start, self.end
        if not self.weekly:
            return None
        k = math.floor((now - self.end) / WEEK) + 1
        return self.start + k * WEEK, self.end + k * WEEK

    def windows(self, since: float, until: float) -> Iterable[tuple[float, float]]:
        """Its windows that meet [since, until)."""
        w = self.window(since)
        while w is not None and w[0] < until:
            yield w
            w = (w[0] + WEEK, w[1] + WEEK) if self.weekly else None

    def state(self, now: float) -> str:
        w = self.window(now)
        return "ended" if w is None else "active" if w[0] <= now else "upcoming"

    def member(self, user: str, groups: Sequence[str]) -> bool:
        return user in self.users or any(g in self.groups for g in groups)

    def overlaps(self, other: "Reservation") -> bool:
        """Whether any window of one meets any window of the other."""
        since = max(self.start, other.start) - WEEK
        for s, e in self.windows(since, since + 3 * WEEK if self.weekly else math.inf):
            if any(True for _ in other.windows(s, e)):
                return True
        return False

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "owner": self.owner, "users": list(self.users), "groups": list(self.groups),
                "spec": self.spec.to_json(), "count": self.count, "start": self.start, "end": self.end,
                "weekly": self.weekly, "lead_seconds": self.lead, "preempt_interactive": self.preempt_interactive,
                "created_at": self.created_at, "leases": self.leases, "gpu_seconds": self.gpu_seconds,
                "started": self.started, "ended": self.ended, "served": self.served}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Reservation":
        return cls(data["name"], data["owner"], tuple(data["users"]), tuple(data["groups"]),
                   SliceSpec.from_json(data["spec"]), data["count"], data["start"], data["end"], data["weekly"],
                   data["lead_seconds"], data["preempt_interactive"], data["created_at"],
                   {k: list(v) for k, v in data["leases"].items()}, data["gpu_seconds"], data["started"],
                   data["ended"], list(data.get("served", [])))


OUT_OF_RANGE = f"must be from 1970-01-01 to 9999-12-31T23:59:59Z (epoch seconds {MIN_EPOCH} to {MAX_EPOCH})"


def parse_time(value: Any, field_name: str) -> float:
    """Seconds since the epoch, from a number or an ISO 8601 time (UTC unless it names its offset),
    from MIN_EPOCH to MAX_EPOCH."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return in_range(float(value), field_name)
    if not isinstance(value, str):
        raise SpecError(field_name, "must be an ISO 8601 time such as 2026-12-08T10:00 or epoch seconds")
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        seconds = parsed.timestamp()
    except (ValueError, OverflowError):
        raise SpecError(field_name, "must be an ISO 8601 time such as 2026-12-08T10:00") from None
    return in_range(seconds, field_name)


def in_range(seconds: Any, field_name: str) -> float:
    """`seconds` if a time from MIN_EPOCH to MAX_EPOCH, else SpecError naming the field."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not MIN_EPOCH <= seconds <= MAX_EPOCH:
        raise SpecError(field_name, OUT_OF_RANGE)
    return float(seconds)


def check_window(start: Any, end: Any, weekly: bool) -> None:
    """SpecError naming the field of a window the core would not keep: a time out of range, an end
    not after the start, a weekly window of a week or more."""
    in_range(start, "start")
    in_range(end, "end")
    if end <= start:
        raise SpecError("end", "must be after start")
    if weekly and end - start >= WEEK:
        raise SpecError("end", "a weekly window must be shorter than a week")


def _names(data: dict, key: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise SpecError(key, "must be a list of names")
    return tuple(check_name(v, key) for v in value)


def parse_request(data: Any, owner: str, now: float) -> Reservation:
    """A reservation from the REST API's object, checked field by field (SpecError names the field)."""
    if not isinstance(data, dict):
        raise SpecError("body", "must be an object")
    for key in data:
        if key not in FIELDS:
            raise SpecError(key, "unknown field")
    name = check_name(data.get("name"), "name", 64)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise SpecError("name", "must be letters, digits, '.', '_' or '-'")
    users, groups = _names(data, "users"), _names(data, "groups")
    if not users and not groups:
        raise SpecError("users", "name at least one user or group")
    if "spec" not in data:
        raise SpecError("spec", "is required")
    spec = SliceSpec.from_json(data["spec"])
    count = data.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 100000:
        raise SpecError("count", "must be a whole number of slices, at least 1")
    start, end = parse_time(data.get("start"), "start"), parse_time(data.get("end"), "end")
    weekly = data.get("weekly", False)
    if not isinstance(weekly, bool):
        raise SpecError("weekly", "must be true or false")
    check_window(start, end, weekly)
    lead = data.get("lead_seconds", DEFAULT_LEAD)
    if isinstance(lead, bool) or not isinstance(lead, (int, float)) or not 0 <= lead <= WEEK:
        raise SpecError("lead_seconds", "must be a number of seconds from 0 to a week")
    preempt = data.get("preempt_interactive", False)
    if not isinstance(preempt, bool):
        raise SpecError("preempt_interactive", "must be true or false")
    if not weekly and end <= now:
        raise SpecError("end", "is in the past")
    return Reservation(name, owner, users, groups, spec, count, start, end, weekly, float(lead), preempt, now)


def per_gpu(gs: GpuState, plan: Plan) -> float:
    """Slices of `plan` one GPU holds when nothing else is on it."""
    if plan.kind is SliceKind.MIG:
        if gs.gpu.mig_mode is MigMode.DYNAMIC:
            return mig.room_for(mig.Layout.of((), gs.profiles), plan.profile)
        return sum(1 for i in gs.instances.values() if i.profile_id == plan.profile.profile_id)
    if plan.kind is SliceKind.SHARED:
        return 1000 // plan.milli
    return 1 / plan.count


class Reservations:
    """Every reservation, the GPUs each holds, and what they withhold from each request."""

    def __init__(self, store: Store, fleet: FleetState, plans: Plans, fit: FitSearch, book: LeaseBook,
                 deadlines: Deadlines, listeners: Listeners):
        """Load the stored reservations; `listeners` (the scheduler's) hear their events."""
        self.store = store
        self._fleet = fleet
        self._plans = plans
        self._fit = fit
        self._book = book
        self._deadlines = deadlines
        self._journal: ChangeJournal[Reservation] = ChangeJournal(self._write, self._put_back)
        self._journal.listeners = listeners
        self._by_name = {d["name"]: Reservation.from_json(d) for d in store.load_reservations()}
        self._pending: dict[str, str] = {}  # lease id -> the reservation it is being granted from
        self._held: tuple[tuple, dict[str, frozenset[str]]] | None = None
        self._warned: set[str] = set()  # interactive leases warned to leave for a reservation
        self._pass: PassMemo | None = None  # the scheduling pass whose memos _memos are
        self._memos: dict[frozenset[str], PassMemo] = {}

    # ------------------------------------------------------------ journal

    def use(self, plans: Plans, fit: FitSearch) -> None:
        """The plans and fit search of a reloaded fleet (Scheduler.nodes_changed)."""
        self._plans, self._fit = plans, fit
    def _write(self, changed: list[Reservation]) -> None:
        if not changed:
            return
        try:
            self.store.save_reservations(changed)
        except StoreError as err:
            raise refused(err, "the reservation change") from err
        self._held = None

    def _put_back(self, restored: list) -> None:
        for record, before, _ in restored:
            if before is None:
                self._by_name.pop(record.name, None)
            elif not record.deleted:
                self._by_name[record.name] = record
        self._held = None

    def _emit(self, type_: str, now: float, r: Reservation, **data: Any) -> None:
        data.update(name=r.name, count=r.count, spec=r.spec.to_json())
        self._journal.events.append(Event(type_, now, None, r.owner, data))

    # -------------------------------------------------------------- reads
    def get(self, name: str) -> Reservation:
        r = self._by_name.get(name)
        if r is None:
            raise NotFound(f"no reservation {name}")
        return r

    def all(self, user: str | None = None, groups: Sequence[str] = ()) -> list[Reservation]:
        """Every reservation (of which `user` is a member, when given), by start."""
        return sorted((r for r in self._by_name.values() if user is None or r.member(user, groups)),
                      key=lambda r: (r.start, r.name))

    def view(self, r: Reservation, now: float) -> dict[str, Any]:
        """A reservation as the API shows it: its record, state, next window, GPUs held and slices in use."""
        data = r.to_json()
        w = r.window(now)
        live = self._live(r)
        data.update(state=r.state(now), next_start=w[0] if w else None, next_end=w[1] if w else None,
                    held=sorted(self.held(now).get(r.name, frozenset())), in_use=len(live), leases=sorted(live),
                    free=max(0, r.count - len(live)) if r.state(now) == "active" else 0,
                    gpu_hours=self.gpu_seconds(r, now) / 3600.0, summary=describe(r, len(live), now))
        del data["served"]
        return data

    def gpu_seconds(self, r: Reservation, now: float) -> float:
        """GPU-seconds used inside the reservation, its running leases' included."""
        return r.gpu_seconds + sum((now - at) * gpus for at, gpus in self._live(r).values())

    def lease_names(self) -> dict[str, str]:
        """Every lease ever granted from a reservation, with the reservation's name (GET /usage?by=reservation)."""
        return {lease_id: r.name for r in self._by_name.values() for lease_id in r.served}

    def of_lease(self, lease_id: str) -> Reservation | None:
        """The reservation a granted lease was served from, if any."""
        return next((r for r in self._by_name.values() if lease_id in r.leases), None)

    def end_reason(self, lease: Lease, deadline: float) -> str | None:
        """Why a lease ends at `deadline` when that is the end of its reservation's window, else None."""
        r = self.of_lease(lease.id)
        window = r.window(deadline - 1) if r is not None else None
        return f"the window of reservation {r.name} ended" if window and window[1] == deadline else None

    def _live(self, r: Reservation) -> dict[str, list[float]]:
        return {i: v for i, v in r.leases.items() if i in self._book.by_id}

    # ------------------------------------------------------------ changes
    def create(self, r: Reservation, now: float) -> list[str]:
        """Store a reservation the fleet can hold beside those overlapping it (ReservationConflict
        names the field and how many fit; SpecError a window out of range); the warnings: what it
        cannot promise without preempting."""
        check_window(r.start, r.end, r.weekly)
        if r.name in self._by_name:
            raise ReservationConflict("name", f"reservation {r.name} exists already")
        plan = self._plan(r)
        fits = self._fits(r, plan, now, promise=False)
        if fits < r.count:
            raise ReservationConflict("count", f"only {fits} of {r.count} {r.spec.describe()}s fit beside the "
                                      "reservations overlapping it", fits)
        warnings = []
        promised = self._fits(r, plan, now, promise=True)
        if promised < r.count and not r.preempt_interactive:
            warnings.append(f"only {promised} of {r.count} can be promised without ending interactive work "
                            "running now (preempt_interactive ends it at the start)")
        with self._journal.change():
            self._journal.record(r, known=False)
            self._by_name[r.name] = r
            self._emit("reservation.created", now, r, start=r.start, end=r.end, weekly=r.weekly, warnings=warnings)
        self._fleet.moved()  # what the next scheduling pass may grant changed
        return warnings

    def delete(self, name: str, now: float) -> Reservation:
        r = self.get(name)
        with self._journal.change():
            self._journal.record(r, known=True)
            r.deleted = True
            del self._by_name[name]
            self._emit("reservation.deleted", now, r)
        self._fleet.moved()
        return r

    def _plan(self, r: Reservation) -> Plan:
        """The plan it holds capacity for; SpecError (naming the spec's field) when the fleet has none."""
        try:
            return self._plans.of(r.spec)[0]
        except SpecError as err:
            raise SpecError(err.field if err.field.startswith("spec") else f"spec.{err.field}", err.message) from None

    def _fits(self, r: Reservation, plan: Plan, now: float, promise: bool) -> int:
        """How many slices of `plan` the GPUs of its kind hold beside overlapping reservations (with
        `promise`: on GPUs without interactive work that would still run at the start)."""
        cands = self._candidates(plan, r.spec)
        start = r.window(now)[0]
        caps = sorted((per_gpu(gs, plan) for gs in cands
                       if not (promise and self._blockers(gs, r, start))), reverse=True)
        for other in self._by_name.values():
            if other.overlaps(r) and self._same_kind(other, plan):
                room = 0.0
                while caps and room < other.count - 1e-9:  # the GPUs it holds, largest first
                    room += caps.pop(0)
        return int(sum(caps) + 1e-9)

    def _same_kind(self, other: Reservation, plan: Plan) -> bool:
        theirs = self._plan_of(other)
        return theirs is not None and theirs.model == plan.model \
            and (theirs.kind is SliceKind.MIG) == (plan.kind is SliceKind.MIG)

    def _plan_of(self, r: Reservation) -> Plan | None:
        """The plan a reservation holds capacity for: its spec's first (None once the fleet has none)."""
        try:
            return self._plans.of(r.spec)[0]
        except SpecError:
            return None

    def _candidates(self, plan: Plan, spec: SliceSpec) -> list[GpuState]:
        mig_plan = plan.kind is SliceKind.MIG
        return [gs for gs in self._fleet.gpus.values()
                if gs.gpu.model == plan.model and gs.is_mig == mig_plan and not gs.drained
                and (spec.node is None or gs.gpu.node == spec.node)]

    def _blockers(self, gs: GpuState, r: Reservation, start: float) -> list[Lease]:
        """The leases on `gs` that may not be displaced for `r` and would still run at `start`."""
        out = []
        for lease_id in set(gs.owner.values()) | set(gs.holders):
            lease = self._book.by_id.get(lease_id)
            if lease is None or lease_id in r.leases or self._lendable(lease):
                continue
            record = self._deadlines.of(lease_id)
            if record is None or record.deadline > start:
                out.append(lease)
        return out

    @staticmethod
    def _lendable(lease: Lease) -> bool:
        return lease.preemptible and lease.priority is PriorityClass.BATCH

    # ------------------------------------------------------ capacity held
    def held(self, now: float) -> dict[str, frozenset[str]]:
        """The GPUs each reservation that will still hold holds now; recomputed when the fleet or a window moves."""
        windows = tuple((r.name, r.window(now)) for r in self._by_name.values())
        key = (self._fleet.version, windows)
        if self._held is not None and self._held[0] == key:
            return self._held[1]
        held: dict[str, frozenset[str]] = {}
        order = sorted((r for r in self._by_name.values() if r.window(now) is not None),
                       key=lambda r: (r.created_at, r.name))
        for r in order:
            taken = set().union(*(held[o.name] for o in order if o.name in held and o.overlaps(r)))
            held[r.name] = self._hold(r, now, taken)
        self._held = (key, held)
        return held

    def _hold(self, r: Reservation, now: float, taken: set[str]) -> frozenset[str]:
        """The GPUs `r` holds: those without work it may not displace first, in fleet order, until `count` fit."""
        plan = self._plan_of(r)
        if plan is None:
            return frozenset()
        start = r.window(now)[0]
        cands = [gs for gs in self._candidates(plan, r.spec) if gs.gpu.uuid not in taken]
        cands.sort(key=lambda gs: (bool(self._blockers(gs, r, start)), gs.node_index, gs.slot))
        chosen, room = [], 0.0
        for gs in cands:
            if room >= r.count - 1e-9:
                break
            chosen.append(gs.gpu.uuid)
            room += per_gpu(gs, plan)
        return frozenset(chosen)

    def serving(self, lease: Lease, now: float) -> Reservation | None:
        """The reservation in its window that serves this member's request: the same spec, or one
        whose preferred plan is the reservation's, while it has room left."""
        first = self._book.plans.get(lease.id, ())[:1]
        for r in self._by_name.values():
            w = r.window(now)
            if w is not None and w[0] <= now and r.member(lease.user, lease.groups) \
                    and (r.spec == lease.spec or first == (self._plan_of(r),)) and len(self._live(r)) < r.count:
                return r
        return None

    def serves(self, lease: Lease, now: float) -> bool:
        """Whether a reservation serves this request now (the scheduling pass puts it first)."""
        return bool(self._by_name) and self.serving(lease, now) is not None

    def first(self, ordered: list[str], now: float) -> list[str]:
        """The queue's order with the requests a reservation serves first (each group keeps its order)."""
        if not self._by_name:
            return ordered
        served = {i for i in ordered if self.serving(self._book.by_id[i], now) is not None}
        return [i for i in ordered if i in served] + [i for i in ordered if i not in served] if served else ordered

    def withheld(self, lease: Lease, now: float) -> set[str]:
        """The held GPUs this lease may not be placed on now."""
        out: set[str] = set()
        for name, gpus in self.held(now).items():
            r = self._by_name[name]
            start = r.window(now)[0]
            if now < start - r.lead:
                limit = self._deadlines.max_duration(lease)
                if self._lendable(lease) or (limit is not None and now + limit <= start):
                    continue
            elif now >= start and self._lendable(lease):
                continue  # lent while unused, reclaimed when a member asks
            out |= gpus
        return out

    def place(self, lease: Lease, plans: Sequence[Plan], reserved: set[str], now: float, memo: PassMemo | None,
              allowed: Callable[[Plan], bool], preempt: Callable[[list[Lease]], None]) -> Fit | None:
        """Where the request fits (FitSearch.find): a member's in its reservation first, reclaiming
        lent capacity by `preempt`; else outside `reserved` and what reservations withhold from it
        (with a memo of its own per withheld set, see _memo_for)."""
        if not self._by_name:
            return self._fit.find(lease, plans, reserved, memo, allowed)
        r = self.serving(lease, now)
        if r is not None:
            inside = set(self._fleet.gpus) - self.held(now).get(r.name, frozenset())
            fit = self._fit.find(lease, plans, inside, None, allowed)
            if fit is None:
                victims = preemption.victims(lease, plans, inside, self._fleet, self._book.active,
                                             self._book.returning.values())
                if victims:
                    preempt(victims)
                    fit = self._fit.find(lease, plans, inside, None, allowed)
            if fit is not None:
                self._pending[lease.id] = r.name
                return fit
        hidden = self.withheld(lease, now)
        return self._fit.find(lease, plans, reserved | hidden, self._memo_for(memo, frozenset(hidden)), allowed)

    def _memo_for(self, memo: PassMemo | None, hidden: frozenset[str]) -> PassMemo | None:
        """The pass's memo for searches that `hidden` GPUs are withheld from: the pass's own when
        none are, else one per withheld set (what found no room without those GPUs may fit with them)."""
        if memo is None or not hidden:
            return memo
        if self._pass is not memo:
            self._pass, self._memos = memo, {}
        return self._memos.setdefault(hidden, PassMemo(self._fleet))

    def granted(self, lease: Lease, now: float) -> None:
        """A lease was granted: if from a reservation, it counts there and ends with the window."""
        name = self._pending.pop(lease.id, None)
        r = self._by_name.get(name) if name else None
        if r is None:
            return
        with self._journal.change():
            self._journal.record(r, known=True)
            r.leases[lease.id] = [now, gpu_share(lease.slice)]
            r.served.append(lease.id)
        self._deadlines.cap(lease, r.window(now)[1])

    def on_lease_event(self, event: Event) -> None:
        """A lease from a reservation ended: its GPU time is added to the reservation's."""
        if event.type not in ENDINGS or event.lease_id is None:
            return
        r = self.of_lease(event.lease_id)
        if r is None:
            return
        try:
            with self._journal.change():
                self._journal.record(r, known=True)
                at, gpus = r.leases.pop(event.lease_id)
                r.gpu_seconds += max(0.0, event.time - at) * gpus
        except StoreFailed:
            pass  # put back as stored: the lease no longer counts as in use (_live), its GPU time goes unsummed

    # ------------------------------------------------------------ windows
    def next_change(self, now: float) -> float:
        """When the next window's lead, start or end comes (a scheduling pass is due then)."""
        times = [t for r in self._by_name.values() if (w := r.window(now)) is not None
                 for t in (w[0] - r.lead, w[0], w[1]) if t > now]
        return min(times, default=math.inf)

    def names(self) -> list[str]:
        """Every reservation's name, in the order they were loaded or created (the order of `due`)."""
        return list(self._by_name)

    def due(self, name: str, now: float) -> list[tuple[Lease, LeaseState, str]]:
        """Announce that a reservation's window started or ended, warn the interactive work it will
        end; the leases on its held GPUs to end from its window's lead on: (lease, how it ends,
        reason). A change of its own: if anything raises, the reservation is as it was."""
        r = self._by_name[name]
        warned: set[str] = set()
        with self._journal.change():
            self._announce(r, now)
            w = r.window(now)
            gpus = self.held(now).get(r.name, frozenset()) if w is not None and now >= w[0] - r.lead else None
            actions = [] if gpus is None else self._displace(r, w, gpus, now, warned)
        self._warned |= warned
        return actions

    def _announce(self, r: Reservation, now: float) -> None:
        last = r.started
        if last is not None and r.ended != last and now >= last + (r.end - r.start):
            self._journal.record(r, known=True)
            r.ended = last
            self._emit("reservation.ended", now, r, start=last, gpu_hours=self.gpu_seconds(r, now) / 3600.0)
        w = r.window(now)
        if w is not None and w[0] <= now and r.started != w[0]:
            self._journal.record(r, known=True)
            r.started = w[0]
            self._emit("reservation.started", now, r, start=w[0], end=w[1])

    def _displace(self, r: Reservation, w: tuple[float, float], gpus: frozenset[str],
                  now: float, warned: set[str]) -> list[tuple[Lease, LeaseState, str]]:
        """Preemptible work on the held GPUs leaves in the lead; with preempt_interactive, other
        work is warned in the lead (lease.deadline_warning, the lease added to `warned`) and ended at the start."""
        actions = []
        when = datetime.fromtimestamp(w[0], timezone.utc).strftime("%H:%M")
        for lease in self._on(gpus):
            if lease.id in r.leases or lease.state is not LeaseState.GRANTED:
                continue
            if self._lendable(lease):
                if now < w[0]:
                    actions.append((lease, LeaseState.PREEMPTED, f"preempted: reservation {r.name} starts at {when} UTC"))
            elif r.preempt_interactive and now >= w[0]:
                actions.append((lease, LeaseState.EXPIRED, f"ended for reservation {r.name}"))
            elif r.preempt_interactive and lease.id not in self._warned and lease.id not in warned:
                warned.add(lease.id)
                self._journal.events.append(Event("lease.deadline_warning", now, lease.id, lease.user, {
                    "state": lease.state.value, "holder": lease.holder, "deadline": w[0], "release_at": w[0],
                    "reason": f"reservation {r.name} takes this GPU at {when} UTC"}))
        return actions

    def _on(self, gpus: Iterable[str]) -> list[Lease]:
        ids = {i for u in gpus for i in (*self._fleet.gpus[u].owner.values(), *self._fleet.gpus[u].holders)}
        return sorted((self._book.by_id[i] for i in ids if i in self._book.by_id), key=lambda l: l.seq)

    def report(self, now: float) -> list[dict]:
        """GPU-hours used inside each reservation (GET /usage?by=reservation)."""
        return [{"reservation": r.name, "gpu_hours": self.gpu_seconds(r, now) / 3600.0,
                 "in_use": len(self._live(r)), "count": r.count} for r in self.all()]


def describe(r: Reservation, in_use: int, now: float) -> str:
    """'ML101 reservation: 22 of 30 free until 12:00' (times in UTC)."""
    w = r.window(now)
    if w is None:
        return f"{r.name} reservation: ended"
    if now < w[0]:
        return f"{r.name} reservation: {r.count} {r.spec.describe()}s from {_utc(w[0], '%a %H:%M')}"
    return f"{r.name} reservation: {max(0, r.count - in_use)} of {r.count} free until {_utc(w[1], '%H:%M')}"


def _utc(seconds: float, form: str) -> str:
    """A time as UTC text; one no date can show (a window stored before times were bounded) as epoch
    seconds, so that the reservation can still be read and deleted."""
    try:
        return datetime.fromtimestamp(seconds, timezone.utc).strftime(form) + " UTC"
    except (ValueError, OverflowError, OSError):
        return f"{seconds:.0f} (epoch seconds, out of range)"

