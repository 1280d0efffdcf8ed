"""On Kubernetes a running pod cannot gain a device: the core grants a kernel or a job no slice there,
says why and what would enable it, and says so in what it offers before anyone asks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend
from jupyter_gpualloc.core.model import LeaseState, SliceKind, SliceSpec, SpecError

from .conftest import fleet

NODES = json.loads((Path(__file__).parent / "devices" / "k8s_nodes.json").read_text())["items"]
WHOLE = SliceSpec(kind=SliceKind.WHOLE)


@pytest.fixture
def on_kubernetes(harness):
    h = harness(fleet({"model": "T4", "count": 1}))
    h.restart(0.0, backend=KubernetesBackend.from_node_objects(NODES))
    return h.scheduler


def test_a_kernel_is_refused_with_why_and_a_job_with_what_would_run_it(on_kubernetes):
    with pytest.raises(SpecError) as kernel:
        on_kubernetes.submit("alice", "kernel:k1", WHOLE, now=1)
    assert kernel.value.field == "holder"
    assert "a kernel cannot get a GPU slice" in str(kernel.value) and "kernel pods" in str(kernel.value)
    with pytest.raises(SpecError) as job:
        on_kubernetes.submit("alice", "job:j1", WHOLE, now=1)
    assert "a background job cannot get a GPU slice" in str(job.value)
    assert on_kubernetes.leases() == []


def test_a_server_still_gets_its_slice(on_kubernetes):
    assert on_kubernetes.submit("alice", "server", WHOLE, now=1).state is LeaseState.GRANTED


def test_what_is_refused_is_said_with_the_offers(on_kubernetes, harness):
    refused = on_kubernetes.refused_holders()
    assert set(refused) == {"kernel", "job"} and "kernel pods" in refused["kernel"]
    assert harness(fleet({"model": "T4", "count": 1})).scheduler.refused_holders() == {}
