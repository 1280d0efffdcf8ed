"""The holder lifecycle: its two shared loops (the wait in the queue, the keepalive), and HolderLease,
the lifecycle every kind of holder lives, against a real service."""

from __future__ import annotations

import asyncio
import time

import pytest

from jupyter_gpualloc.client import GpuAllocClient
from jupyter_gpualloc.holder import Keepalive, WaitGaveUp, wait_in_queue
from jupyter_gpualloc.holder_lease import HolderLease
from tests.kernel.conftest import ALICE
from tests.kernel.conftest import Service as ServiceProcess


class Service:
    """A lease that leaves the queue at the `granted_after`-th read; heartbeats recorded."""

    def __init__(self, granted_after: int = 3, reasons=("quota for alice: 2 slices in use",)):
        self.reads, self.granted_after, self.reasons = 0, granted_after, reasons
        self.beats: list[list[str]] = []
        self.ended: set[str] = set()

    async def read(self, view):
        self.reads += 1
        if self.reads >= self.granted_after:
            return {**view, "state": "granted", "position": None, "reason": ""}
        return {**view, "position": self.granted_after - self.reads, "reason": self.reasons[0]}

    async def heartbeat(self, holders):
        self.beats.append(list(holders))
        return [{"id": f"lease-{h}", "holder": h} for h in holders if h not in self.ended]


QUEUED = {"id": "l1", "state": "queued", "position": 3, "reason": "quota for alice: 2 slices in use"}


def test_the_wait_tells_each_round_where_the_request_stands_and_why_and_ends_at_the_grant():
    service, rounds = Service(), []
    lease = asyncio.run(wait_in_queue(service.read, QUEUED, on_round=rounds.append, poll=0.01))
    assert lease["state"] == "granted" and service.reads == 3
    assert [r.position for r in rounds] == [3, 2, 1]
    assert {r.reason for r in rounds} == {"quota for alice: 2 slices in use"}
    assert all(r.left == float("inf") for r in rounds)


def test_the_wait_gives_up_at_its_patience_and_leaves_withdrawing_to_the_holder():
    service = Service(granted_after=10**6)
    with pytest.raises(WaitGaveUp) as gave_up:
        asyncio.run(wait_in_queue(service.read, QUEUED, patience=0.1, poll=0.02))
    assert gave_up.value.waiting.view["state"] == "queued" and gave_up.value.waiting.left <= 0
    assert 3 <= service.reads <= 10


def test_a_pod_already_starting_is_waited_for_past_the_patience():
    """Patience applies to the queue only: a kernel's pod granted and starting is not given up."""
    views = iter([{"state": "starting"}, {"state": "starting"}, {"state": "running"}])

    async def read(view):
        return next(views)

    pod = asyncio.run(wait_in_queue(read, {"state": "starting"}, patience=0.0, poll=0.01,
                                    waiting=lambda v: v["state"] not in ("running", "ended"),
                                    patience_applies=lambda v: v["state"] == "queued"))
    assert pod == {"state": "running"}


def test_a_waiting_holder_is_heartbeaten_while_it_waits():
    service = Service(granted_after=6)
    beats = []

    async def beat():
        beats.append(service.reads)

    asyncio.run(wait_in_queue(service.read, QUEUED, poll=0.02, beat=beat, beat_every=0.0))
    assert beats == [0, 1, 2, 3, 4, 5]  # one per round, before each read


def test_one_heartbeat_carries_every_holder_and_each_kind_reacts_to_its_own_end():
    service = Service()
    ended, lost = [], []
    runs = {"server": True}

    async def server_runs():
        return runs["server"]

    async def scenario():
        keepalive = Keepalive(service.heartbeat, 0.01)
        keepalive.keep("kernel:a", lease_id="lease-kernel:a", on_lost=lost.append)
        keepalive.keep("server", lease_id="lease-server", running=server_runs, on_ended=ended.append)
        await keepalive.beat()
        service.ended.add("kernel:a")  # its lease ends at the service (released from the sidebar)
        await keepalive.beat()
        runs["server"] = False  # the server's process ended
        await keepalive.beat()
        return keepalive

    keepalive = asyncio.run(scenario())
    assert service.beats == [["kernel:a", "server"], ["kernel:a", "server"]]
    assert lost == ["kernel:a"] and ended == ["server"] and keepalive.holders == []


