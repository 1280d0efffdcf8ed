"""Where a request goes: filter (which nodes and GPUs fit) and score (which of them is best).

A `ClusterView` holds the free CPU, memory and per-GPU milli of a set of nodes in numpy arrays;
a `PlacementPolicy` picks a node and GPUs for a `Demand`. Besides `binpack`, `spread` and our
fragmentation-aware `default`, the six baselines of the FGD paper (Weng et al., USENIX ATC'23)
are here as that paper defines them, so the trace replay in `openb.py` can compare against its
published figures. Every policy is deterministic for a given seed: ties go to the lowest node
index, which is part of each policy's design (see docs/benchmarks/openb.md).

Fragmentation (FGD): for a node and a "typical" pod, the idle GPU milli that pod could not use;
a node's fragmentation is the frequency-weighted sum over the typical pods. It depends only on
the node's free CPU and its multiset of (GPU model, free milli), so nodes are interned into
such states and fragmentation is cached per state.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MILLI = 1000
MAX_SPEC_CPU = 128_000  # normalisation constants of the FGD paper's scores (milli-CPU, milli-GPU)
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100


@dataclass(frozen=True)
class Demand:
    """What one placement needs. `num_gpu` 1 takes `gpu_milli` of one GPU; above 1, whole GPUs."""

    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    models: frozenset[str] | None = None

    def __post_init__(self):
        if self.cpu_milli < 0 or self.memory_mib < 0 or self.num_gpu < 0:
            raise ValueError("cpu_milli, memory_mib and num_gpu must be non-negative")
        if self.num_gpu == 1 and not 1 <= self.gpu_milli <= MILLI:
            raise ValueError("gpu_milli must be 1..1000 when num_gpu is 1")

    @property
    def per_gpu_milli(self) -> int:
        """Milli taken from each GPU used."""
        if self.num_gpu == 0:
            return 0
        return self.gpu_milli if self.num_gpu == 1 else MILLI

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.per_gpu_milli

    @property
    def is_share(self) -> bool:
        """True for a fraction of one GPU (a GPU-sharing request)."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def gpu_class(self) -> int:
        """-1: no GPU; 0: a share of one GPU; k: k whole GPUs (GPU-clustering's affinity)."""
        if self.num_gpu == 0:
            return -1
        return 0 if self.is_share else self.num_gpu


