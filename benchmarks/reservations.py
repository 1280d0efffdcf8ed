"""A class of 30 at 10:00 on a busy fleet, with and without a reservation (issue 27).

The fleet is kept busy as in benchmarks/jobs.py: one day of the NotebookOS "sensei" trace as
interactive sessions (10 GiB shares or whole A100-40GB GPUs) plus seeded synthetic batch jobs
(preemptible, a preempted attempt starts over), through the real core on a SQLite store, with
simulated time and a scheduler tick every minute. On top, a class of 30 students (group
`students`) arrives between 10:00 and 10:05, each asking for a 10 GiB share, and holds it until
12:00. Runs of the same arrivals:

* **without**: the class queues like everyone else;
* **with**: a reservation `ml101` of 30 x 10 GiB shares for `students`, 10:00-12:00, lead 10 min,
  created at midnight;
* each again with sessions time-boxed (`--session-hours`, policy `max_duration` for kernels): a
  session without a time limit may never be placed on capacity a reservation needs, one that
  ends before the start may.

Reported: the class's time to slice (mean, p95, max, and how many waited over a minute), what it
cost the others (their queue waits from 09:00 to 12:00, the batch attempts preempted and the
GPU-hours those attempts lost), and the simulation time.

    python benchmarks/reservations.py [--day 10] [--jobs 300] [--gpus 16] [--seed 7] [--until 13] [--session-hours 4]

Writes docs/benchmarks/reservations.md; skips (exit 0, a message) when the trace is absent.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from jobs import SESSION_SHARE, Arrival, Day, minutes, sessions_of_day, synthetic_jobs, trace_path  # noqa: E402

from jupyter_gpualloc.core.model import PriorityClass, SliceSpec  # noqa: E402
from jupyter_gpualloc.core.reservations import parse_request  # noqa: E402
from jupyter_gpualloc.core.store import sqlite_url  # noqa: E402

HOUR = 3600.0
START, END = 10 * HOUR, 12 * HOUR
CLASS_SIZE = 30


class ClassDay(Day):
    """benchmarks/jobs.py's mixed day, plus a minute tick and a class arriving at 10:00."""

    def __init__(self, arrivals: list[Arrival], gpus: int, db_url: str, reserve: bool, session_hours: float):
        super().__init__(arrivals, gpus, True, db_url)
        if session_hours:
            self.scheduler.policy.max_duration = {"kernel": session_hours * HOUR}
        self.students: list[dict] = []
        self.preempted_jobs = 0
        self.scheduler.subscribe(self._count_preemptions)
        if reserve:
            self.scheduler.reservations.create(parse_request(
                {"name": "ml101", "groups": ["students"], "spec": SESSION_SHARE, "count": CLASS_SIZE,
                 "start": START, "end": END, "lead_seconds": 600}, "admin", 0.0), 0.0)

    def _count_preemptions(self, event) -> None:
        if event.type == "lease.preempted" and event.data.get("holder", "").startswith("job:"):
            self.preempted_jobs += 1

    def _arrive(self, a: Arrival, t: float, sessions: list[dict]) -> None:
        if a.kind == "tick":
            self.scheduler.tick(t)
            return
        if a.kind != "class":
            super()._arrive(a, t, sessions)
            return
        lease = self.scheduler.submit(a.user, "server", SliceSpec.from_json(a.spec), PriorityClass.INTERACTIVE,
                                      now=t, groups=["students"], preemptible=False)
        record = {"kind": "class", "arrived": t, "duration": END - t, "lease": lease.id}
        self.lease_info.setdefault(lease.id, {})["record"] = record
        self.students.append(record)


def arrivals(args: argparse.Namespace) -> list[Arrival]:
    rng = random.Random(args.seed)
    until = args.until * HOUR
    busy = [a for a in sessions_of_day(trace_path(), args.day, rng) + synthetic_jobs(args.jobs, rng) if a.time < until]
    students = [Arrival(START + rng.uniform(0, 300), "class", f"student{i}", SESSION_SHARE, END - START)
                for i in range(CLASS_SIZE)]
    ticks = [Arrival(t, "tick", "", {}, 0.0) for t in np.arange(60.0, until + 60.0, 60.0)]
    return sorted(busy + students + ticks)


