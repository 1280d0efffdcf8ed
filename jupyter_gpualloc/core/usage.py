"""Usage: GPU-hours of granted leases, kept per UTC day, reports over them, and usage quotas.

A lease accrues from its grant to its end at its share of GPUs: a MIG slice counts its compute
slices over its GPU's, a shared slice its memory cap over its GPU's memory, whole GPUs their
count. It also accrues GiB-hours of the GPU memory it holds. Accrual is written to the store
whenever the holder shows it is alive (touch, heartbeat) and when the lease ends, so a crash
loses nothing before the last sign of life whose accrual was stored; after a restart a recovered
lease accrues again from the moment the new process starts. While the store is out of order a
heartbeat keeps its accrual in memory (the first heartbeat the store takes again writes it), so a
crash during an outage loses the accrual since the last heartbeat before it.

Starting and stopping a lease's accrual and its quota warnings are part of the scheduler's change
that makes them: each records its inverse in the change's journal (a lease's final accrual is
written by the change's commit), so a change undone puts them back. Accrual written at signs of
life (`accrue`) goes to the store at once, and is marked unstored again if the store refuses it.

Each granted lease also keeps its GPU utilisation samples of the last RECENT_SAMPLE_SECONDS in
memory (at most RECENT_SAMPLE_POINTS), for the sidebar's sparkline; a restart starts them afresh.

`usage_quotas` limit GPU-hours over a window, rolling ("7d", "24h") or calendar ("calendar_day",
"calendar_week" from Monday 00:00 UTC, "calendar_month"), per user or per group. The scheduler
asks `refusal()` before it accepts a request and `enforce()` on every tick; both take the time.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import lru_cache, partial
from typing import Iterable, Mapping, Sequence

from . import mig
from .holders import kind_of
from .journal import SchedulerJournal
from .model import MIB_PER_GIB, Lease, SliceKind
from .offers import Offers
from .store import Store, StoreError, UsageSegment

SECONDS_PER_HOUR = 3600.0
RECENT_SAMPLE_SECONDS = 600.0  # how far back a lease's recent utilisation samples go
RECENT_SAMPLE_POINTS = 120  # and how many of them are kept at most
REPORT_DIMENSIONS = ("user", "group", "model", "kind", "offer", "holder_kind", "day", "reservation")
CALENDAR_WINDOWS = ("calendar_day", "calendar_week", "calendar_month")
_ROLLING = re.compile(r"(\d+(?:\.\d+)?)([hdw])")
_UNIT_SECONDS = {"h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


# ---------------------------------------------------------------- measures
def gpu_share(sl) -> float:
    """How many GPUs a slice amounts to (MIG: compute slices over the GPU's; shared: memory cap
    over GPU memory; whole: the count)."""
    if sl.kind is SliceKind.MIG:
        model = mig.lookup_model(sl.model)
        if model is not None and model.mig_capable:
            full = max(p.compute_slices for p in model.profiles.values())
            return model.profile(sl.profile).compute_slices / full
        found = re.match(r"(\d+)g\.", sl.profile or "")
        return int(found.group(1)) / mig.COMPUTE_SLICES if found else 1.0
    if sl.kind is SliceKind.SHARED:
        return sl.memory_mib / sl.gpu_memory_mib if sl.gpu_memory_mib else 1.0
    return float(len(sl.gpu_uuids))


def memory_gib(sl) -> float:
    """GiB of GPU memory a slice holds (whole GPUs: all of each)."""
    per_gpu = len(sl.gpu_uuids) if sl.kind is SliceKind.WHOLE else 1
    return sl.memory_mib * per_gpu / MIB_PER_GIB


# --------------------------------------------------------------------- time
def utc_day(t: float) -> str:
    """The UTC date of POSIX time `t`, e.g. '2026-12-05': by day number (a POSIX day is 86,400 s),
    except within a millisecond of midnight, where datetime's rounding to microseconds decides."""
    day, into = divmod(t, 86400)
    if 0.001 < into < 86399.999:
        return _day_name(int(day))
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d")


@lru_cache(maxsize=64)
def _day_name(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, timezone.utc).strftime("%Y-%m-%d")


