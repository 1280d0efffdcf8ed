"""The placement views a plain (shared or whole) search reads: the fleet's, and one per kind some GPUs cannot take.

A GPU that carries only whole slices (a Kubernetes GPU without sharing) or only shares (time-sliced
replicas) must be invisible to a search for the other kind (`GpuState.takes`). Hiding such GPUs
for each search and showing them again after cost O(those GPUs) per decision: a whole-GPU request
on a fleet of 4,000 time-sliced GPUs refreshed and re-interned a node's state 8,000 times. Instead each kind that some
GPUs cannot take has a view of its own, a copy of the fleet's in which those GPUs stay disabled,
kept in step with it on every allocation, release and change of a GPU's visibility. Its arrays
are then exactly what the fleet's view held while they were hidden, so every policy decides as
before; a search picks its view in O(1), and each change costs O(views) (at most three).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .model import SliceKind
from .placement import ClusterView, Demand


class KindViews:
    """The fleet's placement view and, for each kind some GPUs cannot take, a view without those GPUs."""

    def __init__(self, view: ClusterView, cannot_take: Mapping[SliceKind, Iterable[tuple[int, int]]]):
        """`view`: the fleet's, every GPU as it is now; `cannot_take`: per kind, the (node, slot)
        of each GPU that kind may not go on. O(nodes + those GPUs)."""
        self.view = view
        self._hidden = {kind: frozenset(places) for kind, places in cannot_take.items()}
        self._hidden = {kind: places for kind, places in self._hidden.items() if places}
        self._own: dict[SliceKind, ClusterView] = {}
        for kind, places in self._hidden.items():
            own = self._own[kind] = view.copy()  # shares the node list, so policies see the same fleet
            for node, slot in places:
                own.set_gpu_enabled(node, slot, False)

    def of(self, kind: SliceKind) -> ClusterView:
        """The view a search for `kind` reads: O(1)."""
        return self._own.get(kind, self.view)

    def set_gpu_enabled(self, node: int, slot: int, enabled: bool) -> None:
        """Show or hide a GPU in every view (never shown where its kind is hidden): O(views)."""
        self.view.set_gpu_enabled(node, slot, enabled)
        for kind, own in self._own.items():
            own.set_gpu_enabled(node, slot, enabled and (node, slot) not in self._hidden[kind])

    def allocate(self, node: int, slots: tuple[int, ...], taken: Demand, check: bool = True) -> None:
        """Take `taken` in every view, checked against the fleet's view only (a kind's view may
        hide the GPUs a slice of the other kind holds), unless not `check` (a hold the fleet's state
        allows on GPUs the view may hide: drained, cordoned): O(views)."""
        self.view.allocate(node, slots, taken, check=check)
        for own in self._own.values():
            own.allocate(node, slots, taken, check=False)

    def release(self, node: int, slots: tuple[int, ...], taken: Demand) -> None:
        """Give `taken` back in every view: O(views)."""
        self.view.release(node, slots, taken)
        for own in self._own.values():
            own.release(node, slots, taken)
