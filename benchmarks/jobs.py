"""Background jobs in the interactive queue: one mixed day on a simulated fleet, against today's way.

Interactive sessions take their arrival times and durations from one day of the NotebookOS
"sensei" trace (June 2021; ../shared/data/notebookos-sensei-june2021, see its PROVENANCE.md): a
1-GPU event asks for a 10 GiB shared slice of an A100-40GB, a 4- or 8-GPU event for one whole
GPU (the trace has no memory sizes; the cap at one GPU is ours). Batch jobs are synthetic and
seeded: Poisson arrivals over the same day, a whole GPU (60%) or a 20 GiB share (40%), lognormal
durations (median 45 min). Both loads go through the real scheduler core and job book
(`core/scheduler.py`, `core/jobs.py`) on a SQLite store, with simulated time:

* **mixed**: jobs are `batch` leases in the same queue, preemptible (a preempted attempt starts
  over: no checkpoint is assumed), and their slice is the one they asked for;
* **baseline**: every job is run the way a notebook holds a GPU today: an interactive request for
  a whole GPU, held from its grant until it is done, never preempted.

Reported per class: mean and p95 queue wait, how many interactive requests waited at all (and
over a minute), the GPU allocation (time-averaged share of the fleet's GPUs granted), job
turnaround and the GPU-hours lost to preempted attempts.

    python benchmarks/jobs.py [--day 10] [--jobs 150] [--gpus 24] [--seed 7]   (about 3 minutes)

Writes docs/benchmarks/jobs.md; skips (exit 0, a message) when the trace is absent.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend  # noqa: E402
from jupyter_gpualloc.core.jobs import JobRequest, Jobs  # noqa: E402
from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec  # noqa: E402
from jupyter_gpualloc.core.policy import SchedulerPolicy  # noqa: E402
from jupyter_gpualloc.core.scheduler import Scheduler  # noqa: E402
from jupyter_gpualloc.core.store import Store, sqlite_url  # noqa: E402

TRACE_NAME = "notebookos-sensei-june2021/sensei_june_60sec.csv"
MODEL = "A100-SXM4-40GB"
DAY = 24 * 3600.0
SESSION_SHARE = {"kind": "shared", "memory_gib": 10, "model": MODEL}
WHOLE = {"kind": "whole", "model": MODEL}
JOB_SHARE = {"kind": "shared", "memory_gib": 20, "model": MODEL}
SESSION_USERS = 40
JOB_USERS = 8


def trace_path() -> Path:
    """The sensei CSV: under $GPUALLOC_SHARED_DATA, else ../shared/data next to the repository."""
    base = Path(os.environ.get("GPUALLOC_SHARED_DATA", ROOT.parent / "shared" / "data"))
    return base / TRACE_NAME


@dataclass(order=True)
class Arrival:
    time: float
    kind: str = field(compare=False)  # "session" or "job"
    user: str = field(compare=False)
    spec: dict = field(compare=False)
    duration: float = field(compare=False)


def sessions_of_day(path: Path, day: int, rng: random.Random) -> list[Arrival]:
    """The trace's events submitted on `day` (minutes from its first event) as interactive sessions."""
    out = []
    with path.open() as f:
        for row in csv.DictReader(f):
            minute = int(row["submit_time"])
            if minute // 1440 != day:
                continue
            spec = SESSION_SHARE if row["num_gpu"] == "1" else WHOLE
            duration = max(60.0, float(row["duration"]) * 60.0)
            out.append(Arrival((minute - day * 1440) * 60.0 + rng.uniform(0, 60), "session",
                               f"u{rng.randrange(SESSION_USERS)}", spec, duration))
    return out


def synthetic_jobs(n: int, rng: random.Random) -> list[Arrival]:
    out = []
    for _ in range(n):
        spec = WHOLE if rng.random() < 0.6 else JOB_SHARE
        duration = min(8 * 3600.0, rng.lognormvariate(np.log(45 * 60.0), 0.8))
        out.append(Arrival(rng.uniform(0, DAY), "job", f"j{rng.randrange(JOB_USERS)}", spec, duration))
    return out


