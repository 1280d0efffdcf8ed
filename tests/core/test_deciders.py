"""The core's deciders on their own, without a store or a scheduler: plans, quotas, the placement
search and the victim search read a fleet's state and leases and change nothing."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core import mig, preemption
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.errors import QuotaExceeded
from jupyter_gpualloc.core.fit import FitSearch, PassMemo, shape
from jupyter_gpualloc.core.fleet_state import FleetState, GpuState
from jupyter_gpualloc.core.holders import Holder, is_server, job_of, kernel_of, kind_of, parse_holder, server_holder
from jupyter_gpualloc.core.indexes import ActiveLeases
from jupyter_gpualloc.core.model import MILLI_PER_GPU, Lease, LeaseState, PriorityClass, Slice, SliceKind, SliceSpec, \
    SpecError
from jupyter_gpualloc.core.placement import get_policy
from jupyter_gpualloc.core.plans import Plans, slice_demand
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.quotas import quota_block

from .conftest import A100_40

FLEET = {"nodes": [{"name": "node0", "cpu_milli": 16000, "memory_mib": 65536, "gpus": [
    {"model": A100_40, "count": 1, "mig": "dynamic"}, {"model": "L4", "count": 2}]}]}


def spec(**fields) -> SliceSpec:
    return SliceSpec.from_json(fields)


@pytest.fixture
def fleet() -> FleetState:
    return FleetState(SimulatedBackend(FLEET), static_mig=False)


@pytest.fixture
def plans(fleet) -> Plans:
    return Plans(fleet.nodes, fleet.profiles())


def l4s(fleet: FleetState) -> list[GpuState]:
    return [gs for gs in fleet.gpus.values() if gs.gpu.model == "L4"]


def held(fleet: FleetState, active: ActiveLeases, lease_id: str, user: str, gs: GpuState, milli: int, *,
         priority: PriorityClass = PriorityClass.BATCH, preemptible: bool = True, granted_at: float = 0.0) -> Lease:
    """A granted lease holding `milli` of a GPU without MIG, as the scheduler would have left it."""
    kind = SliceKind.WHOLE if milli == MILLI_PER_GPU else SliceKind.SHARED
    asked = spec(kind="whole") if kind is SliceKind.WHOLE else spec(kind="shared", memory_gib=1)
    lease = Lease(id=lease_id, user=user, holder=f"job:{lease_id}", spec=asked, priority=priority,
                  state=LeaseState.GRANTED, created_at=0.0, seq=len(active.by_id) + 1, preemptible=preemptible,
                  granted_at=granted_at,
                  slice=Slice(kind=kind, node=gs.gpu.node, gpu_uuids=(gs.gpu.uuid,),
                              memory_mib=gs.gpu.memory_mib * milli // MILLI_PER_GPU, milli=milli, model=gs.gpu.model,
                              gpu_memory_mib=gs.gpu.memory_mib))
    gs.holders[lease.id] = milli
    fleet.changed(gs)
    fleet.view.allocate(gs.node_index, (gs.slot,), slice_demand(lease))
    active.add(lease)
    return lease


def asking(request: SliceSpec, priority: PriorityClass = PriorityClass.INTERACTIVE, user: str = "ann") -> Lease:
    return Lease(id="asking", user=user, holder="kernel:k", spec=request, priority=priority,
                 state=LeaseState.QUEUED, created_at=0.0, seq=99)


# ------------------------------------------------------------------ plans


def test_plans_prefer_mig_then_a_share_and_are_found_once_per_spec(plans):
    found = plans.of(spec(memory_gib=8))
    assert [(p.kind, p.model) for p in found] == [(SliceKind.MIG, A100_40), (SliceKind.SHARED, "L4")]
    assert found[0].profile.name == "1g.10gb"  # serves the 10 GB its name promises
    assert found[1].milli == -(-8 * 1024 * MILLI_PER_GPU // 23034)
    assert plans.of(spec(memory_gib=8)) is found


def test_plans_refuse_what_the_fleet_can_never_hold(plans):
    with pytest.raises(SpecError) as node:
        plans.of(spec(kind="shared", memory_gib=4, node="nowhere"))
    assert node.value.field == "spec.node"
    with pytest.raises(SpecError) as cpu:
        plans.of(spec(kind="whole", cpu_milli=32000))
    assert cpu.value.field == "spec.cpu_milli"


def test_plans_derive_one_offer_per_profile_share_size_and_whole_gpu(plans):
    names = [o.name for o in plans.derived_offers([8, 100])]
    assert names[0] == "mig-1g.5gb-a100-sxm4-40gb" and names[-2:] == ["shared-8gb-l4", "whole-l4"]


# ----------------------------------------------------------------- quotas


def test_a_user_quota_counts_granted_leases_other_than_the_request(fleet, plans):
    policy = SchedulerPolicy(quotas={"ann": {"slices": 1}})
    active = ActiveLeases()
    mine = held(fleet, active, "one", "ann", l4s(fleet)[0], 356)
    share = plans.of(spec(kind="shared", memory_gib=8))
    blocked = quota_block(policy, active, "ann", (), share, None)
    assert isinstance(blocked, QuotaExceeded) and (blocked.scope, blocked.key, blocked.limit) == ("user", "slices", 1)
    assert str(blocked) == "user quota for ann: at most 1 slice (1 slice in use; this request needs 1 slice)"
    assert quota_block(policy, active, "ann", (), share, mine.id) is None  # the lease itself is not counted twice
    assert quota_block(policy, active, "ann", (), share, None, assume_empty=True) is None
    assert quota_block(policy, active, "bob", (), share, None) is None


def test_a_group_quota_on_memory_counts_every_member(fleet, plans):
    policy = SchedulerPolicy(group_quotas={"lab": {"memory_gib": 20}})
    active = ActiveLeases()
    lease = held(fleet, active, "one", "ann", l4s(fleet)[0], 500)
    active.drop(lease.id)
    lease.groups = ("lab",)
    active.add(lease)
    blocked = quota_block(policy, active, "bob", ("lab",), plans.of(spec(kind="shared", memory_gib=12)), None)
    assert blocked is not None and (blocked.scope, blocked.key, blocked.limit_text) == ("group", "memory_gib",
                                                                                        "at most 20 GiB")


# -------------------------------------------------------------------- fit


def search(fleet: FleetState) -> FitSearch:
    return FitSearch(fleet, get_policy("bestfit"), mig.get_mig_placer("default"))


def test_fit_places_a_share_and_a_new_mig_instance_without_changing_anything(fleet, plans):
    fit = search(fleet).find(asking(spec(kind="shared", memory_gib=8)), plans.of(spec(kind="shared", memory_gib=8)),
                             set(), None, lambda plan: True)
    assert fit.slice.kind is SliceKind.SHARED and fit.gpus[0].gpu.model == "L4" and fit.create_at is None
    mig_spec = spec(kind="mig", profile="1g.5gb")
    made = search(fleet).find(asking(mig_spec), plans.of(mig_spec), set(), None, lambda plan: True)
    assert made.slice.profile == "1g.5gb" and made.slice.mig_uuid is None and made.create_at is not None
    assert all(not gs.holders and not gs.owner for gs in fleet.gpus.values())


def test_fit_passes_over_reserved_gpus_and_plans_not_allowed(fleet, plans):
    whole = spec(kind="whole")
    fits = search(fleet)
    assert fits.find(asking(whole), plans.of(whole), {gs.gpu.uuid for gs in l4s(fleet)}, None, lambda p: True) is None
    assert fits.find(asking(whole), plans.of(whole), set(), None, lambda plan: False) is None


def test_a_pass_memo_forgets_what_found_no_room_once_a_slice_is_freed(fleet, plans):
    active = ActiveLeases()
    for i, gs in enumerate(l4s(fleet)):
        held(fleet, active, f"w{i}", "bob", gs, MILLI_PER_GPU)
    whole = spec(kind="whole")
    memo = PassMemo(fleet)
    assert search(fleet).find(asking(whole), plans.of(whole), set(), memo, lambda plan: True) is None
    assert memo.no_room(shape(plans.of(whole)[0], whole))
    fleet.room_made()
    assert not memo.no_room(shape(plans.of(whole)[0], whole))


# ------------------------------------------------------------- preemption


def test_preemption_picks_the_newest_preemptible_batch_lease_that_makes_room(fleet, plans):
    active = ActiveLeases()
    first, second = l4s(fleet)
    held(fleet, active, "old", "bob", first, MILLI_PER_GPU, granted_at=1.0)
    newest = held(fleet, active, "new", "bob", second, MILLI_PER_GPU, granted_at=2.0)
    whole = spec(kind="whole")
    assert preemption.victims(asking(whole), plans.of(whole), set(), fleet, active, ()) == [newest]
    assert all(gs.holders for gs in (first, second))  # a dry run: the victims still hold their GPUs


def test_preemption_has_no_victims_among_interactive_leases(fleet, plans):
    active = ActiveLeases()
    for i, gs in enumerate(l4s(fleet)):
        held(fleet, active, f"i{i}", "bob", gs, MILLI_PER_GPU, priority=PriorityClass.INTERACTIVE, preemptible=False)
    whole = spec(kind="whole")
    assert preemption.victims(asking(whole), plans.of(whole), set(), fleet, active, ()) is None


def test_preemption_waits_while_a_preempted_slice_is_still_returning(fleet, plans):
    active = ActiveLeases()
    victim = held(fleet, active, "b", "bob", l4s(fleet)[0], MILLI_PER_GPU)
    returning = held(fleet, ActiveLeases(), "gone", "bob", l4s(fleet)[1], MILLI_PER_GPU)
    returning.state = LeaseState.PREEMPTED
    whole = spec(kind="whole")
    assert preemption.victims(asking(whole), plans.of(whole), set(), fleet, active, [returning]) is None
    assert preemption.victims(asking(whole), plans.of(whole), set(), fleet, active, ()) == [victim]


# ---------------------------------------------------------------- holders


def test_the_holder_grammar():
    assert parse_holder("server") == Holder("server") and str(parse_holder("server:gpu")) == "server:gpu"
    assert [parse_holder(h) for h in ("kernel:", "server:", "notebook:1", "Server", "")] == [None] * 5
    assert kernel_of("kernel:abc") == "abc" and kernel_of("job:abc") is None and job_of("job:7") == "7"
    assert is_server("server:x") and not is_server("kernel:x") and server_holder() == "server"
    assert [kind_of(h) for h in ("server", "server:gpu", "kernel:k1", "job:7")] == ["server", "server", "kernel", "job"]
