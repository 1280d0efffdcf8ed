"""Which leases to preempt for a request: a dry run that changes nothing and returns the victims.

The fewest, newest preemptible batch leases whose end makes room for one of the request's plans;
the scheduler ends them, then places the request. To change how victims are picked, change
`victims`.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Sequence

from . import mig
from .fleet_state import FleetState, GpuState
from .indexes import ActiveLeases
from .model import Lease, LeaseState, MigMode, MigProfile, PriorityClass, SliceKind
from .plans import Plan


def victims(lease: Lease, plans: Sequence[Plan], reserved: set[str], fleet: FleetState,
            active: ActiveLeases, returning: Iterable[Lease]) -> list[Lease] | None:
    """The fewest victims whose end makes room for one of `plans` (outside `reserved` GPUs), or None.
    None too while a preempted lease's slice is still returning: no more victims meanwhile.

    O(1) when no preemptible lease is active; otherwise it searches only the GPUs (and, for
    whole GPUs, the nodes) that hold one."""
    if not active.preemptible:
        return None
    if any(l.state is LeaseState.PREEMPTED for l in returning):
        return None
    held = {u for i in active.preemptible if active.by_id[i].state is LeaseState.GRANTED
            for u in active.by_id[i].slice.gpu_uuids}
    if not held:
        return None
    gpus = sorted((fleet.gpus[u] for u in held), key=lambda gs: (gs.node_index, gs.slot))
    best: list[Lease] | None = None
    for plan in plans:
        if plan.kind is SliceKind.MIG:
            chosen = _for_mig_plan(lease, plan, reserved, gpus, active)
        else:
            chosen = _for_plain_plan(lease, plan, reserved, gpus, fleet, active)
        if chosen is not None and (best is None or len(chosen) < len(best)):
            best = chosen
    return best or None


def preemptible_on(gs: GpuState, active: ActiveLeases) -> list[Lease]:
    """The preemptible batch leases holding part of `gs`, newest grant first; leases granted
    at the same time go newest request (highest seq) first, so the order never depends on
    set iteration (string hashing)."""
    holders = set(gs.owner.values()) | set(gs.holders)
    leases = [active.by_id[h] for h in holders if h in active.by_id]  # not those returning
    return sorted((l for l in leases if l.preemptible and l.priority is PriorityClass.BATCH),
                  key=lambda l: (-(l.granted_at or 0), -l.seq))


def _on_mig_gpu(gs: GpuState, profile: MigProfile, active: ActiveLeases) -> list[Lease] | None:
    """The fewest (then newest) preemptible leases on a MIG GPU whose end makes room for `profile`."""
    candidates = preemptible_on(gs, active)
    dynamic = gs.gpu.mig_mode is MigMode.DYNAMIC
    for victim in candidates:  # an instance of the very profile, kept as it is, is handed over
        inst = gs.instances[victim.slice.mig_uuid]
        if inst.profile_id == profile.profile_id and not (dynamic and inst.uuid in gs.created):
            return [victim]
    if not dynamic:
        return None
    destroyable = [v for v in candidates if v.slice.mig_uuid in gs.created]
    layout = gs.layout()
    for size in range(1, len(destroyable) + 1):
        for chosen in itertools.combinations(destroyable, size):
            after = layout
            for victim in chosen:
                inst = gs.instances[victim.slice.mig_uuid]
                after = after.without_instance(gs.profiles[inst.profile_id], inst.start)
            if mig.legal_starts(after, profile):
                return list(chosen)
    return None


def _for_mig_plan(lease: Lease, plan: Plan, reserved: set[str], held: list[GpuState],
                  active: ActiveLeases) -> list[Lease] | None:
    """The fewest victims making room for a MIG plan among the GPUs in `held`."""
    spec = lease.spec
    best: list[Lease] | None = None
    for gs in held:
        if not (gs.is_mig and gs.gpu.model == plan.model and not gs.drained
                and gs.gpu.uuid not in reserved and (spec.node is None or gs.gpu.node == spec.node)):
            continue
        chosen = _on_mig_gpu(gs, plan.profile, active)
        if chosen is None:
            continue
        if best is None or len(chosen) < len(best):
            best = chosen
    return best


def _for_plain_plan(lease: Lease, plan: Plan, reserved: set[str], held: list[GpuState], fleet: FleetState,
                    active: ActiveLeases) -> list[Lease] | None:
    """The fewest victims making room for a share or whole GPUs, on the nodes of the GPUs in `held`."""
    spec = lease.spec
    best: list[Lease] | None = None
    per_node: dict[int, list[GpuState]] = {}
    nodes = sorted({gs.node_index for gs in held})
    for gs in (fleet.gpus[g.uuid] for ni in nodes for g in fleet.nodes[ni].gpus):
        if (not gs.is_mig and gs.gpu.model == plan.model and not gs.drained and gs.takes(plan.kind)
                and gs.gpu.uuid not in reserved and (spec.node is None or gs.gpu.node == spec.node)):
            per_node.setdefault(gs.node_index, []).append(gs)
    for gpus in per_node.values():
        options = _share_options(plan, gpus, active) if plan.kind is SliceKind.SHARED \
            else _whole_options(plan, gpus, active)
        for chosen in options:
            if chosen and (best is None or len(chosen) < len(best)):
                best = chosen
    return best


def _share_options(plan: Plan, gpus: list[GpuState], active: ActiveLeases) -> list[list[Lease]]:
    """Per GPU of a node, the newest preemptible leases whose end frees the plan's share."""
    options = []
    for gs in gpus:
        free, chosen = gs.free_milli(), []
        for victim in preemptible_on(gs, active):
            if free >= plan.milli:
                break
            free += gs.holders[victim.id]
            chosen.append(victim)
        if free >= plan.milli:
            options.append(chosen)
    return options


def _whole_options(plan: Plan, gpus: list[GpuState], active: ActiveLeases) -> list[list[Lease]]:
    """The node's cheapest GPUs held only by preemptible leases, as many as the plan needs."""
    costs = []
    for gs in gpus:
        on_gpu = preemptible_on(gs, active)
        if len(on_gpu) == len(gs.holders):
            costs.append(on_gpu)
    if len(costs) < plan.count:
        return []
    costs.sort(key=lambda vs: (len(vs), -max((v.granted_at or 0 for v in vs), default=0)))
    return [[v for vs in costs[:plan.count] for v in vs]]
