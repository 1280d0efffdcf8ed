"""NVIDIA's MIG catalogue per GPU model and its placement geometry.

Facts from NVIDIA's MIG User Guide ("Supported MIG Profiles") and real `nvidia-smi mig -lgip`
listings (see shared/reference/MIG.md). Each MIG-capable model has its own geometry: a number of
memory slices and compute slices (8 and 7 on A100/H100/H200/B200, 4 and 4 on A30). A GPU
instance occupies `size` memory slices from one of its profile's legal starts, instances never
share a memory slice, their compute slices add up to at most the GPU's, and each profile has an
instance limit. Profile ids are the driver's and belong to one model (id 5 is 4g on A100 but
2g.12gb on A30). The NVML backend reads the real values from the driver and reports where
they differ from this table; the table serves the simulator and names profiles for users.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence

from .model import MigInstance, MigProfile

_GIB = 1024
_LISTING_ROUNDING_MIB = 11  # -lgip prints GiB to two decimals: 9856 MiB reads 9.62


@dataclass(frozen=True)
class MigGeometry:
    """A MIG GPU's slices: placements address its memory slices; compute slices are a budget."""

    memory_slices: int
    compute_slices: int

    @classmethod
    def of(cls, profiles: Mapping[int, MigProfile]) -> "MigGeometry":
        """The geometry a profile table implies: its furthest placement end and its largest
        profile's compute (every MIG GPU has a profile that takes the whole GPU)."""
        kept = _GEOMETRIES.get(id(profiles))
        if kept is not None and kept[0] is profiles:  # the table of a fleet's model, asked about before
            return kept[1]
        if not profiles:
            raise ValueError("a GPU without MIG profiles has no MIG geometry")
        if len(_GEOMETRIES) >= 256:  # tables of fleets reloaded since
            _GEOMETRIES.clear()
        geometry = _geometry_of(tuple(profiles.values()))
        _GEOMETRIES[id(profiles)] = (profiles, geometry)
        return geometry


# MigGeometry.of's answers by table object (kept with it, so its id is not reused): the hash of a
# table's profiles is worked out in Python, on every placement
_GEOMETRIES: dict[int, tuple[Mapping[int, MigProfile], MigGeometry]] = {}


@lru_cache(maxsize=256)
def _geometry_of(profiles: tuple[MigProfile, ...]) -> MigGeometry:
    return MigGeometry(memory_slices=max(s + p.memory_slices for p in profiles for s in p.starts),
                       compute_slices=max(p.compute_slices for p in profiles))


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

    @property
    def geometry(self) -> MigGeometry:
        """Its MIG geometry; ValueError for a model without MIG."""
        return MigGeometry.of(self.profiles)

    def profile(self, name_or_id: str | int) -> MigProfile:
        """The profile called e.g. '3g.40gb' (or with that profile id); KeyError if none."""
        if isinstance(name_or_id, int):
            return self.profiles[name_or_id]
        for p in self.profiles.values():
            if p.name == name_or_id:
                return p
        raise KeyError(f"{self.name} has no MIG profile {name_or_id!r}")


# Placements per profile id, one table per geometry: (compute slices, memory slices, max instances,
# legal starts). The 8-slice table is verified from `-lgipp` on A100-SXM4-40GB, H100 80GB HBM3 and
# H100 NVL; the guide gives the same fractions and instance counts for every 8-slice model.
_EIGHT_SLICES: dict[int, tuple[int, int, int, tuple[int, ...]]] = {
    19: (1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),  # 1g
    20: (1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),  # 1g+me
    15: (1, 2, 4, (0, 2, 4, 6)),           # 1g with double memory
    14: (2, 2, 3, (0, 2, 4)),              # 2g
    9: (3, 4, 2, (0, 4)),                  # 3g
    5: (4, 4, 1, (0,)),                    # 4g
    0: (7, 8, 1, (0,)),                    # 7g
}
# A30: 4 memory and 4 compute slices; the guide's A30 table (1/4, 2/4, full), with the ids, instance
# counts and placements of a real A30 `-lgip`/`-lgipp` listing (driver 535.183.01: 14 {0,1,2,3}:1,
# 21 {0,1,2,3}:1, 5 {0,2}:2, 6 {0,2}:2, 0 {0}:4).
_FOUR_SLICES: dict[int, tuple[int, int, int, tuple[int, ...]]] = {
    14: (1, 1, 4, (0, 1, 2, 3)),  # 1g.6gb
    21: (1, 1, 1, (0, 1, 2, 3)),  # 1g.6gb+me
    5: (2, 2, 2, (0, 2)),         # 2g.12gb
    6: (2, 2, 1, (0, 2)),         # 2g.12gb+me (driver R525+)
    0: (4, 4, 1, (0,)),           # 4g.24gb
}