def next_midnight(t: float) -> float:
    """The first UTC midnight strictly after t: by day number, as utc_day (it runs twice for every
    lease on every heartbeat), except within a millisecond of midnight, where datetime decides."""
    day, into = divmod(t, 86400)
    if 0.001 < into < 86399.999:
        return (day + 1) * 86400.0
    midnight = datetime.fromtimestamp(t, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
    return (midnight + timedelta(days=1)).timestamp()


def _span(template: UsageSegment, start: float, end: float) -> UsageSegment:
    """`template` over [start, end) of one UTC day: dataclasses.replace's result without its
    introspection of every field (this runs for every lease on every heartbeat)."""
    t = template
    return UsageSegment(lease_id=t.lease_id, start=start, end=end, day=utc_day(start), user=t.user, groups=t.groups,
                        model=t.model, kind=t.kind, offer=t.offer, holder_kind=t.holder_kind, gpus=t.gpus, gib=t.gib)


@dataclass(frozen=True)
class Window:
    """A usage window: rolling (`seconds` back from now) or a calendar period in UTC."""

    name: str
    seconds: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "Window":
        if text in CALENDAR_WINDOWS:
            return cls(text)
        found = _ROLLING.fullmatch(text) if isinstance(text, str) else None
        if found is None or float(found.group(1)) <= 0:
            raise ValueError(f"window {text!r}: use a rolling length like '24h', '7d', '2w' "
                             f"or one of {', '.join(CALENDAR_WINDOWS)}")
        return cls(text, float(found.group(1)) * _UNIT_SECONDS[found.group(2)])

    @property
    def rolling(self) -> bool:
        return self.name not in CALENDAR_WINDOWS

    def bounds(self, now: float) -> tuple[float, float | None]:
        """(start, end) of the window containing now; a rolling window has no end."""
        if self.rolling:
            return now - self.seconds, None
        t = datetime.fromtimestamp(now, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        if self.name == "calendar_day":
            start, end = t, t + timedelta(days=1)
        elif self.name == "calendar_week":
            start = t - timedelta(days=t.weekday())
            end = start + timedelta(days=7)
        else:
            start = t.replace(day=1)
            end = (start + timedelta(days=32)).replace(day=1)
        return start.timestamp(), end.timestamp()

    def longest_seconds(self) -> float:
        """The furthest back this window ever reaches."""
        return self.seconds if self.rolling else {"calendar_day": 1, "calendar_week": 7,
                                                  "calendar_month": 31}[self.name] * 86400.0

    def describe(self) -> str:
        if self.rolling:
            return f"in the last {self.name}"
        return {"calendar_day": "today", "calendar_week": "this week", "calendar_month": "this month"}[self.name]


def parse_quota(who: str, entry: dict) -> tuple[float, Window, str]:
    """(GPU-hours, window, 'user' or 'group') of one usage_quotas entry; ValueError names the problem."""
    if not isinstance(entry, dict):
        raise ValueError(f"usage quota for {who!r} must be a dict")
    unknown = set(entry) - {"gpu_hours", "window", "per"}
    if unknown:
        raise ValueError(f"usage quota for {who!r}: unknown key {sorted(unknown)[0]!r} (use gpu_hours, window, per)")
    hours = entry.get("gpu_hours")
    if isinstance(hours, bool) or not isinstance(hours, (int, float)) or hours < 0:
        raise ValueError(f"usage quota for {who!r}: gpu_hours must be a non-negative number")
    per = entry.get("per", "user")
    if per not in ("user", "group"):
        raise ValueError(f"usage quota for {who!r}: per must be 'user' or 'group'")
    if per == "group" and who == "*":
        raise ValueError("usage quota '*' applies to each user: it cannot be per group")
    try:
        window = Window.parse(entry.get("window", "7d"))
    except ValueError as err:
        raise ValueError(f"usage quota for {who!r}: {err}") from None
    return float(hours), window, per


def format_time(t: float) -> str:
    """'Mon 2026-12-07 00:00 UTC'."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%a %Y-%m-%d %H:%M UTC")


# ------------------------------------------------------------------ verdicts
@dataclass(frozen=True)
class QuotaStatus:
    """Where one user or group stands against one usage quota."""

    scope: str  # "user" or "group"
    who: str
    limit: float
    window: Window
    used: float
    resets_at: float | None  # calendar: the window's end; rolling: when usage falls under the limit
    warn_fraction: float  # the policy's usage_warn_fraction: from it the quota's leases are warned

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit else float("inf")

    @property
    def standing(self) -> str:
        """'exceeded' at the limit, 'warning' from warn_fraction of it, else 'ok': running leases the
        quota counts against get the event usage.<standing> (none when ok)."""
        if self.fraction >= 1.0:
            return "exceeded"
        return "warning" if self.fraction >= self.warn_fraction else "ok"

    def sentence(self) -> str:
        owner = "you have" if self.scope == "user" else f"group {self.who} has"
        text = f"{owner} used {self.used:.2f} of {self.limit:g} GPU-hours {self.window.describe()}"
        if self.resets_at is not None:
            verb = "resets" if not self.window.rolling else "falls under the limit"
            text += f" ({verb} {format_time(self.resets_at)})"
        return text

    def to_json(self) -> dict:
        return {"scope": self.scope, "who": self.who, "gpu_hours": round(self.used, 6), "limit": self.limit,
                "window": self.window.name, "resets_at": self.resets_at, "warn_fraction": self.warn_fraction,
                "standing": self.standing, "message": self.sentence()}


@dataclass(frozen=True)
class UsageAction:
    """What a tick decided for one running lease: an event to announce, maybe a release."""

    lease: Lease
    event: str  # "usage.warning" or "usage.exceeded"
    status: QuotaStatus
    release: bool


@dataclass
class _Accrual:
    """A granted lease being accrued: its current segment and how far it is stored."""

    template: UsageSegment
    segment_start: float
    stored_to: float


@dataclass(frozen=True)
class _GpuSignal:
    """The last GPU utilisation sample of a lease, and since when its GPU has been idle."""

    sampled_at: float
    sm_percent: float
    active_at: float


@dataclass
class _Totals:
    gpu_hours: float = 0.0
    gib_hours: float = 0.0
    leases: set = field(default_factory=set)


# -------------------------------------------------------------------- ledger
class UsageLedger:
    """Accrues granted leases into the store and answers reports and usage quotas."""

    def __init__(self, store: Store, policy, offers: Offers, journal: SchedulerJournal, *, now: float):
        """`offers`: the scheduler's, to which each lease's usage is accounted; `journal`: the
        scheduler's, whose changes start and stop accrual."""
        self.store = store
        self._journal = journal
        self.policy = policy
        self._offers = offers
        self._running: dict[str, _Accrual] = {}
        self._gpu: dict[str, _GpuSignal] = {}
        self._samples: dict[str, deque[tuple[float, float]]] = {}  # lease -> (time, SM %) samples
        self._warned: dict[tuple[str, str, str], str] = {}  # (lease, scope, who) -> last event
        self._quotas = [(who, *parse_quota(who, entry)) for who, entry in policy.usage_quotas.items()]
        self._horizon = max((w.longest_seconds() for _, _, w, _ in self._quotas), default=0.0)
        # Stored segments a usage quota may still count, per user and per group.
        self._recent: dict[tuple[str, str], dict[tuple[str, float], UsageSegment]] = {}
        self._pruned_at = now
        if self._horizon:
            self._remember(store.load_usage(now - self._horizon, float("inf")))

    # ------------------------------------------------------------ accrual
    def start(self, lease: Lease, now: float) -> None:
        """Begin accruing a lease just granted (or recovered after a restart) from now."""
        sl = lease.slice
        template = UsageSegment(
            lease_id=lease.id, start=now, end=now, day=utc_day(now), user=lease.user, groups=tuple(lease.groups),
            model=sl.model, kind=sl.kind.value, offer=self._offers.name_of(lease.spec),
            holder_kind=kind_of(lease.holder), gpus=gpu_share(sl), gib=memory_gib(sl))
        self._running[lease.id] = _Accrual(template, now, now)
        self._journal.on_undo(partial(self._running.pop, lease.id, None))

    def accrue(self, leases: Iterable[Lease], now: float, *, keep_if_refused: bool = False) -> None:
        """Store the accrual of these leases up to now (those not being accrued are skipped).

        If the store refuses (now, or the group commit the write waits in), nothing is marked
        stored: StoreError, or with `keep_if_refused` the accrual stays in memory and the next
        accrual the store takes writes it."""
        running = [acc for acc in (self._running.get(lease.id) for lease in leases) if acc is not None]
        marks = [(acc, acc.segment_start, acc.stored_to) for acc in running]

        def unmark() -> None:
            for acc, segment_start, stored_to in marks:
                acc.segment_start, acc.stored_to = segment_start, stored_to
        segments = [seg for lease in leases for seg in self._advance(lease.id, now)]
        try:
            self._save(segments, now)
        except StoreError:
            unmark()
            if not keep_if_refused:
                raise
        if segments:
            self.store.if_refused(unmark)

    def stop(self, lease: Lease, now: float) -> None:
        """Stop accruing a lease; the change's commit writes its final accrual up to its end."""
        acc = self._running.pop(lease.id, None)
        warned = {key: event for key, event in self._warned.items() if key[0] == lease.id}
        for key in warned:
            del self._warned[key]
        self._journal.on_undo(partial(self._restart, lease.id, acc, self._gpu.pop(lease.id, None), warned,
                                      self._samples.pop(lease.id, None)))
        if acc is not None:
            segments = self._pending(acc, now)
            self._journal.write_usage(segments)
            if self._horizon:
                self._remember(segments)

    def _restart(self, lease_id: str, acc: _Accrual | None, signal: _GpuSignal | None, warned: dict,
                 recent: deque | None) -> None:
        """Undo stop(): accrue the lease again from where it was stored to, with its GPU signal, samples and
        warnings."""
        if acc is not None:
            self._running[lease_id] = acc
        if signal is not None:
            self._gpu[lease_id] = signal
        if recent is not None:
            self._samples[lease_id] = recent
        self._warned.update(warned)

    def _advance(self, lease_id: str, now: float) -> list[UsageSegment]:
        """Move a running lease's stored accrual to now: one segment per UTC day touched."""
        acc = self._running.get(lease_id)
        if acc is None:
            return []
        out = []
        for seg in self._pending(acc, now):
            out.append(seg)
            acc.segment_start, acc.stored_to = seg.start, seg.end
        if acc.stored_to >= next_midnight(acc.segment_start):
            acc.segment_start = acc.stored_to
        return out

    @staticmethod
    def _pending(acc: _Accrual, now: float) -> list[UsageSegment]:
        """The segments from the last stored point to now, without storing them."""
        out, start, stored = [], acc.segment_start, acc.stored_to
        while now > stored:
            midnight = next_midnight(start)
            if stored >= midnight:
                start = midnight
                continue
            end = min(now, midnight)
            out.append(_span(acc.template, start, end))
            stored = end
        return out

    def _save(self, segments: list[UsageSegment], now: float) -> None:
        if not segments:
            return
        self.store.save_usage(segments)
        if self._horizon:
            self._remember(segments)

    def _remember(self, segments: Iterable[UsageSegment]) -> None:
        for seg in segments:
            for owner in (("user", seg.user), *(("group", g) for g in seg.groups)):
                self._recent.setdefault(owner, {})[(seg.lease_id, seg.start)] = seg

    def segments(self, since: float, until: float, now: float, user: str | None = None) -> list[UsageSegment]:
        """Stored segments overlapping [since, until) plus running leases' accrual up to now (whose
        current segment replaces the part of it already stored)."""
        pending = [s for acc in self._running.values() if user is None or acc.template.user == user
                   for s in self._pending(acc, now) if s.end > since and s.start < until]
        replaced = {(s.lease_id, s.start) for s in pending}
        stored = self.store.load_usage(since, until, user)
        return [s for s in stored if (s.lease_id, s.start) not in replaced] + pending

    # ------------------------------------------------- GPU-aware idleness
    def sample(self, lease: Lease, sm_percent: float, now: float) -> bool:
        """Record a GPU utilisation sample (SM %) of a granted lease: the GPU-seconds since the last
        sample count as busy in proportion to its utilisation. True when the sample shows the GPU active."""
        acc = self._running.get(lease.id)
        if acc is None:
            return False
        last = self._gpu.get(lease.id)
        if last is not None and now > last.sampled_at:
            held = (now - last.sampled_at) * acc.template.gpus
            self.store.add_busy(lease.id, utc_day(now), lease.user, held * last.sm_percent / 100.0, held)
        active = sm_percent >= self.policy.gpu_idle_threshold
        idle_from = last.active_at if last is not None else acc.template.start
        self._gpu[lease.id] = _GpuSignal(now, sm_percent, now if active else idle_from)
        recent = self._samples.setdefault(lease.id, deque(maxlen=RECENT_SAMPLE_POINTS))
        recent.append((now, sm_percent))
        self._journal.on_undo(recent.pop)
        return active

    def recent_samples(self, lease_id: str, now: float) -> list[tuple[float, float]]:
        """(time, SM %) of a lease's utilisation samples of the last RECENT_SAMPLE_SECONDS, oldest first;
        empty when nothing samples its GPU."""
        return [(at, value) for at, value in self._samples.get(lease_id, ()) if at > now - RECENT_SAMPLE_SECONDS]

    def gpu_decides(self, lease: Lease) -> bool:
        """Whether the GPU alone decides this lease's idleness (idle_signal "gpu" and samples exist)."""
        return self.policy.idle_signal == "gpu" and lease.id in self._gpu

    def idle_since(self, lease: Lease, active_at: float) -> float | None:
        """Since when the lease counts as idle, given its holder's last activity; None when it is not
        idle at all (its holder is busy and that counts). Without GPU samples activity decides."""
        signal = self._gpu.get(lease.id)
        if self.gpu_decides(lease):
            return signal.active_at
        if lease.busy and not self.policy.release_busy:
            return None
        if signal is None or self.policy.idle_signal == "activity":
            return active_at
        return max(active_at, signal.active_at)

    def efficiency(self, since: float, until: float, now: float, user: str | None = None) -> list[dict]:
        """Leases with GPU samples in [since, until): GPU-hours held vs. busy, least efficient first."""
        until = min(until, now)
        busy = self.store.load_busy(utc_day(since), utc_day(until), user)
        if not busy:
            return []
        held: dict[str, dict] = {}
        for seg in self.segments(since, until, now, user):
            if seg.lease_id not in busy:
                continue
            row = held.setdefault(seg.lease_id, {
                "lease_id": seg.lease_id, "user": seg.user, "holder_kind": seg.holder_kind, "model": seg.model,
                "kind": seg.kind, "memory_gib": round(seg.gib, 3), "gpu_hours": 0.0})
            row["gpu_hours"] += max(0.0, min(seg.end, until) - max(seg.start, since)) * seg.gpus / SECONDS_PER_HOUR
        rows = []
        for lease_id, row in held.items():
            busy_hours = busy[lease_id] / SECONDS_PER_HOUR
            share = min(1.0, busy_hours / row["gpu_hours"]) if row["gpu_hours"] else 0.0
            rows.append({**row, "gpu_hours": round(row["gpu_hours"], 6), "busy_gpu_hours": round(busy_hours, 6),
                         "efficiency": round(share, 4),
                         "message": f"{row['user']}'s {row['holder_kind']} holds {row['memory_gib']:g} GiB, "
                                    f"used {share:.0%} of its {row['gpu_hours']:.2f} GPU-hours"})
        return sorted(rows, key=lambda r: (r["efficiency"], -r["gpu_hours"]))

    # ------------------------------------------------------------ reports
    def report(self, since: float, until: float, by: str, now: float, user: str | None = None,
               reservation_of: Mapping[str, str] | None = None) -> list[dict]:
        """GPU-hours and GiB-hours in [since, until) (clipped at now) per value of `by`, largest first
        (days in order).

        A lease of several groups counts fully in each of them; a lease without one under group "".
        By reservation, only the leases `reservation_of` names (lease id -> reservation) count.
        """
        if by not in REPORT_DIMENSIONS:
            raise ValueError(f"by must be one of {', '.join(REPORT_DIMENSIONS)}")
        until = min(until, now)
        totals: dict[str, _Totals] = {}
        for seg in self.segments(since, until, now, user):
            seconds = min(seg.end, until) - max(seg.start, since)
            if seconds <= 0:
                continue
            if by == "reservation":
                keys = (reservation_of[seg.lease_id],) if seg.lease_id in (reservation_of or {}) else ()
            else:
                keys = (seg.groups or ("",)) if by == "group" else (getattr(seg, by),)
            for key in keys:
                t = totals.setdefault(key, _Totals())
                t.gpu_hours += seconds * seg.gpus / SECONDS_PER_HOUR
                t.gib_hours += seconds * seg.gib / SECONDS_PER_HOUR
                t.leases.add(seg.lease_id)
        rows = [{by: key, "gpu_hours": round(t.gpu_hours, 6), "gib_hours": round(t.gib_hours, 6),
                 "leases": len(t.leases)} for key, t in totals.items()]
        if by == "day":
            return sorted(rows, key=lambda r: r["day"])
        return sorted(rows, key=lambda r: (-r["gpu_hours"], r[by]))

    def history(self, since: float, until: float, now: float, user: str | None = None) -> list[dict]:
        """GPU-hours per UTC day in [since, until) (clipped at now), days in order, each split by offer
        (largest first; "" for requests of no offer); days without use are left out."""
        until = min(until, now)
        days: dict[str, dict[str, float]] = {}
        for seg in self.segments(since, until, now, user):
            seconds = min(seg.end, until) - max(seg.start, since)
            if seconds > 0:
                offers = days.setdefault(seg.day, {})
                offers[seg.offer] = offers.get(seg.offer, 0.0) + seconds * seg.gpus / SECONDS_PER_HOUR
        out = []
        for day, offers in sorted(days.items()):
            ranked = sorted(offers.items(), key=lambda o: (-o[1], o[0]))
            out.append({"day": day, "gpu_hours": round(sum(offers.values()), 6),
                        "offers": {name: round(hours, 6) for name, hours in ranked}})
        return out

    def totals(self, now: float) -> dict[tuple[str, str, str, str], float]:
        """All-time GPU-hours per (user, group, model, kind), running leases up to now; a lease
        counts in each of its groups, one without a group under group ""."""
        out: dict[tuple[str, str, str, str], float] = {}

        def add(user: str, groups: Sequence[str], model: str, kind: str, gpu_seconds: float) -> None:
            for group in groups or ("",):
                key = (user, group, model, kind)
                out[key] = out.get(key, 0.0) + gpu_seconds / SECONDS_PER_HOUR

        for user, groups, model, kind, gpu_seconds in self.store.usage_totals():
            add(user, json.loads(groups), model, kind, gpu_seconds)
        for acc in self._running.values():
            for seg in self._pending(acc, now):  # only what is not stored yet
                add(seg.user, seg.groups, seg.model, seg.kind, (seg.end - max(seg.start, acc.stored_to)) * seg.gpus)
        return out

    # ------------------------------------------------------------- quotas
    def quotas_for(self, user: str, groups: Sequence[str], now: float,
                   known: dict | None = None) -> list[QuotaStatus]:
        """Every usage quota that applies to this user (their own or their groups'), with its use now
        (`known`: statuses already worked out at this time, reused and added to)."""
        own = [q for q in self._quotas if q[3] == "user" and q[0] == user] or \
              [q for q in self._quotas if q[3] == "user" and q[0] == "*"]
        mine = [q for q in self._quotas if q[3] == "group" and q[0] in groups]
        known = {} if known is None else known
        out = []
        for who, limit, window, per in own + mine:
            key = (per, who if per == "group" else user, limit, window)
            if key not in known:
                known[key] = self._status(key[1], limit, window, per, now)
            out.append(known[key])
        return out

    def _status(self, who: str, limit: float, window: Window, per: str, now: float) -> QuotaStatus:
        start, end = window.bounds(now)
        used = self._used(who, per, start, now, now)
        resets = end
        if window.rolling and used >= limit:
            resets = self._rolling_reset(who, per, window, limit, now)
        return QuotaStatus(per, who, limit, window, used, resets, self.policy.usage_warn_fraction)

    def _matching(self, who: str, per: str, now: float) -> list[UsageSegment]:
        """The user's or group's stored segments within the horizon, and its running leases' accrual since."""
        segs = dict(self._recent.get((per, who), {}))
        for acc in self._running.values():
            if (acc.template.user == who) if per == "user" else (who in acc.template.groups):
                segs.update(((seg.lease_id, seg.start), seg) for seg in self._pending(acc, now))
        return list(segs.values())

    def _used(self, who: str, per: str, since: float, until: float, now: float) -> float:
        total = 0.0
        for seg in self._matching(who, per, now):
            seconds = min(seg.end, until) - max(seg.start, since)
            if seconds > 0:
                total += seconds * seg.gpus
        return total / SECONDS_PER_HOUR

    def _rolling_reset(self, who: str, per: str, window: Window, limit: float, now: float) -> float:
        """When, if nothing more ran, usage in the rolling window first falls under the limit (to 1 s)."""
        segs = self._matching(who, per, now)

        def used_at(t: float) -> float:
            return sum(max(0.0, min(s.end, t) - max(s.start, t - window.seconds)) * s.gpus
                       for s in segs) / SECONDS_PER_HOUR

        low, high = now, now + window.seconds
        while high - low > 1.0:
            mid = (low + high) / 2
            if used_at(mid) < limit:
                high = mid
            else:
                low = mid
        return float(round(high))

    def refusal(self, user: str, groups: Sequence[str], now: float, known: dict | None = None) -> QuotaStatus | None:
        """The usage quota a request of this user would start over (or at) the limit of, or None."""
        return next((s for s in self.quotas_for(user, groups, now, known) if s.used >= s.limit), None)

    def enforce(self, leases: Iterable[Lease], now: float) -> list[UsageAction]:
        """Warn running leases whose quota passed the warning fraction, and at the limit warn or
        release them as `usage_enforcement` says (jobs only when `usage_release_jobs`)."""
        if not self._quotas:
            return []
        if now - self._pruned_at >= SECONDS_PER_HOUR:
            self._recent = {owner: {k: seg for k, seg in segs.items() if seg.end >= now - self._horizon}
                            for owner, segs in self._recent.items()}
            self._pruned_at = now
        actions = []
        cache: dict[tuple[str, str], list[QuotaStatus]] = {}
        known: dict = {}
        for lease in leases:
            key = (lease.user, ",".join(lease.groups))
            if key not in cache:
                cache[key] = self.quotas_for(lease.user, lease.groups, now, known)
            for status in cache[key]:
                mark = (lease.id, status.scope, status.who)
                if status.standing == "ok":
                    self._warn(mark, None)
                    continue
                event = f"usage.{status.standing}"
                release = event == "usage.exceeded" and self.policy.usage_enforcement == "release" and \
                    (kind_of(lease.holder) != "job" or self.policy.usage_release_jobs)
                if self._warned.get(mark) != event or release:
                    self._warn(mark, event)
                    actions.append(UsageAction(lease, event, status, release))
                    if release:
                        break
        return actions

    def _warn(self, mark: tuple[str, str, str], event: str | None) -> None:
        """Remember the last event a lease got for a quota (None: none), put back if the change is undone."""
        before = self._warned.get(mark)
        if before == event:
            return
        self._put_warned(mark, event)
        self._journal.on_undo(partial(self._put_warned, mark, before))

    def _put_warned(self, mark: tuple[str, str, str], event: str | None) -> None:
        if event is None:
            del self._warned[mark]
        else:
            self._warned[mark] = event


def to_csv(rows: list[dict], by: str) -> str:
    """A report as CSV with a header row."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([by, "gpu_hours", "gib_hours", "leases"])
    for row in rows:
        writer.writerow([row[by], row["gpu_hours"], row["gib_hours"], row["leases"]])
    return out.getvalue()
