"""Capacity held outside the allocator: GPU workloads it did not place (another namespace's pod, a
training Job, a DaemonSet) take devices from the free pool of their node, and give them back when
they end.

An outside holder is named by a key that is never a lease id (`pod:<namespace>/<name>`). It holds
MIG instances by profile, whole GPUs, and shares of time-sliced GPUs, each on the free devices of
its node in slot order; what finds no free device (a pod the device plugin admitted while the
allocator had granted the same device) is counted as over-committed until it ends. Every change
goes through the scheduler's journal, so a change undone puts the holds back too.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fleet_state import FleetState, GpuState
from .journal import SchedulerJournal
from .model import MILLI_PER_GPU, OutsideUse
from .placement import Demand


@dataclass
class _Held:
    """Where an outside use was placed: (GPU, MIG UUID or None, milli) per device, and what did not fit."""

    use: OutsideUse
    devices: list[tuple[GpuState, str | None, int]]
    unplaced: list[str]


class OutsideHolds:
    """The outside holders of a fleet, by key."""

    def __init__(self, fleet: FleetState, journal: SchedulerJournal):
        self._fleet, self._journal = fleet, journal
        self._held: dict[str, _Held] = {}
        self._on_node: dict[str, dict[str, None]] = {}  # node -> the keys of its holders, in the order they took

    def __contains__(self, key: str) -> bool:
        return key in self._held

    def uses(self) -> list[OutsideUse]:
        return [held.use for held in self._held.values()]

    def unplaced(self) -> dict[str, list[str]]:
        """Per holder, what it holds that found no free device (over-committed)."""
        return {key: held.unplaced for key, held in self._held.items() if held.unplaced}

    def take(self, use: OutsideUse) -> None:
        """Hold what `use` takes on its node's free devices (an unknown node holds nothing)."""
        held = _Held(use, [], [])
        named = set(use.devices)  # the devices it names first, then the rest in slot order
        gpus = sorted(self._fleet.on_node(use.node), key=lambda gs: gs.gpu.uuid not in named)
        for profile, count in sorted(use.mig.items()):
            for _ in range(count):
                self._take_instance(held, gpus, profile)
        free_whole = [gs for gs in gpus if not gs.is_mig and not gs.holders]
        if len(free_whole) < use.whole:
            held.unplaced.append(f"{use.whole - len(free_whole)} whole GPU(s)")
        for gs in free_whole[:use.whole]:
            self._take_share(held, gs, MILLI_PER_GPU)
        for milli in use.shares:
            gs = next((gs for gs in gpus if not gs.is_mig and gs.free_milli() >= milli), None)
            if gs is None:
                held.unplaced.append(f"a {milli / MILLI_PER_GPU:g} GPU share")
            else:
                self._take_share(held, gs, milli)
        self._held[use.key] = held
        self._on_node.setdefault(use.node, {})[use.key] = None

    def give_back(self, key: str) -> bool:
        """End an outside holder's holds; whether it held anything."""
        held = self._held.pop(key, None)
        if held is None:
            return False
        on_node = self._on_node[held.use.node]
        del on_node[key]
        if not on_node:
            del self._on_node[held.use.node]
        for gs, mig_uuid, milli in held.devices:
            self._journal.record_gpu(gs)
            if mig_uuid is not None:
                gs.owner.pop(mig_uuid, None)
            else:
                left = gs.holders.get(key, 0) - milli
                if left > 0:
                    gs.holders[key] = left
                else:
                    gs.holders.pop(key, None)
                self._journal.view_release(gs.node_index, (gs.slot,), _share(milli))
            self._fleet.changed(gs)
        self._fleet.room_made()
        return bool(held.devices)

    def give_back_on(self, node: str) -> list[OutsideUse]:
        """End the holds of the outside holders on a node; their uses, in the order they took, to take again."""
        uses = [self._held[key].use for key in self._on_node.get(node, ())]
        for use in uses:
            self.give_back(use.key)
        return uses

    def forget_all(self) -> list[OutsideUse]:
        """Drop every hold without touching the fleet (which is being reloaded); the uses, to take again."""
        uses = self.uses()
        self._held.clear()
        self._on_node.clear()
        return uses

    def _take_instance(self, held: _Held, gpus: list[GpuState], profile: str) -> None:
        named = set(held.use.devices)
        free = [(inst.uuid not in named, gs, inst) for gs in gpus if gs.is_mig
                for inst in sorted(gs.instances.values(), key=lambda i: i.start)
                if inst.uuid not in gs.owner and gs.profiles[inst.profile_id].name == profile]
        if not free:
            held.unplaced.append(f"a MIG {profile} device")
            return
        _, gs, inst = min(free, key=lambda item: item[0])  # a device it names, else the first in slot order
        self._journal.record_gpu(gs)
        gs.owner[inst.uuid] = held.use.key
        self._fleet.changed(gs)
        held.devices.append((gs, inst.uuid, 0))

    def _take_share(self, held: _Held, gs: GpuState, milli: int) -> None:
        self._journal.record_gpu(gs)
        gs.holders[held.use.key] = gs.holders.get(held.use.key, 0) + milli
        self._journal.view_allocate(gs.node_index, (gs.slot,), _share(milli), check=False)  # it runs, drained or not
        self._fleet.changed(gs)
        held.devices.append((gs, None, milli))


def _share(milli: int) -> Demand:
    """What `milli` of one GPU takes from the placement view."""
    return Demand(num_gpu=1, gpu_milli=milli)
