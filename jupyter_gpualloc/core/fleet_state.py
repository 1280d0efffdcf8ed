"""The fleet as the scheduler holds it: each GPU's instances, owners and holders, and the indexes over them.

Every change to a GPU's instances, owners, holders or drain is followed by `FleetState.changed(gs)`,
which keeps the GPU's cached MIG layout, the MIG capacity index, the placement view and the
version a scheduling pass depends on in step. The version has one rule: it moves with every
changed() and moved() (the leases a pass reads changed); room_made() moves only `freed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from . import mig
from .devices.base import DeviceBackend
from .indexes import MigCapacity
from .kind_views import KindViews
from .model import MILLI_PER_GPU, Gpu, MigInstance, MigMode, MigProfile, Node, SliceKind, SliceSpec
from .placement import ClusterView, NodeCapacity


@dataclass
class GpuState:
    """One GPU as the scheduler holds it: its MIG instances and their owners, or the leases holding it."""

    gpu: Gpu
    node_index: int
    slot: int
    profiles: dict[int, MigProfile]
    instances: dict[str, MigInstance] = field(default_factory=dict)
    owner: dict[str, str] = field(default_factory=dict)  # mig uuid -> lease id
    created: set[str] = field(default_factory=set)  # mig uuids this core created
    holders: dict[str, int] = field(default_factory=dict)  # lease id (or outside holder) -> milli it holds
    drained_by_admin: bool = False
    cordoned: str | None = None  # why its node takes nothing new (the cluster says so), else None
    cached_layout: mig.Layout | None = None  # forgotten by FleetState.changed()

    @property
    def is_mig(self) -> bool:
        return self.gpu.mig_mode is not MigMode.OFF

    def takes(self, kind: SliceKind) -> bool:
        """Whether a plain slice of `kind` (shared or whole) may go on this GPU (Gpu.sharing)."""
        return self.gpu.sharing == "any" or self.gpu.sharing == kind.value

    @property
    def drained(self) -> bool:
        """Whether nothing new is granted here: drained by an admin, or its node cordoned."""
        return self.drained_by_admin or self.cordoned is not None

    def layout(self) -> mig.Layout:
        """The MIG layout of its instances, computed once per change of them."""
        if self.cached_layout is None:
            self.cached_layout = mig.Layout.of(self.instances.values(), self.profiles)
        return self.cached_layout

    def free_milli(self) -> int:
        return MILLI_PER_GPU - sum(self.holders.values())

    def snapshot(self) -> tuple:
        """Its instances, owners, holders and drain as they are now (see restore)."""
        return dict(self.instances), dict(self.owner), set(self.created), dict(self.holders), self.drained_by_admin

    def restore(self, snapshot: tuple) -> None:
        self.instances, self.owner, self.created, self.holders, self.drained_by_admin = snapshot


class FleetState:
    """Every GPU's state, the placement view of the nodes, and the MIG capacity index over them."""

    def __init__(self, backend: DeviceBackend, static_mig: bool):
        """Discover the fleet; MIG GPUs are static when `static_mig` or when the backend cannot change MIG."""
        self._backend, self._static_mig = backend, static_mig
        self.version = 0  # moved by changed() and moved(): what a scheduling pass grants may differ
        self.freed = 0  # moved by room_made(): what a pass found no room for may fit now
        self.load(backend.discover())

    def load(self, nodes: list[Node]) -> None:
        """Hold these nodes, every GPU free (the caller puts back what is held), cordoned ones drained."""
        self.nodes: list[Node] = nodes
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.gpus: dict[str, GpuState] = {}
        tables: dict[tuple, dict[int, MigProfile]] = {}  # GPUs with equal profile tables share one
        capacities = []
        for ni, node in enumerate(self.nodes):
            capacities.append(NodeCapacity(node.name, node.cpu_milli, node.memory_mib,
                                           tuple(g.model for g in node.gpus)))
            for slot, gpu in enumerate(node.gpus):
                gpu.mig_mode = self.mig_mode(gpu)
                profiles = self._backend.mig_profiles(gpu.uuid) if gpu.mig_mode is not MigMode.OFF else {}
                profiles = tables.setdefault(tuple(sorted(profiles.items())), profiles)
                self.gpus[gpu.uuid] = GpuState(gpu, ni, slot, profiles, {i.uuid: i for i in gpu.instances},
                                               cordoned=node.unschedulable)
        view = ClusterView(capacities)
        self.mig_gpus: dict[str, list[GpuState]] = {}  # model -> its MIG GPUs, in fleet order
        for gs in self.gpus.values():
            if gs.is_mig:
                self.mig_gpus.setdefault(gs.gpu.model, []).append(gs)
        self.mig_capacity = MigCapacity(gs for gs in self.gpus.values() if gs.is_mig)
        self.undrained: dict[str, set[str]] = {}  # model -> its GPUs not drained (kept by changed())
        for gs in self.gpus.values():
            self.undrained.setdefault(gs.gpu.model, set())
            self._file_drain(gs)
        self.views = KindViews(view, {kind: [(gs.node_index, gs.slot) for gs in self.gpus.values()
                                             if not gs.is_mig and not gs.takes(kind)]
                                      for kind in (SliceKind.SHARED, SliceKind.WHOLE)})
        self.view = view  # the fleet's; a plain search reads views.of(its kind)
        for gs in self.gpus.values():
            self.show(gs)
        self.moved()
        self.room_made()

    def mig_mode(self, gpu: Gpu) -> MigMode:
        """A GPU's MIG mode as held here: static when the policy says so or the backend cannot change MIG."""
        if gpu.mig_mode is MigMode.DYNAMIC and (self._static_mig or not self._backend.can_change_mig):
            return MigMode.STATIC
        return gpu.mig_mode

    def structure(self, node: Node) -> tuple:
        """What the fleet's structure depends on of a node: its resources, its GPUs and the MIG instances
        of the static ones (not whether it is schedulable, nor a dynamic GPU's instances, which are its
        state: DRA claims allocate and free them). Equal structures need no reload."""
        return (node.name, node.cpu_milli, node.memory_mib, tuple(
            (g.uuid, g.model, g.memory_mib, mode, g.sharing,
             () if mode is MigMode.DYNAMIC else placements(g.instances))
            for g, mode in ((g, self.mig_mode(g)) for g in node.gpus)))

    def changed(self, gs: GpuState) -> None:
        """A GPU's instances, owners, holders or drain changed: its layout, index entry and view follow."""
        gs.cached_layout = None
        self.mig_capacity.changed(gs)
        self._file_drain(gs)
        self.show(gs)
        self.version += 1

    def _file_drain(self, gs: GpuState) -> None:
        if gs.drained:
            self.undrained[gs.gpu.model].discard(gs.gpu.uuid)
        else:
            self.undrained[gs.gpu.model].add(gs.gpu.uuid)

    def moved(self) -> None:
        """Something a scheduling pass depends on changed (a lease came or went)."""
        self.version += 1

    def room_made(self) -> None:
        """A slice was freed: what found no room before may fit now (its GPUs' changed() moves the version)."""
        self.freed += 1

    def show(self, gs: GpuState, reserved: bool = False) -> None:
        """Whether the placement views offer the GPU: not when MIG-managed, drained or (for a search)
        reserved; O(views)."""
        self.views.set_gpu_enabled(gs.node_index, gs.slot, not (gs.is_mig or gs.drained or reserved))

    def profiles(self) -> dict[str, dict[int, MigProfile]]:
        """Each GPU's MIG profiles by UUID (empty without MIG)."""
        return {uuid: gs.profiles for uuid, gs in self.gpus.items()}

    def on_node(self, name: str) -> list[GpuState]:
        """The GPUs of a node, in slot order (none for an unknown node)."""
        node = self.nodes[self.node_index[name]] if name in self.node_index else None
        return [self.gpus[g.uuid] for g in node.gpus] if node else []

    def node_mask(self, spec: SliceSpec) -> np.ndarray | None:
        """The nodes a spec allows (None: all)."""
        if spec.node is None:
            return None
        mask = np.zeros(len(self.nodes), dtype=bool)
        if spec.node in self.node_index:
            mask[self.node_index[spec.node]] = True
        return mask


def placements(instances: Iterable[MigInstance]) -> tuple:
    """MIG instances as what tells them apart: each one's UUID, profile and start, in order."""
    return tuple(sorted((i.uuid, i.profile_id, i.start) for i in instances))
