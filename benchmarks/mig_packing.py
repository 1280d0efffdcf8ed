"""MIG packing: our default placer against first-fit and the clairvoyant bound.

Arrival-only streams of MIG requests on 1, 2, 4 and 8 A100-SXM4-40GB GPUs (dynamic MIG): each
request is placed on arrival whenever any GPU has a legal placement for it, and instances never
move. We count the compute slices placed by each online placer and compare them with

* the clairvoyant bound: the most any policy bound by the same rules could place if it knew the
  whole stream when choosing each placement (exact search over placements), and
* the offline optimum, which may also refuse requests (exact, for context).

Run ``python benchmarks/mig_packing.py`` (about 4 minutes on 2 cores); it writes
docs/benchmarks/mig.md. ``--streams`` and ``--sizes`` shrink it.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_gpualloc.core.mig import (  # noqa: E402
    MIG_PLACER_NAMES, DefaultPlacer, Layout, MigPlacer, get_mig_placer, is_legal, legal_starts,
    lookup_model)
from jupyter_gpualloc.core.model import MigInstance, MigProfile  # noqa: E402
from jupyter_gpualloc.core.openb import DATA_ENV, trace_dir  # noqa: E402

MODEL = lookup_model("A100-SXM4-40GB")
PROFILES: dict[int, MigProfile] = MODEL.profiles
COMPUTE_SLICES = MODEL.geometry.compute_slices
EMPTY = Layout(MODEL.geometry)
STREAM_PROFILES = [p for p in PROFILES.values() if not p.media_extensions]
OPENB_FILE = "openb_pod_list_default.csv"
OVERSUBSCRIPTION = 1.5
DEFAULT_SIZES = (1, 2, 4, 8)
CEILING_SIZES = (1, 2, 4)  # the online ceiling's exact solution is too large beyond 4 GPUs
SEED = 2025  # the placer was tuned on other seeds
DEFAULT_STREAMS = {1: 1000, 2: 1000, 4: 1000, 8: 200}
OTHER_DISCOUNTS = (0.8, 0.85, 0.95)  # the default placer's sensitivity to its one tuned number


class Geometry:
    """Every layout one GPU can reach from empty under `profiles`, and its moves."""

    def __init__(self, profiles: list[MigProfile]):
        self.profiles = profiles
        self.compute = np.array([p.compute_slices for p in profiles])
        index = {EMPTY: 0}
        self.layouts = [EMPTY]
        self.succ: list[list[list[int]]] = []  # [layout][profile position] -> successor layouts
        i = 0
        while i < len(self.layouts):
            row = []
            for p in profiles:
                targets = []
                for s in legal_starts(self.layouts[i], p):
                    nxt = self.layouts[i].with_instance(p, s)
                    if nxt not in index:
                        index[nxt] = len(self.layouts)
                        self.layouts.append(nxt)
                    if index[nxt] not in targets:
                        targets.append(index[nxt])
                row.append(targets)
            self.succ.append(row)
            i += 1
        # how many more instances of each profile alone fit: a per-GPU cap for the bound
        self.room = np.array([[self._room(i, k) for k in range(len(profiles))]
                              for i in range(len(self.layouts))])
        self.packings = self._maximal_packings()
        self.index = index
        self.classes = self._classes()

    def _classes(self) -> list[int]:
        """Each layout's class: layouts that every future request sequence treats alike
        (coarsest partition where placing any profile reaches the same set of classes)."""
        block = [0] * len(self.layouts)
        n_blocks = 1
        while True:
            signatures: dict[tuple, int] = {}
            block = [signatures.setdefault((block[i],) + tuple(
                frozenset(block[t] for t in row) for row in self.succ[i]), len(signatures))
                for i in range(len(self.layouts))]
            if len(signatures) == n_blocks:
                return block
            n_blocks = len(signatures)

    def _room(self, layout: int, k: int) -> int:
        n = 0
        while self.succ[layout][k]:
            layout = self.succ[layout][k][0]
            n += 1
        return n

    def _maximal_packings(self) -> list[tuple[int, ...]]:
        """Instance counts per profile of the full layouts (nothing more fits)."""
        full = set()
        for i, layout in enumerate(self.layouts):
            if not any(self.succ[i]):
                full.add(tuple(layout.count(p.profile_id) for p in self.profiles))
        return sorted(full)


GEOMETRY = Geometry(STREAM_PROFILES)
POSITION = {p.profile_id: k for k, p in enumerate(STREAM_PROFILES)}
_CLASS_BITS = 5


@dataclass
class _Step:
    """One position of a stream, as the bound's search sees it (all arrays are per class)."""

    compute: int
    succ: np.ndarray      # [class, j] -> class at the next position after placing here, or -1
    down: np.ndarray      # [class] -> class at the next position when not placed here
    fill: np.ndarray      # [class] -> most compute this GPU alone could take from the rest
    room: np.ndarray      # [class, profile] -> instances of each profile alone that still fit
    demand: int           # compute slices still to come, this one included
    counts: np.ndarray    # [profile] -> requests still to come, this one included


