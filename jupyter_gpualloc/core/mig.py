"""NVIDIA's MIG catalogue per GPU model and its placement geometry.

Facts from NVIDIA's MIG User Guide (see shared/reference/MIG.md). A MIG-capable GPU of the
A100/H100/H200 family has 8 memory slices and 7 compute slices; a GPU instance occupies
`size` memory slices from one of its profile's legal starts, instances never share a memory
slice, their compute slices add up to at most 7, and each profile has an instance limit.
The NVML backend reads the real values from the driver; this table serves the simulator and
names profiles for users.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

from .model import MigInstance, MigProfile

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
_GIB = 1024

# profile id -> (compute slices, memory slices, max instances, legal starts), shared by the family.
_GEOMETRY: dict[int, tuple[int, int, int, tuple[int, ...]]] = {
    19: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    20: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    15: (1, 2, 4, (0, 2, 4, 6)),
    14: (2, 2, 3, (0, 2, 4)),
    9: (3, 4, 2, (0, 4)),
    5: (4, 4, 1, (0,)),
    0: (7, 8, 1, (0,)),
}


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: its canonical name, memory and (if MIG-capable) its profiles by id."""

    name: str
    memory_mib: int
    profiles: dict[int, MigProfile] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    def profile(self, name_or_id: str | int) -> MigProfile:
        """The profile called e.g. '3g.40gb' (or with that profile id); KeyError if none."""
        if isinstance(name_or_id, int):
            return self.profiles[name_or_id]
        for p in self.profiles.values():
            if p.name == name_or_id:
                return p
        raise KeyError(f"{self.name} has no MIG profile {name_or_id!r}")


def _mig_model(name: str, memory_mib: int, rows: dict[int, tuple[str, float, int]],
               aliases: tuple[str, ...]) -> GpuModel:
    profiles = {}
    for pid, (pname, mem_gib, sms) in rows.items():
        compute, mem_slices, max_n, starts = _GEOMETRY[pid]
        profiles[pid] = MigProfile(
            profile_id=pid, name=pname, compute_slices=compute, memory_slices=mem_slices,
            memory_mib=round(mem_gib * _GIB), max_instances=max_n, starts=starts, sms=sms,
            media_extensions=pname.endswith("+me"))
    return GpuModel(name=name, memory_mib=memory_mib, profiles=profiles, aliases=aliases)


_MODELS: list[GpuModel] = [
    _mig_model("A100-SXM4-40GB", 40960, {
        19: ("1g.5gb", 4.75, 14), 20: ("1g.5gb+me", 4.75, 14), 15: ("1g.10gb", 9.62, 14),
        14: ("2g.10gb", 9.62, 28), 9: ("3g.20gb", 19.50, 42), 5: ("4g.20gb", 19.50, 56),
        0: ("7g.40gb", 39.25, 98)}, ("A100-40GB", "A100-PCIE-40GB")),
    _mig_model("A100-SXM4-80GB", 81920, {
        19: ("1g.10gb", 9.75, 14), 20: ("1g.10gb+me", 9.75, 14), 15: ("1g.20gb", 19.50, 14),
        14: ("2g.20gb", 19.62, 28), 9: ("3g.40gb", 39.25, 42), 5: ("4g.40gb", 39.25, 56),
        0: ("7g.80gb", 79.25, 98)}, ("A100-80GB", "A100 80GB PCIe")),
    _mig_model("H100 80GB HBM3", 81559, {
        19: ("1g.10gb", 9.75, 16), 20: ("1g.10gb+me", 9.75, 16), 15: ("1g.20gb", 19.62, 26),
        14: ("2g.20gb", 19.62, 32), 9: ("3g.40gb", 39.50, 60), 5: ("4g.40gb", 39.50, 64),
        0: ("7g.80gb", 79.25, 132)}, ("H100-SXM5-80GB", "H100-80GB", "H100 PCIe")),
    _mig_model("H100 NVL", 95830, {
        19: ("1g.12gb", 10.75, 16), 20: ("1g.12gb+me", 10.75, 16), 15: ("1g.24gb", 21.62, 26),
        14: ("2g.24gb", 21.62, 32), 9: ("3g.47gb", 46.38, 60), 5: ("4g.47gb", 46.38, 64),
        0: ("7g.94gb", 93.12, 132)}, ("H100-NVL-94GB",)),
    # H200 memory sizes other than 1g.18gb, 2g.35gb and 7g.141gb are unverified (MIG.md).
    _mig_model("H200", 143771, {
        19: ("1g.18gb", 16.00, 16), 20: ("1g.18gb+me", 16.00, 16), 15: ("1g.35gb", 32.50, 26),
        14: ("2g.35gb", 32.50, 32), 9: ("3g.71gb", 70.00, 60), 5: ("4g.71gb", 70.00, 64),
        0: ("7g.141gb", 140.00, 132)}, ("H200-141GB",)),
    GpuModel("L4", 23034),
    GpuModel("T4", 15360, aliases=("Tesla T4",)),
    GpuModel("A10", 23028, aliases=("A10G",)),
    GpuModel("L40S", 46068),
    GpuModel("V100-SXM2-16GB", 16384, aliases=("Tesla V100-SXM2-16GB", "V100", "V100-16GB")),
    GpuModel("V100-SXM2-32GB", 32768, aliases=("Tesla V100-SXM2-32GB", "V100-32GB")),
    GpuModel("RTX A6000", 49140, aliases=("A6000",)),
]


