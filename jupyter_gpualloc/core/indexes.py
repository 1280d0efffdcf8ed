"""The scheduler's indexes: what lets a decision look at the few leases or GPUs it concerns.

`ActiveLeases` holds the active (queued and granted) leases by id, user, group and
preemptibility, with each user's granted GPU memory (fair share's order) and each lease's place
in the order they were added (that of `by_id`). `MigCapacity` groups
each model's MIG GPUs by their layout, and by the free instances they hold, so a MIG placement
looks at one GPU per distinct layout instead of every GPU of the model.

Both are kept up to date by the scheduler as leases come and go and as GPUs change; neither
decides anything.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Iterator, Protocol

from . import mig
from .model import Lease, LeaseState, MigInstance, MigMode, PriorityClass


class ActiveLeases:
    """The active leases, indexed. Every method is O(1) or O(the lease's groups) unless it says."""

    def __init__(self) -> None:
        self.by_id: dict[str, Lease] = {}
        self._by_user: dict[str, dict[str, Lease]] = {}
        self._by_group: dict[str, dict[str, Lease]] = {}
        self.preemptible: set[str] = set()  # active preemptible batch leases
        self.held_mib: dict[str, int] = {}  # user -> GPU memory of its granted leases
        self._counted: dict[str, int] = {}  # granted lease id -> the memory it adds to held_mib
        self._place: dict[str, int] = {}  # lease id -> when it was added (by_id's order)
        self._added = 0

    def add(self, lease: Lease) -> None:
        """Hold a lease (counted in its user's memory if granted): O(its groups)."""
        self.by_id[lease.id] = lease
        self._added += 1
        self._place.setdefault(lease.id, self._added)  # held again: by_id keeps its place too
        self._by_user.setdefault(lease.user, {})[lease.id] = lease
        for group in lease.groups:
            self._by_group.setdefault(group, {})[lease.id] = lease
        if lease.preemptible and lease.priority is PriorityClass.BATCH:
            self.preemptible.add(lease.id)
        if lease.state is LeaseState.GRANTED:
            self.count_held(lease)

    def count_held(self, lease: Lease) -> None:
        """Add a newly granted lease's GPU memory to its user's: O(1)."""
        self._counted[lease.id] = lease.slice.memory_mib
        self.held_mib[lease.user] = self.held_mib.get(lease.user, 0) + lease.slice.memory_mib

    def drop(self, lease_id: str) -> Lease | None:
        """Forget a lease and its index entries (the lease, or None if it was not held): O(its groups)."""
        lease = self.by_id.pop(lease_id, None)
        if lease is None:
            return None
        for index, key in [(self._by_user, lease.user)] + [(self._by_group, g) for g in lease.groups]:
            held = index.get(key, {})
            held.pop(lease_id, None)
            if not held:
                index.pop(key, None)
        self.preemptible.discard(lease_id)
        del self._place[lease_id]
        if lease_id in self._counted:
            self.held_mib[lease.user] -= self._counted.pop(lease_id)
            if not self.held_mib[lease.user]:
                del self.held_mib[lease.user]
        return lease

    def place(self, lease_id: str) -> int:
        """Where a held lease comes in `by_id`'s order (earlier added, smaller): O(1)."""
        return self._place[lease_id]

    def granted(self, lease_id: str) -> Lease | None:
        """The lease if it is held and granted, else None: O(1)."""
        lease = self.by_id.get(lease_id)
        return lease if lease is not None and lease.state is LeaseState.GRANTED else None

    def of_user(self, user: str) -> Iterable[Lease]:
        """The user's active leases: O(1) to get, O(the user's leases) to walk."""
        return self._by_user.get(user, {}).values()

    def of_group(self, group: str) -> Iterable[Lease]:
        """The group's active leases: O(1) to get, O(the group's leases) to walk."""
        return self._by_group.get(group, {}).values()


class MigGpu(Protocol):
    """What `MigCapacity` reads of a MIG GPU's state (the scheduler's per-GPU record)."""

    node_index: int
    slot: int
    instances: dict[str, MigInstance]
    owner: dict[str, str]
    drained: bool

    @property
    def gpu(self): ...

    def layout(self) -> mig.Layout: ...


class MigCapacity:
    """Each model's undrained MIG GPUs grouped by layout (dynamic GPUs only: where a new
    instance may be made) and by the profiles of the free instances they hold.

    The scheduler calls `changed(gs)` after any change to a GPU's instances, owners or drain;
    the GPU is re-filed on the next read, O(its instances + log of its group) each. Reading is
    then O(changed GPUs) plus what each method states."""

    def __init__(self, gpus: Iterable[MigGpu]) -> None:
        self._position: dict[int, MigGpu] = {}  # fleet order -> GPU
        self._where: dict[int, tuple[mig.Layout | None, frozenset[int]]] = {}  # position -> its filing
        self._layouts: dict[str, dict[mig.Layout, list[int]]] = {}  # model -> layout -> sorted positions
        self._free: dict[tuple[str, int], set[int]] = {}  # (model, profile id) -> positions
        self._stale: set[int] = set()
        self._number: dict[int, int] = {}  # id(gs) -> position
        for gs in gpus:
            position = len(self._position)
            self._position[position] = gs
            self._number[id(gs)] = position
            self._where[position] = (None, frozenset())
            self._stale.add(position)

    def changed(self, gs: MigGpu) -> None:
        """Note that a GPU's instances, owners or drain changed: O(1)."""
        position = self._number.get(id(gs))
        if position is not None:
            self._stale.add(position)

    def layouts(self, model: str) -> list[tuple[mig.Layout, Iterator[MigGpu]]]:
        """Each distinct layout of the model's undrained dynamic GPUs, with its GPUs in fleet
        order: O(distinct layouts); each group's GPUs are read one at a time, as far as needed."""
        self._refresh()
        return [(layout, (self._position[p] for p in positions))
                for layout, positions in self._layouts.get(model, {}).items()]

    def with_free(self, model: str, profile_id: int) -> list[MigGpu]:
        """The model's undrained GPUs holding an unowned instance of the profile, in fleet
        order: O(those GPUs x log)."""
        self._refresh()
        return [self._position[p] for p in sorted(self._free.get((model, profile_id), ()))]

    def _refresh(self) -> None:
        for position in self._stale:
            gs = self._position[position]
            old_layout, old_free = self._where[position]
            model = gs.gpu.model
            if old_layout is not None:
                bucket = self._layouts[model][old_layout]
                del bucket[bisect.bisect_left(bucket, position)]
                if not bucket:
                    del self._layouts[model][old_layout]
            for pid in old_free:
                self._free[(model, pid)].discard(position)
            layout = None if gs.drained or gs.gpu.mig_mode is not MigMode.DYNAMIC else gs.layout()
            free = frozenset() if gs.drained else frozenset(
                inst.profile_id for inst in gs.instances.values() if inst.uuid not in gs.owner)
            if layout is not None:
                bisect.insort(self._layouts.setdefault(model, {}).setdefault(layout, []), position)
            for pid in free:
                self._free.setdefault((model, pid), set()).add(position)
            self._where[position] = (layout, free)
        self._stale.clear()