def _mig_model(name: str, memory_mib: int, placements: dict[int, tuple[int, int, int, tuple[int, ...]]],
               rows: dict[int, tuple[str, float, int]], aliases: tuple[str, ...]) -> GpuModel:
    profiles = {}
    for pid, (pname, mem_gib, sms) in rows.items():
        compute, mem_slices, max_n, starts = placements[pid]
        profiles[pid] = MigProfile(
            profile_id=pid, name=pname, compute_slices=compute, memory_slices=mem_slices,
            memory_mib=round(mem_gib * _GIB), max_instances=max_n, starts=starts, sms=sms,
            media_extensions=pname.endswith("+me"))
    return GpuModel(name=name, memory_mib=memory_mib, profiles=profiles, aliases=aliases)


def _eight_slice_rows(small: str, double: str, half: str, full: str, mem: tuple[float, ...],
                       sms: tuple[int, ...] = (16, 16, 26, 32, 60, 64, 132)) -> dict[int, tuple[str, float, int]]:
    """Rows of an 8-slice model: profile names from the memory in each name ('10gb', '20gb',
    '40gb', '80gb'), memory in GiB per id 19, 20, 15, 14, 9, 5, 0 and SMs in the same order."""
    names = (f"1g.{small}", f"1g.{small}+me", f"1g.{double}", f"2g.{double}", f"3g.{half}", f"4g.{half}",
             f"7g.{full}")
    return {pid: (n, m, s) for pid, n, m, s in zip((19, 20, 15, 14, 9, 5, 0), names, mem, sms)}


# Memory in GiB as `nvidia-smi mig -lgip` prints it, and SMs. Every model's profile names, memory and
# SM fractions and instance counts are those of NVIDIA's MIG User Guide, "Supported MIG Profiles"
# (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html); the sizes come from
# the real listings named per model. Values marked "unverified" were seen in no listing: estimates
# the NVML backend replaces with the driver's (it reports the difference). Sizes vary a little with
# the driver (A100-40GB's 2g, 3g and 7g read 9.75/19.62/39.50 on some, H100 NVL's 10.62/46.12/92.62).
# A100-40GB: MIG.md's -lgip captures.
_A100_40 = _eight_slice_rows("5gb", "10gb", "20gb", "40gb", (4.75, 4.75, 9.62, 9.62, 19.50, 19.50, 39.25),
                              (14, 14, 14, 28, 42, 56, 98))
# A100-80GB: published A100 80GB -lgip listings (9.50/19.50/39.25/79.00); 1g.20gb (id 15, R525+) was
# in none of them and is unverified.
_A100_80 = _eight_slice_rows("10gb", "20gb", "40gb", "80gb", (9.50, 9.50, 19.50, 19.50, 39.25, 39.25, 79.00),
                              (14, 14, 14, 28, 42, 56, 98))
