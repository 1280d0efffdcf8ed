"""Replay of Alibaba's openb GPU trace the way the FGD paper (USENIX ATC'23) did.

Protocol (see shared/reference/OPENB.md): per seed, pods sorted by name are shuffled, then
inflated by resampling until their total GPU request would pass 1.3 x the cluster's GPU capacity
(resampled pods after the originals); pods only arrive; a pod that fits nowhere is skipped.
"Arrived" counts every pod seen, failed ones too. The figure "at 100%" is the allocation at the
first pod where arrived reaches 100% of capacity; "at 130%" is the end of the run.
"""

from __future__ import annotations

import csv
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .placement import ClusterView, Demand, NodeCapacity, get_policy

INFLATION = 1.3
TYPICAL_COVERAGE = 0.95
DATA_ENV = "GPUALLOC_SHARED_DATA"
TRACE_SUBDIR = Path("alibaba-gpu-v2023") / "csv"


@dataclass(frozen=True)
class Pod:
    """One row of a pod list."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""

    @property
    def gpu_request(self) -> int:
        """Total milli-GPU asked."""
        return self.num_gpu * self.gpu_milli if self.num_gpu == 1 else self.num_gpu * 1000

    def demand(self) -> Demand:
        models = frozenset(self.gpu_spec.split("|")) if self.gpu_spec else None
        return Demand(cpu_milli=self.cpu_milli, memory_mib=self.memory_mib, num_gpu=self.num_gpu,
                      gpu_milli=self.gpu_milli if self.num_gpu == 1 else 0, models=models)


def default_data_dir() -> Path:
    """The shared data folder: $GPUALLOC_SHARED_DATA when it holds `alibaba-gpu-v2023/csv`, else a
    `shared/data` beside a parent folder of this package."""
    env = os.environ.get(DATA_ENV)
    if env and (Path(env) / TRACE_SUBDIR).is_dir():
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "shared" / "data"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"no openb trace: set {DATA_ENV} to the folder holding openb_pod_list_default.csv "
                            "(cluster-trace-gpu-v2023/csv of github.com/alibaba/clusterdata)")


def trace_dir(data_dir: Path | None = None) -> Path:
    """Folder of the openb CSV files: $GPUALLOC_SHARED_DATA, else `alibaba-gpu-v2023/csv` in the data folder.

    $GPUALLOC_SHARED_DATA may also name a data folder that holds `alibaba-gpu-v2023/csv`.
    """
    env = os.environ.get(DATA_ENV)
    if data_dir is None and env:
        folder = Path(env)
        return folder if any(folder.glob("openb_*.csv")) else folder / TRACE_SUBDIR
    return (data_dir or default_data_dir()) / TRACE_SUBDIR


def load_nodes(path: str | Path) -> list[NodeCapacity]:
    """Nodes of a node list (columns sn, cpu_milli, memory_mib, gpu, model)."""
    with open(path, newline="") as fh:
        return [NodeCapacity(name=row["sn"], cpu_milli=int(row["cpu_milli"]),
                             memory_mib=int(row["memory_mib"]),
                             gpu_models=(row["model"],) * int(row["gpu"]) if int(row["gpu"]) else ())
                for row in csv.DictReader(fh)]


def load_pods(path: str | Path) -> list[Pod]:
    """Pods of a pod list; the 5-column multigpu lists have no gpu_spec (any model goes)."""
    with open(path, newline="") as fh:
        return [Pod(name=row["name"], cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]),
                    num_gpu=int(row["num_gpu"]), gpu_milli=int(row["gpu_milli"]),
                    gpu_spec=(row.get("gpu_spec") or "").strip())
                for row in csv.DictReader(fh)]


def typical_pods(pods: Sequence[Pod], coverage: float = TYPICAL_COVERAGE) -> list[tuple[Demand, float]]:
    """The most frequent (cpu, gpu_milli, num_gpu, gpu_spec) specs covering `coverage` of the pods,
    each with its frequency among them (frequencies sum to 1), CPU-only pods included."""
    counts = Counter((p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec) for p in pods)
    out, covered = [], 0
    for (cpu, milli, num, spec), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if covered >= coverage * len(pods):
            break
        covered += n
        out.append((Pod("", cpu, 0, num, milli, spec).demand(), n))
    return [(demand, n / covered) for demand, n in out]


def workload(pods: Sequence[Pod], seed: int, capacity_milli: int, ratio: float = INFLATION) -> list[Pod]:
    """Sorted by name, shuffled by `seed`, then resampled pods appended until the total GPU request
    would pass `ratio` x capacity."""
    rng = np.random.default_rng(seed)
    ordered = sorted(pods, key=lambda p: p.name)
    out = [ordered[i] for i in rng.permutation(len(ordered))]
    total = sum(p.gpu_request for p in out)
    target = ratio * capacity_milli
    if total > target or not any(p.gpu_request for p in ordered):
        return out
    while True:
        for i in rng.integers(len(ordered), size=1024).tolist():
            pod = ordered[i]
            if total + pod.gpu_request > target:
                return out
            total += pod.gpu_request
            out.append(pod)


def simulate(nodes: Sequence[NodeCapacity], pods: Sequence[Pod], policy: str, seed: int,
             typical: Sequence[tuple[Demand, float]]) -> dict:
    """One seed: returns per-pod arrived and used milli-GPU arrays and the decision count."""
    view = ClusterView(nodes)
    chooser = get_policy(policy, seed=seed, typical=typical)
    capacity = int(view.gpu_count.sum()) * 1000
    arrivals = workload(pods, seed, capacity)
    demands: dict[Pod, Demand] = {}
    arrived = np.empty(len(arrivals), dtype=np.int64)
    used = np.empty(len(arrivals), dtype=np.int64)
    total_arrived = total_used = 0
    for i, pod in enumerate(arrivals):
        demand = demands.get(pod)
        if demand is None:
            demand = demands[pod] = pod.demand()
        total_arrived += pod.gpu_request
        choice = chooser.choose(view, demand)
        if choice is not None:
            view.allocate(choice[0], choice[1], demand)
            total_used += pod.gpu_request
        arrived[i] = total_arrived
        used[i] = total_used
    return {"arrived": arrived, "used": used, "capacity": capacity, "decisions": len(arrivals)}


def alloc_at(run: dict, arrived_pct: float) -> float:
    """Allocation % at the first pod where arrived reaches `arrived_pct` % (else at the end)."""
    cap = run["capacity"]
    reached = np.flatnonzero(run["arrived"] * 100 >= arrived_pct * cap)
    i = int(reached[0]) if reached.size else len(run["used"]) - 1
    return 100.0 * run["used"][i] / cap


def curve_bins(run: dict, top: int = 130) -> np.ndarray:
    """Mean allocation % of the records within each round(arrived %) bin 0..top (NaN if empty)."""
    cap = run["capacity"]
    bins = np.rint(run["arrived"] * 100.0 / cap).astype(np.int64)
    alloc = run["used"] * 100.0 / cap
    keep = bins <= top
    sums = np.bincount(bins[keep], weights=alloc[keep], minlength=top + 1)
    counts = np.bincount(bins[keep], minlength=top + 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _one_seed(args: tuple) -> dict:
    nodes_csv, pods_csv, policy, seed, curve = args
    nodes = load_nodes(nodes_csv)
    pods = load_pods(pods_csv)
    run = simulate(nodes, pods, policy, seed, typical_pods(pods))
    out = {"seed": seed, "100": alloc_at(run, 100), "130": alloc_at(run, 130), "decisions": run["decisions"]}
    if curve:
        out["curve"] = curve_bins(run)
    return out


def replay(nodes_csv: str | Path, pods_csv: str | Path, policy: str, seeds: Sequence[int], *,
           curve: bool = False, workers: int | None = None) -> dict:
    """Replay a pod list on a node list with `policy`, once per seed; mean/population-sd figures.

    `workers` processes run the seeds (default: up to 2, never more than the seeds or CPUs)."""
    start = time.perf_counter()
    seeds = list(seeds)
    jobs = [(str(nodes_csv), str(pods_csv), policy, s, curve) for s in seeds]
    if workers is None:
        workers = min(2, len(seeds), os.cpu_count() or 1)
    if workers > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(workers) as pool:
            results = pool.map(_one_seed, jobs)
    else:
        results = [_one_seed(job) for job in jobs]
    out = {"policy": policy, "seeds": seeds, "alloc_pct": {}, "decisions": sum(r["decisions"] for r in results)}
    for point in ("100", "130"):
        values = np.array([r[point] for r in results])
        out["alloc_pct"][point] = {"mean": float(values.mean()), "sd": float(values.std())}
    out["per_seed"] = {point: [float(r[point]) for r in results] for point in ("100", "130")}
    if curve:
        out["curve"] = [None if np.isnan(v) else float(v)
                        for v in np.nanmean(np.vstack([r["curve"] for r in results]), axis=0)]
    out["elapsed_s"] = time.perf_counter() - start
    return out
