"""Notebook sessions through the core: GPU-hours held vs. busy, and the queue wait they buy.

    python benchmarks/usage_sessions.py [--days 1] [--nodes 10] [--seed 15]

GPU bursts (arrival, GPU count, duration) come from the NotebookOS sensei trace
(shared/data/notebookos-sensei-june2021/sensei_june_60sec.csv: one row per training burst, times
in minutes, no session ids). The trace has no session boundaries, so sessions are modelled, as
stated in the report: a session is 1 + Geometric(1/2) consecutive rows of the same GPU count
(mean 2 bursts); it asks for its whole GPUs at its first row's submit time; after each burst the
user keeps working without the GPU for an Exponential(mean 15 min) gap, and after the last one
leaves the notebook open and idle for an Exponential(mean 45 min) linger, then closes it. The
user's activity (touches) continues through gaps and stops in the linger. Each session runs a
notebook process on each of its GPUs in the simulated backend, at 90% SM utilisation during bursts
and 0% otherwise; its lease is sampled from the backend as the watchdog does (slice_utilization)
at each burst's start and end and every poll. A lease lost to idleness or a deadline is asked for
again at the next burst, which waits in the queue like any request.

Four policies, each in the same run over the same sessions: idle release on activity (30 min +
5 min grace), the same with 4 h time-boxed leases (a busy user extends, at most twice by 2 h),
GPU-aware idleness (idle_signal = "gpu", same timeout), and both. Writes
docs/benchmarks/usage.md; skips with a message when the trace is absent.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import itertools
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from jupyter_gpualloc.core.deadlines import ExtensionRefused
from jupyter_gpualloc.core.devices.base import slice_utilization
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import LeaseState, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

HERE = Path(__file__).resolve().parent
DOCS = HERE.parent / "docs" / "benchmarks"
TRACE = HERE.parent.parent / "shared" / "data" / "notebookos-sensei-june2021" / "sensei_june_60sec.csv"
MINUTE = 60.0
POLL = 10 * MINUTE  # how often a session's holder touches its lease and its GPU is sampled
BUSY_SM = 90.0  # SM utilisation of a notebook's process during a burst (0 otherwise)
BASE = {"heartbeat_ttl": 0, "idle_timeout": 30 * MINUTE, "idle_grace": 5 * MINUTE, "preemption": False,
        "wait_for_holders": False}  # a kernel whose lease ended is shut down at once
POLICIES = {
    "activity idle release": {},
    "+ 4 h time-boxed leases": {"max_duration": {"kernel": 4 * 3600}, "max_extensions": 2, "extension": 7200},
    "GPU-aware idle release": {"idle_signal": "gpu"},
    "GPU-aware + time-boxed": {"idle_signal": "gpu", "max_duration": {"kernel": 4 * 3600}, "max_extensions": 2,
                               "extension": 7200},
}


@dataclass
class Session:
    """A notebook: its bursts (GPU count, seconds) and the idle gaps after each."""

    id: int
    start: float
    gpus: int
    bursts: list[float]
    gaps: list[float]
    lease_id: str | None = None
    burst: int = 0
    running_until: float | None = None
    remaining: float = 0.0
    wants_since: float | None = None
    phase: str = "waiting"  # waiting, burst, gap, linger, done
    waits: list[float] = field(default_factory=list)
    busy_gpu_seconds: float = 0.0


def load_sessions(path: Path, days: float, seed: int) -> list[Session]:
    rows = []
    with open(path) as fh:
        for row in csv.DictReader(fh):
            submit = float(row["submit_time"]) * MINUTE
            if submit < days * 86400:
                rows.append((submit, int(row["num_gpu"]), max(1.0, float(row["duration"])) * MINUTE))
    rows.sort()
    rng = random.Random(seed)
    pending: dict[int, list[tuple[float, int, float]]] = {}
    for row in rows:
        pending.setdefault(row[1], []).append(row)
    sessions = []
    for gpus, group in pending.items():
        i = 0
        while i < len(group):
            size = 1
            while rng.random() < 0.5:
                size += 1
            part = group[i:i + size]
            gaps = [rng.expovariate(1 / (15 * MINUTE)) for _ in part[:-1]] + [rng.expovariate(1 / (45 * MINUTE))]
            sessions.append(Session(len(sessions), part[0][0], gpus, [p[2] for p in part], gaps))
            i += size
    sessions.sort(key=lambda s: s.start)
    for n, s in enumerate(sessions):
        s.id = n
    return sessions


def fleet(nodes: int) -> dict:
    return {"nodes": [{"name": f"n{i}", "cpu_milli": 128000, "memory_mib": 1024 * 1024,
                       "gpus": [{"model": "A100-SXM4-80GB", "count": 8}]} for i in range(nodes)]}


class Replay:
    """One policy over the sessions: an event loop driving the scheduler with injected time."""

    def __init__(self, sessions: list[Session], nodes: int, policy: dict, end: float):
        self.sessions = [Session(s.id, s.start, s.gpus, list(s.bursts), list(s.gaps)) for s in sessions]
        self.end = end
        self.backend = SimulatedBackend(fleet(nodes))
        self.scheduler = Scheduler(self.backend, Store("sqlite://"), SchedulerPolicy(**BASE, **policy), now=0.0)
        self.by_lease: dict[str, Session] = {}
        self.events: list[tuple[float, int, str, int]] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.scheduler.subscribe(self.hear)

    def at(self, t: float, what: str, session: Session) -> None:
        heapq.heappush(self.events, (t, next(self.counter), what, session.id))

    def hear(self, event) -> None:
        session = self.by_lease.get(event.lease_id)
        if session is None:
            return
        if event.type == "lease.granted":
            self.at(self.now, "granted", session)
        elif event.type in ("lease.expired", "lease.preempted") and session.lease_id == event.lease_id:
            session.lease_id = None  # at once: events already queued for this lease must not use it
            self.at(self.now, "lost", session)
        elif event.type == "lease.deadline_warning" and session.phase == "burst" \
                and event.data.get("extensions_left", 0) > 0:
            self.at(self.now, "extend", session)

    def run(self) -> dict:
        for s in self.sessions:
            self.at(s.start, "want", s)
        next_tick = 0.0
        started = time.perf_counter()
        while self.events and self.events[0][0] <= self.end:
            t, _, what, sid = heapq.heappop(self.events)
            while next_tick <= t:
                self.now = next_tick
                self.scheduler.tick(next_tick)
                next_tick += MINUTE
            self.now = t
            getattr(self, "_" + what)(self.sessions[sid])
        self.now = self.end
        self.scheduler.tick(self.end)
        for s in self.sessions:  # the replay ends: every lease's accrual is stored up to the end
            if s.lease_id is not None:
                self.scheduler.release(s.lease_id, now=self.end)
        return self.result(time.perf_counter() - started)

    # ------------------------------------------------------------ session events
    def _want(self, s: Session) -> None:
        """The session needs its GPUs now (its first burst, or a burst after losing its lease)."""
        s.phase, s.wants_since = "waiting", self.now
        lease = self.scheduler.submit(f"u{s.id % 200}", f"kernel:{s.id}-{len(s.waits)}",
                                      SliceSpec.from_json({"kind": "whole", "count": s.gpus}), now=self.now)
        s.lease_id = lease.id
        self.by_lease[lease.id] = s
        if lease.state is LeaseState.GRANTED:
            self.at(self.now, "granted", s)

    def _granted(self, s: Session) -> None:
        if s.phase != "waiting" or s.wants_since is None:
            return
        s.waits.append(self.now - s.wants_since)
        s.wants_since = None
        self._start_burst(s)

    def _start_burst(self, s: Session) -> None:
        s.phase = "burst"
        s.remaining = s.remaining or s.bursts[s.burst]
        s.running_until = self.now + s.remaining
        self._gpu_work(s, BUSY_SM)
        self._sample(s)
        self.scheduler.touch(s.lease_id, now=self.now, last_activity=self.now, busy=True)
        self.at(s.running_until, "burst_end", s)
        self.at(self.now + POLL, "poll", s)

    def _burst_end(self, s: Session) -> None:
        if s.phase != "burst" or s.running_until != self.now:
            return
        s.busy_gpu_seconds += s.remaining * s.gpus
        s.remaining, s.running_until = 0.0, None
        self._sample(s)  # busy until now
        self._gpu_work(s, 0.0)
        self.scheduler.touch(s.lease_id, now=self.now, last_activity=self.now, busy=False)
        last = s.burst == len(s.bursts) - 1
        s.phase = "linger" if last else "gap"
        self.at(self.now + s.gaps[s.burst], "close" if last else "next", s)
        s.burst += 0 if last else 1

    def _next(self, s: Session) -> None:
        if s.phase != "gap":
            return
        if s.lease_id is None:
            self._want(s)
        else:
            self._start_burst(s)

    def _close(self, s: Session) -> None:
        if s.lease_id is not None:
            self.scheduler.release(s.lease_id, now=self.now)
        self._gpu_work(s, None)
        s.phase, s.lease_id = "done", None

    def _poll(self, s: Session) -> None:
        if s.lease_id is None or s.phase in ("done", "waiting"):
            return
        in_burst = s.phase == "burst"
        self._sample(s)
        if s.phase != "linger":
            self.scheduler.touch(s.lease_id, now=self.now, last_activity=self.now, busy=in_burst)
        self.at(self.now + POLL, "poll", s)

    def _gpu_work(self, s: Session, sm_percent: float | None) -> None:
        """The session's notebook process on each GPU of its lease, keeping `sm_percent` of its SMs
        busy (None: the process ended), as the simulated backend reports it."""
        gpus = self.scheduler.lease(s.lease_id).slice.gpu_uuids if sm_percent is not None else []
        for n in range(8):
            pid = s.id * 8 + n + 1
            if n < len(gpus):
                self.backend.run_process(pid, gpus[n], 1024, sm_percent=sm_percent)
            else:
                self.backend.end_process(pid)

    def _sample(self, s: Session) -> None:
        """What a watchdog would report: the session's processes' share of its slice, from the backend."""
        lease = self.scheduler.lease(s.lease_id)
        pids = {s.id * 8 + n + 1 for n in range(len(lease.slice.gpu_uuids))}
        value = slice_utilization(lease.slice.to_json(), pids, self.backend.utilization(self.now))
        if value is not None:
            self.scheduler.sample_gpu(s.lease_id, now=self.now, sm_percent=value)

    def _extend(self, s: Session) -> None:
        if s.lease_id is not None and s.phase == "burst":
            try:
                self.scheduler.extend(s.lease_id, now=self.now)
            except ExtensionRefused:
                pass  # others wait: the lease ends at its deadline and the burst asks again

    def _lost(self, s: Session) -> None:
        """The lease ended by policy: a running burst stops and resumes when a new lease is granted."""
        self._gpu_work(s, None)
        if s.phase == "burst":
            done = self.now - (s.running_until - s.remaining)
            s.busy_gpu_seconds += done * s.gpus
            s.remaining -= done
            s.running_until = None
            self._want(s)
        elif s.phase == "linger":
            s.phase = "done"

    # ------------------------------------------------------------------ result
    def result(self, elapsed: float) -> dict:
        rows = self.scheduler.usage.report(0.0, self.end, "user", self.end)
        held = sum(r["gpu_hours"] for r in rows)
        busy = sum(s.busy_gpu_seconds for s in self.sessions) / 3600
        for s in self.sessions:  # bursts still running at the end count up to the end
            if s.phase == "burst" and s.running_until is not None:
                busy += (self.end - (s.running_until - s.remaining)) * s.gpus / 3600
        waits = np.array([w for s in self.sessions for w in s.waits]) / MINUTE
        unserved = sum(1 for s in self.sessions if s.wants_since is not None)
        return {"held": held, "busy": busy, "waits": waits, "unserved": unserved,
                "requests": len(waits) + unserved, "elapsed": elapsed}


def write_report(path: Path, sessions: list[Session], args, results: dict[str, dict]) -> None:
    bursts = sum(len(s.bursts) for s in sessions)
    lines = [
        "## GPU-hours held vs. busy: notebook sessions from the NotebookOS sensei trace", "",
        f"`python benchmarks/usage_sessions.py --days {args.days:g} --nodes {args.nodes} --seed {args.seed}`: "
        f"the first {args.days:g} day(s) of the trace ({bursts} bursts of 1, 4 or 8 GPUs) as {len(sessions)} "
        f"sessions on {args.nodes} nodes of 8 whole A100-80GB ({args.nodes * 8} GPUs), replayed through "
        "the scheduler core with injected time (one tick a minute).", "",
        "Sessions are modelled (the trace has none): 1 + Geometric(1/2) consecutive bursts of one GPU "
        "count, Exponential(mean 15 min) working gaps between bursts with the user active and the GPU "
        "idle, and an Exponential(mean 45 min) idle linger after the last burst before the notebook is "
        "closed. The notebook's processes keep 90% of their GPUs' SMs busy in bursts and 0% otherwise, as "
        "the simulated backend reports them; the lease is sampled at each burst's start and end and, with "
        "activity, every 10 minutes. A burst whose lease was released asks again and waits in the queue.", "",
        "| policy | GPU-hours held | GPU-hours busy | busy / held | requests | waited | "
        "wait p50 (min) | wait p95 (min) | wait mean (min) | still waiting at the end | run time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        w = r["waits"]
        waited = int((w > 0).sum())
        lines.append(
            f"| {name} | {r['held']:.0f} | {r['busy']:.0f} | {r['busy'] / r['held']:.0%} | {r['requests']} | "
            f"{waited} | {np.percentile(w, 50):.1f} | {np.percentile(w, 95):.1f} | {w.mean():.1f} | "
            f"{r['unserved']} | {r['elapsed']:.0f} |")
    base_name, base = next(iter(results.items()))
    lines += [""] + [
        f"- {name}: {r['held'] / base['held'] - 1:+.0%} GPU-hours held and "
        f"{r['waits'].mean() - base['waits'].mean():+.1f} min mean wait against {base_name}."
        for name, r in list(results.items())[1:]]
    lines += ["", "GPU-hours held come from the core's usage ledger (leases still open at the end are "
                  "released then); busy ones from the replay (GPUs × burst time actually run). Waits are "
                  "per request, from the moment a session needed its GPUs to the grant; requests still "
                  "waiting at the end are left out of the percentiles.", ""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--days", type=float, default=1.0, help="how many days of the trace to replay")
    parser.add_argument("--nodes", type=int, default=10, help="nodes of 8 whole GPUs")
    parser.add_argument("--seed", type=int, default=15, help="seed of the session model")
    parser.add_argument("--trace", type=Path, default=TRACE, help="the sensei CSV")
    parser.add_argument("--out", type=Path, default=DOCS / "usage.md", help="where the section goes")
    args = parser.parse_args()
    if not args.trace.is_file():
        print(f"skipped: the NotebookOS sensei trace is not at {args.trace}")
        return 0
    sessions = load_sessions(args.trace, args.days, args.seed)
    results = {}
    for name, policy in POLICIES.items():
        results[name] = Replay(sessions, args.nodes, policy, args.days * 86400).run()
        r = results[name]
        print(f"{name:>26}: held {r['held']:.0f} GPU-h, busy {r['busy']:.0f} GPU-h, "
              f"mean wait {r['waits'].mean():.1f} min ({r['elapsed']:.0f} s)", flush=True)
    write_report(args.out, sessions, args, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