@dataclass(frozen=True)
class NodeCapacity:
    """A node's allocatable CPU (milli), memory (MiB) and one model name per GPU."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_models: tuple[str, ...] = ()


class _Interner:
    """Process-wide ids for GPU model names and node states, so policy caches are shareable."""

    def __init__(self):
        self.model_ids: dict[str, int] = {}
        self.model_names: list[str] = []
        self.state_ids: dict[tuple, int] = {}
        self.states: list[tuple] = []

    def model(self, name: str) -> int:
        mid = self.model_ids.get(name)
        if mid is None:
            mid = self.model_ids[name] = len(self.model_names)
            self.model_names.append(name)
        return mid

    def state(self, key: tuple) -> int:
        sid = self.state_ids.get(key)
        if sid is None:
            sid = self.state_ids[key] = len(self.states)
            self.states.append(key)
        return sid


_INTERN = _Interner()


def _state_key(cpu_free: int, models: list[int], free: list[int]) -> tuple:
    """(free CPU, sorted ((model id, free milli) of each visible GPU))."""
    return (cpu_free, tuple(sorted((m, f) for m, f in zip(models, free) if f >= 0)))


class ClusterView:
    """Mutable state of a set of nodes: free CPU, free memory, free milli per GPU (1000 = idle GPU)."""

    def __init__(self, nodes: Sequence[NodeCapacity]):
        self.nodes: list[NodeCapacity] = list(nodes)
        n = len(self.nodes)
        width = max([len(nd.gpu_models) for nd in self.nodes] + [1])
        self.cpu_free = np.array([nd.cpu_milli for nd in self.nodes], dtype=np.int64)
        self.mem_free = np.array([nd.memory_mib for nd in self.nodes], dtype=np.int64)
        self.gpu_model = np.full((n, width), -1, dtype=np.int64)
        self._gpu_real = np.full((n, width), -1, dtype=np.int64)
        for i, nd in enumerate(self.nodes):
            for g, model in enumerate(nd.gpu_models):
                self.gpu_model[i, g] = _INTERN.model(model)
                self._gpu_real[i, g] = MILLI
        self._enabled = self._gpu_real >= 0
        self.gpu_vis = self._gpu_real.copy()  # free milli of enabled GPUs, -1 elsewhere
        self.gpu_free_total = np.where(self.gpu_vis > 0, self.gpu_vis, 0).sum(axis=1)
        self.gpu_count = (self.gpu_vis >= 0).sum(axis=1)
        self.classes: list[dict[int, int]] = [{} for _ in range(n)]
        self.state_id = np.array([self._intern(i) for i in range(n)], dtype=np.int64)
        self._allowed_cache: dict[frozenset, np.ndarray] = {}

    def copy(self) -> ClusterView:
        other = object.__new__(ClusterView)
        other.nodes = self.nodes
        for name in ("cpu_free", "mem_free", "gpu_model", "_gpu_real", "_enabled", "gpu_vis",
                     "gpu_free_total", "gpu_count", "state_id"):
            setattr(other, name, getattr(self, name).copy())
        other.classes = [dict(c) for c in self.classes]
        other._allowed_cache = {}
        return other

    # -- reading -------------------------------------------------------------------------------
    def gpu_free(self, node: int, gpu: int) -> int:
        """Free milli of that GPU, whether or not it is enabled."""
        return int(self._gpu_real[node, gpu])

    def state(self, node: int) -> tuple:
        """The node's interned state key: (free CPU, sorted (model id, free milli) per GPU)."""
        return _INTERN.states[self.state_id[node]]

    def allowed_gpus(self, models: frozenset[str] | None) -> np.ndarray | None:
        """Boolean (node, GPU) mask of GPUs whose model is in `models`; None when any model goes."""
        if models is None:
            return None
        mask = self._allowed_cache.get(models)
        if mask is None:
            ids = [_INTERN.model_ids[m] for m in models if m in _INTERN.model_ids]
            mask = self._allowed_cache[models] = np.isin(self.gpu_model, ids)
        return mask

    def usable_gpus(self, demand: Demand) -> np.ndarray:
        """(node, GPU) mask of enabled GPUs of an allowed model with room for the demand's share."""
        need = demand.per_gpu_milli
        ok = self.gpu_vis == MILLI if need == MILLI else self.gpu_vis >= need
        allowed = self.allowed_gpus(demand.models)
        return ok if allowed is None else ok & allowed

    def feasible(self, demand: Demand, node_mask: np.ndarray | None = None) -> np.ndarray:
        """Boolean mask of nodes the demand fits on (the filter every policy shares)."""
        mask = (self.cpu_free >= demand.cpu_milli) & (self.mem_free >= demand.memory_mib)
        if node_mask is not None:
            mask &= node_mask
        if demand.num_gpu == 1:
            mask &= self.usable_gpus(demand).any(axis=1)
        elif demand.num_gpu > 1:
            mask &= self.usable_gpus(demand).sum(axis=1) >= demand.num_gpu
        return mask

    def fits(self, node: int, demand: Demand) -> bool:
        """Whether the demand fits on that node (its row of `feasible`): O(the node's GPUs)."""
        if not self.nodes or self.cpu_free[node] < demand.cpu_milli or self.mem_free[node] < demand.memory_mib:
            return False
        return demand.num_gpu == 0 or self.fitting_gpus(node, demand).size >= demand.num_gpu

    def fitting_gpus(self, node: int, demand: Demand) -> np.ndarray:
        """Indices of the node's GPUs that can take the demand's per-GPU share."""
        need = demand.per_gpu_milli
        row = self.gpu_vis[node]
        ok = row == MILLI if need == MILLI else row >= need
        allowed = self.allowed_gpus(demand.models)
        if allowed is not None:
            ok &= allowed[node]
        return np.flatnonzero(ok)

    # -- changing ------------------------------------------------------------------------------
    def allocate(self, node: int, gpus: tuple[int, ...], demand: Demand, *, check: bool = True) -> None:
        """Take the demand from the node and those GPUs; ValueError if it does not fit (unchecked
        when not `check`: a view that follows another takes what that one took, hidden GPUs too)."""
        gpus = tuple(int(g) for g in gpus)
        if check:
            self._check_fits(node, gpus, demand)
        self._apply(node, gpus, demand, -1)
        self.classes[node][demand.gpu_class] = self.classes[node].get(demand.gpu_class, 0) + 1

    def _check_fits(self, node: int, gpus: tuple[int, ...], demand: Demand) -> None:
        if len(gpus) != demand.num_gpu or len(set(gpus)) != len(gpus):
            raise ValueError(f"demand needs {demand.num_gpu} distinct GPUs, got {gpus}")
        if self.cpu_free[node] < demand.cpu_milli or self.mem_free[node] < demand.memory_mib:
            raise ValueError(f"not enough CPU or memory on {self.nodes[node].name}")
        if gpus and not set(self.fitting_gpus(node, demand).tolist()).issuperset(gpus):
            raise ValueError(f"GPUs {gpus} on {self.nodes[node].name} cannot take {demand}")

    def release(self, node: int, gpus: tuple[int, ...], demand: Demand) -> None:
        """Give back what `allocate` took; ValueError if that would exceed the node's capacity."""
        gpus = tuple(int(g) for g in gpus)
        cap = self.nodes[node]
        if len(gpus) != demand.num_gpu:
            raise ValueError(f"demand used {demand.num_gpu} GPUs, got {gpus}")
        if (self.cpu_free[node] + demand.cpu_milli > cap.cpu_milli
                or self.mem_free[node] + demand.memory_mib > cap.memory_mib):
            raise ValueError(f"release exceeds the CPU or memory of {cap.name}")
        for g in gpus:
            if not 0 <= g < len(cap.gpu_models) or self._gpu_real[node, g] + demand.per_gpu_milli > MILLI:
                raise ValueError(f"release exceeds GPU {g} of {cap.name}")
        self._apply(node, gpus, demand, +1)
        count = self.classes[node].get(demand.gpu_class, 0) - 1
        if count > 0:
            self.classes[node][demand.gpu_class] = count
        else:
            self.classes[node].pop(demand.gpu_class, None)

    def set_gpu_enabled(self, node: int, gpu: int, enabled: bool) -> None:
        """A disabled GPU is invisible to every policy (drained, reserved or MIG-managed)."""
        if not 0 <= gpu < len(self.nodes[node].gpu_models):
            raise IndexError(f"{self.nodes[node].name} has no GPU {gpu}")
        if bool(self._enabled[node, gpu]) == enabled:
            return
        self._enabled[node, gpu] = enabled
        self._allowed_cache.clear()
        self._refresh(node)

    def _apply(self, node: int, gpus: tuple[int, ...], demand: Demand, sign: int) -> None:
        if not (gpus or demand.cpu_milli or demand.memory_mib):
            return  # a MIG slice's host share of nothing: the node's state stays as it is
        self.cpu_free[node] += sign * demand.cpu_milli
        self.mem_free[node] += sign * demand.memory_mib
        for g in gpus:
            self._gpu_real[node, g] += sign * demand.per_gpu_milli
        self._refresh(node)

    def _refresh(self, node: int) -> None:
        row = np.where(self._enabled[node], self._gpu_real[node], -1)
        self.gpu_vis[node] = row
        shares = row.tolist()  # a node's few GPUs: Python sums them in half numpy's call overhead
        self.gpu_free_total[node] = sum(share for share in shares if share > 0)
        self.gpu_count[node] = sum(share >= 0 for share in shares)
        self.state_id[node] = self._intern(node, shares)

    def _intern(self, node: int, shares: list[int] | None = None) -> int:
        """The node's state id; `shares`: its row of gpu_vis as a list, if at hand."""
        free = self.gpu_vis[node].tolist() if shares is None else shares
        return _INTERN.state(_state_key(int(self.cpu_free[node]), self.gpu_model[node].tolist(), free))


