"""The cluster's changes reach the scheduler: outside holders take capacity and give it back, cordons
drain a node's GPUs, a node added serves, a node deleted ends the leases on it. The clock is passed in."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from jupyter_gpualloc.core.model import LeaseState, SliceKind, SliceSpec, SpecError
from jupyter_gpualloc.core.model import OutsideUse

from .conftest import A100_40, fleet

WHOLE8 = SliceSpec(kind=SliceKind.WHOLE, count=8, model=A100_40)


def nodes_of(h, count: int | None = None):
    """The backend's nodes, fresh copies (the scheduler keeps its own)."""
    nodes = copy.deepcopy(h.backend.discover())
    return nodes if count is None else nodes[:count]


def test_an_outside_holder_of_eight_gpus_makes_a_whole_x8_request_wait_until_it_ends(harness):
    h = harness(fleet({"model": A100_40, "count": 8}))
    s = h.scheduler
    s.outside_use("pod:train/big-0", OutsideUse("pod:train/big-0", "node0", whole=8), now=1)
    lease = s.submit("alice", "server", WHOLE8, now=2)
    assert lease.state is LeaseState.QUEUED
    shares = [sh for g in s.inventory()["nodes"][0]["gpus"] for sh in g["shares"]]
    assert [sh["outside"] for sh in shares] == ["pod:train/big-0"] * 8
    s.outside_use("pod:train/big-0", None, now=3)
    assert s.lease(lease.id).state is LeaseState.GRANTED


def test_outside_shares_and_mig_devices_leave_the_pool(harness):
    h = harness(fleet({"model": A100_40, "count": 1},
                      {"model": A100_40, "count": 1, "mig": "static", "layout": ["3g.20gb", "3g.20gb"]}))
    s = h.scheduler
    s.outside_use("pod:a/x", OutsideUse("pod:a/x", "node0", shares=(500, 250), mig={"3g.20gb": 1}), now=1)
    gpus = s.inventory()["nodes"][0]["gpus"]
    plain = next(g for g in gpus if g["mig_mode"] == "off")
    assert plain["free_milli"] == 250
    mig_gpu = next(g for g in gpus if g["mig_mode"] != "off")
    assert [i.get("outside") for i in mig_gpu["instances"]] == ["pod:a/x", None]
    assert mig_gpu["free_profiles"]["3g.20gb"] == 1
    s.outside_use("pod:a/x", None, now=2)
    assert next(g for g in s.inventory()["nodes"][0]["gpus"] if g["mig_mode"] == "off")["free_milli"] == 1000


def test_what_finds_no_free_device_is_over_committed_not_lost(harness):
    h = harness(fleet({"model": A100_40, "count": 1}))
    s = h.scheduler
    granted = s.submit("alice", "server", SliceSpec(kind=SliceKind.WHOLE, model=A100_40), now=1)
    s.outside_use("pod:b/y", OutsideUse("pod:b/y", "node0", whole=1), now=2)
    assert s.inventory()["over_committed"] == [{"outside": "pod:b/y", "unplaced": ["1 whole GPU(s)"]}]
    assert s.lease(granted.id).state is LeaseState.GRANTED


def test_a_cordoned_node_drains_and_comes_back_when_uncordoned(harness):
    h = harness(fleet({"model": A100_40, "count": 1}))
    s = h.scheduler
    cordoned = [dataclasses.replace(n, unschedulable="cordoned") for n in nodes_of(h)]
    s.nodes_changed(cordoned, now=1)
    lease = s.submit("alice", "server", SliceSpec(kind=SliceKind.WHOLE, model=A100_40), now=2)
    assert lease.state is LeaseState.QUEUED
    assert s.inventory()["nodes"][0]["unschedulable"] == "cordoned"
    s.nodes_changed(nodes_of(h), now=3)
    assert s.lease(lease.id).state is LeaseState.GRANTED
    assert "node.cordoned" in h.types() and "node.uncordoned" in h.types()


def test_an_admin_drain_outlives_a_cordon(harness):
    h = harness(fleet({"model": A100_40, "count": 1}))
    s = h.scheduler
    uuid = nodes_of(h)[0].gpus[0].uuid
    s.drain(uuid, now=1)
    s.nodes_changed([dataclasses.replace(n, unschedulable="not Ready") for n in nodes_of(h)], now=2)
    s.nodes_changed(nodes_of(h), now=3)
    assert s.inventory()["nodes"][0]["gpus"][0]["drained"] is True


def test_a_node_added_serves_and_a_node_deleted_ends_its_leases_saying_why(harness):
    h = harness(fleet({"model": A100_40, "count": 2}, nodes=2))
    s = h.scheduler
    s.nodes_changed(nodes_of(h, 1), now=1)
    assert s.gpu_count() == 2
    on_0 = s.submit("alice", "server", SliceSpec(kind=SliceKind.WHOLE, count=2, model=A100_40), now=2)
    waiting = s.submit("bob", "server", SliceSpec(kind=SliceKind.WHOLE, count=2, model=A100_40), now=3)
    assert waiting.state is LeaseState.QUEUED
    s.nodes_changed(nodes_of(h), now=4)  # node1 joins
    assert s.lease(waiting.id).state is LeaseState.GRANTED
    assert s.lease(on_0.id).state is LeaseState.GRANTED
    s.nodes_changed(nodes_of(h)[1:], now=5)  # node0 is deleted
    ended = s.lease(on_0.id)
    assert (ended.state, ended.reason) == (LeaseState.EXPIRED, "node node0 left the cluster")
    assert s.lease(waiting.id).state is LeaseState.GRANTED