# H100 80GB HBM3: MIG.md's capture and published H100 -lgip listings.
_H100_80 = _eight_slice_rows("10gb", "20gb", "40gb", "80gb", (9.75, 9.75, 19.62, 19.62, 39.50, 39.50, 79.25))
# H100 NVL: the -lgip listing in NVIDIA/gpu-operator PR 903.
_H100_94 = _eight_slice_rows("12gb", "24gb", "47gb", "94gb", (10.75, 10.75, 21.62, 21.62, 46.38, 46.38, 93.12))
# H100 96GB (the guide's "H100 on GH200" table): a GH200 480GB -lgip listing, every row (published
# Grace Hopper benchmarking logs, kf-cuanschutz/NVIDIA_Grace_Hopper_benchmarking_logs_).
_H100_96 = _eight_slice_rows("12gb", "24gb", "48gb", "96gb", (11.00, 11.00, 23.00, 23.00, 46.50, 46.50, 93.00))
# H20: names and instance counts from NVIDIA's vGPU documentation (MIG-backed vGPU types for H20 SXM5
# 96GB: 1g.12gb x7, 1g.12gb+me, 1g.24gb x4, 2g.24gb x3, 3g.48gb x2, 4g.48gb, 7g.96gb); sizes unverified
# (those of the GH200 listing, the same 97871 MiB of HBM3); SMs unknown.
_H20 = {pid: (name, mem, 0) for pid, (name, mem, _) in _H100_96.items()}
# H200: the -lgip listing in NVIDIA/mig-parted issue 120, every row. H200 NVL shares it (same names in
# the guide, same 143771 MiB); its own listing was not seen.
_H200 = _eight_slice_rows("18gb", "35gb", "71gb", "141gb", (16.00, 16.00, 32.25, 32.25, 69.50, 69.50, 139.75))
# GH200 144G HBM3e: 1g and 2g from the -lgip listing in NVIDIA/mig-parted PR 139 (names of 3g.72gb,
# 4g.72gb and 7g.144gb from mig-parted's configs); 3g, 4g and 7g sizes unverified (scaled from H200).
_GH200_144 = _eight_slice_rows("18gb", "36gb", "72gb", "144gb", (17.50, 17.50, 35.25, 35.25, 71.00, 71.00, 142.75))
# B200: 1g and 2g from the -lgip listing in NVIDIA/mig-parted PR 166 (a later one, PR 187, reads
# 1g.23gb as 20.50); 3g, 4g and 7g sizes unverified and their SMs unknown (the guide gives only
# fractions: 4/8 memory for 3g and 4g).
_B200 = _eight_slice_rows("23gb", "45gb", "90gb", "180gb", (22.00, 22.00, 44.25, 44.25, 88.50, 88.50, 178.25),
                           (18, 18, 30, 36, 0, 0, 0))
# A30: the A30 -lgip listing above (driver 535.183.01; an older driver read 4g.24gb as 23.50).
_A30 = {14: ("1g.6gb", 5.81, 14), 21: ("1g.6gb+me", 5.81, 14), 5: ("2g.12gb", 11.69, 28),
        6: ("2g.12gb+me", 11.69, 28), 0: ("4g.24gb", 23.44, 56)}

