"""Replay the openb trace with every placement policy and compare with the FGD paper's figures.

    python benchmarks/openb_replay.py                       # everything (long: ~1 h on 2 cores)
    python benchmarks/openb_replay.py --pod-lists default --seeds 42-51
    python benchmarks/openb_replay.py --policies default,fgd,bestfit --seeds 42-44

Writes docs/benchmarks/openb.md and docs/benchmarks/openb_alloc.png (default trace curves).
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from jupyter_gpualloc.core import openb
from jupyter_gpualloc.core.placement import POLICY_NAMES

PUBLISHED_NAMES = {"random": "01-Random", "dotprod": "02-DotProd", "clustering": "03-GpuClustering",
                   "packing": "04-GpuPacking", "bestfit": "05-BestFit", "fgd": "06-FGD"}
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def published(data_dir: Path) -> tuple[dict, list[str]]:
    """{(workload, policy): (mean, sd)} at 100% arrived, and the workloads in paper order."""
    table, workloads = {}, []
    path = data_dir / "fgd-reference" / "fgd_expected_results_summary.csv"
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["metric"] == "gpu_alloc_pct" and row["arrived_pct"] == "100":
                name = row["workload"].removeprefix("openb_pod_list_")
                table[(name, row["policy"])] = (float(row["mean"]), float(row["sd"]))
                if name not in workloads:
                    workloads.append(name)
    return table, sorted(workloads, key=lambda w: (w != "default", w))


HOW_DEFAULT_DECIDES = """## How `default` decides, and why its ties matter

`default` (`FragmentationAwarePolicy` in jupyter_gpualloc/core/placement.py) scores every feasible
node by a tuple compared lexicographically, and takes the lowest node index among the best:

1. the growth of a fragmentation measure (against the typical pods of the workload), in 100 coarse
   sigmoid steps: ceil(100 x sigmoid(-growth / 1000)) - 1. The measure is FGD's, except that a
   typical GPU share can use only as many of a node's GPUs as the node's free CPU has room for
   copies of it (`ShareCopiesFragmentation`; see below). Placements whose fragmentation differs
   by less than about 40 milli-GPU fall in one step, so the keys below decide them; a placement
   that leaves fragmentation exactly unchanged shares its step with a small increase (ceil - 1
   rather than floor), so any placement that reduces fragmentation beats it (when it was
   introduced, this alone took cpu250 from -0.1 to about +0.8 against FGD);