def test_a_failed_heartbeat_is_tried_again_and_the_loop_stops_from_its_own_callback():
    calls = []

    async def flaky(holders):
        calls.append(list(holders))
        if len(calls) == 1:
            raise ConnectionError("the service restarts")
        return []  # the lease is gone at the second beat

    async def scenario():
        keepalive = Keepalive(flaky, 0.01)
        keepalive.keep("job:j1", lease_id="l-j1", on_lost=lambda holder: keepalive.stop())
        keepalive.start()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if not keepalive.running:
                break
        return keepalive

    keepalive = asyncio.run(scenario())
    assert calls == [["job:j1"], ["job:j1"]] and not keepalive.running


# ---------------------------------------------------------------- HolderLease, with a real service

ONE_MIG = {"kind": "mig", "profile": "1g.5gb"}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """`jupyter-gpualloc serve` over the kernel tests' fleet (seven 1g.5gb MIG slices, two L4s)."""
    svc = ServiceProcess(tmp_path_factory.mktemp("service")).start()
    yield svc
    svc.stop()


def run_with_clients(service, token: str, scenario):
    """asyncio.run(scenario(client, another)): two clients of the same user (the second one as a
    client that restarted), closed after."""
    async def main():
        first, second = GpuAllocClient(service.url, token, env={}), GpuAllocClient(service.url, token, env={})
        try:
            return await scenario(first, second)
        finally:
            await first.close()
            await second.close()

    return asyncio.run(main())


def lease_at(service, lease_id: str) -> dict:
    return service.call("GET", f"leases/{lease_id}")


def test_a_restarted_client_finds_the_lease_from_its_state_and_a_gone_holder_returns_its_slice(service):
    async def scenario(client, restarted):
        lease = HolderLease(client, "kernel:restarts")
        granted = await lease.acquire(spec=ONE_MIG)
        state = lease.get_state()
        again = HolderLease(restarted, "kernel:restarts")
        again.load_state(state)
        seen = await again.read()
        env = again.env(service_url=service.url)
        ended = await again.release(gone=True)
        return granted, state, seen, env, ended, again.get_state()

    granted, state, seen, env, ended, after = run_with_clients(service, ALICE, scenario)
    assert granted["state"] == "granted" and state == {"lease_id": granted["id"]}
    assert seen["id"] == granted["id"] and env["CUDA_VISIBLE_DEVICES"] == granted["slice"]["mig_uuid"]
    assert env["GPUALLOC_LEASE_ID"] == granted["id"]
    assert ended["state"] == "released" and after == {}
    assert not lease_at(service, granted["id"])["returning"]  # the holder is gone: the slice is free at once


def test_a_release_while_the_holder_may_use_the_gpu_keeps_the_slice_until_the_holder_is_gone(service):
    async def scenario(client, _):
        lease = HolderLease(client, "kernel:cuda-in-use")
        granted = await lease.acquire(spec=ONE_MIG)
        state = lease.get_state()
        await lease.release()  # its process may still hold a CUDA context
        returning = lease_at(service, granted["id"])["returning"]
        lease.load_state(state)
        await lease.release(gone=True)  # its process ended
        return granted, returning

    granted, returning = run_with_clients(service, ALICE, scenario)
    assert returning is True
    after = lease_at(service, granted["id"])
    assert after["state"] == "released" and not after["returning"]