def _key(name: str) -> str:
    name = re.sub(r"^NVIDIA\s+", "", name.strip(), flags=re.IGNORECASE)
    return re.sub(r"[\s_-]+", "-", name).upper()


_BY_KEY: dict[str, GpuModel] = {}
for _m in _MODELS:
    for _n in (_m.name, *_m.aliases):
        _BY_KEY[_key(_n)] = _m


def known_models() -> list[GpuModel]:
    return list(_MODELS)


def lookup_model(name: str) -> GpuModel | None:
    """The catalogue entry for a model name as NVML or a fleet file spells it, or None."""
    return _BY_KEY.get(_key(name))


def resolve_model(name: str, memory_mib: int | None = None) -> GpuModel:
    """The catalogue entry, or for an unknown model one without MIG and the given memory."""
    model = lookup_model(name)
    if model is not None:
        return model
    if not memory_mib:
        raise ValueError(f"unknown GPU model {name!r}: give its memory_mib")
    return GpuModel(name=re.sub(r"^NVIDIA\s+", "", name.strip()), memory_mib=int(memory_mib))


def same_model(a: str, b: str) -> bool:
    """Whether two spellings name the same GPU model (aliases and `NVIDIA ` prefix allowed)."""
    ma, mb = lookup_model(a), lookup_model(b)
    if ma is not None and mb is not None:
        return ma.name == mb.name
    return _key(a) == _key(b)


@dataclass(frozen=True)
class Layout:
    """The occupied part of one MIG GPU: memory-slice bitmask, compute used, count per profile."""

    occupied: int = 0
    compute_used: int = 0
    counts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, instances: Iterable[MigInstance], profiles: dict[int, MigProfile]) -> "Layout":
        layout = cls()
        for inst in instances:
            layout = layout.with_instance(profiles[inst.profile_id], inst.start)
        return layout

    def count(self, profile_id: int) -> int:
        for pid, n in self.counts:
            if pid == profile_id:
                return n
        return 0

    def with_instance(self, profile: MigProfile, start: int) -> "Layout":
        mask = _mask(start, profile.memory_slices)
        counts = dict(self.counts)
        counts[profile.profile_id] = counts.get(profile.profile_id, 0) + 1
        return Layout(self.occupied | mask, self.compute_used + profile.compute_slices,
                      tuple(sorted(counts.items())))

    def without_instance(self, profile: MigProfile, start: int) -> "Layout":
        mask = _mask(start, profile.memory_slices)
        if self.occupied & mask != mask or self.count(profile.profile_id) == 0:
            raise ValueError(f"no {profile.name} instance at start {start}")
        counts = dict(self.counts)
        counts[profile.profile_id] -= 1
        if counts[profile.profile_id] == 0:
            del counts[profile.profile_id]
        return Layout(self.occupied & ~mask, self.compute_used - profile.compute_slices,
                      tuple(sorted(counts.items())))

    @property
    def free_memory_slices(self) -> int:
        return MEMORY_SLICES - bin(self.occupied).count("1")

    @property
    def free_compute_slices(self) -> int:
        return COMPUTE_SLICES - self.compute_used


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def legal_starts(layout: Layout, profile: MigProfile) -> list[int]:
    """Every start at which `profile` can be created on a GPU with this layout."""
    if layout.compute_used + profile.compute_slices > COMPUTE_SLICES:
        return []
    if layout.count(profile.profile_id) >= profile.max_instances:
        return []
    return [s for s in profile.starts
            if s + profile.memory_slices <= MEMORY_SLICES
            and not layout.occupied & _mask(s, profile.memory_slices)]


