"""What shapes a spec can take on the fleet: its plans (a MIG profile, a share or whole GPUs of one model).

Plans read only the fleet, which is fixed once loaded, and the policy's offers: a spec's plans
are found once and shared by every lease asking the same. Nothing here looks at who holds what.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from . import names
from .model import (
    MIB_PER_GIB,
    MILLI_PER_GPU,
    Lease,
    MigMode,
    MigProfile,
    Node,
    SliceKind,
    SliceSpec,
    SpecError,
)
from .offers import Offer
from .placement import Demand

CACHE_LIMIT = 4096  # specs (and host shapes) remembered; requests of many odd sizes start over


@dataclass(frozen=True)
class Plan:
    """One concrete way to satisfy a spec: a MIG profile, a share or whole GPUs of one model."""

    kind: SliceKind
    model: str
    memory_mib: int
    profile: MigProfile | None = None
    milli: int = MILLI_PER_GPU
    count: int = 1


@dataclass
class ModelGroup:
    """The fleet's GPUs of one model and MIG-ness: how many sit on each node, and what plain slices
    any of them may carry (Gpu.sharing: "any", "whole", "shared")."""

    model: str
    is_mig: bool
    memory_mib: int
    profiles: dict[int, MigProfile]
    per_node: dict[str, int] = field(default_factory=dict)
    sharing: set[str] = field(default_factory=set)
    dynamic: bool = False  # MIG: whether any of its GPUs may have instances made
    existing: set[int] = field(default_factory=set)  # MIG: the profile ids of its GPUs' instances now

    def takes(self, kind: SliceKind) -> bool:
        return "any" in self.sharing or kind.value in self.sharing

    @property
    def usable_profiles(self) -> dict[int, MigProfile]:
        """The MIG profiles a slice here can have: any of the model's where a layout may change, only
        those with an instance on one of its GPUs where every layout is static."""
        if self.dynamic:
            return self.profiles
        return {pid: p for pid, p in self.profiles.items() if pid in self.existing}


class Plans:
    """Every spec's plans on one fleet, found once per spec (O(1) after the first)."""

    def __init__(self, nodes: Sequence[Node], profiles: dict[str, dict[int, MigProfile]]):
        """`profiles`: each MIG GPU's profiles by GPU UUID (absent or empty: not MIG)."""
        self.nodes = list(nodes)
        self._node_index = {n.name: i for i, n in enumerate(self.nodes)}
        groups: dict[tuple[str, bool], ModelGroup] = {}
        for gpu in (g for n in self.nodes for g in n.gpus):
            key = (gpu.model, gpu.mig_mode is not MigMode.OFF)
            if key not in groups:
                groups[key] = ModelGroup(gpu.model, key[1], gpu.memory_mib, profiles.get(gpu.uuid, {}))
            group = groups[key]
            group.per_node[gpu.node] = group.per_node.get(gpu.node, 0) + 1
            group.sharing.add(gpu.sharing)
            group.dynamic = group.dynamic or gpu.mig_mode is MigMode.DYNAMIC
            group.existing.update(i.profile_id for i in gpu.instances)
        self.groups = list(groups.values())
        self._known: dict[SliceSpec, tuple[Plan, ...]] = {}
        self._hosts_known: dict[tuple, frozenset[int]] = {}

    def of(self, spec: SliceSpec) -> tuple[Plan, ...]:
        """Every concrete way to satisfy a spec in this fleet, preferred first; SpecError if none.
        O(1) after the first lease of the spec (a spec refused is looked at again)."""
        plans = self._known.get(spec)
        if plans is None:
            if len(self._known) >= CACHE_LIMIT:
                self._known.clear()
            plans = self._known[spec] = tuple(self._find(spec))
        return plans

    def _find(self, spec: SliceSpec) -> list[Plan]:
        groups = self._groups_for(spec)
        plans: list[Plan] = []
        if spec.kind in (SliceKind.MIG, SliceKind.ANY):
            for g in groups:
                if g.is_mig:
                    profile = pick_profile(g.usable_profiles, spec)
                    if profile is not None:
                        plans.append(Plan(SliceKind.MIG, g.model, profile.memory_mib, profile=profile))
        plain = [g for g in groups if not g.is_mig and spec.memory_mib <= g.memory_mib]
        if spec.kind in (SliceKind.SHARED, SliceKind.ANY) and spec.count == 1 and spec.memory_mib \
                and not spec.profile:
            for g in (g for g in plain if g.takes(SliceKind.SHARED)):
                milli = math.ceil(spec.memory_mib * MILLI_PER_GPU / g.memory_mib)
                plans.append(Plan(SliceKind.SHARED, g.model, spec.memory_mib, milli=milli))
        if spec.kind is SliceKind.WHOLE or (spec.kind is SliceKind.ANY and not spec.profile):
            # "any" with a memory size is a share where the GPU can share, else the GPU whole
            whole = [g for g in plain if g.takes(SliceKind.WHOLE) and (
                spec.kind is SliceKind.WHOLE or not spec.memory_mib or not g.takes(SliceKind.SHARED))]
            for g in whole:
                counts = [g.per_node[spec.node]] if spec.node else g.per_node.values()
                if max(counts) >= spec.count:
                    plans.append(Plan(SliceKind.WHOLE, g.model, g.memory_mib * spec.count, count=spec.count))
        if not plans:
            raise SpecError(_unmet_field(spec, groups), f"no GPU in this fleet can provide {spec.describe(article=True)}")
        hosted = [p for p in plans if self.host_nodes(p, spec)]
        if not hosted:
            raise self._no_host(plans, spec)
        kind_rank = {SliceKind.MIG: 0, SliceKind.SHARED: 1, SliceKind.WHOLE: 2}
        hosted.sort(key=lambda p: (kind_rank[p.kind], p.memory_mib))
        return hosted

    def _groups_for(self, spec: SliceSpec) -> list[ModelGroup]:
        """The model groups the spec's model and node allow; SpecError for an unknown node or profile."""
        if spec.node and not any(spec.node in g.per_node for g in self.groups):
            raise SpecError("spec.node", f"no node {spec.node!r} with GPUs in this fleet")
        models = names.models_named(spec.model, [g.model for g in self.groups]) if spec.model else None
        groups = [g for g in self.groups
                  if (models is None or g.model in models)
                  and (not spec.node or spec.node in g.per_node)]
        if spec.profile:
            where = (f" on {spec.model}" if spec.model else "") + (f" on node {spec.node}" if spec.node else "")
            mig_groups = [g for g in groups if g.is_mig]
            usable = {g.model: [p.name for p in g.usable_profiles.values()] for g in mig_groups}
            static = [g for g in mig_groups if spec.profile in {p.name for p in g.profiles.values()}
                      and spec.profile not in usable[g.model]]
            if static and not any(spec.profile in found for found in usable.values()):
                raise SpecError("spec.profile", _never_made(spec.profile, static))
            names.check_profile(spec.profile, usable, where)
        return groups

    def host_nodes(self, plan: Plan, spec: SliceSpec, *, host: bool = True) -> frozenset[int]:
        """Nodes with enough GPUs of the plan's model and (when `host`) enough CPU and host
        memory in all to hold the request, busy or not: O(nodes) the first time for a (plan,
        node, host demand), O(1) after."""
        key = (plan, spec.node, spec.cpu_milli, spec.host_memory_mib, host)
        found = self._hosts_known.get(key)
        if found is None:
            if len(self._hosts_known) >= CACHE_LIMIT:
                self._hosts_known.clear()
            found = self._hosts_known[key] = frozenset(self._find_host_nodes(plan, spec, host))
        return found

    def _find_host_nodes(self, plan: Plan, spec: SliceSpec, host: bool) -> set[int]:
        is_mig = plan.kind is SliceKind.MIG
        group = next(g for g in self.groups if g.model == plan.model and g.is_mig == is_mig)
        found = set()
        for name, gpus in group.per_node.items():
            node = self.nodes[self._node_index[name]]
            if gpus >= plan.count and (not spec.node or name == spec.node) and (not host or (
                    node.cpu_milli >= spec.cpu_milli and node.memory_mib >= spec.host_memory_mib)):
                found.add(self._node_index[name])
        return found

    def _no_host(self, plans: Sequence[Plan], spec: SliceSpec) -> SpecError:
        """Why no node could ever hold the request beside a fitting GPU, blaming CPU or host memory."""
        nodes = [self.nodes[i] for p in plans for i in self.host_nodes(p, spec, host=False)]
        most_cpu = max(n.cpu_milli for n in nodes)
        most_memory = max(n.memory_mib for n in nodes)
        what = f"{spec.describe(article=True)}"
        if spec.cpu_milli > most_cpu:
            return SpecError("spec.cpu_milli", f"{spec.cpu_milli} milli-CPU is more than any node with {what} "
                                               f"has (at most {most_cpu})")
        if spec.host_memory_mib > most_memory:
            return SpecError("spec.host_memory_mib", f"{spec.host_memory_mib} MiB of host memory is more than any "
                                                     f"node with {what} has (at most {most_memory})")
        return SpecError("spec.cpu_milli", f"no node with {what} has both {spec.cpu_milli} milli-CPU and "
                                           f"{spec.host_memory_mib} MiB of host memory")

    def derived_offers(self, shared_offer_gib: Sequence[float]) -> list[Offer]:
        """Without configured offers: every MIG profile, the policy's share sizes and whole GPUs, per model."""
        offers = []
        for group in self.groups:
            model = group.model
            slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
            if group.is_mig:
                for p in sorted(group.usable_profiles.values(), key=lambda p: (p.memory_mib, p.compute_slices)):
                    if not p.media_extensions:
                        offers.append(Offer(f"mig-{p.name}-{slug}", f"MIG {p.name} on {model}",
                                            SliceSpec.from_json({"kind": "mig", "profile": p.name, "model": model})))
                continue
            for gib in shared_offer_gib:
                if gib * MIB_PER_GIB < group.memory_mib:
                    offers.append(Offer(f"shared-{gib:g}gb-{slug}", f"Shared {gib:g} GiB on {model}",
                                        SliceSpec.from_json({"kind": "shared", "memory_gib": gib, "model": model})))
            offers.append(Offer(f"whole-{slug}", f"Whole {model}",
                                SliceSpec.from_json({"kind": "whole", "model": model})))
        return offers

    def offer_plans(self, offers: Iterable[Offer]) -> list[tuple[Offer, tuple[Plan, ...]]]:
        """Each offer with its plans; the ones this fleet cannot satisfy left out."""
        out = []
        for offer in offers:
            try:
                out.append((offer, self.of(offer.spec)))
            except SpecError:
                continue
        return out

    def typical_demands(self, offers: Iterable[Offer]) -> list[tuple[Demand, float]]:
        """The workload a fragmentation-aware policy plans for: the non-MIG offers, equally weighted."""
        typical = []
        for offer, plans in self.offer_plans(offers):
            plain = [p for p in plans if p.kind is not SliceKind.MIG]
            if plain:
                typical.append((demand(plain[0], offer.spec), 1.0))
        return typical


