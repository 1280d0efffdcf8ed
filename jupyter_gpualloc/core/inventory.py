"""Read models: what there is and what could be granted now, read from the fleet's state; nothing decided here."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from . import mig
from .devices.base import UnusableNode
from .fleet_state import FleetState, GpuState
from .indexes import ActiveLeases
from .model import MILLI_PER_GPU, Lease, LeaseState, MigInstance, MigMode, PriorityClass, SliceKind
from .offers import Offer, Offers
from .plans import Plan
from .policy import SchedulerPolicy
from .quotas import quota_block
from .usage import QuotaStatus


def inventory(fleet: FleetState, active: Mapping[str, Lease], returning: Mapping[str, Lease],
              queue: Iterable[str], unusable: Sequence[UnusableNode],
              over_committed: Mapping[str, list[str]] | None = None) -> dict:
    """Every node and GPU: MIG layout with owners, shares, free capacity per profile and kind;
    what outside holders (workloads the allocator did not place) hold, and what of theirs found
    no free device (`over_committed`)."""
    nodes = []
    for ni, node in enumerate(fleet.nodes):
        gpus = [_gpu_entry(fleet.gpus[gpu.uuid], active, returning) for gpu in node.gpus]
        held = [l for l in active.values() if l.state is LeaseState.GRANTED and l.slice.node == node.name]
        nodes.append({"name": node.name, "unschedulable": node.unschedulable,
                      "cpu_milli": node.cpu_milli, "memory_mib": node.memory_mib,
                      "free_cpu_milli": node.cpu_milli - sum(l.spec.cpu_milli for l in held),
                      "free_memory_mib": node.memory_mib - sum(l.spec.host_memory_mib for l in held),
                      "gpus": gpus})
    waiting = [active[i].priority for i in queue]
    return {"nodes": nodes, "queue": {p.value: waiting.count(p) for p in PriorityClass},
            "unusable_nodes": [{"name": u.name, "reason": u.reason} for u in unusable],
            "over_committed": [{"outside": key, "unplaced": what} for key, what in (over_committed or {}).items()]}


def offers(offer_plans: Iterable[tuple[Offer, tuple[Plan, ...]]], fleet: FleetState, policy: SchedulerPolicy,
           active: ActiveLeases, offer_terms: Offers, user: str | None, groups: Sequence[str],
           used_up: QuotaStatus | None) -> list[dict]:
    """The offers `user` (in `groups`) may take, each with how many could be granted now, the quota
    that never allows one, the idle timeout and time limit a kernel's lease on it gets (what the
    policy decides: shown, never sent back), its extensions, the quota the user's slices in use fill now
    (`quota_full`: a request waits, or is refused, until one of them ends), and the usage quota `used_up` (if any)."""
    out = []
    for offer, plans in offer_plans:
        if not offer.open_to(groups):
            continue
        never = quota_block(policy, active, user, groups, plans, None, assume_empty=True) if user else None
        full = quota_block(policy, active, user, groups, plans, None) if user and not never else None
        max_duration = offer_terms.max_duration("server", offer=offer)
        out.append({"name": offer.name, "label": offer.label, "spec": offer.spec.to_json(),
                    "idle_timeout": offer.idle_timeout, "max_duration": max_duration,
                    "available": count_available(fleet, plans),
                    "over_quota": never.limit_text if never else None,
                    "quota_full": str(full) if full else None,
                    "max_extensions": policy.max_extensions if max_duration else None,
                    "over_usage_quota": used_up.sentence() if used_up else None})
    return out


def _gpu_entry(gs: GpuState, active: Mapping[str, Lease], returning: Mapping[str, Lease]) -> dict:
    gpu = gs.gpu
    entry = {"uuid": gpu.uuid, "index": gpu.index, "model": gpu.model, "memory_mib": gpu.memory_mib,
             "mig_mode": gpu.mig_mode.value, "drained": gs.drained, "cordoned": gs.cordoned}
    if gs.is_mig:
        layout = gs.layout()
        entry["instances"] = [_instance_entry(gs, i, active, returning)
                              for i in sorted(gs.instances.values(), key=lambda i: i.start)]
        entry["memory_slices"] = layout.geometry.memory_slices
        entry["compute_slices"] = layout.geometry.compute_slices
        entry["free_memory_slices"] = layout.free_memory_slices
        entry["free_compute_slices"] = layout.free_compute_slices
        entry["free_profiles"] = free_profiles(gs, layout)
        return entry
    held = sorted((active.get(l) or returning[l] for l in gs.holders if l in active or l in returning),
                  key=lambda l: l.seq)
    outside = {key: milli for key, milli in gs.holders.items() if key not in active and key not in returning}
    used = sum(l.slice.memory_mib for l in held if l.slice.kind is SliceKind.SHARED)
    used += sum(gpu.memory_mib * milli // MILLI_PER_GPU for milli in outside.values())
    whole = [l for l in held if l.slice.kind is SliceKind.WHOLE]
    entry["shares"] = [{"lease_id": l.id, "memory_mib": l.slice.memory_mib,
                        "kind": l.slice.kind.value, "returning": l.returning} for l in held]
    entry["shares"] += [{"lease_id": None, "outside": key, "milli": milli,
                         "memory_mib": gpu.memory_mib * milli // MILLI_PER_GPU,
                         "kind": "whole" if milli == MILLI_PER_GPU else "shared", "returning": False}
                        for key, milli in sorted(outside.items())]
    entry["free_memory_mib"] = 0 if whole else max(gpu.memory_mib - used, 0)
    entry["free_milli"] = gs.free_milli()
    entry["whole_free"] = not gs.holders
    entry["sharing"] = gpu.sharing
    return entry


def _instance_entry(gs: GpuState, instance: MigInstance, active: Mapping[str, Lease],
                    returning: Mapping[str, Lease]) -> dict:
    """A MIG instance with its lease, or the outside holder that holds it."""
    owner = gs.owner.get(instance.uuid)
    is_lease = owner in active or owner in returning
    entry = {"uuid": instance.uuid, "profile": gs.profiles[instance.profile_id].name, "start": instance.start,
             "size": instance.size, "lease_id": owner if is_lease else None, "returning": owner in returning}
    if owner is not None and not is_lease:
        entry["outside"] = owner
    return entry


def free_profiles(gs: GpuState, layout: mig.Layout) -> dict[str, int]:
    """How many instances of each profile this GPU could still hand out (each counted alone)."""
    out = {}
    for p in gs.profiles.values():
        free_existing = sum(1 for i in gs.instances.values()
                            if i.profile_id == p.profile_id and i.uuid not in gs.owner)
        new = mig.room_for(layout, p) if gs.gpu.mig_mode is MigMode.DYNAMIC else 0
        out[p.name] = 0 if gs.drained else free_existing + new
    return out


def count_available(fleet: FleetState, plans: Sequence[Plan]) -> int:
    """How many slices of the plans could be granted now, one after another."""
    total = 0
    for plan in plans:
        if plan.kind is SliceKind.MIG:
            total += sum(free_profiles(gs, gs.layout()).get(plan.profile.name, 0)
                         for gs in fleet.gpus.values()
                         if gs.is_mig and gs.gpu.model == plan.model)
            continue
        per_node: dict[int, int] = {}
        for gs in fleet.gpus.values():
            if gs.is_mig or gs.drained or gs.gpu.model != plan.model or not gs.takes(plan.kind):
                continue
            if plan.kind is SliceKind.SHARED:
                total += gs.free_milli() // plan.milli
            elif not gs.holders:
                per_node[gs.node_index] = per_node.get(gs.node_index, 0) + 1
        total += sum(n // plan.count for n in per_node.values())
    return total