def _steps(stream: list[int]) -> list[_Step]:
    """Per position, group one GPU's layouts into classes with the same future.

    Two layouts are in one class at position i when the rest of the stream cannot tell them
    apart: they are in one class at i + 1, and placing request i on them reaches the same set of
    classes at i + 1 (none when it does not fit). Every future choice, and so the bound, is then
    the same from either, so the search keeps one state per multiset of classes (GPUs are
    interchangeable). Classes are computed backwards from the end, where all layouts are alike.
    """
    geo = GEOMETRY
    n_layouts = len(geo.layouts)
    positions = [POSITION[pid] for pid in stream]
    classes = [np.zeros(n_layouts, dtype=np.int64)]
    fills = [np.zeros(n_layouts, dtype=np.int64)]
    for k in reversed(positions):
        later, later_fill = classes[0], fills[0]
        gain = int(geo.compute[k])
        signatures: dict[tuple, int] = {}
        row = np.empty(n_layouts, dtype=np.int64)
        fill = later_fill.copy()
        for layout in range(n_layouts):
            targets = geo.succ[layout][k]
            sig = (int(later[layout]), frozenset(int(later[t]) for t in targets))
            row[layout] = signatures.setdefault(sig, len(signatures))
            for t in targets:
                fill[layout] = max(fill[layout], gain + later_fill[t])
        classes.insert(0, row)
        fills.insert(0, fill)
    counts = np.zeros(len(geo.profiles), dtype=np.int64)
    demand = 0
    steps: list[_Step] = []
    for i in range(len(stream), -1, -1):
        if i < len(stream):
            counts = counts.copy()
            counts[positions[i]] += 1
            demand += int(geo.compute[positions[i]])
        n_classes = int(classes[i].max()) + 1
        reps = np.array([int(np.argmax(classes[i] == c)) for c in range(n_classes)])
        if i < len(stream):
            targets = [sorted({int(classes[i + 1][t]) for t in geo.succ[r][positions[i]]})
                       for r in reps]
            succ = np.full((n_classes, max(1, max(map(len, targets)))), -1, dtype=np.int64)
            for c, ts in enumerate(targets):
                succ[c, :len(ts)] = ts
            down = classes[i + 1][reps]
            gain = int(geo.compute[positions[i]])
        else:
            succ, down, gain = np.full((n_classes, 1), -1, dtype=np.int64), reps * 0, 0
        steps.insert(0, _Step(gain, succ, down, fills[i][reps], geo.room[reps], demand, counts))
    return steps


def _upper_bound(step: _Step, states: np.ndarray) -> np.ndarray:
    """Most compute still placeable from each state: no GPU takes more than it alone could from
    the rest of the stream, no profile more instances than are still to come or still fit."""
    alone = np.minimum(step.fill[states].sum(axis=1), step.demand)
    per_profile = np.minimum(step.room[states].sum(axis=1), step.counts[None, :])
    return np.minimum(alone, per_profile @ GEOMETRY.compute)


def _encode(states: np.ndarray) -> np.ndarray:
    key = np.zeros(len(states), dtype=np.int64)
    for g in range(states.shape[1]):
        key = (key << _CLASS_BITS) | states[:, g]
    return key