# Total memory is MiB as NVML reports it (nvidia-smi's Memory-Usage total), seen in published output
# for A30 (24576), A800-SXM4-80GB (81920), H100 80GB HBM3 and H800 (81559), H100 NVL (95830),
# GH200 480GB and H20 (97871), H200 and H200 NVL (143771), GH200 144G HBM3e (146831) and B200
# (183359). Unverified: H100 96GB HBM3, H800 NVL and the A800 40GB and PCIe boards (the values of
# their siblings). NVML calls the GH200 with 96 GB of HBM3 and 120 GB of LPDDR "GH200 120GB".
_MODELS: list[GpuModel] = [
    _mig_model("A100-SXM4-40GB", 40960, _EIGHT_SLICES, _A100_40, ("A100-40GB",)),
    _mig_model("A100-PCIE-40GB", 40960, _EIGHT_SLICES, _A100_40, ()),
    _mig_model("A100-SXM4-80GB", 81920, _EIGHT_SLICES, _A100_80, ("A100-80GB",)),
    _mig_model("A100 80GB PCIe", 81920, _EIGHT_SLICES, _A100_80, ("A100-PCIE-80GB",)),
    _mig_model("A800-SXM4-40GB", 40960, _EIGHT_SLICES, _A100_40, ("A800-40GB",)),
    _mig_model("A800-SXM4-80GB", 81920, _EIGHT_SLICES, _A100_80, ("A800-80GB",)),
    _mig_model("A800 80GB PCIe", 81920, _EIGHT_SLICES, _A100_80, ("A800-PCIE-80GB",)),
    _mig_model("A30", 24576, _FOUR_SLICES, _A30, ("A30-24GB",)),
    _mig_model("H100 80GB HBM3", 81559, _EIGHT_SLICES, _H100_80, ("H100-SXM5-80GB", "H100-80GB", "H100 PCIe")),
    _mig_model("H800 80GB HBM3", 81559, _EIGHT_SLICES, _H100_80, ("H800", "H800-80GB", "H800 PCIe")),
    _mig_model("H100 NVL", 95830, _EIGHT_SLICES, _H100_94, ("H100-NVL-94GB",)),
    _mig_model("H800 NVL", 95830, _EIGHT_SLICES, _H100_94, ()),
    _mig_model("H100 96GB HBM3", 97871, _EIGHT_SLICES, _H100_96, ("H100-96GB", "PG506-96GB")),
    _mig_model("GH200 480GB", 97871, _EIGHT_SLICES, _H100_96, ("GH200-96GB", "GH200", "GH200 120GB")),
    _mig_model("H20", 97871, _EIGHT_SLICES, _H20, ("H20-96GB",)),
    _mig_model("H200", 143771, _EIGHT_SLICES, _H200, ("H200-141GB", "H200-SXM5-141GB")),
    _mig_model("H200 NVL", 143771, _EIGHT_SLICES, _H200, ("H200-NVL-141GB",)),
    _mig_model("GH200 144G HBM3e", 146831, _EIGHT_SLICES, _GH200_144, ("GH200-144GB",)),
    _mig_model("B200", 183359, _EIGHT_SLICES, _B200, ("B200-180GB",)),
    GpuModel("L4", 23034),
    GpuModel("T4", 15360, aliases=("Tesla T4",)),
    GpuModel("A10", 23028, aliases=("A10G",)),
    GpuModel("L40S", 46068),
    GpuModel("V100-SXM2-16GB", 16384, aliases=("Tesla V100-SXM2-16GB", "V100", "V100-16GB")),
    GpuModel("V100-SXM2-32GB", 32768, aliases=("Tesla V100-SXM2-32GB", "V100-32GB")),
    GpuModel("RTX A6000", 49140, aliases=("A6000",)),
]


_VENDOR = re.compile(r"^NVIDIA[\s_-]+", re.IGNORECASE)
_SEPARATORS = re.compile(r"[\s_-]+")


def _key(name: str) -> str:
    """The patterns are compiled once: a fleet's reading calls this for every GPU (re's shared cache missed there)."""
    return _SEPARATORS.sub("-", _VENDOR.sub("", name.strip())).upper()


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
    """The occupied part of one MIG GPU of some geometry: memory-slice bitmask, compute used,
    count per profile. `Layout(geometry)` is an empty GPU."""

    geometry: MigGeometry
    occupied: int = 0
    compute_used: int = 0
    counts: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(cls, instances: Iterable[MigInstance], profiles: Mapping[int, MigProfile]) -> "Layout":
        """The layout of these instances on a GPU with this profile table."""
        layout = cls(MigGeometry.of(profiles))
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
        return Layout(self.geometry, self.occupied | mask, self.compute_used + profile.compute_slices,
                      tuple(sorted(counts.items())))

    def without_instance(self, profile: MigProfile, start: int) -> "Layout":
        mask = _mask(start, profile.memory_slices)
        if self.occupied & mask != mask or self.count(profile.profile_id) == 0:
            raise ValueError(f"no {profile.name} instance at start {start}")
        counts = dict(self.counts)
        counts[profile.profile_id] -= 1
        if counts[profile.profile_id] == 0:
            del counts[profile.profile_id]
        return Layout(self.geometry, self.occupied & ~mask, self.compute_used - profile.compute_slices,
                      tuple(sorted(counts.items())))

    @property
    def free_memory_slices(self) -> int:
        return self.geometry.memory_slices - bin(self.occupied).count("1")

    @property
    def free_compute_slices(self) -> int:
        return self.geometry.compute_slices - self.compute_used


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def legal_starts(layout: Layout, profile: MigProfile) -> list[int]:
    """Every start at which `profile` can be created on a GPU with this layout."""
    if layout.compute_used + profile.compute_slices > layout.geometry.compute_slices:
        return []
    if layout.count(profile.profile_id) >= profile.max_instances:
        return []
    size, occupied = profile.memory_slices, layout.occupied
    last, width = layout.geometry.memory_slices - size, (1 << size) - 1  # the mask of a start at 0
    return [s for s in profile.starts if s <= last and not occupied & width << s]