# -- fragmentation ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Typical:
    weight: float
    cpu_milli: int
    num_gpu: int
    per_gpu: int
    total: int
    model_ids: frozenset[int] | None


class Fragmentation:
    """FGD's fragmentation measure of node states against a weighted set of typical demands."""

    def __init__(self, typical: Sequence[tuple[Demand, float]]):
        self.typical = [
            _Typical(float(w), d.cpu_milli, d.num_gpu, d.per_gpu_milli, d.total_gpu_milli,
                     None if d.models is None else frozenset(_INTERN.model(m) for m in d.models))
            for d, w in typical if w > 0]
        self._cache: dict[tuple, float] = {}

    def of_state(self, key: tuple) -> float:
        """Weighted idle GPU milli the typical demands could not use on a node in this state."""
        value = self._cache.get(key)
        if value is None:
            value = self._cache[key] = self._compute(key)
        return value

    def _compute(self, key: tuple) -> float:
        cpu_free, gpus = key
        frees = sorted(f for _, f in gpus)
        idle = sum(frees)
        if idle == 0:
            return 0.0
        # The typical demands that may use any model (all of them on most pod lists) are answered
        # from the sorted free milli and its prefix sums: the same integers as `_fgd_fragment` and
        # `_copies_fragment` give, summed in the same order, without a pass over the GPUs for each.
        n = len(frees)
        prefix = [0] * (n + 1)
        for i, f in enumerate(frees):
            prefix[i + 1] = prefix[i] + f
        copies = self._copies_rule(gpus)
        fragment = self._copies_fragment if copies else self._fgd_fragment
        total = 0.0
        for t in self.typical:
            if t.num_gpu == 0 or cpu_free < t.cpu_milli:
                total += t.weight * idle
            elif t.model_ids is not None:
                total += t.weight * fragment(t, cpu_free, gpus, idle)
            elif copies and t.num_gpu == 1 and t.per_gpu < MILLI and t.cpu_milli:
                fed = min(n - bisect_left(frees, t.per_gpu), cpu_free // t.cpu_milli)
                total += t.weight * (idle - (prefix[n] - prefix[n - fed]))
            elif idle < t.total:
                total += t.weight * idle
            else:
                total += t.weight * prefix[bisect_left(frees, t.per_gpu)]
        return total

    def _copies_rule(self, gpus: tuple) -> bool:
        """Whether a node with these (model id, free) GPUs is measured by `_copies_fragment`."""
        return False

    def _rule(self, gpus: tuple):
        """The fragment rule for a node with these (model id, free) GPUs."""
        return self._copies_fragment if self._copies_rule(gpus) else self._fgd_fragment

    def _fgd_fragment(self, t: _Typical, cpu_free: int, gpus: tuple, idle: int) -> int:
        """Idle milli that `t` cannot use on a node whose free CPU has room for at least one `t`."""
        if t.model_ids is None:
            usable = idle
            frag = sum(f for _, f in gpus if f < t.per_gpu)
        else:
            usable = sum(f for m, f in gpus if m in t.model_ids)
            frag = sum(f for m, f in gpus if m not in t.model_ids or f < t.per_gpu)
        return idle if usable < t.total else frag

    def after(self, key: tuple, demand: Demand, gpu_entries: Sequence[tuple[int, int]]) -> tuple:
        """The state key after placing `demand` on GPUs with these (model id, free) entries."""
        cpu_free, gpus = key
        remaining = list(gpus)
        for entry in gpu_entries:
            remaining.remove(entry)
            remaining.append((entry[0], entry[1] - demand.per_gpu_milli))
        return (cpu_free - demand.cpu_milli, tuple(sorted(remaining)))


class ShareCopiesFragmentation(Fragmentation):
    """FGD's measure, except that a typical GPU share can use only as many of a node's GPUs as the
    node's free CPU has room for copies of it (the GPUs with the most free milli).

    FGD counts every GPU a share fits on as usable once the CPU fits one copy, so it does not see
    GPUs stranded by CPU (a node with 12 free cores cannot feed eight 4-core shares) until the CPU
    is all but gone. Nodes with a GPU model some model-restricted typical demand needs keep FGD's
    rule: measured on the openb gpuspec pod lists, the copy count costs there what it gains
    elsewhere (docs/benchmarks/openb.md)."""

    def __init__(self, typical: Sequence[tuple[Demand, float]]):
        super().__init__(typical)
        self.restricted_models = frozenset().union(
            *(t.model_ids for t in self.typical if t.num_gpu and t.model_ids is not None))
        self.reserved_models = self.restricted_models  # until reserve_for sees the fleet
        self._capacity: dict[int, int] | None = None

    def reserve_for(self, capacity: dict[int, int]) -> bool:
        """Which models the restricted typical demands need more than their share of (the models
        `FragmentationAwarePolicy` keeps for them); `capacity` is the fleet's GPUs per model id.

        Each restricted typical demand's GPU milli is split over the fleet's GPUs of its models in
        proportion to their count; a model is reserved when the restricted demand falling on it is a
        larger share of all restricted demand than its GPUs are of the fleet's. On the openb gpuspec
        lists that is T4, P100 and V100 (2-4x their share), not G2 (0.3x): the union of restricted
        models held every model, so no node was preferred. Returns whether the set changed."""
        if capacity == self._capacity:
            return False
        self._capacity = dict(capacity)
        load: dict[int, float] = {}
        for t in self.typical:
            if not t.num_gpu or t.model_ids is None:
                continue
            present = {m: capacity[m] for m in t.model_ids if capacity.get(m)}
            total = sum(present.values())
            for m, n in present.items():
                load[m] = load.get(m, 0.0) + t.weight * t.total * n / total
        restricted, fleet = sum(load.values()), sum(capacity.values())
        reserved = frozenset(m for m, x in load.items() if x * fleet > restricted * capacity[m])
        if reserved == self.reserved_models:
            return False
        self.reserved_models = reserved
        return True

    def _copies_rule(self, gpus):
        return not any(m in self.restricted_models for m, _ in gpus)

    def _copies_fragment(self, t: _Typical, cpu_free: int, gpus: tuple, idle: int) -> int:
        """FGD's fragment, except that a share can use only its CPU-fed copies' GPUs."""
        if t.num_gpu != 1 or t.per_gpu >= MILLI or t.cpu_milli == 0:
            return self._fgd_fragment(t, cpu_free, gpus, idle)
        fitting = sorted((f for m, f in gpus if f >= t.per_gpu and (t.model_ids is None or m in t.model_ids)),
                         reverse=True)
        return idle - sum(fitting[:cpu_free // t.cpu_milli])


def _sigmoid_score(delta: float) -> int:
    """FGD's integer score: floor(100 * sigmoid(delta / 1000)), delta = F before - F after."""
    x = delta / 1000.0
    s = 1.0 / (1.0 + math.exp(-x)) if x > -700 else 0.0
    return int(s * MAX_SCORE)


def _entry_options(key: tuple, demand: Demand, allowed: frozenset[int] | None) -> list[tuple[int, int]]:
    """Distinct (model id, free) GPU entries of a state that can take the demand's share."""
    need = demand.per_gpu_milli
    out = []
    for entry in dict.fromkeys(key[1]):
        m, f = entry
        if f >= need and (allowed is None or m in allowed):
            out.append(entry)
    return out


# -- policies ----------------------------------------------------------------------------------------


class PlacementPolicy(ABC):
    """Chooses a node and GPUs for a demand on a ClusterView."""

    name: str = "abstract"

    def choose(self, view: ClusterView, demand: Demand,
               node_mask: np.ndarray | None = None) -> tuple[int, tuple[int, ...]] | None:
        """(node index, GPU indices on that node; () for num_gpu == 0), or None when no node is feasible."""
        candidates = np.flatnonzero(view.feasible(demand, node_mask))
        if candidates.size == 0:
            return None
        node = int(self.pick_node(view, demand, candidates))
        if demand.num_gpu == 0:
            return node, ()
        return node, tuple(int(g) for g in self.pick_gpus(view, demand, node))

    @abstractmethod
    def pick_node(self, view: ClusterView, demand: Demand, candidates: np.ndarray) -> int:
        """One of the feasible node indices (sorted ascending)."""

    def pick_gpus(self, view: ClusterView, demand: Demand, node: int) -> Sequence[int]:
        """Default GPU choice: whole GPUs by index; a share on the best-fitting GPU."""
        fitting = view.fitting_gpus(node, demand)
        if demand.is_share:
            free = view.gpu_vis[node, fitting]
            return (fitting[int(np.argmin(free))],)
        return fitting[:demand.num_gpu]


def _first_max(scores: np.ndarray, candidates: np.ndarray) -> int:
    return candidates[int(np.argmax(scores))]


class RandomPolicy(PlacementPolicy):
    """A uniformly random feasible node, and a uniformly random fitting GPU for a share."""

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def pick_node(self, view, demand, candidates):
        return candidates[int(self.rng.integers(candidates.size))]

    def pick_gpus(self, view, demand, node):
        fitting = view.fitting_gpus(node, demand)
        if demand.is_share:
            return (fitting[int(self.rng.integers(fitting.size))],)
        return fitting[:demand.num_gpu]


class BestFitPolicy(PlacementPolicy):
    """Least weighted leftover: 0.5 (free CPU - asked)/128,000 + 0.5 (free GPU - asked)/8,000."""

    name = "bestfit"

    def pick_node(self, view, demand, candidates):
        cpu_left = (view.cpu_free[candidates] - demand.cpu_milli) / MAX_SPEC_CPU * 0.5
        gpu_left = (view.gpu_free_total[candidates] - demand.total_gpu_milli) / MAX_SPEC_GPU * 0.5
        scores = ((1.0 - (cpu_left + gpu_left)) * MAX_SCORE).astype(np.int64)
        return _first_max(scores, candidates)


class DotProductPolicy(PlacementPolicy):
    """Tetris-style: the smallest dot product of free and asked (CPU, total GPU), each over its max."""

    name = "dotprod"

    def pick_node(self, view, demand, candidates):
        dot = (view.cpu_free[candidates] / MAX_SPEC_CPU * (demand.cpu_milli / MAX_SPEC_CPU)
               + view.gpu_free_total[candidates] / MAX_SPEC_GPU * (demand.total_gpu_milli / MAX_SPEC_GPU))
        scores = (MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
        return _first_max(scores, candidates)


class GpuClusteringPolicy(PlacementPolicy):
    """Keep GPU demands of one kind (share, k whole GPUs) together, fuller nodes first."""

    name = "clustering"

    def pick_node(self, view, demand, candidates):
        if demand.num_gpu == 0:
            return candidates[0]
        cls = demand.gpu_class
        fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU - view.gpu_free_total[candidates]) // MAX_SPEC_GPU
        band = np.empty(candidates.size, dtype=np.int64)
        for i, n in enumerate(candidates.tolist()):
            classes = view.classes[n]
            gpu_classes = len(classes) - (1 if -1 in classes else 0)
            if classes.get(cls, 0) > 0:
                band[i] = 3 if gpu_classes == 1 else 2
            else:
                band[i] = 1 if gpu_classes == 0 else 0
        return _first_max(fill + band * (MAX_SCORE // 4), candidates)


class GpuPackingPolicy(PlacementPolicy):
    """Prefer partly used GPUs, then free GPUs on used nodes, then idle nodes with fewer GPUs."""

    name = "packing"

    def pick_node(self, view, demand, candidates):
        if demand.num_gpu == 0:
            return candidates[0]
        rows = view.gpu_vis[candidates]
        full = (rows == MILLI).sum(axis=1)
        idle = full == view.gpu_count[candidates]
        fitting = np.where(rows >= demand.per_gpu_milli, rows, 10 * MILLI)
        chosen = np.sort(fitting, axis=1)[:, :demand.num_gpu]
        full_used = (chosen == MILLI).sum(axis=1)
        ratio = (chosen * 100 // MILLI).sum(axis=1)
        scores = np.where(
            idle, np.maximum(MAX_SCORE // 3 - full, full),
            np.where(full_used > 0, np.maximum(MAX_SCORE // 2 - full_used, MAX_SCORE // 3),
                     np.maximum(MAX_SCORE - ratio // 10, MAX_SCORE // 2)))
        return _first_max(scores, candidates)


class BinpackPolicy(PlacementPolicy):
    """Most allocated first: least free GPU milli left on the node, then least free CPU."""

    name = "binpack"

    def pick_node(self, view, demand, candidates):
        order = np.lexsort((view.cpu_free[candidates], view.gpu_free_total[candidates]))
        return candidates[order[0]]


class SpreadPolicy(PlacementPolicy):
    """Least allocated first: most free GPU milli on the node, then most free CPU; emptiest GPU."""

    name = "spread"

    def pick_node(self, view, demand, candidates):
        order = np.lexsort((-view.cpu_free[candidates], -view.gpu_free_total[candidates]))
        return candidates[order[0]]

    def pick_gpus(self, view, demand, node):
        fitting = view.fitting_gpus(node, demand)
        if demand.is_share:
            return (fitting[int(np.argmax(view.gpu_vis[node, fitting]))],)
        return fitting[:demand.num_gpu]


class _StateScored(PlacementPolicy):
    """A policy whose node score depends only on the node's interned state (cached per state)."""

    max_cached = 2_000_000
    measure: type[Fragmentation] = Fragmentation

    def __init__(self, typical: Sequence[tuple[Demand, float]] | None):
        self.frag = self.measure(typical or [])
        self._scores: dict[Demand, dict[int, tuple]] = {}  # demand -> state id -> (score, entries)
        self._cached = 0

    def _table(self, demand: Demand) -> dict[int, tuple]:
        table = self._scores.get(demand)
        if table is None:
            table = self._scores[demand] = {}
        return table

    def _evaluate_into(self, table: dict[int, tuple], sid: int, demand: Demand) -> tuple:
        if self._cached >= self.max_cached:
            for other in self._scores.values():
                other.clear()
            self._cached = 0
        hit = table[sid] = self.evaluate(_INTERN.states[sid], demand)
        self._cached += 1
        return hit

    def state_choice(self, sid: int, demand: Demand) -> tuple:
        """(score tuple, best GPU entries) for a node in state `sid`; cached."""
        table = self._table(demand)
        hit = table.get(sid)
        return hit if hit is not None else self._evaluate_into(table, sid, demand)

    @abstractmethod
    def evaluate(self, key: tuple, demand: Demand) -> tuple:
        """(score, entries): higher score is better; entries are the (model, free) GPUs to use."""

    def _allowed_ids(self, demand: Demand) -> frozenset[int] | None:
        if demand.models is None:
            return None
        return frozenset(_INTERN.model_ids[m] for m in demand.models if m in _INTERN.model_ids)

    def pick_node(self, view, demand, candidates):
        sids = view.state_id[candidates]
        unique = np.unique(sids).tolist()
        table = self._table(demand)
        scores = []
        for sid in unique:
            hit = table.get(sid)
            scores.append((hit if hit is not None else self._evaluate_into(table, sid, demand))[0])
        best = max(scores)
        tied = [sid for sid, score in zip(unique, scores) if score == best]
        hits = sids == tied[0] if len(tied) == 1 else np.isin(sids, tied)
        return candidates[int(np.argmax(hits))]

    def pick_gpus(self, view, demand, node):
        _, entries = self.state_choice(int(view.state_id[node]), demand)
        fitting = view.fitting_gpus(node, demand)
        if not demand.is_share:
            return fitting[:demand.num_gpu]
        wanted = set(entries)
        for g in fitting.tolist():
            if (int(view.gpu_model[node, g]), int(view.gpu_vis[node, g])) in wanted:
                return (g,)
        raise AssertionError("cached GPU choice does not match the node's state")


class FgdPolicy(_StateScored):
    """Fragmentation gradient descent: the placement that grows fragmentation least (integer score)."""

    name = "fgd"

    def evaluate(self, key, demand):
        before = self.frag.of_state(key)
        if not demand.is_share:
            whole = [e for e in _entry_options(key, demand, self._allowed_ids(demand))][:1]
            entries = whole * demand.num_gpu if demand.num_gpu else []
            after = self.frag.of_state(self.frag.after(key, demand, entries))
            return _sigmoid_score(before - after), tuple(entries)
        best, chosen = -1, []
        for entry in _entry_options(key, demand, self._allowed_ids(demand)):
            score = _sigmoid_score(before - self.frag.of_state(self.frag.after(key, demand, [entry])))
            if score > best:
                best, chosen = score, [entry]
            elif score == best:
                chosen.append(entry)
        return best, tuple(chosen)


class FragmentationAwarePolicy(_StateScored):
    """Our default: fragmentation growth in coarse steps, then keep idle, big and needed nodes whole.

    Score, compared lexicographically (higher is better), ties to the lowest node index:
    1. ceil(`levels` x sigmoid(-growth / 1000)) - 1 of the node's fragmentation growth (FGD's
       measure against `typical`, with shares limited to the copies the node's CPU can hold:
       `ShareCopiesFragmentation`); coarse on purpose, so placements whose fragmentation differs
       little are decided by the packing keys below instead of by noise in the measure;
    2. not a fully idle node (idle nodes are what whole-GPU and multi-GPU demands need);
    3. for a GPU demand, a node with no reserved GPU model before one with some: a model is reserved
       when the model-restricted typical demands need more of it than its share of the fleet
       (`ShareCopiesFragmentation.reserve_for`; those GPUs are the only place such demands can go).
       A CPU-only demand takes no reserved GPU, so for it no node is reserved;
    4. among the former, fewer GPUs on the node (small nodes absorb small demands, 8-GPU nodes
       stay whole); among the latter no size preference, since a small node of a model that
       restricted demands need is exactly what must not be filled first;
    5. for a share, the GPU with the least free milli that fits (best fit on the GPU).

    When a GPU demand must open an idle node (an idle node scores best), an idle node at most
    `idle_slack` steps of key 1 below the best idle node with as many GPUs counts as level with it,
    and ties among idle nodes go to the least free CPU, then memory, then the lowest index. Among
    idle nodes of one size, key 1's small differences come from the bigger nodes' spare CPU (more
    copies of a typical share fit), so the measure alone opens the biggest node first, and those are
    the only home of the biggest demands (openb multigpu40: 8-GPU pods asking for 120 cores fit only
    the 39 G3 nodes, and lost about 12 a seed). A node whose CPU would strand GPUs scores several
    steps lower and still loses; a CPU-only demand goes as scored (key 4 sends it where the CPU is).

    When a used node is best for a whole single GPU, ties go to the least free CPU, then the lowest
    index: the GPU takes its CPU from the node that has least of it to spare, and nodes with more
    CPU keep it for their own free GPUs (openb multigpu40, 10 seeds: 96.893 before, 96.907 after;
    fewer G2 GPUs stranded without CPU at 100% arrived, e.g. 12.2 -> 6.7 GPUs on seed 45).
    """

    name = "default"
    measure = ShareCopiesFragmentation
    levels = 100
    idle_slack = 1  # multigpu40, 10 seeds: 0: 96.77; 1 and 2: 96.89; 3 and 4: 96.77

    def __init__(self, typical: Sequence[tuple[Demand, float]] | None):
        super().__init__(typical)
        self._fleet: list[NodeCapacity] | None = None

    def pick_node(self, view, demand, candidates):
        if view.nodes is not self._fleet:  # a new fleet: which models do restricted demands need?
            self._fleet = view.nodes
            capacity: dict[int, int] = {}
            for nd in view.nodes:
                for model in nd.gpu_models:
                    mid = _INTERN.model(model)
                    capacity[mid] = capacity.get(mid, 0) + 1
            if self.frag.reserve_for(capacity):
                for table in self._scores.values():
                    table.clear()
                self._cached = 0
        sids = view.state_id[candidates]
        unique = np.unique(sids).tolist()
        table = self._table(demand)
        scores = []
        for sid in unique:
            hit = table.get(sid)
            scores.append((hit if hit is not None else self._evaluate_into(table, sid, demand))[0])
        best = max(scores)
        if best[1] == 0 or not demand.num_gpu:  # a used node is best, or no GPU asked: as scored
            tied = [sid for sid, score in zip(unique, scores) if score == best]
            hits = sids == tied[0] if len(tied) == 1 else np.isin(sids, tied)
            if demand.num_gpu == 1 and not demand.is_share:  # a whole GPU: the least free CPU
                pool = candidates[hits]
                if pool.size > 1:
                    return int(pool[np.lexsort((pool, view.cpu_free[pool]))[0]])
            return candidates[int(np.argmax(hits))]
        return self._open_idle(view, candidates, sids, unique, scores)

    def _open_idle(self, view, candidates, sids, unique, scores) -> int:
        """The idle node to open for a GPU demand when an idle node scores best (see the class doc).

        Within each GPU count, an idle node's key 1 is raised to the best of its size when it is at
        most `idle_slack` steps below it; the ties then go to the least free CPU, then memory."""
        top: dict[int, int] = {}
        for sid, score in zip(unique, scores):
            if score[1] == -1:
                size = len(_INTERN.states[sid][1])
                top[size] = max(top.get(size, score[0]), score[0])
        merged = []
        for sid, score in zip(unique, scores):
            if score[1] == -1:
                step = top[len(_INTERN.states[sid][1])]
                if score[0] >= step - self.idle_slack:
                    score = (step, *score[1:])
            merged.append(score)
        best = max(merged)
        tied = [sid for sid, score in zip(unique, merged) if score == best]
        pool = candidates[sids == tied[0] if len(tied) == 1 else np.isin(sids, tied)]
        if pool.size == 1:
            return int(pool[0])
        order = np.lexsort((pool, view.mem_free[pool], view.cpu_free[pool]))
        return int(pool[order[0]])

    def size_keys(self, key: tuple, demand: Demand) -> tuple[int, int]:
        """Keys 3 and 4 for a node state: (not reserved for restricted demands, -GPUs if not).

        A demand without GPUs takes no reserved GPU, so for it no node is reserved: it goes by size,
        to the small nodes, which have the most CPU per GPU (openb's 2-GPU T4 nodes: 52 cores a GPU,
        the 8-GPU G2 nodes: 12). Sending it past them to the G2 nodes strands G2 GPUs without CPU."""
        if demand.num_gpu and any(m in self.frag.reserved_models for m, _ in key[1]):
            return (0, 0)
        return (1, -len(key[1]))

    def evaluate(self, key, demand):
        before = self.frag.of_state(key)
        options = _entry_options(key, demand, self._allowed_ids(demand))
        idle_node = int(bool(key[1]) and all(f == MILLI for _, f in key[1]))
        size = self.size_keys(key, demand)
        if demand.is_share:
            placements = [[entry] for entry in options]
        else:
            placements = [options[:1] * demand.num_gpu if demand.num_gpu else []]
        best, chosen = None, []
        for entries in placements:
            growth = self.frag.of_state(self.frag.after(key, demand, entries)) - before
            # ceil - 1, not floor: a placement that leaves fragmentation exactly as it was shares its
            # step with a small increase, so any placement that reduces fragmentation beats it.
            step = math.ceil(self.levels / (1.0 + math.exp(min(growth / 1000.0, 700.0)))) - 1
            score = (step, -idle_node, *size, -(entries[0][1] if entries else 0))
            if best is None or score > best:
                best, chosen = score, entries[:1]
            elif score == best:
                chosen += entries[:1]
        return best, tuple(chosen)


POLICY_NAMES: tuple[str, ...] = (
    "random", "dotprod", "clustering", "packing", "bestfit", "fgd", "binpack", "spread", "default")


def get_policy(name: str, *, seed: int = 0,
               typical: Sequence[tuple[Demand, float]] | None = None) -> PlacementPolicy:
    """A fresh policy by name; `seed` feeds `random`, `typical` the fragmentation-aware ones."""
    if name == "random":
        return RandomPolicy(seed)
    if name == "fgd":
        return FgdPolicy(typical)
    if name == "default":
        return FragmentationAwarePolicy(typical)
    simple = {"dotprod": DotProductPolicy, "clustering": GpuClusteringPolicy, "packing": GpuPackingPolicy,
              "bestfit": BestFitPolicy, "binpack": BinpackPolicy, "spread": SpreadPolicy}
    if name not in simple:
        raise ValueError(f"unknown placement policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return simple[name]()
