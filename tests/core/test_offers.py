"""Offers are the core's typed objects; a lease's terms come from the admin's policy for its offer,
and a request may ask only for less (a shorter idle timeout, a preemptible lease)."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import LeaseState, PriorityClass, SliceSpec, SpecError
from jupyter_gpualloc.core.offers import Offer
from jupyter_gpualloc.core.policy import SchedulerPolicy

from .conftest import fleet

L4_4GB = {"kind": "shared", "memory_gib": 4, "model": "L4"}
L4_WHOLE = {"kind": "whole", "model": "L4"}
OFFERS = [
    {"name": "small", "label": "4 GiB on L4", "spec": L4_4GB, "idle_timeout": 50, "max_duration": 500},
    {"name": "whole-l4", "spec": L4_WHOLE, "groups": ["staff"]},
]


@pytest.fixture
def hub(harness):
    """Two L4s, the two offers above, kernels idle-released after 100 s (warned, then 20 s)."""
    return harness(fleet({"model": "L4", "count": 2}), offers=OFFERS, idle_timeout=100, idle_grace=20,
                   heartbeat_ttl=0, max_duration={"kernel": 1000})


def spec(data: dict) -> SliceSpec:
    return SliceSpec.from_json(data)


def test_an_offer_is_a_typed_object_checked_when_the_policy_is_loaded():
    offer = Offer.from_config(OFFERS[0])
    assert offer == Offer("small", "4 GiB on L4", spec(L4_4GB), 50.0, 500.0, ())
    assert Offer.from_config(OFFERS[1]).open_to(["staff"]) and not Offer.from_config(OFFERS[1]).open_to([])
    for bad, words in [({**OFFERS[0], "idle_timout": 5}, "unknown key 'idle_timout'"),
                       ({**OFFERS[0], "idle_timeout": -1}, "idle_timeout must be a number of seconds"),
                       ({**OFFERS[0], "spec": {"kind": "shared"}}, "spec"),
                       ({**OFFERS[0], "groups": "staff"}, "groups must be a list")]:
        with pytest.raises(ValueError, match=words):
            SchedulerPolicy(offers=[bad])
    with pytest.raises(ValueError, match="used more than once"):
        SchedulerPolicy(offers=[OFFERS[0], OFFERS[0]])


def test_a_request_cannot_turn_idle_release_off_or_lengthen_it(hub):
    s = hub.scheduler
    for asked in (0, -5, float("nan"), True):
        with pytest.raises(SpecError) as refused:
            s.submit("alice", "kernel:k0", spec(L4_4GB), now=0, idle_timeout=asked)
        assert refused.value.field == "idle_timeout"
    longer = s.submit("alice", "kernel:k1", spec(L4_4GB), now=0, idle_timeout=10_000_000)
    assert longer.idle_timeout == 50  # the offer's: asking for more changes nothing
    own = s.submit("bob", "kernel:k2", spec({"kind": "shared", "memory_gib": 3, "model": "L4"}), now=0,
                   idle_timeout=10_000_000)
    assert own.idle_timeout == 100  # a spec of its own: the policy's for kernels
    shorter = s.submit("carol", "kernel:k3", spec({"kind": "shared", "memory_gib": 2, "model": "L4"}), now=0,
                       idle_timeout=30)
    assert shorter.idle_timeout == 30  # asking for less is honoured
    s.tick(100)
    s.tick(121)
    assert [s.lease(l.id).state for l in (longer, own, shorter)] == [LeaseState.EXPIRED] * 3


def test_the_offer_decides_the_time_limit_and_idle_timeout_of_a_lease_whatever_its_holder(hub):
    s = hub.scheduler
    kernel = s.submit("alice", "kernel:k1", spec(L4_4GB), now=0)
    server = s.submit("bob", "server", spec(L4_4GB), now=0)
    assert kernel.idle_timeout == server.idle_timeout == 50
    assert s.deadline(kernel.id)["at"] == s.deadline(server.id)["at"] == 500
    job = s.submit("carol", "job:j1", spec(L4_4GB), PriorityClass.BATCH, now=0, idle_timeout=10)
    assert job.idle_timeout is None  # jobs are never idle-released: they end with their run


def test_an_offer_pinned_to_a_node_by_the_service_keeps_its_terms(hub):
    node = hub.scheduler.inventory()["nodes"][0]["name"]
    lease = hub.scheduler.submit("alice", "kernel:k1", spec({**L4_4GB, "node": node}), now=0)
    assert lease.idle_timeout == 50 and hub.scheduler.deadline(lease.id)["at"] == 500


def test_offers_are_resolved_by_name_for_those_who_may_take_them(hub):
    s = hub.scheduler
    assert s.requested_spec({"offer": "small"}) == spec(L4_4GB)
    assert s.requested_spec({"spec": L4_WHOLE}, ["staff"]) == spec(L4_WHOLE)
    assert s.requested_spec({"offer": "whole-l4"}, ["staff"]) == spec(L4_WHOLE)
    for request, groups in [({"offer": "nope"}, ()), ({"offer": "whole-l4"}, ["students"])]:
        with pytest.raises(SpecError) as refused:
            s.requested_spec(request, groups)
        assert refused.value.field == "offer"
    # the same spec asked by hand is the same offer: its groups still decide
    with pytest.raises(SpecError, match="only for members of staff"):
        s.submit("alice", "kernel:k1", spec(L4_WHOLE), now=0, groups=["students"])
    assert s.submit("alice", "kernel:k1", spec(L4_WHOLE), now=0, groups=["staff"]).state is LeaseState.GRANTED
    assert [o["name"] for o in s.offers("alice", ["students"])] == ["small"]


def test_batch_work_cannot_opt_out_of_preemption_unless_the_policy_allows_it(harness):
    strict = harness(fleet({"model": "L4", "count": 1}), heartbeat_ttl=0).scheduler
    with pytest.raises(SpecError) as refused:
        strict.submit("alice", "job:j1", spec(L4_WHOLE), PriorityClass.BATCH, now=0, preemptible=False)
    assert refused.value.field == "preemptible"
    assert strict.submit("alice", "job:j2", spec(L4_WHOLE), PriorityClass.BATCH, now=0).preemptible
    assert strict.submit("bob", "kernel:k1", spec(L4_WHOLE), now=0, preemptible=True).preemptible  # less: allowed
    lenient = harness(fleet({"model": "L4", "count": 1}), heartbeat_ttl=0, allow_non_preemptible=True).scheduler
    pinned = lenient.submit("alice", "job:j1", spec(L4_WHOLE), PriorityClass.BATCH, now=0, preemptible=False)
    assert not pinned.preemptible


def test_an_offer_says_per_user_when_their_quota_is_full_now(harness):
    """carol's offers said '12 free now' while her quota was full: each offer now carries the quota
    her slices in use fill, in the words of a queued lease's reason, and bob's do not."""
    h = harness(fleet({"model": "L4", "count": 4}), offers=OFFERS, heartbeat_ttl=0,
                quotas={"carol": {"slices": 1}})
    s = h.scheduler
    assert all(o["quota_full"] is None for o in s.offers("carol", ["staff"]))
    s.submit("carol", "kernel:k1", spec(L4_4GB), now=0)
    queued = s.submit("carol", "job:j1", spec(L4_4GB), PriorityClass.BATCH, now=0)
    carol = {o["name"]: o for o in s.offers("carol", ["staff"])}
    assert carol["small"]["quota_full"] == queued.reason
    assert carol["small"]["quota_full"].startswith("user quota for carol: at most 1 slice (1 slice in use")
    assert carol["small"]["available"] > 0 and carol["small"]["over_quota"] is None
    assert all(o["quota_full"] is None for o in s.offers("bob", ["staff"]))
