"""Remote mode: the server's stream from the service survives outages without losing a lease's end.

A real service process behind a TCP proxy the test cuts (a network blip), the extension in an
in-process Jupyter server, and a kernel-side subscriber of the server's relay (LeaseNotices, as
the %gpu magic runs it in a kernel). Events published while the stream is down reach the
kernel-side subscriber: replayed when the service still has them, made again from the state
after a `stream.reset` (service restart, or more events than it keeps).
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from jupyter_gpualloc.client import GpuAllocError, SyncGpuAllocClient
from jupyter_gpualloc.kernel.notices import LeaseNotices, usage_event_type
from tests.cuttable_proxy import CuttableProxy
from tests.kernel.test_notices_catch_up import TINY_QUOTA
from tests.server.conftest import extension_config, wait_for
from tests.service.conftest import ALICE, BOB, ServiceProcess

MIG = {"kind": "mig", "profile": "1g.5gb"}
TTL = 3.0  # seconds a lease lives without heartbeats: how leases end while the server's stream is down


@pytest.fixture
def replay_size() -> int:
    return 10_000


@pytest.fixture
def more_config() -> str:
    return ""


@pytest.fixture
def remote(tmp_path, replay_size, more_config):
    config = (f"c.GpuAllocService.tick_interval = 0.2\nc.SchedulerPolicy.heartbeat_ttl = {TTL}\n"
              f"c.GpuAllocService.event_replay_size = {replay_size}\n") + more_config
    service = ServiceProcess(tmp_path / "service", config=config).start()
    proxy = CuttableProxy(service.port)
    yield service, proxy
    proxy.cut()
    service.kill()


@pytest.fixture
def jp_server_config(tmp_path, remote):
    _, proxy = remote
    return extension_config(tmp_path, GpuAllocExtension={
        "mode": "remote", "service_url": f"http://127.0.0.1:{proxy.port}/", "service_token": ALICE,
        "report_interval": 60.0})


class KernelSide:
    """What a kernel holding `lease_id` is told through the server's relay: notice lines, and the events."""

    def __init__(self, ext):
        self.lines: list[str] = []
        self.lease_id: str | None = None
        self.client = SyncGpuAllocClient(ext.kernel_link.events_url, ALICE)
        self.notices = LeaseNotices(lambda: self.client, lambda: self.lease_id, show=self.lines.append, retry=0.2)
        self.events: list[dict] = []
        self.queue = ext.kernel_events.subscribe()

    async def drain(self) -> list[dict]:
        while not self.queue.empty():
            self.events.append(self.queue.get_nowait())
        return self.events

    def close(self) -> None:
        self.notices.stop()
        self.client.close()


@pytest.fixture
def kernel_side(gpualloc):
    side = KernelSide(gpualloc)
    side.notices.start()
    yield side
    side.close()


async def connected(ext) -> str:
    """The server's stream position once it has one (its stream is open)."""
    return await wait_for(lambda: ext.stream_position.last_id, timeout=20)


async def ended(service, lease_id: str) -> dict:
    async def read():
        lease = await asyncio.to_thread(service.call, "GET", f"leases/{lease_id}", None, ALICE)
        return lease.json() if lease.json()["state"] == "expired" else None
    return await wait_for(read, timeout=20, interval=0.2)


def lease_events(events: list, lease_id: str) -> list[tuple[str, str]]:
    return [(t, d["lease_id"]) for t, d in events if d.get("lease_id") == lease_id]


async def test_events_of_a_network_blip_are_replayed_to_the_kernels(gpualloc, remote, kernel_side, events):
    service, proxy = remote
    await connected(gpualloc)
    await asyncio.sleep(0.3)  # the kernel side's stream is open too
    proxy.cut()
    lease = (await asyncio.to_thread(service.call, "POST", "leases", {"spec": MIG, "holder": "kernel:gone"},
                                     ALICE)).json()
    kernel_side.lease_id = lease["id"]
    await ended(service, lease["id"])  # granted, then expired (no heartbeat), while the server could not hear
    proxy.restore()
    line = f"gpu: lease {lease['id']} expired: no heartbeat from kernel:gone"
    await wait_for(lambda: any(l.startswith(line) for l in kernel_side.lines), timeout=30)
    relayed = [e for e in await kernel_side.drain() if e.get("lease_id") == lease["id"]]
    assert [e["type"] for e in relayed] == ["lease.granted", "lease.expired"]
    assert all(e["id"] and "resync" not in e for e in relayed)  # replayed by the service, not made up
    assert lease_events(events, lease["id"]) == [("lease.granted", lease["id"]), ("lease.expired", lease["id"])]


@pytest.mark.parametrize("gap,replay_size,usage_answers", [("restart", 10_000, True), ("overflow", 2, True),
                                                            ("overflow", 2, False)])