def _decode(keys: np.ndarray, gpus: int) -> np.ndarray:
    states = np.empty((len(keys), gpus), dtype=np.int64)
    for g in range(gpus - 1, -1, -1):
        states[:, g] = keys & ((1 << _CLASS_BITS) - 1)
        keys = keys >> _CLASS_BITS
    return states


def clairvoyant_bound(stream: list[int], gpus: int, reached: int = 0) -> int:
    """Most compute slices a policy that must place each request whenever it fits, and never
    moves an instance, can place from `stream` (profile ids) if it knows the whole stream.

    Exact: a forward search over every placement, one state per (position, multiset of GPU
    classes) keeping the most compute placed so far on the way there. `reached` is what some
    legal policy placed; states whose upper bound cannot beat it are dropped, so it must be
    a real result (it only makes the search faster).
    """
    steps = _steps(stream)
    if max(len(step.fill) for step in steps) > 1 << _CLASS_BITS:
        raise ValueError("more classes than the state encoding holds")
    target = reached + 1
    states = np.zeros((1, gpus), dtype=np.int64)
    placed = np.zeros(1, dtype=np.int64)
    for i, step in enumerate(steps[:-1]):
        nxt = steps[i + 1]
        below = step.down[states]
        keys, values = [], []
        fits = np.zeros(len(states), dtype=bool)
        for g in range(gpus):
            first_of_class = np.ones(len(states), dtype=bool) if g == 0 else states[:, g] != states[:, g - 1]
            for j in range(step.succ.shape[1]):
                target_class = step.succ[states[:, g], j]
                ok = target_class >= 0
                fits |= ok
                ok &= first_of_class
                if ok.any():
                    child = below[ok].copy()
                    child[:, g] = target_class[ok]
                    keys.append(_encode(np.sort(child, axis=1)))
                    values.append(placed[ok] + step.compute)
        if (~fits).any():  # refused: no GPU had a legal placement
            keys.append(_encode(np.sort(below[~fits], axis=1)))
            values.append(placed[~fits])
        keys_all = np.concatenate(keys)
        values_all = np.concatenate(values)
        order = np.lexsort((-values_all, keys_all))
        keys_all, values_all = keys_all[order], values_all[order]
        first = np.ones(len(keys_all), dtype=bool)
        first[1:] = keys_all[1:] != keys_all[:-1]
        states, placed = _decode(keys_all[first], gpus), values_all[first]
        hopeful = placed + _upper_bound(nxt, states) >= target
        states, placed = states[hopeful], placed[hopeful]
        if not len(states):
            return reached
    return int(placed.max())


