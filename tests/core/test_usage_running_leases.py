"""A running lease whose accrual is partly stored counts once in reports, usage quotas, totals and efficiency."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store

MONDAY = 1_796_428_800.0  # 2026-12-07 00:00 UTC
FLEET = {"nodes": [{"name": "n", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [{"model": "L4"}]}]}


def test_a_running_lease_whose_accrual_was_stored_counts_once():
    s = Scheduler(SimulatedBackend(FLEET), Store("sqlite://"), SchedulerPolicy(
        heartbeat_ttl=0, usage_quotas={"*": {"gpu_hours": 100, "window": "7d"}}), now=MONDAY)
    lease = s.submit("alice", "kernel:k", SliceSpec.from_json({"kind": "whole", "model": "L4"}), now=MONDAY)
    s.touch(lease.id, now=MONDAY + 3600, last_activity=MONDAY + 3600)
    s.tick(MONDAY + 7200)
    s.sample_gpu(lease.id, now=MONDAY + 7200, sm_percent=50)
    assert s.store.load_usage(0, 2e9)  # part of its accrual is stored, the rest is still running
    now = MONDAY + 7260
    s.sample_gpu(lease.id, now=now, sm_percent=50)
    held = 7260 / 3600
    assert s.usage.report(MONDAY, now, "user", now)[0]["gpu_hours"] == pytest.approx(held, abs=1e-5)
    assert s.usage.quotas_for("alice", [], now)[0].used == pytest.approx(held)
    assert sum(s.usage.totals(now).values()) == pytest.approx(held)
    [row] = s.usage.efficiency(MONDAY, now, now)
    assert row["gpu_hours"] == pytest.approx(held, abs=1e-5)