def is_legal(instances: Sequence[MigInstance], profiles: dict[int, MigProfile]) -> bool:
    """Whether a set of instances is a layout the driver could have made."""
    layout = Layout()
    for inst in sorted(instances, key=lambda i: i.start):
        profile = profiles.get(inst.profile_id)
        if profile is None or inst.size != profile.memory_slices:
            return False
        if inst.start not in legal_starts(layout, profile):
            return False
        layout = layout.with_instance(profile, inst.start)
    return True


class MigPlacer(ABC):
    """Chooses the GPU and the legal start for a new MIG instance."""

    name: str = "abstract"

    @abstractmethod
    def choose(self, layouts: Sequence[Layout], profile: MigProfile,
               profiles: dict[int, MigProfile]) -> tuple[int, int] | None:
        """(index into layouts, start) for a new instance of `profile`, or None when no GPU has a
        legal placement. `profiles` is the GPU model's whole profile table."""


class FirstFitPlacer(MigPlacer):
    """The first GPU with any legal placement, at its lowest legal start."""

    name = "firstfit"

    def choose(self, layouts: Sequence[Layout], profile: MigProfile,
               profiles: dict[int, MigProfile]) -> tuple[int, int] | None:
        for index, layout in enumerate(layouts):
            starts = legal_starts(layout, profile)
            if starts:
                return index, starts[0]
        return None


@lru_cache(maxsize=65536)
def room_for(layout: Layout, profile: MigProfile) -> int:
    """How many more instances of `profile` alone fit on a GPU with this layout."""
    n = 0
    while True:
        starts = legal_starts(layout, profile)
        if not starts:
            return n
        layout = layout.with_instance(profile, starts[0])
        n += 1


class _LayoutGraph:
    """Every layout one GPU can reach under a profile table, and where each profile leads.

    Layouts are grouped by occupied memory slices: a new instance always occupies more, so
    values can be computed level by level, from full GPUs down to the empty one."""

    def __init__(self, table: tuple[MigProfile, ...], roots: tuple[Layout, ...]):
        self.index: dict[Layout, int] = {}
        self.layouts: list[Layout] = []
        for root in roots:
            self._add(root)
        succ: list[list[list[int]]] = []
        i = 0
        while i < len(self.layouts):
            row = []
            for p in table:
                row.append([self._add(self.layouts[i].with_instance(p, s))
                            for s in legal_starts(self.layouts[i], p)])
            succ.append(row)
            i += 1
        width = max((len(t) for row in succ for t in row), default=0) or 1
        self.succ = np.full((len(self.layouts), len(table), width), -1, dtype=np.int64)
        for i, row in enumerate(succ):
            for k, targets in enumerate(row):
                self.succ[i, k, :len(targets)] = targets
        used = np.array([bin(layout.occupied).count("1") for layout in self.layouts])
        self.levels = [np.flatnonzero(used == n) for n in range(MEMORY_SLICES, -1, -1)]
        self.gains = np.array([p.compute_slices for p in table], dtype=float)

    def _add(self, layout: Layout) -> int:
        if layout not in self.index:
            self.index[layout] = len(self.layouts)
            self.layouts.append(layout)
        return self.index[layout]

    def values(self, shares: np.ndarray, discount: float) -> np.ndarray:
        """Per layout: the compute slices a GPU in it expects to take from the requests to come,
        if it faced them alone. Each request draws a profile by `shares`; one that fits goes where
        it leaves the most value; the n-th request from now counts `discount`**n."""
        value = np.zeros(len(self.layouts))
        for level in self.levels:
            if not level.size:
                continue
            targets = self.succ[level]                       # [layout, profile, start]
            fits = targets[:, :, 0] >= 0
            after = np.where(targets >= 0, value[targets], -np.inf).max(axis=2)
            after[~fits] = 0.0
            placed = (fits * shares * (self.gains + discount * after)).sum(axis=1)
            stays = (shares * ~fits).sum(axis=1)             # requests that do not fit leave it as is
            value[level] = placed / (1.0 - discount * stays)
        return value