async def test_after_a_reset_the_server_reads_the_state_and_a_kernel_learns_its_lease_ended(
        gpualloc, remote, kernel_side, events, gap, replay_size, usage_answers, monkeypatch):
    service, proxy = remote
    await connected(gpualloc)
    if not usage_answers:  # the quotas are read too, but a usage report refused must not stop the catch-up
        async def refused(**query):
            raise GpuAllocError("usage: 400 until must be later than since", 400)
        monkeypatch.setattr(gpualloc.client, "usage", refused)
    lease = (await asyncio.to_thread(service.call, "POST", "leases", {"spec": MIG, "holder": "kernel:gone"},
                                     ALICE)).json()
    kernel_side.lease_id = lease["id"]
    await wait_for(lambda: lease["id"] in gpualloc.stream_mirror.leases)  # the server heard of the grant
    proxy.cut()
    before = gpualloc.stream_position.last_id
    if gap == "restart":
        await asyncio.to_thread(service.kill, signal.SIGTERM)
        await asyncio.to_thread(service.start)
    else:  # another user's lease: its events count against what the service keeps, yet alice never sees them
        other = (await asyncio.to_thread(service.call, "POST", "leases", {"spec": MIG, "holder": "kernel:b"},
                                         BOB)).json()
        await asyncio.to_thread(service.call, "DELETE", f"leases/{other['id']}", None, BOB)
    final = await ended(service, lease["id"])
    proxy.restore()
    line = f"gpu: lease {lease['id']} expired: {final['reason']}"
    await wait_for(lambda: line in kernel_side.lines, timeout=30)
    relayed = [e for e in await kernel_side.drain() if e.get("lease_id") == lease["id"]]
    assert [(e["type"], e.get("resync")) for e in relayed] == [("lease.granted", None), ("lease.expired", True)]
    assert relayed[1]["data"]["holder"] == "kernel:gone" and relayed[1]["time"] == final["ended_at"]
    assert lease_events(events, lease["id"]) == [("lease.granted", lease["id"]), ("lease.expired", lease["id"])]
    assert gpualloc.stream_mirror.leases == {}
    position = await wait_for(lambda: gpualloc.stream_position.last_id != before and gpualloc.stream_position.last_id)
    if gap == "restart":
        assert position.split("-")[0] != before.split("-")[0]
        # the same state read again after another restart says nothing more
        proxy.cut()
        await asyncio.to_thread(service.kill, signal.SIGTERM)
        await asyncio.to_thread(service.start)
        proxy.restore()
        await wait_for(lambda: gpualloc.stream_position.last_id.split("-")[0] not in (position.split("-")[0],),
                       timeout=30)
        await asyncio.sleep(0.5)
        assert [e for e in await kernel_side.drain() if e.get("resync")] == [relayed[1]]
        assert len(kernel_side.lines) == 1, kernel_side.lines


@pytest.mark.parametrize("replay_size,more_config", [(2, TINY_QUOTA + "c.SchedulerPolicy.heartbeat_ttl = 600\n")])
async def test_after_a_reset_a_kernel_learns_its_usage_quota_passed_its_warning_level(
        gpualloc, remote, kernel_side, events, replay_size, more_config):
    service, proxy = remote
    await connected(gpualloc)
    proxy.cut()
    lease = (await asyncio.to_thread(service.call, "POST", "leases", {"spec": MIG, "holder": "kernel:k1"},
                                     ALICE)).json()
    kernel_side.lease_id = lease["id"]

    async def warned():
        quotas = (await asyncio.to_thread(service.call, "GET", "usage", None, ALICE)).json()["quotas"]
        return usage_event_type(quotas[0]) == "usage.warning"
    await wait_for(warned, timeout=20, interval=0.2)
    await asyncio.sleep(0.5)  # a tick or two: the service has sent its warning; then more than it keeps
    other = (await asyncio.to_thread(service.call, "POST", "leases", {"spec": MIG, "holder": "kernel:b"}, BOB)).json()
    await asyncio.to_thread(service.call, "DELETE", f"leases/{other['id']}", None, BOB)
    proxy.restore()
    await wait_for(lambda: any(l.startswith("gpu: usage quota nearly used up: ") for l in kernel_side.lines),
                   timeout=30)
    relayed = [e for e in await kernel_side.drain() if e.get("lease_id") == lease["id"]]
    assert [(e["type"], e.get("resync")) for e in relayed] == [("lease.granted", True), ("usage.warning", True)]
    assert relayed[1]["data"]["scope"] == "user" and relayed[1]["data"]["holder"] == "kernel:k1"
    assert ("usage.warning", lease["id"]) in lease_events(events, lease["id"])
    await asyncio.sleep(1)
    assert len(kernel_side.lines) == 1, kernel_side.lines