def fleet(gpus: int) -> dict:
    per_node = 8
    return {"nodes": [{"name": f"n{i}", "cpu_milli": 128000, "memory_mib": 1024 * 1024,
                       "gpus": [{"model": MODEL, "count": per_node}]} for i in range(gpus // per_node)]}


class Day:
    """One simulated day through the core: arrivals, grants, ends, preemptions."""

    def __init__(self, arrivals: list[Arrival], gpus: int, mixed: bool, db_url: str):
        self.mixed = mixed
        self.store = Store(db_url)
        policy = SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0, server_idle_timeout=0, reserve_after=600,
                                 wait_for_holders=False)
        self.scheduler = Scheduler(SimulatedBackend(fleet(gpus)), self.store, policy, now=0.0)
        self.jobs = Jobs(self.scheduler, now=0.0)
        self.gpu_mib = 40 * 1024
        self.heap: list = []
        self.seq = 0
        self.sessions_made = 0
        for a in arrivals:
            self._push(a.time, "arrive", a)
        self.granted: list = []
        self.scheduler.subscribe(self._on_event)
        self.lease_info: dict[str, dict] = {}  # lease id -> what it is
        self.job_info: dict[str, dict] = {}
        self.allocated = 0.0  # GPUs allocated now
        self.last_t = 0.0
        self.gpu_seconds = 0.0  # integral of allocated GPUs over [0, DAY]
        self.wasted_gpu_s = 0.0

    def _push(self, t: float, what: str, payload) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, what, payload))

    def _weight(self, slice_: dict) -> float:
        if slice_["kind"] == "shared":
            return slice_["memory_mib"] / self.gpu_mib
        return float(len(slice_["gpu_uuids"]))

    def _advance(self, t: float) -> None:
        end = min(t, DAY)
        if end > self.last_t:
            self.gpu_seconds += self.allocated * (end - self.last_t)
            self.last_t = end

    def _on_event(self, event) -> None:
        if event.type == "lease.granted":
            self.granted.append(event)
            self.allocated += self._weight(event.data["slice"])
            self.lease_info.setdefault(event.lease_id, {})["weight"] = self._weight(event.data["slice"])
            self.lease_info[event.lease_id]["granted_at"] = event.time
        elif event.type in ("lease.released", "lease.preempted", "lease.expired"):
            info = self.lease_info.get(event.lease_id, {})
            if "weight" in info:
                self.allocated -= info["weight"]
                if event.type == "lease.preempted":
                    self.wasted_gpu_s += info["weight"] * (event.time - info["granted_at"])

    def run(self) -> dict:
        sessions: list[dict] = []
        started = time.perf_counter()
        while self.heap:
            t, _, what, payload = heapq.heappop(self.heap)
            self._advance(t)
            if what == "arrive":
                self._arrive(payload, t, sessions)
            elif what == "end_lease":
                if self.scheduler.lease(payload).state is LeaseState.GRANTED:
                    self.scheduler.release(payload, now=t)
            elif what == "end_job":
                job_id, attempt = payload
                job = self.jobs.job(job_id)
                if job.state.value == "running" and job.attempts == attempt:
                    self.jobs.finish(job_id, attempt, "succeeded", now=t)
                    self.job_info[job_id]["done"] = t
            self._settle(t)
        self._advance(DAY)
        elapsed = time.perf_counter() - started
        self.store.close()
        return {"sessions": sessions, "jobs": list(self.job_info.values()), "elapsed_s": elapsed,
                "gpu_seconds": self.gpu_seconds, "wasted_gpu_s": self.wasted_gpu_s}

    def _arrive(self, a: Arrival, t: float, sessions: list[dict]) -> None:
        if a.kind == "session" or not self.mixed:
            spec = a.spec if a.kind == "session" else WHOLE
            self.sessions_made += 1
            holder = f"kernel:{self.sessions_made}"
            lease = self.scheduler.submit(a.user, holder, SliceSpec.from_json(spec), PriorityClass.INTERACTIVE,
                                          now=t, wait=True, preemptible=False)
            record = {"kind": a.kind, "arrived": t, "duration": a.duration, "lease": lease.id}
            self.lease_info.setdefault(lease.id, {})["record"] = record
            if a.kind == "session":
                sessions.append(record)
            else:
                self.job_info[lease.id] = record
            return
        request = JobRequest.from_json({"spec": a.spec, "workdir": "/sim", "source": {"kind": "cell", "code": "x"}})
        job = self.jobs.submit(a.user, request, now=t)
        self.job_info[job.id] = {"kind": "job", "arrived": t, "duration": a.duration, "job": job.id}

    def _settle(self, t: float) -> None:
        """Start what was granted (sessions hold their slice; jobs are claimed at once), until quiet."""
        while True:
            self.jobs.tick(t)
            if not self.granted:
                return
            events, self.granted = self.granted, []
            for event in events:
                holder = event.data["holder"]
                if holder.startswith("job:"):
                    job = self.jobs.start(holder[4:], now=t)
                    info = self.job_info[job.id]
                    info.setdefault("first_start", t)
                    self._push(t + info["duration"], "end_job", (job.id, job.attempts))
                else:
                    record = self.lease_info[event.lease_id]["record"]
                    record["granted"] = t
                    self._push(t + record["duration"], "end_lease", event.lease_id)
                    if record["kind"] == "job":
                        record["first_start"] = t
                        record["done_at"] = t + record["duration"]


