"""Requests no node could ever hold are refused at submit; reservations stay on nodes that fit."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import LeaseState, SliceSpec, SpecError

BIG = {"name": "big", "cpu_milli": 64000, "memory_mib": 262144, "gpus": [{"model": "L4", "count": 1}]}
SMALL = {"name": "small", "cpu_milli": 4000, "memory_mib": 16384, "gpus": [{"model": "L4", "count": 2}]}
FLEET = {"nodes": [BIG, SMALL]}


def spec(**fields) -> SliceSpec:
    return SliceSpec.from_json({"kind": "whole", "model": "L4", **fields})


@pytest.mark.parametrize("fields, field, words", [
    ({"cpu_milli": 100000}, "spec.cpu_milli", "at most 64000"),
    ({"host_memory_mib": 300000}, "spec.host_memory_mib", "at most 262144"),
    ({"count": 2, "cpu_milli": 8000}, "spec.cpu_milli", "at most 4000"),  # 2 L4s sit only on the small node
    ({"count": 2, "host_memory_mib": 32768}, "spec.host_memory_mib", "at most 16384"),
    ({"cpu_milli": 8000, "host_memory_mib": 32768, "node": "small"}, "spec.cpu_milli", "at most 4000"),
])
def test_a_request_beyond_every_node_is_refused_saying_why(harness, fields, field, words):
    s = harness(FLEET, heartbeat_ttl=0).scheduler
    with pytest.raises(SpecError) as refused:
        s.submit("alice", "kernel:a", spec(**fields), now=1)
    assert refused.value.field == field and words in refused.value.message
    assert s.leases() == []


def test_a_request_that_fits_one_node_is_accepted(harness):
    s = harness(FLEET, heartbeat_ttl=0).scheduler
    assert s.submit("alice", "kernel:a", spec(cpu_milli=32000), now=1).slice.node == "big"
    assert s.submit("bob", "kernel:b", spec(count=2, cpu_milli=2000), now=1).slice.node == "small"


def test_reservations_cover_only_gpus_on_nodes_the_request_fits(harness):
    h = harness(FLEET, heartbeat_ttl=0, reserve_after=60)
    s = h.scheduler
    s.submit("alice", "kernel:a", spec(), now=0)  # the big node's only L4
    waiting = s.submit("bob", "kernel:b", spec(cpu_milli=32000), now=1)
    assert waiting.state is LeaseState.QUEUED
    s.tick(1000)  # bob has waited past reserve_after: his reservation is the big node's L4, not the small's
    for user in ("carol", "dave"):
        lease = s.submit(user, f"kernel:{user}", spec(), now=1001)
        assert lease.state is LeaseState.GRANTED and lease.slice.node == "small"
    s.release(s.leases(user="alice")[0].id, now=1002)
    assert s.lease(waiting.id).state is LeaseState.GRANTED


H100 = "H100 80GB HBM3"
BALANCED = ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]  # mig-parted's all-balanced on an H100


def mig(**fields) -> SliceSpec:
    return SliceSpec.from_json({"kind": "mig", **fields})


def test_a_mig_profile_no_static_layout_has_is_refused_at_submit_and_not_offered(harness):
    h = harness({"nodes": [{"name": "n", "cpu_milli": 64000, "memory_mib": 262144,
                            "gpus": [{"model": H100, "count": 2, "mig": "static", "layout": BALANCED}]}]},
                heartbeat_ttl=0)
    s = h.scheduler
    with pytest.raises(SpecError) as refused:
        s.submit("alice", "kernel:a", mig(profile="7g.80gb"), now=1)
    assert refused.value.field == "spec.profile"
    assert "none can be made" in refused.value.message and "1g.10gb, 2g.20gb, 3g.40gb" in refused.value.message
    with pytest.raises(SpecError):  # bigger than every instance there is: no plan at all
        s.submit("alice", "kernel:b", mig(memory_gib=60), now=1)
    assert s.leases() == []
    assert sorted(o["spec"]["profile"] for o in s.offers()) == ["1g.10gb", "2g.20gb", "3g.40gb"]
    # a size is served by the smallest profile that exists: 2g.20gb, not the 1g.20gb no GPU has
    assert s.submit("alice", "kernel:c", mig(memory_gib=15), now=1).slice.profile == "2g.20gb"
    assert s.submit("bob", "kernel:d", mig(profile="3g.40gb"), now=1).state is LeaseState.GRANTED


def test_configured_offers_of_profiles_that_cannot_exist_are_left_out(harness):
    offers = [{"name": name, "spec": {"kind": "mig", "profile": name}} for name in ("7g.80gb", "3g.40gb")]
    h = harness({"nodes": [{"name": "n", "cpu_milli": 64000, "memory_mib": 262144,
                            "gpus": [{"model": H100, "count": 1, "mig": "dynamic"}]}]},
                mig_changes="static", offers=offers)
    assert [o["name"] for o in h.scheduler.offers()] == []  # no instance exists, and none may be made


def test_a_model_with_one_gpu_whose_layout_may_change_keeps_every_profile(harness):
    h = harness({"nodes": [{"name": "n", "cpu_milli": 64000, "memory_mib": 262144,
                            "gpus": [{"model": H100, "count": 1, "mig": "static", "layout": BALANCED},
                                     {"model": H100, "count": 1, "mig": "dynamic"}]}]})
    lease = h.scheduler.submit("alice", "kernel:a", mig(profile="7g.80gb"), now=1)
    assert lease.state is LeaseState.GRANTED