def is_legal(instances: Sequence[MigInstance], profiles: Mapping[int, MigProfile]) -> bool:
    """Whether a set of instances is a layout the driver could have made."""
    layout = Layout(MigGeometry.of(profiles))
    for inst in sorted(instances, key=lambda i: i.start):
        profile = profiles.get(inst.profile_id)
        if profile is None or inst.size != profile.memory_slices:
            return False
        if inst.start not in legal_starts(layout, profile):
            return False
        layout = layout.with_instance(profile, inst.start)
    return True


def catalogue_differences(model_name: str, profiles: Mapping[int, MigProfile]) -> list[str]:
    """Where a driver's profile table (NVML's) disagrees with this catalogue's entry for the model,
    one sentence each; empty when they agree or the catalogue has no MIG entry for the model."""
    model = lookup_model(model_name)
    if model is None or not model.mig_capable:
        return []
    out = []
    for pid in sorted(set(model.profiles) | set(profiles)):
        ours, theirs = model.profiles.get(pid), profiles.get(pid)
        if ours is None or theirs is None:
            which, p = ("only the driver", theirs) if ours is None else ("only the catalogue", ours)
            out.append(f"{model.name}: profile id {pid} ({p.name}) is known to {which}")
            continue
        for attr in ("name", "compute_slices", "memory_slices", "memory_mib", "max_instances", "starts"):
            if attr == "memory_mib" and abs(ours.memory_mib - theirs.memory_mib) <= _LISTING_ROUNDING_MIB:
                continue
            if getattr(ours, attr) != getattr(theirs, attr):
                out.append(f"{model.name}: profile id {pid} {attr} is {getattr(theirs, attr)!r} "
                           f"on the driver, {getattr(ours, attr)!r} in the catalogue")
    return out


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
    """Every layout one GPU can reach under a profile table, where each profile leads, and the
    classes of layouts that are worth the same.

    Two layouts are in one class when the same profiles fit on both and each profile leads to
    the same classes on both: their values (`values`) are then equal whatever the mix, so values
    are worked out once per class (52 classes for the 1,109 layouts of an 8-slice GPU). Classes
    are numbered fullest first: a new instance always occupies more, so every class a profile
    leads to comes before the class it leads from."""

    def __init__(self, table: tuple[MigProfile, ...], roots: tuple[Layout, ...]):
        self.layouts, edges = self._explore(table, roots)
        self.index: dict[Layout, int] = {layout: n for n, layout in enumerate(self.layouts)}
        self.gains = tuple(float(p.compute_slices) for p in table)
        self.classes = [0] * len(self.layouts)  # [layout] -> its class
        # [layout][profile]: the class each legal start leads to, by legal start
        self.successors: list[list[list[int]]] = [[] for _ in self.layouts]
        # per class, fullest first: ((profile, classes it leads to), ...) of the profiles that
        # fit, and the profiles that do not (a request for one leaves the layout as it is)
        self._steps: list[tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[int, ...]]] = []
        signatures: dict[tuple[frozenset[int], ...], int] = {}
        for n in sorted(range(len(self.layouts)), key=lambda n: -bin(self.layouts[n].occupied).count("1")):
            after = [[self.classes[t] for t in targets] for targets in edges[n]]
            signature = tuple(frozenset(row) for row in after)
            number = signatures.get(signature)
            if number is None:
                number = signatures[signature] = len(self._steps)
                self._steps.append((tuple((k, tuple(sorted(row))) for k, row in enumerate(signature) if row),
                                    tuple(k for k, row in enumerate(signature) if not row)))
            self.classes[n] = number
            self.successors[n] = after
        self._values: Callable[[Sequence[float], float], list[float]] | None = None  # compiled when first asked

    @staticmethod
    def _explore(table: tuple[MigProfile, ...], roots: tuple[Layout, ...]) -> tuple[list[Layout], list]:
        """Every layout reachable from `roots` by adding instances, in the order first reached, and
        its edges: [layout][profile] -> the layouts each legal start leads to."""
        found: dict[Layout, int] = {}
        reached: list[Layout] = []
        for root in roots:
            if root not in found:
                found[root] = len(reached)
                reached.append(root)
        edges: list[list[list[int]]] = []
        i = 0
        while i < len(reached):
            row = []
            for p in table:
                targets = []
                for s in legal_starts(reached[i], p):
                    after = reached[i].with_instance(p, s)
                    if after not in found:
                        found[after] = len(reached)
                        reached.append(after)
                    targets.append(found[after])
                row.append(targets)
            edges.append(row)
            i += 1
        return reached, edges

    def values(self, shares: Sequence[float], discount: float) -> list[float]:
        """Per class: the compute slices a GPU in it expects to take from the requests to come, if
        it faced them alone. Each request draws a profile by `shares`; one that fits goes where it
        leaves the most value; the n-th request from now counts `discount`**n.

        O(classes x profiles x starts), in one pass from the fullest class (`_compile_values`)."""
        if self._values is None:
            self._values = _compile_values(self._steps, self.gains)
        return self._values(shares, discount)


