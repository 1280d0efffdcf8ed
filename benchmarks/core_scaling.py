"""How the scheduler core's cost grows with active leases, fleet size and queue length.

    python benchmarks/core_scaling.py [--quick] [--fill-budget 120] [--ops 200] [--cpu] [--out FILE]

To compare another tree's core with the same script, put that tree first on PYTHONPATH.

Simulated fleets of 4-GPU nodes (80 GiB GPUs, no MIG; and one section of dynamic-MIG A100-80GB
GPUs), an in-memory SQLite store (the store's cost per call is constant; this measures the core),
1,000 users. Three sections:

- `submit`/`release`/`touch` p50 and p99 with N active shared leases on G GPUs (each op timed
  alone, --ops of each, on a fleet filled by `submit`; a cell whose filling exceeds
  --fill-budget seconds is reported as not reached; --cpu: in thread CPU time);
- MIG `submit`+`release` of a 1g.10gb slice on G dynamic-MIG GPUs holding 500 leases;
- `tick()` with Q queued shared requests on G full GPUs (each GPU held whole): the first pass
  after filling, a second one with nothing changed, and one `submit` while that queue waits
  (the queue is filled with the scheduling pass suppressed, so that filling stays linear);
- memory holding --memory-leases shared leases on --memory-gpus GPUs, with a SQLite file store
  (an in-memory database would count the database in the process): resident memory (RSS)
  before the fleet, with the fleet and with the leases, then tracemalloc's largest sources of
  what 10 % more leases add (traced apart, as tracing itself takes memory).

Prints a markdown table (and writes it to --out when given).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
import tracemalloc

import numpy as np
from core_memory import rss_mib  # this folder is on sys.path when run as a script

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import Gpu, MigMode, Node, PriorityClass, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
GPUS_PER_NODE = 4
USERS = 1000
MIG_LEASES = 500  # 1g.10gb slices: 100 GPUs hold 700


def fleet(gpus: int, mig: bool = False) -> list[Node]:
    nodes = []
    for n in range(gpus // GPUS_PER_NODE):
        name = f"node{n}"
        nodes.append(Node(name, 10_000_000, 100_000_000, [
            Gpu(uuid=f"GPU-{name}-{i}", index=i, model="A100-SXM4-80GB", memory_mib=81920, node=name,
                mig_capable=mig, mig_mode=MigMode.DYNAMIC if mig else MigMode.OFF)
            for i in range(GPUS_PER_NODE)]))
    return nodes


def scheduler(gpus: int, mig: bool = False, store_url: str = "sqlite://") -> Scheduler:
    policy = SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0, wait_for_holders=False)
    return Scheduler(SimulatedBackend(fleet(gpus, mig)), Store(store_url), policy)


def pct(times: list[float]) -> tuple[float, float]:
    ms = np.array(times) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def fill(s: Scheduler, count: int, spec: SliceSpec, budget: float, start: int = 0) -> float | None:
    """Submit `count` granted leases; the seconds it took, or None past the budget."""
    t0 = time.perf_counter()
    for i in range(start, start + count):
        lease = s.submit(f"u{i % USERS}", f"kernel:f{i}", spec, now=1.0, wait=False)
        if lease.state.value != "granted":
            raise RuntimeError(f"lease {i} was not granted: {lease.reason}")
        if time.perf_counter() - t0 > budget:
            return None
    return time.perf_counter() - t0


def leases_cell(gpus: int, leases: int, ops: int, budget: float, clock=time.perf_counter) -> dict | None:
    s = scheduler(gpus)
    spec = SliceSpec.from_json({"kind": "shared", "memory_gib": 1})
    took = fill(s, leases, spec, budget)
    if took is None:
        return None
    rng = np.random.default_rng(42)
    held = [l.id for l in s.leases()]
    sub, rel, tou = [], [], []
    for k in range(ops):
        t0 = clock()
        lease = s.submit(f"u{k % USERS}", f"kernel:m{k}", spec, now=2.0, wait=False)
        sub.append(clock() - t0)
        t0 = clock()
        s.release(lease.id, now=2.0)
        rel.append(clock() - t0)
        lease_id = held[int(rng.integers(len(held)))]
        t0 = clock()
        s.touch(lease_id, now=2.0, last_activity=2.0)
        tou.append(clock() - t0)
    return {"fill": took, "submit": pct(sub), "release": pct(rel), "touch": pct(tou)}


def mig_cell(gpus: int, leases: int, ops: int, budget: float, clock=time.perf_counter) -> dict | None:
    s = scheduler(gpus, mig=True)
    spec = SliceSpec.from_json({"kind": "mig", "profile": "1g.10gb"})
    took = fill(s, leases, spec, budget)
    if took is None:
        return None
    times = []
    for k in range(ops):
        t0 = clock()
        lease = s.submit(f"u{k % USERS}", f"kernel:m{k}", spec, now=2.0, wait=False)
        s.release(lease.id, now=2.0)
        times.append(clock() - t0)
    return {"fill": took, "submit_release": pct(times)}


def tick_cell(gpus: int, queued: int, budget: float) -> dict | None:
    s = scheduler(gpus)
    if fill(s, gpus, SliceSpec.from_json({"kind": "whole"}), budget) is None:
        return None
    spec = SliceSpec.from_json({"kind": "shared", "memory_gib": 8})
    s._settle = lambda now: None  # filling only: the pass each queued submit runs is timed below
    for i in range(queued):
        s.submit(f"u{i % USERS}", f"kernel:q{i}", spec, now=10.0, wait=True)
    del s._settle
    t0 = time.perf_counter()
    s.tick(20.0)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    s.tick(21.0)
    second = time.perf_counter() - t0
    t0 = time.perf_counter()
    lease = s.submit("late", "kernel:late", spec, now=22.0, priority=PriorityClass.INTERACTIVE)
    submit = time.perf_counter() - t0
    if lease.state.value != "queued":
        raise RuntimeError("the late request should wait")
    return {"first": first, "second": second, "submit": submit}


def memory_cell(gpus: int, leases: int, top: int = 8) -> dict:
    """RSS at each step, and the lines that allocated most of what 10 % more leases hold."""
    spec = SliceSpec.from_json({"kind": "shared", "memory_gib": 1})
    gc.collect()
    before = rss_mib()
    with tempfile.TemporaryDirectory() as tmp:
        s = scheduler(gpus, store_url=sqlite_url(os.path.join(tmp, "bench.sqlite")))
        gc.collect()
        with_fleet = rss_mib()
        took = fill(s, leases, spec, float("inf"))
        gc.collect()
        with_leases = rss_mib()
        tracemalloc.start()
        more = leases // 10
        fill(s, more, spec, float("inf"), start=leases)
        gc.collect()
        snapshot = tracemalloc.take_snapshot()
        tracemalloc.stop()
        s.store.close()
    stats = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]).statistics("lineno")
    lines = []
    for st in stats[:top]:
        frame = st.traceback[0]
        name = frame.filename
        where = os.path.relpath(name, ROOT) if name.startswith(ROOT) else os.path.basename(name)
        lines.append((f"{where}:{frame.lineno}", st.size / 2**20, st.count))
    return {"before": before, "fleet": with_fleet, "leases": with_leases, "fill": took, "held": leases,
            "more": more, "traced": sum(st.size for st in stats) / 2**20, "top": lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small cells only (a minute or so)")
    parser.add_argument("--fill-budget", type=float, default=120.0, help="seconds allowed to fill one cell")
    parser.add_argument("--ops", type=int, default=200, help="timed operations of each kind per cell")
    parser.add_argument("--max-queue-x-fleet", type=float, default=float("inf"),
                        help="skip tick cells whose queued x GPUs is larger (a slow core needs minutes there)")
    parser.add_argument("--memory-gpus", type=int, default=10_000, help="GPUs of the memory cell")
    parser.add_argument("--memory-leases", type=int, default=50_000, help="leases held in the memory cell")
    parser.add_argument("--only", choices=["leases", "mig", "tick", "memory"], action="append",
                        help="run only these sections (repeatable; default all)")
    parser.add_argument("--cpu", action="store_true",
                        help="time submit, release and touch in this thread's CPU time, not wall time (on a "
                             "shared machine, what other processes take then does not count)")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args()
    if args.quick:
        lease_cells = [(100, 1000), (1000, 1000)]
        mig_gpus = [100, 1000]
        tick_cells = [(100, 1000)]
        args.memory_gpus, args.memory_leases = min(args.memory_gpus, 1000), min(args.memory_leases, 5000)
    else:
        lease_cells = [(100, 1000), (1000, 1000), (1000, 10_000), (10_000, 1000), (10_000, 10_000),
                       (10_000, 50_000)]
        mig_gpus = [100, 1000, 10_000]
        tick_cells = [(100, 1000), (100, 10_000), (1000, 1000), (1000, 10_000), (10_000, 1000),
                      (10_000, 10_000)]
    sections = set(args.only or ["leases", "mig", "tick", "memory"])
    clock = time.thread_time if args.cpu else time.perf_counter
    lease_cells = lease_cells if "leases" in sections else []
    mig_gpus = mig_gpus if "mig" in sections else []
    tick_cells = tick_cells if "tick" in sections else []
    lines: list[str] = []
    if lease_cells:
        lines += ["", "| GPUs | active leases | fill s | submit p50 / p99 ms | release p50 / p99 ms | "
                  "touch p50 / p99 ms |", "|---:|---:|---:|---:|---:|---:|"]
    for gpus, leases in lease_cells:
        r = leases_cell(gpus, leases, args.ops, args.fill_budget, clock)
        if r is None:
            lines.append(f"| {gpus:,} | {leases:,} | > {args.fill_budget:.0f} | not reached | | |")
        else:
            lines.append(f"| {gpus:,} | {leases:,} | {r['fill']:.1f} | " + " | ".join(
                f"{r[k][0]:.3f} / {r[k][1]:.3f}" for k in ("submit", "release", "touch")) + " |")
        print(lines[-1], flush=True)
    if mig_gpus:
        lines += ["", "| MIG GPUs (dynamic) | active leases | fill s | submit+release p50 / p99 ms |",
                  "|---:|---:|---:|---:|"]
    for gpus in mig_gpus:
        r = mig_cell(gpus, MIG_LEASES, args.ops, args.fill_budget, clock)
        if r is None:
            lines.append(f"| {gpus:,} | {MIG_LEASES:,} | > {args.fill_budget:.0f} | not reached |")
        else:
            lines.append(f"| {gpus:,} | {MIG_LEASES:,} | {r['fill']:.1f} | "
                         f"{r['submit_release'][0]:.3f} / {r['submit_release'][1]:.3f} |")
        print(lines[-1], flush=True)
    if tick_cells:
        lines += ["", "| GPUs (all held) | queued | tick, first pass s | tick, nothing changed s | "
                  "submit while queued s |", "|---:|---:|---:|---:|---:|"]
    for gpus, queued in tick_cells:
        if gpus * queued > args.max_queue_x_fleet:
            lines.append(f"| {gpus:,} | {queued:,} | skipped | | |")
            continue
        r = tick_cell(gpus, queued, args.fill_budget)
        if r is None:
            lines.append(f"| {gpus:,} | {queued:,} | not reached | | |")
        else:
            lines.append(f"| {gpus:,} | {queued:,} | {r['first']:.4f} | {r['second']:.4f} | {r['submit']:.4f} |")
        print(lines[-1], flush=True)
    if "memory" in sections:
        r = memory_cell(args.memory_gpus, args.memory_leases)
        top = [f"| `{where}` | {mib:.1f} | {count:,} |" for where, mib, count in r["top"]]
        lines += ["", f"Memory: {r['held']:,} shared leases on {args.memory_gpus:,} GPUs, SQLite file store "
                  f"(filled in {r['fill']:.1f} s)", "",
                  "| RSS before the fleet | with the fleet | with the leases | per lease | "
                  f"traced for {r['more']:,} more, per lease |",
                  "|---:|---:|---:|---:|---:|",
                  f"| {r['before']:.0f} MiB | {r['fleet']:.0f} MiB | {r['leases']:.0f} MiB | "
                  f"{(r['leases'] - r['fleet']) * 1024 / r['held']:.2f} KiB | "
                  f"{r['traced'] * 1024 / r['more']:.2f} KiB |",
                  "", f"| tracemalloc top: what {r['more']:,} more leases hold, by line | MiB | blocks |",
                  "|---|---:|---:|", *top]
        print("\n".join(lines[-8 - len(top):]), flush=True)
    lines += ["", f"load average {os.getloadavg()[0]:.1f} at the end"]
    table = "\n".join(lines[1:])
    print()
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(table + "\n")


if __name__ == "__main__":
    main()