def offline_optimum(stream: list[int], gpus: int) -> int:
    """Most compute slices of any sub-multiset of `stream` that fits on `gpus` empty GPUs.

    Order does not matter once requests may be refused, so this is a knapsack: every count
    vector (instances per profile, capped at the requests there are) that g GPUs can hold,
    each GPU adding the counts of one of its full layouts, for g = 1 .. gpus.
    """
    wanted = np.zeros(len(GEOMETRY.profiles), dtype=np.int64)
    for pid in stream:
        wanted[POSITION[pid]] += 1
    packings = np.array(GEOMETRY.packings)
    radix = np.cumprod(np.concatenate([[1], wanted[:-1] + 1]))
    held = np.zeros(1, dtype=np.int64)  # count vectors, each as one mixed-radix number
    for _ in range(gpus):
        vectors = (held[:, None] // radix) % (wanted + 1)
        grown = np.minimum(vectors[:, None, :] + packings[None, :, :], wanted)
        held = np.unique(grown.reshape(-1, len(wanted)) @ radix)
    vectors = (held[:, None] // radix) % (wanted + 1)
    return int((vectors @ GEOMETRY.compute).max())


def run_online(placer: MigPlacer, stream: list[int], gpus: int) -> int:
    """Compute slices `placer` places from `stream`, checking every rule as it goes."""
    layouts = [EMPTY for _ in range(gpus)]
    instances: list[list[MigInstance]] = [[] for _ in range(gpus)]
    placed = 0
    for n, pid in enumerate(stream):
        profile = PROFILES[pid]
        choice = placer.choose(layouts, profile, PROFILES)
        if choice is None:
            if any(legal_starts(layout, profile) for layout in layouts):
                raise AssertionError(f"{placer.name} refused placeable {profile.name}")
            continue
        g, start = choice
        if start not in legal_starts(layouts[g], profile):
            raise AssertionError(f"{placer.name} chose illegal {profile.name}@{start}")
        layouts[g] = layouts[g].with_instance(profile, start)
        instances[g].append(MigInstance(f"mig-{n}", pid, start, profile.memory_slices))
        if not is_legal(instances[g], PROFILES):
            raise AssertionError(f"{placer.name} made an illegal layout on GPU {g}")
        placed += profile.compute_slices
    return placed


def openb_csv() -> Path | None:
    """The openb pod list in the trace folder (`jupyter_gpualloc.core.openb.trace_dir()`, which
    $GPUALLOC_SHARED_DATA sets), or None when it is not there."""
    try:
        path = trace_dir() / OPENB_FILE
    except FileNotFoundError:
        return None
    return path if path.is_file() else None


def openb_profile_weights(path: Path | None = None) -> dict[int, int]:
    """Pod counts per A100-40GB profile from the openb GPU-sharing pods.

    Each pod with num_gpu == 1 and gpu_milli < 1000 gets the smallest profile whose compute
    share (compute slices / 7) covers gpu_milli / 1000; ties in compute go to less memory.
    """
    path = path or openb_csv()
    if path is None:
        raise FileNotFoundError(f"no {OPENB_FILE}: set {DATA_ENV} to the folder that holds it")
    ranked = sorted(STREAM_PROFILES, key=lambda p: (p.compute_slices, p.memory_slices))
    weights: dict[int, int] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            milli = int(row["gpu_milli"])
            if int(row["num_gpu"]) != 1 or milli >= 1000:
                continue
            profile = next(p for p in ranked if p.compute_slices * 1000 >= milli * COMPUTE_SLICES)
            weights[profile.profile_id] = weights.get(profile.profile_id, 0) + 1
    return weights


def make_stream(weights: dict[int, float], gpus: int, seed: tuple[int, ...]) -> list[int]:
    """Profile ids drawn from `weights` until they ask for 1.5x the GPUs' compute slices."""
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    ids = sorted(weights)
    p = np.array([weights[i] for i in ids], dtype=float)
    p /= p.sum()
    stream: list[int] = []
    asked = 0
    while asked < OVERSUBSCRIPTION * COMPUTE_SLICES * gpus:
        pid = ids[int(rng.choice(len(ids), p=p))]
        stream.append(pid)
        asked += PROFILES[pid].compute_slices
    return stream


class OnlineCeiling(MigPlacer):
    """For context only: the best online placer in expectation when it knows the mix's exact
    profile shares and the rule that ends the stream (solved exactly as a Markov decision
    process over (multiset of GPU classes, compute asked so far)). It does not see the stream
    itself; no online placer can beat its expected result, so it bounds what is reachable."""

    name = "ceiling"

    def __init__(self, shares: dict[int, float], gpus: int, memo: dict):
        self.shares = [(POSITION[pid], w) for pid, w in sorted(shares.items()) if w > 0]
        self.gpus = gpus
        self.memo = memo
        self.asked = 0
        self.end = OVERSUBSCRIPTION * COMPUTE_SLICES * gpus
        geo = GEOMETRY
        rep: dict[int, int] = {}
        for i, c in enumerate(geo.classes):
            rep.setdefault(c, i)
        self.moves = [[sorted({geo.classes[t] for t in geo.succ[rep[c]][k]})
                       for k in range(len(geo.profiles))] for c in range(len(rep))]

    def value(self, state: tuple[int, ...], asked: int) -> float:
        """Expected compute placed from here on under the best policy."""
        if asked >= self.end:
            return 0.0
        key = (state, asked)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        total = 0.0
        for k, w in self.shares:
            gain = int(GEOMETRY.compute[k])
            best = None
            for g, c in enumerate(state):
                if g and c == state[g - 1]:
                    continue
                for t in self.moves[c][k]:
                    child = tuple(sorted(state[:g] + (t,) + state[g + 1:]))
                    v = gain + self.value(child, asked + gain)
                    best = v if best is None or v > best else best
            total += w * (self.value(state, asked + gain) if best is None else best)
        self.memo[key] = total
        return total

    def choose(self, layouts, profile, profiles):
        classes = [GEOMETRY.classes[GEOMETRY.index[layout]] for layout in layouts]
        gain = profile.compute_slices
        best = None
        for g, layout in enumerate(layouts):
            for start in legal_starts(layout, profile):
                after = GEOMETRY.classes[GEOMETRY.index[layout.with_instance(profile, start)]]
                state = tuple(sorted(classes[:g] + [after] + classes[g + 1:]))
                v = self.value(state, self.asked + gain)
                if best is None or v > best[0] + 1e-12:
                    best = (v, g, start)
        self.asked += gain
        return None if best is None else (best[1], best[2])


MIXES = ("uniform", "openb")
_WORKER: dict = {}


def _mix_weights(mix: str) -> dict[int, float]:
    if mix == "uniform":
        return {p.profile_id: 1.0 for p in STREAM_PROFILES}
    return {pid: float(n) for pid, n in openb_profile_weights().items()}


def _measure(task: tuple[str, int, int]) -> dict:
    """Every placer, the bound and the offline optimum on one stream."""
    mix, gpus, index = task
    if mix not in _WORKER:
        _WORKER[mix] = _mix_weights(mix)
    weights = _WORKER[mix]
    stream = make_stream(weights, gpus, (SEED, MIXES.index(mix), gpus, index))
    row = {"mix": mix, "gpus": gpus, "index": index, "requests": len(stream)}
    for name in MIG_PLACER_NAMES:
        row[name] = run_online(get_mig_placer(name), stream, gpus)
    for discount in OTHER_DISCOUNTS:
        placer = DefaultPlacer()
        placer.discount = discount
        row[f"discount {discount}"] = run_online(placer, stream, gpus)
    started = time.perf_counter()
    row["bound"] = clairvoyant_bound(stream, gpus, max(row[n] for n in MIG_PLACER_NAMES))
    row["bound_s"] = time.perf_counter() - started
    row["offline"] = offline_optimum(stream, gpus)
    if gpus in CEILING_SIZES:
        total = sum(weights.values())
        memo = _WORKER.setdefault((mix, gpus), {})
        ceiling = OnlineCeiling({pid: w / total for pid, w in weights.items()}, gpus, memo)
        row["ceiling"] = run_online(ceiling, stream, gpus)
    return row


def _ratios(sel: list[dict]) -> dict[str, np.ndarray]:
    """Each stream's figures over its clairvoyant bound (bound_s as it is)."""
    bound = np.array([r["bound"] for r in sel], dtype=float)
    keys = ["default", "firstfit", "offline", *(f"discount {d}" for d in OTHER_DISCOUNTS)]
    keys += ["ceiling"] if "ceiling" in sel[0] else []
    out = {k: np.array([r[k] for r in sel]) / bound for k in keys}
    out["bound_s"] = np.array([r["bound_s"] for r in sel])
    return out


def _summary(values: np.ndarray) -> tuple[float, float, float]:
    return float(values.mean()), float(np.percentile(values, 5)), float(np.mean(values >= 1 - 1e-12))


def _report(rows: list[dict], sizes: list[int], streams: dict[int, int], wall: float) -> str:
    if any(r["mix"] == "openb" for r in rows):
        weights = openb_profile_weights()
        share = "Pods per profile: " + ", ".join(
            f"{PROFILES[pid].name} {n}" for pid, n in sorted(weights.items(), key=lambda x: PROFILES[x[0]].compute_slices)) + "."
    else:
        share = f"Not measured in this run: {OPENB_FILE} was not found ({DATA_ENV})."
    lines = [
        "# MIG packing: default placer vs first-fit and the clairvoyant bound",
        "",
        f"Generated by `python benchmarks/mig_packing.py` in {wall:.0f} s (2 worker processes).",
        "",
        "## Method",
        "",
        "GPUs: A100-SXM4-40GB geometry, dynamic MIG (8 memory slices, 7 compute slices, the",
        "legal starts of `jupyter_gpualloc/core/mig.py`). Each stream is arrival-only: requests",
        "arrive one by one, each must be placed on arrival whenever some GPU has a legal",
        "placement (and is lost otherwise), instances never move and none is released. A stream",
        "draws profiles independently until the compute asked reaches 1.5x the GPUs' compute",
        "slices, so every stream oversubscribes its GPUs. Score: compute slices placed.",
        "",
        "Mixes:",
        "- `uniform`: the six A100-40GB profiles other than `1g.5gb+me`, equally likely.",
        "- `openb`: the GPU-sharing pods of the Alibaba openb trace (`openb_pod_list_default.csv`,",
        "  `num_gpu == 1` and `gpu_milli < 1000`), each mapped to the smallest profile whose share",
        "  of the GPU's compute, compute slices / 7, covers `gpu_milli / 1000`. Compute, not memory:",
        "  `gpu_milli` is a share of one GPU's compute time (the trace has no GPU-memory column), and",
        "  the memory share (slices / 8) would tie 1g.10gb with 2g.10gb and 3g with 4g, so no",
        f"  request would ever map to 2g or 4g. {share}",
        "",
        "Compared, per stream:",
        "- `default`: `get_mig_placer('default')`; it learns the profile shares from the instances",
        "  it has placed and never sees the rest of the stream. It values each GPU's layout by the",
        "  compute that GPU alone could expect from the requests to come (the n-th discounted by",
        "  0.9^n; exact dynamic programming over the layouts one GPU can reach, grouped in the 52",
        "  classes of layouts worth the same, about 15 µs) and places each instance where its GPU",
        "  loses the least of that value. A placer that has placed thousands keeps its values",
        "  until the learnt mix moves by `mix_tolerance` (0.002);",
        "  every placement of these streams moves it by more, so each is made on fresh values.",
        "- `firstfit`: the first GPU with any legal placement, at its lowest legal start.",
        "- bound: the clairvoyant bound, the most compute any policy under the same rules (place",
        "  whenever a legal placement exists, never move) can place knowing the whole stream.",
        "  Exact: a forward search over every placement, keeping one state per position and",
        "  multiset of GPU classes, with the most compute placed on the way there. Layouts are",
        "  merged into one class at a position when the rest of that stream cannot tell them apart",
        "  (same class later, and placing the current request reaches the same classes), and GPUs",
        "  are interchangeable. States that cannot beat the better online result even by an upper",
        "  bound (no GPU takes more than it alone could from the rest of the stream; no profile more",
        "  instances than are still to come or still fit) are dropped; this prunes, it does not",
        "  approximate.",
        "- offline: the optimum when requests may also be refused (order then does not matter):",
        "  an exact knapsack over the count vectors a GPU's full layouts hold.",
        "- ceiling (1, 2 and 4 GPUs): the best online placer *in expectation* when it knows the mix's",
        "  exact shares and the rule that ends the stream, solved exactly as a Markov decision",
        "  process. No online placer, ours included, can place more compute on average (its mean",
        "  ratio to the bound can still differ from the best one in the fourth digit): it shows how",
        "  much of the gap to the clairvoyant bound is reachable at all without seeing the future.",
        "  Its state space is too large to solve at 8 GPUs.",
        "",
        "Ratios are per stream, to that stream's bound; p5 is the 5th percentile; 'at bound' is the",
        f"share of streams that reach the bound. Streams per size: {', '.join(f'{g} GPU: {streams[g]}' for g in sizes)}.",
        f"Seeds: `SeedSequence(({SEED}, mix, gpus, stream))`; the placer was tuned on other seeds.",
        "",
        "## Results",
        "",
        "| mix | GPUs | default / bound: mean | p5 | at bound | firstfit / bound: mean | p5 | at bound | ceiling / bound | bound / offline | bound s/stream (max) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups = [(mix, gpus, _ratios(sel)) for mix in MIXES for gpus in sizes
              if (sel := [r for r in rows if r["mix"] == mix and r["gpus"] == gpus])]
    for mix, gpus, g in groups:
        ours, ff = _summary(g["default"]), _summary(g["firstfit"])
        ceiling = f"{np.mean(g['ceiling']):.4f}" if "ceiling" in g else "n/a"
        offline = np.mean(1 / g["offline"])
        secs = g["bound_s"]
        lines.append(
            f"| {mix} | {gpus} | {ours[0]:.4f} | {ours[1]:.3f} | {ours[2]:.2f} | {ff[0]:.4f} | "
            f"{ff[1]:.3f} | {ff[2]:.2f} | {ceiling} | {offline:.4f} | {secs.mean():.2f} ({secs.max():.1f}) |")
    lines += ["", "## Reading", ""]
    for mix, gpus, g in groups:
        ours, ff = float(np.mean(g["default"])), float(np.mean(g["firstfit"]))
        verdict = "meets" if ours >= 0.99 else "misses"
        text = (f"- {mix}, {gpus} GPU: default {ours:.4f} {verdict} the 0.99 target; "
                f"{'above' if ours > ff else 'not above'} first-fit ({ff:.4f})")
        if "ceiling" in g:
            ceiling = float(np.mean(g["ceiling"]))
            reach = "so no online placer can meet it on average" if ceiling < 0.99 else \
                "so it is reachable in principle"
            text += f"; the online ceiling is {ceiling:.4f}, {reach}"
        lines.append(text + ".")
    lines += [
        "",
        "The clairvoyant bound profits from knowing what comes next: it puts small instances where",
        "they will make later wasteful requests unplaceable, or where they keep room for the large",
        "request it knows is coming. An online placer has to hedge; the ceiling column measures",
        "how much of the gap any hedge can close when the mix and the stream's length are known",
        "exactly (ours knows neither: it learns the shares as it goes). At 8 GPUs the ceiling could",
        "not be solved, so there the gap to 0.99 is not split into reachable and unreachable.",
        "",
        "## The discount, default's one tuned number",
        "",
        "The discount (0.9) was chosen on other seeds. The same streams, placed by `default` with",
        "other discounts (mean ratio to the bound):",
        "",
        "| mix | GPUs | " + " | ".join(f"{d}" for d in OTHER_DISCOUNTS) + " | 0.9 (default) |",
        "|---|---|" + "---|" * (len(OTHER_DISCOUNTS) + 1),
    ]
    for mix, gpus, g in groups:
        others = " | ".join(f"{np.mean(g[f'discount {d}']):.4f}" for d in OTHER_DISCOUNTS)
        lines.append(f"| {mix} | {gpus} | {others} | {np.mean(g['default']):.4f} |")
    lines += [
        "",
        "A lower discount looks fewer requests ahead and fills the GPUs already in use first; a",
        "higher one keeps more room on each GPU for large profiles that may never come.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="GPU counts, comma separated (default 1,2,4,8)")
    parser.add_argument("--streams", type=int, default=None,
                        help="streams per size and mix (default 1000, and 200 at 8 GPUs)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "mig.md",
                        help="where to write the results (default docs/benchmarks/mig.md)")
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    streams = {g: args.streams or DEFAULT_STREAMS.get(g, 200) for g in sizes}
    mixes = MIXES
    if openb_csv() is None:
        mixes = tuple(m for m in MIXES if m != "openb")
        print(f"mig_packing: skipping the openb-weighted mix: {OPENB_FILE} not found in the trace folder; "
              f"set {DATA_ENV} to the folder that holds it (Alibaba clusterdata cluster-trace-gpu-v2023/csv)",
              file=sys.stderr)
    # the slowest searches first, so the two workers finish together
    tasks = [(mix, g, i) for g in sorted(sizes, reverse=True) for mix in mixes for i in range(streams[g])]
    started = time.perf_counter()
    with multiprocessing.Pool(args.workers) as pool:
        rows = list(pool.imap_unordered(_measure, tasks, chunksize=1))
    wall = time.perf_counter() - started
    report = _report(rows, sizes, streams, wall)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