def _compile_values(steps: Sequence[tuple[tuple[tuple[int, tuple[int, ...]], ...], tuple[int, ...]]],
                    gains: tuple[float, ...]) -> Callable[[Sequence[float], float], list[float]]:
    """`_LayoutGraph.values` for one graph as a function of straight-line arithmetic (one line per
    class, fullest first), five times as fast as a loop over `steps`: a class's value is what the
    profiles that fit place, each at its best start, over the share of requests that leave it as
    it is (`w`, one per set of profiles that do not fit). The terms are added in profile order, as
    they always were, so the values and the choices made from them do not depend on how they are
    computed.

        w2 = 1.0 - d * (s1 + s2)
        v7 = (s0 * (1.0 + d * max(v2, v5, v6)) + s3 * (2.0 + d * v4)) / w2

    The source holds only numbers made here, never anything from outside."""
    shares = [f"s{k}" for k in range(len(gains))]
    lines = ["def values(shares, d):", f"    {', '.join(shares)}, = shares"]
    staying = {unfit: n for n, unfit in enumerate(dict.fromkeys(unfit for _, unfit in steps))}
    for unfit, n in staying.items():  # classes that leave the same profiles unplaced share it
        lines.append(f"    w{n} = 1.0 - d * ({' + '.join(f's{k}' for k in unfit) or '0.0'})")
    for number, (fitting, unfit) in enumerate(steps):
        placed = " + ".join(f"s{k} * ({gains[k]!r} + d * {_best(targets)})" for k, targets in fitting) or "0.0"
        lines.append(f"    v{number} = ({placed}) / w{staying[unfit]}")
    lines.append(f"    return [{', '.join(f'v{n}' for n in range(len(steps)))}]")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102 (numbers only, see above)
    return namespace["values"]


