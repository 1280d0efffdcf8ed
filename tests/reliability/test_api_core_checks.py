"""The core's own checks under the API: names the store could refuse, the blamed field, no other user named.

The API refuses these first (tests/reliability/test_api_input.py); the core refuses them too, so
no client of the core can poison the store.
"""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import PriorityClass, SliceSpec, SpecError
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url

FLEET = {"nodes": [{"name": "n1", "cpu_milli": 64000, "memory_mib": 262144,
                    "gpus": [{"model": "L4", "count": 2}, {"model": "A100-SXM4-40GB", "mig": "dynamic"}]}]}


@pytest.fixture
def scheduler(tmp_path):
    store = Store(sqlite_url(tmp_path / "db.sqlite"))
    yield Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(preemption=True), now=0.0)
    store.close()


@pytest.mark.parametrize("bad", ["kernel:\ud800", "kernel:a\x00b", "kernel:\u202e", "kernel:" + "x" * 300,
                                 "kernel:x ", "\ufeffserver"])
def test_holders_the_store_cannot_keep_are_refused(scheduler, bad):
    with pytest.raises(SpecError) as err:
        scheduler.submit("alice", bad, SliceSpec.from_json({"kind": "shared", "memory_gib": 1}), now=1)
    assert err.value.field == "holder"
    assert scheduler.submit("alice", "kernel:ok", SliceSpec.from_json({"kind": "shared", "memory_gib": 1}), now=2)


@pytest.mark.parametrize("user", ["", "al\x00ice", "\udc80", "u" * 256])
def test_user_names_the_store_cannot_keep_are_refused(scheduler, user):
    with pytest.raises(SpecError) as err:
        scheduler.submit(user, "kernel:1", SliceSpec.from_json({}), now=1)
    assert err.value.field == "user"


@pytest.mark.parametrize(("spec", "field"), [
    ({"model": "L4\x00"}, "spec.model"), ({"node": "\u200fn1"}, "spec.node"),
    ({"profile": "\u0661g.5gb"}, "spec.profile"),
    ({"memory_gib": 1e308}, "spec.memory_gib"), ({"memory_mib": 2 ** 63}, "spec.memory_mib"),
    ({"count": 2 ** 63}, "spec.count"), ({"cpu_milli": 1.5}, "spec.cpu_milli"), ({"model": " L4"}, "spec.model"),
])
def test_specs_out_of_bounds_are_refused_naming_the_field(spec, field):
    with pytest.raises(SpecError) as err:
        SliceSpec.from_json(spec)
    assert err.value.field == field


def test_integral_floats_are_integers():
    as_floats = SliceSpec.from_json({"count": 2.0, "cpu_milli": 500.0})
    assert as_floats == SliceSpec.from_json({"count": 2, "cpu_milli": 500})


@pytest.mark.parametrize(("spec", "field"), [
    ({"node": "elsewhere"}, "spec.node"), ({"kind": "whole", "count": 3}, "spec.count"),
    ({"kind": "shared", "memory_gib": 500}, "spec.memory_mib"), ({"model": "H100"}, "spec.model"),
])
def test_what_no_gpu_can_provide_blames_the_field_that_asks_for_it(scheduler, spec, field):
    with pytest.raises(SpecError) as err:
        scheduler.submit("alice", "kernel:1", SliceSpec.from_json(spec), now=1)
    assert err.value.field == field


def test_a_preempted_lease_does_not_name_who_took_its_place(scheduler):
    whole_l4 = SliceSpec.from_json({"kind": "whole", "model": "L4"})
    batch = [scheduler.submit("bob", f"job:{i}", whole_l4, PriorityClass.BATCH, now=1, preemptible=True)
             for i in range(2)]
    scheduler.submit("alice-the-interactive", "kernel:1", whole_l4, now=2)
    preempted = [scheduler.lease(lease.id) for lease in batch if scheduler.lease(lease.id).state.value == "preempted"]
    assert preempted and all("alice" not in lease.reason for lease in preempted)
    assert preempted[0].reason == "preempted for an interactive request"
