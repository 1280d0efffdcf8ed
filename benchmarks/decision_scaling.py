"""What one decision costs as the fleet grows: submit, release and tick at 100, 1,000 and 10,000 GPUs
with 3 active leases per GPU, as instructions (callgrind) and as latency, each a ratio to 100 GPUs.

    python benchmarks/decision_scaling.py [--sizes 100,1000,10000] [--rounds 300] [--counted 100] [--liveness]
        [--out FILE]

The fleet is issue 42's: 40 % A100-80GB with dynamic MIG (8 a node), 40 % H100-80GB time-sliced
(shares only, 8 a node), 20 % L4 (4 a node); simulated backend, in-memory SQLite store (a store
call costs the same at any size: this measures the core). It is filled by `submit` to 3 leases
per GPU with a cycle of 15 request shapes (MIG 1g.10gb, 2g.20gb and 1g.20gb; H100 shares of 4, 8
and 16 GiB; whole L4s). Then each round releases a random lease and submits its spec again (a
new holder), then ticks; policy defaults except no heartbeats and no idle release (so nothing
expires; time limits stay on, as kernels have one). With --liveness, heartbeats and idle release
keep the policy's defaults (heartbeat_ttl 120 s, idle_timeout 1,800 s) and every user's holders
heartbeat every 30 s (a thirtieth of the users before each tick, timed as "heartbeat"), so
nothing expires either: the tick's heartbeat and idle rules run over every lease and act on none.

Each size runs in a child process of its own, twice: once natively, timing --rounds rounds
(latency p50/p99 of each operation), and, when valgrind is installed, once under
`valgrind --tool=callgrind --instr-atstart=no`, where the child switches counting on
(`callgrind_control -i on`) for --counted releases, then for their --counted submits (a phase per
kind asked: shares, MIG slices, whole GPUs), then for --counted ticks (with --liveness, the
heartbeats before each tick counted apart), each dumped alone:
instructions per operation, a figure the machine's load does not move.
Fill time and resident memory come from the native child. After the fill, both children collect
and freeze the heap (`gc.freeze()`, as the service does with its start-up heap), so a full
collection over the filled fleet's objects, which lands on whichever operation triggers it, is
counted in neither figure. To compare another tree's core, put that tree first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

KINDS = [("A100-SXM4-80GB", "dynamic", 0.4, 8), ("H100-80GB", "shared", 0.4, 8), ("L4", "any", 0.2, 4)]
MEMORY_MIB = {"A100-SXM4-80GB": 81920, "H100-80GB": 81920, "L4": 23034}
H100 = "H100-80GB"
SHAPES = [{"kind": "mig", "profile": "1g.10gb"}, {"kind": "shared", "memory_gib": 4, "model": H100},
          {"kind": "mig", "profile": "2g.20gb"}, {"kind": "shared", "memory_gib": 8, "model": H100},
          {"kind": "mig", "profile": "1g.20gb"}, {"kind": "shared", "memory_gib": 16, "model": H100},
          {"kind": "mig", "profile": "1g.10gb"}, {"kind": "shared", "memory_gib": 4, "model": H100},
          {"kind": "whole", "model": "L4"}, {"kind": "shared", "memory_gib": 8, "model": H100},
          {"kind": "mig", "profile": "2g.20gb"}, {"kind": "shared", "memory_gib": 4, "model": H100},
          {"kind": "mig", "profile": "1g.10gb"}, {"kind": "shared", "memory_gib": 8, "model": H100},
          {"kind": "shared", "memory_gib": 4, "model": H100}]  # 6 MIG, 8 shares, 1 whole L4 per 5 GPUs
KINDS_ASKED = ("shared", "mig", "whole")
LEASES_PER_GPU = 3
USERS = 1000
HEARTBEAT_EVERY = 30  # seconds between a holder's heartbeats (--liveness)


def fleet(gpus: int):
    from jupyter_gpualloc.core.model import Gpu, MigMode, Node
    nodes = []
    for n, (model, mode, share, per_node) in enumerate(KINDS):
        count = round(gpus * share) if n < len(KINDS) - 1 else gpus - sum(round(gpus * k[2]) for k in KINDS[:-1])
        for node, first in enumerate(range(0, count, per_node)):
            name = f"{model.split('-')[0].lower()}-{node}"
            nodes.append(Node(name, 256_000, 2_097_152, [
                Gpu(uuid=f"GPU-{name}-{i}", index=i, model=model, memory_mib=MEMORY_MIB[model], node=name,
                    mig_capable=mode == "dynamic", mig_mode=MigMode.DYNAMIC if mode == "dynamic" else MigMode.OFF,
                    sharing="any" if mode == "dynamic" else mode)
                for i in range(min(per_node, count - first))]))
    return nodes


class Cell:
    """A scheduler on the fleet, filled, and the rounds run on it."""

    def __init__(self, gpus: int, liveness: bool = False):
        from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
        from jupyter_gpualloc.core.model import SliceSpec
        from jupyter_gpualloc.core.policy import SchedulerPolicy
        from jupyter_gpualloc.core.scheduler import Scheduler
        from jupyter_gpualloc.core.store import Store
        policy = SchedulerPolicy(wait_for_holders=False) if liveness else \
            SchedulerPolicy(heartbeat_ttl=0, idle_timeout=0, wait_for_holders=False)
        self.liveness = liveness
        self.scheduler = Scheduler(SimulatedBackend(fleet(gpus)), Store("sqlite://"), policy, now=0.0)
        self.specs = [SliceSpec.from_json(shape) for shape in SHAPES]
        self.rng = np.random.default_rng(42)
        self.now = 1.0
        self.serial = 0
        self.held: list[tuple[str, int]] = []  # (lease id, its shape)
        t0 = time.perf_counter()
        for i in range(LEASES_PER_GPU * gpus):
            self.held.append((self.submit(i % len(self.specs)), i % len(self.specs)))
        self.fill_s = time.perf_counter() - t0
        gc.collect()
        gc.freeze()  # as the service freezes its start-up heap: what the fill built is not walked again

    def submit(self, shape: int) -> str:
        self.serial += 1
        lease = self.scheduler.submit(f"u{self.serial % USERS}", f"kernel:k{self.serial}", self.specs[shape],
                                      now=self.now, wait=False)
        if lease.state.value != "granted":
            raise RuntimeError(f"{SHAPES[shape]} was not granted: {lease.reason}")
        return lease.id

    def release(self, k: int | None = None) -> tuple[int, int]:
        """Release the lease at `k` in `held` (a random one by default): (k, its shape)."""
        k = int(self.rng.integers(len(self.held))) if k is None else k
        self.scheduler.release(self.held[k][0], now=self.now)
        return k, self.held[k][1]

    def heartbeat(self) -> None:
        """One second passes; with liveness, the users whose turn it is heartbeat all their holders."""
        self.now += 1.0
        if self.liveness:
            turn = int(self.now) % HEARTBEAT_EVERY
            for user in range(turn, USERS, HEARTBEAT_EVERY):
                self.scheduler.heartbeat(f"u{user}", now=self.now)

    def tick(self) -> None:
        self.scheduler.tick(self.now)


def rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))


def timed(gpus: int, rounds: int, liveness: bool) -> dict:
    """The native child: fill, then `rounds` rounds of release, submit, (heartbeats,) tick, each timed."""
    cell = Cell(gpus, liveness)
    times: dict[str, list[float]] = {"submit": [], "release": [], "tick": [], **({"heartbeat": []} if liveness else {})}
    clock = time.perf_counter
    for _ in range(rounds):
        t0 = clock()
        k, shape = cell.release()
        t1 = clock()
        cell.held[k] = (cell.submit(shape), shape)
        t2 = clock()
        cell.heartbeat()
        t3 = clock()
        cell.tick()
        t4 = clock()
        times["release"].append(t1 - t0)
        times["submit"].append(t2 - t1)
        if liveness:
            times["heartbeat"].append(t3 - t2)
        times["tick"].append(t4 - t3)
    out = {"fill_s": cell.fill_s, "rss_mib": rss_mib(), "leases": len(cell.held)}
    for op, seconds in times.items():
        ms = np.array(seconds) * 1000
        out[op] = [float(np.percentile(ms, 50)), float(np.percentile(ms, 99))]
    return out


def counted(gpus: int, count: int, liveness: bool) -> None:
    """The child under callgrind: fill and warm up uncounted, then `count` releases, their
    submits (of the released shapes, a phase per kind) and `count` ticks, each phase counted and
    dumped alone (named after it); prints how many submits each kind's phase made. With
    liveness, the heartbeats before each counted tick are counted apart, as a phase of their own."""
    cell = Cell(gpus, liveness)
    for _ in range(20):  # warm: first-time caches (plans of each shape, policy scores) are not the subject
        k, shape = cell.release()
        cell.held[k] = (cell.submit(shape), shape)
        cell.heartbeat()
        cell.tick()
    pid = str(os.getpid())

    def counting(on: bool) -> None:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", pid], check=True, stdout=subprocess.DEVNULL)

    def phase(name: str, op) -> None:
        counting(True)
        op()
        counting(False)
        subprocess.run(["callgrind_control", "-d", name, pid], check=True, stdout=subprocess.DEVNULL)

    released: list[tuple[int, int]] = []
    places = cell.rng.choice(len(cell.held), size=count, replace=False).tolist()
    phase("release", lambda: released.extend(cell.release(k) for k in places))

    for kind in KINDS_ASKED:  # the submits, one phase per kind asked for (their sum is the submits')
        def submit_all(kind: str = kind) -> None:
            for k, shape in released:
                if SHAPES[shape]["kind"] == kind:
                    cell.held[k] = (cell.submit(shape), shape)
        phase(f"submit-{kind}", submit_all)
    if not liveness:
        phase("tick", lambda: [cell.heartbeat() or cell.tick() for _ in range(count)])
    else:  # each second's heartbeats, then its tick, each counted in a dump of its own
        for n in range(count):
            phase(f"heartbeat-{n}", cell.heartbeat)
            phase(f"tick-{n}", cell.tick)
    print(json.dumps({kind: sum(SHAPES[shape]["kind"] == kind for _, shape in released) for kind in KINDS_ASKED}))


def totals(dumps: Path) -> dict[str, int]:
    """Instructions of each phase's dump, by the phase's name (the dump's trigger)."""
    found: dict[str, int] = {}
    for dump in dumps.glob("callgrind.out*"):
        lines = dump.read_text(errors="replace").splitlines()
        trigger = next((line.split()[-1] for line in lines if line.startswith("desc: Trigger:")), "")
        found[trigger] = next((int(line.split()[1]) for line in lines if line.startswith("totals:")), 0)
    return found


def run_child(args: list[str], under: list[str] | None = None) -> str:
    cmd = (under or []) + [sys.executable, __file__, *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=os.environ).stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000", help="fleet sizes in GPUs, the first the reference")
    parser.add_argument("--rounds", type=int, default=300, help="timed rounds (release, submit, tick) per size")
    parser.add_argument("--counted", type=int, default=100, help="operations of each kind counted by callgrind")
    parser.add_argument("--no-instructions", action="store_true", help="latency only (skip callgrind)")
    parser.add_argument("--liveness", action="store_true",
                        help="heartbeats and idle release at the policy's defaults, holders heartbeating every 30 s")
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--child", choices=["timed", "counted"], help=argparse.SUPPRESS)
    parser.add_argument("--gpus", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "timed":
        print(json.dumps(timed(args.gpus, args.rounds, args.liveness)))
        return
    if args.child == "counted":
        counted(args.gpus, args.counted, args.liveness)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    instructions = not args.no_instructions and shutil.which("valgrind") and shutil.which("callgrind_control")
    rows = {}
    liveness = ["--liveness"] if args.liveness else []
    for gpus in sizes:
        row = json.loads(run_child(["--child", "timed", "--gpus", str(gpus), "--rounds", str(args.rounds), *liveness]))
        if instructions:
            with tempfile.TemporaryDirectory(prefix="gpualloc-decisions-") as tmp:
                valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                            f"--callgrind-out-file={tmp}/callgrind.out"]
                asked = json.loads(run_child(["--child", "counted", "--gpus", str(gpus), "--counted",
                                              str(args.counted), *liveness], valgrind))
                found = totals(Path(tmp))
                for op in ("heartbeat", "tick") if args.liveness else ():  # a dump per second: summed
                    found[op] = sum(found.pop(f"{op}-{n}") for n in range(args.counted))
                row["instructions"] = {op: found[op] / args.counted for op in ("release", "tick", "heartbeat")
                                       if op in found}
                row["instructions"]["submit"] = sum(found[f"submit-{kind}"] for kind in asked) / args.counted
                row["instructions"].update({f"submit {kind}": found[f"submit-{kind}"] / n
                                            for kind, n in asked.items() if n})
        rows[gpus] = row
        print(json.dumps({"gpus": gpus, **row}), flush=True)
    print()
    table = render(rows, sizes[0], bool(instructions))
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")


def render(rows: dict[int, dict], base: int, instructions: bool) -> str:
    ref = rows[base]
    lines = ["| GPUs | active leases | fill s | RSS MiB | op | instructions / op | x 100 GPUs | p50 ms | p99 ms | "
             "p50 x 100 GPUs |", "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for gpus, row in rows.items():
        for n, op in enumerate(op for op in ("submit", "release", "heartbeat", "tick") if op in row):
            head = (f"| {gpus:,} | {row['leases']:,} | {row['fill_s']:.1f} | {row['rss_mib']:.0f} |" if n == 0
                    else "| | | | |")
            ins = row.get("instructions", {}).get(op)
            ref_ins = ref.get("instructions", {}).get(op)
            ins_cells = (f" {ins / 1e6:.2f} M | {ins / ref_ins:.2f} |" if ins and ref_ins else " - | - |")
            p50, p99 = row[op]
            lines.append(f"{head} {op} |{ins_cells} {p50:.3f} | {p99:.3f} | {p50 / ref[op][0]:.2f} |")
        for kind in KINDS_ASKED if instructions else ():
            ins, ref_ins = row["instructions"].get(f"submit {kind}"), ref["instructions"].get(f"submit {kind}")
            if ins and ref_ins:
                lines.append(f"| | | | | submit, {kind} only | {ins / 1e6:.2f} M | {ins / ref_ins:.2f} | | | |")
    if "heartbeat" in ref:
        lines += ["", f"heartbeat: one second's heartbeats (the holders of a {HEARTBEAT_EVERY}th of the {USERS:,} users); "
                  "heartbeats and idle release at the policy's defaults"]
    lines += ["", f"load average {os.getloadavg()[0]:.1f} at the end" +
              ("" if instructions else "; instructions not counted (no valgrind)")]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