def _best(targets: tuple[int, ...]) -> str:
    """The source of the largest of these classes' values (no call for one or two)."""
    if len(targets) == 1:
        return f"v{targets[0]}"
    if len(targets) == 2:
        return f"(v{targets[0]} if v{targets[0]} >= v{targets[1]} else v{targets[1]})"
    return f"max({', '.join(f'v{t}' for t in targets)})"


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
    start. It never refuses when some GPU has a legal start. The values are worked out again only
    once the expected mix has moved by more than `mix_tolerance` since they last were: early on
    that is every placement, on a hub that has placed thousands one in many.
    """

    name = "default"
    discount = 0.9  # about the next ten requests matter; see docs/benchmarks/mig.md
    prior_count = 10
    mix_tolerance = 0.002  # total variation; see docs/benchmarks/mig.md

    def __init__(self) -> None:
        self._placed: dict[int, int] = {}  # profile id -> instances this placer placed
        # per profile table object (a fleet's GPUs of one model share one): the table, its graph
        self._tables: dict[int, tuple[dict[int, MigProfile], tuple[MigProfile, ...], _LayoutGraph]] = {}
        # per layout graph: the graph, the shares its values were worked out for, the values
        self._valued: dict[int, tuple[_LayoutGraph, list[float], list[float]]] = {}

    def _table(self, profiles: dict[int, MigProfile]) -> tuple[tuple[MigProfile, ...], _LayoutGraph]:
        """The profile table in id order and the layouts reachable from an empty GPU, kept per table
        object (the fleet's GPUs of one model share one): O(1) for an object asked about before."""
        kept = self._tables.get(id(profiles))
        if kept is None or kept[0] is not profiles:
            if len(self._tables) >= 64:  # tables of fleets reloaded since
                self._tables.clear()
            table = tuple(p for _, p in sorted(profiles.items()))
            kept = self._tables[id(profiles)] = (
                profiles, table, _layout_graph(table, (Layout(MigGeometry.of(profiles)),)))
        return kept[1], kept[2]

    def choose(self, layouts: Sequence[Layout], profile: MigProfile,
               profiles: dict[int, MigProfile]) -> tuple[int, int] | None:
        """O(layouts x legal starts) plus at most one `_LayoutGraph.values`."""
        first: dict[Layout, int] = {}  # an identical GPU earlier in the list wins every tie
        for index, layout in enumerate(layouts):
            first.setdefault(layout, index)
        candidates = [(index, layout, starts) for layout, index in first.items()
                      if (starts := legal_starts(layout, profile))]
        if not candidates:
            return None
        table, graph = self._table(profiles)
        if any(layout not in graph.index for layout in first):  # not reachable from empty
            graph = _layout_graph(table, (graph.layouts[0], *first))
        value = self._values(graph, self._shares(table))
        k = next(k for k, p in enumerate(table) if p.profile_id == profile.profile_id)
        best: tuple | None = None
        for index, layout, starts in candidates:
            at = graph.index[layout]
            here = value[graph.classes[at]]
            # the graph lists each layout's successors by legal start
            for start, after in zip(starts, graph.successors[at][k]):
                key = (round(value[after] - here, 9), layout.compute_used, -index, -start)
                if best is None or key > best[0]:
                    best = (key, index, start)
        self._placed[profile.profile_id] = self._placed.get(profile.profile_id, 0) + 1
        return best[1], best[2]

    def _values(self, graph: _LayoutGraph, shares: list[float]) -> list[float]:
        """The graph's values (per class) under `shares`, or the ones last worked out for that graph
        while `shares` is within `mix_tolerance` of the mix they were worked out for: O(profiles) then."""
        kept = self._valued.get(id(graph))
        if kept is None or kept[0] is not graph or _mix_moved(kept[1], shares) > self.mix_tolerance:
            if kept is None and len(self._valued) >= 64:  # graphs of fleets reloaded since
                self._valued.clear()
            kept = self._valued[id(graph)] = (graph, shares, graph.values(shares, self.discount))
        return kept[2]

    def _shares(self, table: tuple[MigProfile, ...]) -> list[float]:
        """Each profile's share of the placed instances plus `prior_count` of each non-media one."""
        counts = [self._placed.get(p.profile_id, 0) + (0 if p.media_extensions else self.prior_count) for p in table]
        total = float(sum(counts))
        return [count / total for count in counts]


def _mix_moved(before: list[float], now: list[float]) -> float:
    """The total variation distance between two mixes (the terms summed in order)."""
    moved = 0.0
    for a, b in zip(before, now):
        moved += abs(a - b)
    return 0.5 * moved


_PLACERS: dict[str, type[MigPlacer]] = {"firstfit": FirstFitPlacer, "default": DefaultPlacer}
MIG_PLACER_NAMES = ("firstfit", "default")


def get_mig_placer(name: str = "default") -> MigPlacer:
    """A new placer of this name (one of MIG_PLACER_NAMES)."""
    try:
        return _PLACERS[name]()
    except KeyError:
        raise ValueError(f"unknown MIG placer {name!r}: choose one of {', '.join(MIG_PLACER_NAMES)}") from None
