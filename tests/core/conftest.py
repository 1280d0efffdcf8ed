"""Fixtures for the core: a simulated fleet, a real database (SQLite, then PostgreSQL), a scheduler over both."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

A100_40 = "A100-SXM4-40GB"


def fleet(*gpus: dict, cpu_milli: int = 64000, memory_mib: int = 256 * 1024, nodes: int = 1) -> dict:
    """A fleet dict of `nodes` identical nodes holding the given GPU entries."""
    return {"nodes": [{"name": f"node{i}", "cpu_milli": cpu_milli, "memory_mib": memory_mib,
                       "gpus": list(gpus)} for i in range(nodes)]}


class Harness:
    """A scheduler with its backend and store, rebuildable from the same database."""

    def __init__(self, url: str, fleet_dict: dict, **policy):
        # The tests of queueing and placement release as a holder that is gone; those of slices
        # waiting for their holders (test_returning.py) turn the default back on.
        policy.setdefault("wait_for_holders", False)
        self.url = url
        self.fleet = fleet_dict
        self.policy_kw = policy
        self.backend = SimulatedBackend(fleet_dict)
        self.events: list = []
        self.scheduler = self._build(0.0)

    def _build(self, now: float) -> Scheduler:
        self.store = Store(self.url)
        return Scheduler(self.backend, self.store, SchedulerPolicy(**self.policy_kw), now=now,
                         listeners=[self.events.append])

    def restart(self, now: float, backend: SimulatedBackend | None = None) -> Scheduler:
        """A new scheduler process over the same database (and the same devices)."""
        self.store.close()
        if backend is not None:
            self.backend = backend
        self.scheduler = self._build(now)
        return self.scheduler

    def types(self) -> list[str]:
        return [e.type for e in self.events]


@pytest.fixture
def harness(store_urls):
    """Factory: harness(fleet_dict, **policy) -> Harness, each with a database of its own."""
    made: list[Harness] = []

    def make(fleet_dict: dict, **policy) -> Harness:
        made.append(Harness(store_urls.fresh(), fleet_dict, **policy))
        return made[-1]

    yield make
    for h in made:
        h.store.close()