def test_a_gone_holder_returns_a_slice_whose_lease_ended_elsewhere_or_was_never_known_here(service):
    """Released from the sidebar (the slice waits for the kernel), then the kernel's launcher, which
    never knew the lease (the kernel's %gpu asked for it), reports the kernel gone."""
    async def scenario(client, launcher):
        asked = await HolderLease(client, "kernel:asked-by-magic").acquire(spec=ONE_MIG)
        await client.release(asked["id"])  # the sidebar's Release: the kernel may still use it
        returning = lease_at(service, asked["id"])["returning"]
        ended = await HolderLease(launcher, "kernel:asked-by-magic").release(gone=True)
        return asked, returning, ended

    asked, returning, ended = run_with_clients(service, ALICE, scenario)
    assert returning is True and ended is None
    assert not lease_at(service, asked["id"])["returning"]


def test_the_wait_states_its_position_the_cores_reason_and_its_deadline_then_withdraws_or_is_granted(service):
    both_l4, one_l4 = {"kind": "whole", "count": 2, "model": "L4"}, {"kind": "whole", "count": 1, "model": "L4"}

    async def scenario(client, _):
        held = HolderLease(client, "kernel:holds-both-l4")
        await held.acquire(spec=both_l4)
        waiting = HolderLease(client, "kernel:waits-for-an-l4")
        queued = await waiting.acquire(spec=one_l4)
        rounds: list = []
        keeper = Keepalive(client.heartbeat)  # the process's, heartbeating the waiting holder each round
        asked_at = time.time()
        with pytest.raises(WaitGaveUp):
            await waiting.wait(patience=0.6, on_round=rounds.append, poll=0.1, keeper=keeper, beat_every=0.0)
        deadline = waiting.gives_up_at
        beaten, kept_after = (await client.lease(queued["id"]))["heartbeat_at"], keeper.holders
        withdrawn = await waiting.release()
        requeued = await waiting.acquire(spec=one_l4)

        async def the_slice_in_the_way_returns():
            await asyncio.sleep(0.3)
            await held.release(gone=True)

        freeing = asyncio.ensure_future(the_slice_in_the_way_returns())
        granted = await waiting.wait(patience=30, poll=0.1)
        await freeing
        env = waiting.env()
        await waiting.release(gone=True)
        return queued, rounds, asked_at, deadline, beaten, kept_after, withdrawn, requeued, granted, env

    queued, rounds, asked_at, deadline, beaten, kept_after, withdrawn, requeued, granted, env = \
        run_with_clients(service, ALICE, scenario)
    assert queued["state"] == "queued" and rounds[0].position == queued["position"] == 1
    assert beaten > queued["heartbeat_at"] and kept_after == []  # heartbeaten while it waited, only then
    assert rounds[0].reason and {r.reason for r in rounds} == {queued["reason"]}
    assert asked_at + 0.6 <= deadline <= asked_at + 1.6 and rounds[-1].left <= 0
    assert withdrawn["state"] == "cancelled" and requeued["state"] == "queued"
    assert granted["state"] == "granted" and env["CUDA_VISIBLE_DEVICES"] == granted["slice"]["gpu_uuids"][0]


def test_a_lease_joins_the_processs_keepalive_and_hears_when_the_service_ended_it(service):
    async def scenario(client, _):
        keeper = Keepalive(client.heartbeat, 30.0)
        lost: list[str] = []
        watched = HolderLease(client, "kernel:watched")
        plain = HolderLease(client, "kernel:plain")
        for lease in (watched, plain):
            await lease.acquire(spec=ONE_MIG)
        watched.keepalive(keeper, on_lost=lost.append, start=False)
        plain.keepalive(keeper, start=False)  # no on_lost: heartbeaten while its process lives
        first = await keeper.beat()
        await client.release(watched.lease_id)
        await client.release(plain.lease_id)
        await keeper.beat()
        kept = keeper.holders
        await client.holders_gone(["kernel:watched", "kernel:plain"])
        return first, lost, kept

    first, lost, kept = run_with_clients(service, ALICE, scenario)
    assert sorted(lease["holder"] for lease in first) == ["kernel:plain", "kernel:watched"]
    assert lost == ["kernel:watched"] and kept == ["kernel:plain"]