def pick_profile(profiles: dict[int, MigProfile], spec: SliceSpec) -> MigProfile | None:
    """The MIG profile a spec asks for, by name, or the smallest that holds its memory."""
    if spec.profile:
        return next((p for p in profiles.values() if p.name == spec.profile), None)
    # A profile serves the size in its name: 1g.10gb answers a 10 GB request, though the
    # driver reports 9.50 GiB for it on A100-80GB (9.75 on H100 80GB).
    fitting = [p for p in profiles.values() if not p.media_extensions
               and max(p.memory_mib, nominal_mib(p)) >= spec.memory_mib]
    return min(fitting, key=lambda p: (nominal_mib(p), p.memory_mib, p.compute_slices), default=None)


def _never_made(profile: str, groups: Sequence[ModelGroup]) -> str:
    """Why a MIG profile the model has is refused where every layout is static: no empty fleet holds it."""
    models = " or ".join(sorted({g.model for g in groups}))
    have = sorted({p.name for g in groups for p in g.usable_profiles.values()}, key=names.profile_order)
    return (f"no {models} GPU here has a {profile} instance, and none can be made: their MIG layouts are "
            f"static (set by the administrator or the cluster's MIG manager); they have "
            f"{', '.join(have) if have else 'no instances'}")


def nominal_mib(profile: MigProfile) -> int:
    """The memory a profile's name promises ('3g.40gb' -> 40 GiB)."""
    found = re.search(r"\.(\d+)gb", profile.name)
    return int(found.group(1)) * MIB_PER_GIB if found else profile.memory_mib


