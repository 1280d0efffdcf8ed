"""Placement search: where a plan fits now, as a dry run that changes nothing.

`FitSearch.find` tries a request's plans in order and returns the first `Fit` (the slice, and the
GPUs and MIG start it takes) or None. Within one scheduling pass a `PassMemo` remembers the plan
shapes that found no room, so the pass searches the fleet once per distinct shape; the memo
forgets them whenever the fleet frees a slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from . import mig
from .fleet_state import FleetState, GpuState
from .model import MILLI_PER_GPU, Lease, MigMode, Slice, SliceKind, SliceSpec
from .placement import PlacementPolicy
from .plans import Plan, demand, host_demand


@dataclass
class Fit:
    """Where a plan fits: the slice, the node and GPUs it takes, and the start of a MIG instance to create."""

    slice: Slice
    plan: Plan
    node_index: int
    gpus: tuple[GpuState, ...]
    create_at: int | None = None  # start, when a MIG instance must be created


def shape(plan: Plan, spec: SliceSpec) -> tuple:
    """What decides whether a plan finds room: the plan, the node asked for and the host demand."""
    return (plan, spec.node, spec.cpu_milli, spec.host_memory_mib)


class PassMemo:
    """The plan shapes a scheduling pass found no room for, until the fleet frees a slice."""

    def __init__(self, fleet: FleetState):
        self._fleet = fleet
        self._freed = fleet.freed
        self._no_room: set[tuple] = set()

    def _current(self) -> set[tuple]:
        if self._fleet.freed != self._freed:  # room was made: what failed in this pass may fit now
            self._no_room.clear()
            self._freed = self._fleet.freed
        return self._no_room

    def no_room(self, shape_: tuple) -> bool:
        return shape_ in self._current()

    def add(self, shape_: tuple) -> None:
        self._current().add(shape_)


class FitSearch:
    """The placement search over the fleet's state: MIG instances by the MIG placer, other GPUs
    by the placement policy."""

    def __init__(self, fleet: FleetState, placement_policy: PlacementPolicy, mig_placer: mig.MigPlacer):
        self.fleet = fleet
        self.placement_policy = placement_policy
        self.mig_placer = mig_placer

    def find(self, lease: Lease, plans: Sequence[Plan], reserved: set[str], memo: PassMemo | None,
             allowed: Callable[[Plan], bool]) -> Fit | None:
        """The first plan that fits now (outside reserved GPUs) and is `allowed` (within quota), or None.

        With a pass's `memo`, a plan that found no room is not searched again for the same host
        demand until room is made: grants only take room and reservations only grow within a pass."""
        for plan in plans:
            if not allowed(plan):
                continue
            key = shape(plan, lease.spec) if memo is not None else None
            if key is not None and memo.no_room(key):
                continue
            found = self._mig(lease, plan, reserved) if plan.kind is SliceKind.MIG \
                else self._plain(lease, plan, reserved)
            if found is not None:
                return found
            if key is not None:
                memo.add(key)
        return None

    def mig_candidates(self, plan: Plan, spec: SliceSpec, reserved: set[str]) -> list[GpuState]:
        """The plan model's MIG GPUs that may take it, in fleet order: O(MIG GPUs of that model),
        or O(the node's GPUs) when the spec names a node."""
        usable = self._usable(spec, reserved)
        if spec.node is not None:
            gpus = [gs for gs in self.fleet.on_node(spec.node) if gs.is_mig and gs.gpu.model == plan.model]
        else:
            gpus = self.fleet.mig_gpus.get(plan.model, ())
        return [gs for gs in gpus if not gs.drained and usable(gs)]

    def _usable(self, spec: SliceSpec, reserved: set[str]) -> Callable[[GpuState], bool]:
        """Whether a GPU is outside `reserved`, on the node asked for, and its node has room for the host demand."""
        host = host_demand(spec)
        fits: dict[int, bool] = {}  # per node: room for the host demand

        def usable(gs: GpuState) -> bool:
            if gs.gpu.uuid in reserved or (spec.node is not None and gs.gpu.node != spec.node):
                return False
            if gs.node_index not in fits:
                fits[gs.node_index] = self.fleet.view.fits(gs.node_index, host)
            return fits[gs.node_index]

        return usable

    def _mig(self, lease: Lease, plan: Plan, reserved: set[str]) -> Fit | None:
        """An existing free instance of the profile, else a new one where the MIG placer says.

        Without a node asked for, it reads the MIG capacity index: O(GPUs holding a free
        instance of the profile) for the first step and O(distinct layouts of the model) for
        the second (plus, per layout, the GPUs passed over as reserved or on full nodes);
        with a node, O(the node's GPUs)."""
        spec = lease.spec
        pid = plan.profile.profile_id
        usable = self._usable(spec, reserved)
        if spec.node is not None:
            candidates = self.mig_candidates(plan, spec, reserved)
            with_free = [gs for gs in candidates if any(
                i.profile_id == pid and i.uuid not in gs.owner for i in gs.instances.values())]
            groups = [(gs.layout(), iter([gs])) for gs in candidates if gs.gpu.mig_mode is MigMode.DYNAMIC]
        else:
            with_free = [gs for gs in self.fleet.mig_capacity.with_free(plan.model, pid) if usable(gs)]
            groups = self.fleet.mig_capacity.layouts(plan.model)
        return self._existing(plan, with_free) or self._new_instance(plan, groups, usable)

    def _existing(self, plan: Plan, with_free: list[GpuState]) -> Fit | None:
        """An existing free instance of the profile, used before any new one is made: on the GPU
        with the fewest free slices, so emptier GPUs stay whole."""
        pid = plan.profile.profile_id
        existing = [(gs.layout().free_memory_slices, gs.gpu.uuid, gs, inst)
                    for gs in with_free for inst in gs.instances.values()
                    if inst.profile_id == pid and inst.uuid not in gs.owner]
        if not existing:
            return None
        _, _, gs, inst = min(existing, key=lambda e: (e[0], e[1], e[3].start))
        return Fit(mig_slice(gs, plan, inst.start, inst.uuid), plan, gs.node_index, (gs,))

    def _new_instance(self, plan: Plan, groups: list[tuple[mig.Layout, Iterator[GpuState]]],
                      usable: Callable[[GpuState], bool]) -> Fit | None:
        """A new instance where the MIG placer puts it. The placer sees each distinct layout once, at
        its first usable GPU in fleet order: it gives ties to the earliest GPU of a layout anyway,
        so this only spares it the repeats."""
        first: dict[mig.Layout, GpuState] = {}
        for layout, gpus in groups:
            if layout not in first:
                gs = next((g for g in gpus if usable(g)), None)
                if gs is not None:
                    first[layout] = gs
        if not first:
            return None
        dynamic = sorted(first.values(), key=lambda gs: (gs.node_index, gs.slot))
        first = {gs.layout(): gs for gs in dynamic}
        choice = self.mig_placer.choose(list(first), plan.profile, dynamic[0].profiles)
        if choice is None:
            return None
        gs = dynamic[choice[0]]
        return Fit(mig_slice(gs, plan, choice[1], None), plan, gs.node_index, (gs,), create_at=choice[1])

    def _plain(self, lease: Lease, plan: Plan, reserved: set[str]) -> Fit | None:
        """A share or whole GPUs where the placement policy puts them, in the view of the plan's
        kind (without the GPUs that cannot take it, GpuState.takes: KindViews), reserved GPUs hidden
        from it: O(reserved GPUs) besides the policy's choice."""
        hidden = [self.fleet.gpus[u] for u in reserved if not self.fleet.gpus[u].is_mig]
        for gs in hidden:
            self.fleet.show(gs, reserved=True)
        try:
            choice = self.placement_policy.choose(self.fleet.views.of(plan.kind), demand(plan, lease.spec),
                                                  self.fleet.node_mask(lease.spec))
        finally:
            for gs in hidden:
                self.fleet.show(gs)
        if choice is None:
            return None
        node_index, slots = choice
        node = self.fleet.nodes[node_index]
        gpus = tuple(self.fleet.gpus[node.gpus[s].uuid] for s in slots)
        memory = plan.memory_mib if plan.kind is SliceKind.SHARED else gpus[0].gpu.memory_mib
        sl = Slice(kind=plan.kind, node=node.name, gpu_uuids=tuple(g.gpu.uuid for g in gpus),
                   memory_mib=memory, milli=plan.milli if plan.kind is SliceKind.SHARED else MILLI_PER_GPU,
                   model=plan.model, gpu_memory_mib=gpus[0].gpu.memory_mib)
        return Fit(sl, plan, node_index, gpus)

    def all_drained(self, plans: Sequence[Plan]) -> bool:
        """Whether every GPU of the plans' models is drained (a refusal then says so): O(plans),
        from the fleet's GPUs not drained per model."""
        undrained = self.fleet.undrained
        present = [model for model in {p.model for p in plans} if model in undrained]
        return bool(present) and not any(undrained[model] for model in present)


def mig_slice(gs: GpuState, plan: Plan, start: int, mig_uuid: str | None) -> Slice:
    return Slice(kind=SliceKind.MIG, node=gs.gpu.node, gpu_uuids=(gs.gpu.uuid,),
                 memory_mib=plan.profile.memory_mib, profile=plan.profile.name, start=start,
                 mig_uuid=mig_uuid, milli=MILLI_PER_GPU, model=gs.gpu.model,
                 gpu_memory_mib=gs.gpu.memory_mib)