2. not a fully idle node: idle nodes are what whole-GPU and multi-GPU pods need;
3. for a GPU pod, a node with no reserved GPU model comes before a node with one: a model is reserved
   when the model-restricted typical pods need more of it than its share of the fleet (each
   restricted typical pod's GPU request split over its models' GPUs by count; a model is reserved
   when it gets a larger share of that restricted request than its share of the fleet's GPUs).
   Those GPUs are the only place such pods can go. A CPU-only pod takes no reserved GPU, so for it
   no node is reserved;
4. among the unreserved nodes, fewer GPUs first (small nodes absorb small pods and 8-GPU nodes stay
   whole for multi-GPU pods); among the reserved ones, no size preference;
5. for a GPU share, the GPU with the least free milli that still fits (best fit on the GPU).

When a GPU pod has to open an idle node (an idle node scores best on the keys above), an idle node
at most one step of key 1 below the best idle node with as many GPUs counts as level with it, and
ties among idle nodes go to the least free CPU, then the least free memory, then the lowest index
(issue 28, part 2). Among idle nodes of one size, key 1's one-step differences come from the bigger
nodes' spare CPU: more copies of a typical share fit after the pod, so the measure opens the biggest
node first. On multigpu40 that was the 39 G3 nodes (128 cores, 768 GiB), from about 30% arrived on,
for shares, single GPUs and 4-GPU pods, while some 500 idle G2 nodes (96 cores) were left; 8-GPU
pods asking for 120 cores fit only G3, and about 12 of them a seed were lost (FGD: 3). An 8-GPU pod
changes the measure by nothing on every idle node, so it went to the lowest index, often a G3 too;
now it takes the smallest idle node it fits. A node whose CPU would strand its GPUs for the pod
scores several steps lower and still loses; CPU-only pods go as scored (key 4 sends them to the
small nodes with the most CPU per GPU). The slack of one step is measured, not derived: multigpu40,
10 seeds: 0 steps 96.77, 1 and 2: 96.89, 3 and 4: 96.77 (at 3 it merges real CPU stranding).

When a used node is best for a whole single-GPU pod and several used nodes tie on every key, the one
with the least free CPU takes it, then the lowest index (issue 28, part 2b): the pod's cores come from
the node with least to spare, and the others keep theirs for their own free GPUs. On multigpu40 (10
seeds) it took `default` from 96.893 to 96.907, with fewer GPUs stranded without CPU on G2 nodes at
100% arrived; shares and multi-GPU pods keep the lowest index (least free CPU for them: 96.88-96.90).

Ties decide most placements: whole-GPU and CPU-only pods change the fragmentation measure by the same
amount on almost every node, so after key 1 the packing keys and the fixed node order choose. Breaking
them at random spreads pods over empty nodes (FGD falls to about 90%); exact float scores replace the
packing keys by noise in the measure (exact growth as a last key cost `default` about 0.4 points).
Key 3 is what the 4 `gpuspec` lists need: without it, key 4 sent unrestricted pods into the small T4
and P100 nodes, which are the only GPUs T4- and P100-restricted pods can use (gpuspec20, seed 42: 88.9%
before). On lists without `gpu_spec` no typical pod is restricted, so key 3 is neutral there.

Why key 3 reserves by need and skips CPU-only pods (issue 28): it used to reserve every model some
restricted typical pod names. On the gpuspec lists that is every model but A10, G2 included, because
a few percent of pods ask for G2 alone, so key 3 and key 4 preferred no node at all and `default` was
FGD with coarse steps (it trailed FGD's published figure on gpuspec20, 25 and 33). Split by GPU count,
the restricted request falls on T4 at 4.3x its share of the fleet, P100 2.4-3.1x, V100 1.1-1.6x, G3
0.4-0.6x and G2 0.3x, so T4, P100 and V100 are reserved and G2, G3 and A10 are not. Reserving them for
CPU-only pods too is wrong: those pods take no GPU, and the small T4 and P100 nodes are where the CPU
per GPU is (a 2-GPU T4 node has 104 cores, an 8-GPU G2 node 96); sent past them, CPU-only pods fill
G2 nodes' CPU and strand G2 GPUs (gpuspec20, seed 42: 463 G2 GPUs free at 100% arrived against 259,
and 90.7% allocated). Seeds 42-45, gpuspec20: 94.25 before; CPU-only pods by size alone 94.87; with
the reserved models by need as well 94.80 (gpuspec25: 93.71, 93.83, 94.15; gpuspec33: 87.76, 87.72,
88.06; gpuspec10: 94.88, 95.13, 95.17). Using the reserved set for the copy count as well (the
measure's FGD rule only on reserved models) lost 2 points on gpuspec20 (92.68): nodes under the two
rules then differ in growth for the same share, and key 1 pushes shares onto the FGD-rule nodes, the
reserved ones; so the measure keeps FGD's rule on every model some restricted typical pod names.

Why the copy count: FGD counts every GPU a share fits on as usable once the node's CPU fits one copy
of it. A node with 8 free GPUs and 12 free cores can feed only three 4-core shares, so five of its
GPUs are stranded, and FGD does not see it until the CPU is all but gone (on seed 42 of the default
list, about 31 GPUs' worth of free milli sat on nodes without the CPU to use it at 100% arrived).
Counting copies only for shares matters: applied to whole-GPU typical pods as well, it took
multigpu30 from 96.47 to 96.01 (seeds 42-45, 200 steps). Nodes with a GPU model that some
model-restricted typical pod needs keep FGD's rule: with the copy count there, gpuspec25 fell from
94.27 to 91.93 (seeds 42-45, 50 steps).

Key 1's step count is the one tuned number, and the results move by a few tenths of a point from one
count to the next. With this measure, on the default list (10 seeds): 50 steps 95.49, 75: 95.49,
100: 95.56; seeds 42-45: 150: 95.48, 200: 95.52. On gpuspec25 (seeds 42-45): 50: 94.27, 75: 94.52,
100: 93.71, 200: 93.58. 100 gains on the default, CPU and sharing lists what it costs on the
gpuspec lists; it is a design choice with a measured sensitivity, not a derived constant.
"""


def run_seed(job: tuple) -> tuple:
    pod_list, policy, seed = job
    folder = openb.trace_dir()
    start = time.perf_counter()
    result = openb._one_seed((folder / "openb_node_list_gpu_node.csv",
                              folder / f"openb_pod_list_{pod_list}.csv", policy, seed, pod_list == "default"))
    return pod_list, policy, seed, result, time.perf_counter() - start


def parse_seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pod-lists", default="all", help="comma-separated pod lists (e.g. default,cpu050) or 'all'")
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated policy names")
    parser.add_argument("--seeds", default="42-51", help="'42-51' or '42,43'")
    parser.add_argument("--sweep-policies", default=None,
                        help="policies for the pod lists other than default (default: --policies)")
    parser.add_argument("--sweep-seeds", default=None, help="seeds for the other pod lists (default: --seeds)")
    parser.add_argument("--sweep-baseline-seeds", default=None,
                        help="seeds for policies other than default on the other pod lists (default: --sweep-seeds)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    data_dir = openb.default_data_dir()
    table, workloads = published(data_dir)
    lists = workloads if args.pod_lists == "all" else args.pod_lists.split(",")
    policies = args.policies.split(",")
    seeds = parse_seeds(args.seeds)
    sweep_policies = args.sweep_policies.split(",") if args.sweep_policies else policies
    sweep_seeds = parse_seeds(args.sweep_seeds) if args.sweep_seeds else seeds
    baseline_seeds = parse_seeds(args.sweep_baseline_seeds) if args.sweep_baseline_seeds else sweep_seeds
    jobs = []
    for pod_list in lists:
        if pod_list == "default":
            jobs += [(pod_list, p, s) for p in policies for s in seeds]
        else:
            jobs += [(pod_list, p, s) for p in sweep_policies
                     for s in (sweep_seeds if p == "default" else baseline_seeds)]
    jobs.sort(key=lambda j: j[1] in ("random", "dotprod", "bestfit"))  # slow policies first
    results: dict = defaultdict(list)
    times: dict = defaultdict(float)
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        for pod_list, policy, seed, result, elapsed in pool.imap_unordered(run_seed, jobs):
            results[(pod_list, policy)].append(result)
            times[(pod_list, policy)] += elapsed
            print(f"{pod_list:12s} {policy:10s} {seed} {result['100']:.3f} {elapsed:.1f}s", flush=True)
    write_report(results, times, table, lists, time.perf_counter() - start, args)


def stats(runs: list, point: str) -> tuple[float, float]:
    values = np.array([r[point] for r in runs])
    return float(values.mean()), float(values.std())


def write_report(results, times, table, lists, wall, args) -> None:
    DOCS.mkdir(parents=True, exist_ok=True)
    lines = ["# openb trace replay (FGD paper protocol)", "",
             "Generated by `python benchmarks/openb_replay.py "
             f"--pod-lists {args.pod_lists} --policies {args.policies} --seeds {args.seeds}"
             + (f" --sweep-policies {args.sweep_policies}" if args.sweep_policies else "")
             + (f" --sweep-seeds {args.sweep_seeds}" if args.sweep_seeds else "")
             + (f" --sweep-baseline-seeds {args.sweep_baseline_seeds}" if args.sweep_baseline_seeds else "")
             + f"` in {wall:.0f} s wall on {args.workers} workers.", "",
             ("Protocol: shared/reference/OPENB.md (1,213 GPU nodes, 6,212 GPUs; pods sorted by name, shuffled per "
             "seed, inflated to 1.3x by resampling; arrival only; failures skipped). GPU allocation % = used "
             "milli-GPU / 6,212,000, at the first pod where arrived GPU request reaches 100% (and at the end, 130%). "
             "Published = FGD paper's per-seed results (mean / population sd over seeds 42-51); Go's random "
             "sequence differs from ours, so seeds match only in number."), "",
             "## Default pod list, all policies", "",
             "| policy | ours @100% | sd | ours @130% | sd | published @100% | sd | ours - published | s per seed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for policy in POLICY_NAMES:
        runs = results.get(("default", policy))
        if not runs:
            continue
        m100, s100 = stats(runs, "100")
        m130, s130 = stats(runs, "130")
        pub = table.get(("default", PUBLISHED_NAMES.get(policy, "")))
        pub_txt = f"{pub[0]:.2f} | {pub[1]:.2f} | {m100 - pub[0]:+.2f}" if pub else "- | - | -"
        lines.append(f"| {policy} | {m100:.2f} | {s100:.2f} | {m130:.2f} | {s130:.2f} | {pub_txt} | "
                     f"{times[('default', policy)] / len(runs):.1f} |")
    targets = []
    if ("default", "default") in results:
        mean = stats(results[("default", "default")], "100")[0]
        targets.append(f"`default` on the default pod list at 100% arrived, mean >= 95.50: "
                       f"{'met' if mean >= 95.5 else 'missed'} ({mean:.2f} over "
                       f"{len(results[('default', 'default')])} seeds).")
    sweep = [p for p in POLICY_NAMES if any((w, p) in results for w in lists if w != "default")]
    if sweep:
        lines += ["", "## All pod lists at 100% arrived", "",
                  "Ours: mean (population sd, seeds run); FGD published: mean (sd) over seeds 42-51.", "",
                  "| pod list | " + " | ".join(f"ours {p}" for p in sweep)
                  + " | FGD published | default - FGD published |",
                  "|---|" + "---:|" * len(sweep) + "---:|---:|"]
        wins = total = 0
        for w in lists:
            cells = []
            for p in sweep:
                runs = results.get((w, p))
                if not runs:
                    cells.append("-")
                    continue
                mean, sd = stats(runs, "100")
                cells.append(f"{mean:.2f} ({sd:.2f}, {len(runs)} seeds)")
            pub = table.get((w, "06-FGD"))
            pub_txt = f"{pub[0]:.2f} ({pub[1]:.2f})" if pub else "-"
            diff = "-"
            if (w, "default") in results and pub:
                d = stats(results[(w, "default")], "100")[0] - pub[0]
                diff = f"{d:+.2f}"
                wins += d >= 0
                total += 1
            lines.append(f"| {w} | " + " | ".join(cells) + f" | {pub_txt} | {diff} |")
        if total:
            lines += ["", f"`default` reaches FGD's published figure on {wins} of {total} pod lists."]
            targets.append(f"`default` at least FGD's published figure on at least 12 of the 17 pod lists: "
                           f"{'met' if wins >= 12 and total == 17 else 'missed'} ({wins} of {total}).")
    if ("default", "default") in results and results[("default", "default")][0].get("curve") is not None:
        plot(results)
        lines += ["", "![GPU allocation vs arrived load](openb_alloc.png)"]
    if targets:
        lines += ["", "## Targets of issue 7", ""] + [f"- {t}" for t in targets]
    lines += ["", HOW_DEFAULT_DECIDES]
    (DOCS / "openb.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(results) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = np.arange(131)
    for policy in POLICY_NAMES:
        runs = results.get(("default", policy))
        if runs:
            ax.plot(x, np.nanmean(np.vstack([r["curve"] for r in runs]), axis=0), label=policy, lw=1.2)
    ax.set_xlabel("arrived GPU request (% of capacity)")
    ax.set_ylabel("GPU allocation (%)")
    ax.set_xlim(60, 130)
    ax.set_ylim(60, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    ax.set_title("openb default pod list, mean over seeds")
    fig.tight_layout()
    fig.savefig(DOCS / "openb_alloc.png", dpi=120)


if __name__ == "__main__":
    main()
