"""The service and embedded mode wire the core the same way: what recovery announces is published."""

from __future__ import annotations

import json

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.core.wiring import open_core
from jupyter_gpualloc.server.embedded import EmbeddedScheduler
from jupyter_gpualloc.service.app import GpuAllocService

L4_NODE = {"nodes": [{"name": "n0", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [{"model": "L4", "count": 1}]}]}
T4_NODE = {"nodes": [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [{"model": "T4", "count": 1}]}]}


def lease_on_a_gpu_that_goes(url: str) -> str:
    """A granted lease stored on an L4 that the next start no longer finds: recovery ends it."""
    core = open_core(SimulatedBackend(L4_NODE), Store(url), SchedulerPolicy(), now=0.0)
    lease = core.scheduler.submit("alice", "kernel:k1", SliceSpec.from_json({"kind": "shared", "memory_gib": 4}),
                                  now=0.0)
    core.close()
    return lease.id


def published(audit_log) -> list[tuple[str, str | None]]:
    """(type, lease id) of each event the audit log holds, as the broker published them."""
    return [(e["type"], e.get("lease_id")) for e in map(json.loads, audit_log.read_text().splitlines())]


def test_embedded_mode_publishes_what_recovery_announces(tmp_path):
    url = sqlite_url(tmp_path / "db.sqlite")
    lease_id = lease_on_a_gpu_that_goes(url)
    audit = tmp_path / "audit.jsonl"
    embedded = EmbeddedScheduler(SimulatedBackend(T4_NODE), url, SchedulerPolicy(), user="alice",
                                 audit_log=str(audit))
    embedded.close()
    assert ("reconcile.slice_lost", lease_id) in published(audit)
    assert ("lease.expired", lease_id) in published(audit)


def test_the_service_publishes_what_recovery_announces(tmp_path):
    url = sqlite_url(tmp_path / "db.sqlite")
    lease_id = lease_on_a_gpu_that_goes(url)
    fleet = tmp_path / "fleet.json"
    fleet.write_text(json.dumps(T4_NODE))
    audit = tmp_path / "audit.jsonl"
    service = GpuAllocService()
    service.initialize(["--fleet", str(fleet), "--db", url, "--audit-log", str(audit)])
    service.broker.close()
    service.core.close()
    assert ("reconcile.slice_lost", lease_id) in published(audit)
    assert ("lease.expired", lease_id) in published(audit)