def summarise(result: dict, gpus: int) -> dict:
    sessions = [s for s in result["sessions"] if "granted" in s]
    waits = np.array([s["granted"] - s["arrived"] for s in sessions])
    jobs = [j for j in result["jobs"] if "first_start" in j]
    job_waits = np.array([j["first_start"] - j["arrived"] for j in jobs])
    turnaround = np.array([(j.get("done") or j.get("done_at")) - j["arrived"] for j in jobs
                           if j.get("done") or j.get("done_at")])
    return {
        "sessions": len(result["sessions"]), "sessions_granted": len(sessions),
        "session_wait_mean": waits.mean(), "session_wait_p95": np.percentile(waits, 95),
        "sessions_waited": int((waits > 0).sum()), "sessions_waited_1m": int((waits > 60).sum()),
        "jobs": len(result["jobs"]), "jobs_started": len(jobs),
        "job_wait_mean": job_waits.mean(), "job_wait_p95": np.percentile(job_waits, 95),
        "job_turnaround_mean": turnaround.mean() if len(turnaround) else float("nan"),
        "allocation": result["gpu_seconds"] / (gpus * DAY),
        "wasted_gpu_h": result["wasted_gpu_s"] / 3600, "elapsed_s": result["elapsed_s"],
    }


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--day", type=int, default=10, help="day of the trace (0-29)")
    parser.add_argument("--jobs", type=int, default=150, help="batch jobs over the day")
    parser.add_argument("--gpus", type=int, default=24, help="A100-40GB GPUs, 8 per node")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "jobs.md")
    args = parser.parse_args()
    path = trace_path()
    if not path.is_file():
        print(f"skipped: the sensei trace is not at {path} (set GPUALLOC_SHARED_DATA)")
        return 0
    results = {}
    for mode in ("baseline", "mixed"):
        rng = random.Random(args.seed)
        arrivals = sorted(sessions_of_day(path, args.day, rng) + synthetic_jobs(args.jobs, rng))
        with tempfile.TemporaryDirectory() as tmp:
            day = Day(arrivals, args.gpus, mode == "mixed", sqlite_url(Path(tmp) / "day.sqlite"))
            results[mode] = summarise(day.run(), args.gpus)
        print(mode, {k: round(v, 3) if isinstance(v, float) else v for k, v in results[mode].items()}, flush=True)
    b, m = results["baseline"], results["mixed"]
    rows = [
        ("interactive sessions (granted)", f"{b['sessions']} ({b['sessions_granted']})",
         f"{m['sessions']} ({m['sessions_granted']})"),
        ("interactive wait, mean", minutes(b["session_wait_mean"]), minutes(m["session_wait_mean"])),
        ("interactive wait, p95", minutes(b["session_wait_p95"]), minutes(m["session_wait_p95"])),
        ("interactive requests that waited (over 1 min)", f"{b['sessions_waited']} ({b['sessions_waited_1m']})",
         f"{m['sessions_waited']} ({m['sessions_waited_1m']})"),
        ("jobs (started)", f"{b['jobs']} ({b['jobs_started']})", f"{m['jobs']} ({m['jobs_started']})"),
        ("job wait, mean", minutes(b["job_wait_mean"]), minutes(m["job_wait_mean"])),
        ("job wait, p95", minutes(b["job_wait_p95"]), minutes(m["job_wait_p95"])),
        ("job turnaround, mean", minutes(b["job_turnaround_mean"]), minutes(m["job_turnaround_mean"])),
        ("GPU allocation (time-averaged share of the fleet)", f"{b['allocation']:.1%}", f"{m['allocation']:.1%}"),
        ("GPU-hours lost to preempted attempts", f"{b['wasted_gpu_h']:.1f}", f"{m['wasted_gpu_h']:.1f}"),
        ("simulation time", f"{b['elapsed_s']:.0f} s", f"{m['elapsed_s']:.0f} s"),
    ]
    lines = [
        "## Background jobs in the interactive queue",
        "",
        f"`python benchmarks/jobs.py --day {args.day} --jobs {args.jobs} --gpus {args.gpus} --seed {args.seed}`: "
        f"day {args.day} of the NotebookOS sensei trace as interactive sessions (1-GPU events: 10 GiB shares; "
        f"4/8-GPU events: one whole GPU) plus {args.jobs} synthetic batch jobs (60% whole GPU, 40% 20 GiB "
        f"shares, lognormal durations, median 45 min) on {args.gpus} A100-40GB GPUs, through the real core. "
        "**Baseline**: every job is a notebook holding a whole GPU (interactive, never preempted). "
        "**Mixed**: jobs are preemptible batch leases of the slice they asked for, in the same queue; "
        "a preempted attempt starts over. Queue waits are to the first grant (sessions) or first start (jobs); "
        "sessions and jobs still running at midnight run on until they are done.",
        "",
        "| | baseline (whole GPU per job) | mixed (batch jobs) |",
        "|---|---|---|",
        *[f"| {name} | {left} | {right} |" for name, left, right in rows],
        "",
        f"Reading: with jobs in the batch class, {m['sessions_waited']} interactive requests waited instead of "
        f"{b['sessions_waited']} (p95 wait {minutes(m['session_wait_p95'])} instead of "
        f"{minutes(b['session_wait_p95'])}). The jobs pay for it: mean turnaround "
        f"{minutes(m['job_turnaround_mean'])} instead of {minutes(b['job_turnaround_mean'])}, and "
        f"{m['wasted_gpu_h']:.1f} GPU-hours went to attempts preempted before they finished (restarted from "
        "scratch here; a job that checkpoints on SIGTERM within `preempt_grace` loses far less).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