def host_demand(spec: SliceSpec) -> Demand:
    """What a request asks of its node beside the GPU: CPU and host memory."""
    return Demand(cpu_milli=spec.cpu_milli, memory_mib=spec.host_memory_mib)


def demand(plan: Plan, spec: SliceSpec) -> Demand:
    """What a plain (non-MIG) plan asks of a node: host resources, GPUs and each GPU's share."""
    num_gpu = plan.count if plan.kind is SliceKind.WHOLE else 1
    return Demand(cpu_milli=spec.cpu_milli, memory_mib=spec.host_memory_mib, num_gpu=num_gpu,
                  gpu_milli=plan.milli if plan.kind is SliceKind.SHARED else MILLI_PER_GPU,
                  models=frozenset({plan.model}))


def slice_demand(lease: Lease) -> Demand:
    """What a granted plain slice takes from its node."""
    sl = lease.slice
    return Demand(cpu_milli=lease.spec.cpu_milli, memory_mib=lease.spec.host_memory_mib,
                  num_gpu=len(sl.gpu_uuids), gpu_milli=sl.milli, models=frozenset({sl.model}))


def _unmet_field(spec: SliceSpec, groups: list) -> str:
    """The spec field to blame when nothing fits: the first constraint no candidate GPU meets."""
    if spec.profile:
        return "spec.profile"
    if not groups:
        return "spec.node" if spec.node else "spec.model" if spec.model else "spec.kind"
    if spec.count > 1:
        return "spec.count"
    return "spec.memory_mib" if spec.memory_mib else "spec.kind"