@lru_cache(maxsize=64)
def _layout_graph(table: tuple[MigProfile, ...], roots: tuple[Layout, ...]) -> _LayoutGraph:
    return _LayoutGraph(table, roots)


class DefaultPlacer(MigPlacer):
    """Places each instance where it costs its GPU the least expected future.

    A GPU's value is the compute slices it can expect to take from the requests to come if it
    faced them alone (`_LayoutGraph.values`), a request `discount` further ahead counting
    `discount` times less. Profiles are expected in the shares of the instances this placer has
    placed, on top of `prior_count` of each non-media profile: a new placer expects every profile
    alike and learns the real mix over its first hundred or so placements (a request that waits
    and is asked about again counts once, when it is placed). The candidate (GPU, legal start)
    whose GPU loses the least value wins; ties go to the fuller GPU, then the lower index and
    start. It never refuses when some GPU has a legal start.
    """

    name = "default"
    discount = 0.9  # about the next ten requests matter; see docs/benchmarks/mig.md
    prior_count = 10

    def __init__(self) -> None:
        self._placed: dict[int, int] = {}  # profile id -> instances this placer placed

    def choose(self, layouts: Sequence[Layout], profile: MigProfile,
               profiles: dict[int, MigProfile]) -> tuple[int, int] | None:
        first: dict[Layout, int] = {}  # an identical GPU earlier in the list wins every tie
        for index, layout in enumerate(layouts):
            first.setdefault(layout, index)
        candidates = [(index, layout, start) for layout, index in first.items()
                      for start in legal_starts(layout, profile)]
        if not candidates:
            return None
        table = tuple(p for _, p in sorted(profiles.items()))
        graph = _layout_graph(table, (Layout(),))
        if any(layout not in graph.index for layout in first):  # not reachable from empty
            graph = _layout_graph(table, (Layout(), *first))
        value = graph.values(self._shares(table), self.discount)
        best: tuple | None = None
        for index, layout, start in candidates:
            change = value[graph.index[layout.with_instance(profile, start)]] - value[graph.index[layout]]
            key = (round(change, 9), layout.compute_used, -index, -start)
            if best is None or key > best[0]:
                best = (key, index, start)
        self._placed[profile.profile_id] = self._placed.get(profile.profile_id, 0) + 1
        return best[1], best[2]

    def _shares(self, table: tuple[MigProfile, ...]) -> np.ndarray:
        """Each profile's share of the placed instances plus `prior_count` of each non-media one."""
        prior = [0 if p.media_extensions else self.prior_count for p in table]
        counts = np.array([self._placed.get(p.profile_id, 0) + n for p, n in zip(table, prior)], dtype=float)
        return counts / counts.sum()


_PLACERS: dict[str, type[MigPlacer]] = {"firstfit": FirstFitPlacer, "default": DefaultPlacer}
MIG_PLACER_NAMES = ("firstfit", "default")


def get_mig_placer(name: str = "default") -> MigPlacer:
    """A new placer of this name (one of MIG_PLACER_NAMES)."""
    try:
        return _PLACERS[name]()
    except KeyError:
        raise ValueError(f"unknown MIG placer {name!r}: choose one of {', '.join(MIG_PLACER_NAMES)}") from None