def test_outside_holds_survive_a_reload(harness):
    h = harness(fleet({"model": A100_40, "count": 8}, nodes=2))
    s = h.scheduler
    s.nodes_changed(nodes_of(h, 1), now=1)
    s.outside_use("pod:t/x", OutsideUse("pod:t/x", "node0", whole=8), now=2)
    s.nodes_changed(nodes_of(h), now=3)
    assert s.submit("a", "server", WHOLE8, now=4).slice.node == "node1"
    assert s.submit("b", "server", WHOLE8, now=5).state is LeaseState.QUEUED


def test_a_time_sliced_gpu_takes_only_shares_and_a_plain_kubernetes_gpu_only_whole_slices(harness):
    h = harness(fleet({"model": A100_40, "count": 2}))
    nodes = nodes_of(h)
    nodes[0].gpus[0].sharing, nodes[0].gpus[1].sharing = "whole", "shared"
    s = h.scheduler
    s.nodes_changed(nodes, now=1)
    share = s.submit("a", "kernel:1", SliceSpec(kind=SliceKind.SHARED, memory_mib=4096, model=A100_40), now=2)
    whole = s.submit("b", "kernel:2", SliceSpec(kind=SliceKind.WHOLE, model=A100_40), now=3)
    assert share.slice.gpu_uuids == (nodes[0].gpus[1].uuid,) and whole.slice.gpu_uuids == (nodes[0].gpus[0].uuid,)
    s.release(share.id, now=4, holder_gone=True)
    assert s.submit("c", "kernel:3", SliceSpec(kind=SliceKind.WHOLE, model=A100_40), now=5).state is LeaseState.QUEUED
    offers = {o["spec"]["kind"]: o["available"] for o in s.offers()}
    assert offers["whole"] == 0 and offers["shared"] > 0


def test_a_share_of_a_model_no_gpu_of_which_shares_is_refused_at_once(harness):
    h = harness(fleet({"model": A100_40, "count": 2}))
    nodes = nodes_of(h)
    for gpu in nodes[0].gpus:
        gpu.sharing = "whole"
    s = h.scheduler
    s.nodes_changed(nodes, now=1)
    with pytest.raises(SpecError, match="no GPU in this fleet can provide"):
        s.submit("a", "kernel:1", SliceSpec(kind=SliceKind.SHARED, memory_mib=4096, model=A100_40), now=2)
    assert s.submit("a", "kernel:2", SliceSpec(memory_mib=4096, model=A100_40), now=3).slice.kind is SliceKind.WHOLE


def test_a_pod_on_a_cordoned_node_holds_its_gpus(harness):
    """A cordon evicts nothing: a GPU pod that runs there holds its devices (the views hide them, the holds stand)."""
    h = harness(fleet({"model": A100_40, "count": 2}))
    s = h.scheduler
    s.nodes_changed([dataclasses.replace(n, unschedulable="cordoned") for n in nodes_of(h)], now=1)
    s.outside_use("pod:t/x", OutsideUse("pod:t/x", "node0", whole=1, shares=(500,)), now=2)
    assert [sh["outside"] for g in s.inventory()["nodes"][0]["gpus"] for sh in g["shares"]] == ["pod:t/x"] * 2


def test_a_lease_on_a_cordoned_node_or_a_drained_gpu_outlives_a_reload_and_a_restart(harness):
    h = harness(fleet({"model": A100_40, "count": 2}, nodes=2))
    s = h.scheduler
    on_0 = s.submit("alice", "server", SliceSpec(kind=SliceKind.WHOLE, node="node0"), now=1)
    on_1 = s.submit("bob", "server", SliceSpec(kind=SliceKind.SHARED, memory_mib=4096, node="node1"), now=2)
    s.drain(on_1.slice.gpu_uuids[0], now=3)
    cordoned = [dataclasses.replace(n, unschedulable="cordoned") if n.name == "node0" else n for n in nodes_of(h)]
    s.nodes_changed(cordoned, now=4)
    s.nodes_changed([*cordoned, dataclasses.replace(cordoned[1], name="node2", gpus=[])], now=5)  # a reload
    assert "fleet.reloaded" in h.types()
    s = h.restart(now=6)
    assert [s.lease(lease.id).state for lease in (on_0, on_1)] == [LeaseState.GRANTED] * 2


def test_a_named_node_added_or_deleted_reloads_the_fleet_with_the_others_as_held(harness):
    h = harness(fleet({"model": A100_40, "count": 2, "mig": "dynamic"}, nodes=2))
    s = h.scheduler
    node0, node1 = nodes_of(h)
    s.nodes_changed([], names=["node1"], now=1)  # node1 is gone
    lease = s.submit("alice", "server", SliceSpec(kind=SliceKind.MIG, profile="3g.20gb"), now=2)
    assert (s.gpu_count(), lease.slice.node) == (2, "node0")
    s.nodes_changed([node1], names=["node1"], now=3)  # and back: node0 as held, its instance with it
    assert s.gpu_count() == 4 and s.lease(lease.id).state is LeaseState.GRANTED
    s.nodes_changed([], names=["node0"], now=4)
    assert s.lease(lease.id).reason == "node node0 left the cluster" and s.gpu_count() == 2
    assert h.types().count("fleet.reloaded") == 3