def summarise(day: ClassDay, result: dict) -> dict:
    waits = np.array([s["granted"] - s["arrived"] if "granted" in s else np.inf for s in day.students])
    morning = [s for s in result["sessions"] if 9 * HOUR <= s["arrived"] < END]
    others = np.array([s["granted"] - s["arrived"] for s in morning if "granted" in s])
    return {
        "class_mean": waits.mean(), "class_p95": np.percentile(waits, 95), "class_max": waits.max(),
        "class_waited_1m": int((waits > 60).sum()),
        "others": len(morning), "others_granted": len(others), "others_wait_mean": others.mean(),
        "others_wait_p95": np.percentile(others, 95), "others_waited_1m": int((others > 60).sum()),
        "others_wait_total_h": others.sum() / HOUR,
        "preempted_jobs": day.preempted_jobs, "lost_gpu_h": result["wasted_gpu_s"] / HOUR,
        "elapsed_s": result["elapsed_s"],
    }


def run(args: argparse.Namespace, reserve: bool, session_hours: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        day = ClassDay(arrivals(args), args.gpus, sqlite_url(Path(tmp) / "day.sqlite"), reserve, session_hours)
        return summarise(day, day.run())


def table(args: argparse.Namespace, results: dict[str, dict]) -> list[str]:
    def cells(key, fmt):
        return "| " + " | ".join(fmt(r[key]) for r in results.values()) + " |"

    def wait(x):
        return "never" if not np.isfinite(x) else minutes(x)

    rows = [("class: time to slice, mean", "class_mean", wait), ("class: time to slice, p95", "class_p95", wait),
            ("class: time to slice, max", "class_max", wait),
            ("class: students who waited over 1 min", "class_waited_1m", str),
            ("others (sessions arriving 09:00-12:00): wait, mean", "others_wait_mean", minutes),
            ("others: wait, p95", "others_wait_p95", minutes),
            ("others: sessions that waited over 1 min", "others_waited_1m", str),
            ("others: total wait", "others_wait_total_h", lambda h: f"{h:.2f} h"),
            ("batch attempts preempted (whole day)", "preempted_jobs", str),
            ("GPU-hours those attempts lost", "lost_gpu_h", lambda h: f"{h:.1f}"),
            ("simulation time", "elapsed_s", lambda s: f"{s:.0f} s")]
    return [
        "## A class of 30 at 10:00, with and without a reservation",
        "",
        f"`python benchmarks/reservations.py --day {args.day} --jobs {args.jobs} --gpus {args.gpus} "
        f"--seed {args.seed} --until {args.until} --session-hours {args.session_hours:g}`: day {args.day} of the sensei trace and {args.jobs} synthetic "
        f"batch jobs (as in benchmarks/jobs.py, mixed mode, arrivals until {args.until}:00) on {args.gpus} "
        f"A100-40GB GPUs, a scheduler tick every minute, and {CLASS_SIZE} students arriving uniformly between "
        "10:00 and 10:05, each asking for a 10 GiB share until 12:00. **with**: reservation ml101 (30 x 10 GiB "
        f"shares, 10:00-12:00, lead 10 min) created at midnight. **{args.session_hours:g} h sessions**: the trace's "
        "sessions time-boxed by policy max_duration (cut at the limit), so that those ending before 10:00 may use "
        "the reserved capacity; without a time limit a session never may.",
        "",
        "| | " + " | ".join(results) + " |",
        "|---" * (len(results) + 1) + "|",
        *[f"| {name} " + cells(key, fmt) for name, key, fmt in rows],
        "",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--day", type=int, default=10, help="day of the trace (0-29)")
    parser.add_argument("--jobs", type=int, default=300, help="batch jobs over the day")
    parser.add_argument("--gpus", type=int, default=16, help="A100-40GB GPUs, 8 per node")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--until", type=int, default=13, help="hour of the day after which nothing more arrives")
    parser.add_argument("--session-hours", type=float, default=4, help="time limit of sessions in the last two runs")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "reservations.md")
    args = parser.parse_args()
    if not trace_path().is_file():
        print(f"skipped: the sensei trace is not at {trace_path()} (set GPUALLOC_SHARED_DATA)")
        return 0
    results = {}
    boxed = f"{args.session_hours:g} h sessions"
    for name, reserve, hours in (("without", False, 0), ("with", True, 0), (f"without, {boxed}", False,
                                 args.session_hours), (f"with, {boxed}", True, args.session_hours)):
        results[name] = run(args, reserve, hours)
        print(name, {k: round(float(v), 3) for k, v in results[name].items()}, flush=True)
    lines = table(args, results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
