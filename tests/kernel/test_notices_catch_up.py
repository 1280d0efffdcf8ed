"""A kernel's lease notices across a break in its event stream: what the lease went through while
the stream was down (here: it expired) is told once the stream is back, read from the lease
itself; a warning already told live is not told again."""

from __future__ import annotations

import time

from jupyter_gpualloc.client import SyncGpuAllocClient
from jupyter_gpualloc.kernel.notices import LeaseNotices
from tests.cuttable_proxy import CuttableProxy
from tests.service.conftest import ALICE, ServiceProcess

MIG = {"kind": "mig", "profile": "1g.5gb"}


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_lease_that_expired_while_the_stream_was_down_is_told_when_it_is_back(tmp_path):
    service = ServiceProcess(tmp_path / "service", config="c.GpuAllocService.tick_interval = 0.2\n"
                                                         "c.SchedulerPolicy.heartbeat_ttl = 4\n").start()
    proxy = CuttableProxy(service.port)
    direct = SyncGpuAllocClient(f"http://127.0.0.1:{service.port}/", ALICE)
    through_proxy = SyncGpuAllocClient(f"http://127.0.0.1:{proxy.port}/", ALICE, retries=1, backoff=0.05)
    lines: list[str] = []
    try:
        lease = direct.request_lease(MIG, "kernel:k1", wait=5)
        notices = LeaseNotices(lambda: through_proxy, lambda: lease["id"], read_lease=through_proxy.lease,
                               show=lines.append, retry=0.2)
        notices.start()
        time.sleep(0.5)  # the stream is open
        proxy.cut()  # the kernel reaches nothing, and no heartbeat comes: the lease expires meanwhile
        wait_until(lambda: direct.lease(lease["id"])["state"] == "expired", 15)
        assert lines == []
        proxy.restore()
        wait_until(lambda: lines, 10)
        time.sleep(1)  # more reconnects would not tell it again
        notices.stop()
        assert len(lines) == 1 and lines[0].startswith(f"gpu: lease {lease['id']} expired: "), lines
    finally:
        proxy.cut()
        for client in (direct, through_proxy):
            client.close()
        service.kill()


def test_a_warning_told_live_is_not_told_again_by_the_catch_up():
    lease = {"id": "L1", "state": "granted", "idle_warned_at": 1000.0,
             "deadline": {"at": 5000.0, "extensions_left": 1, "warned_at": 2000.0}}
    lines: list[str] = []
    notices = LeaseNotices(lambda: None, lambda: "L1", read_lease=lambda lease_id: lease, show=lines.append)
    notices._on_event({"type": "lease.idle_warning", "time": 1000.0, "lease_id": "L1",
                       "data": {"release_at": 1300.0}})
    notices._catch_up()
    notices._catch_up()
    assert len(lines) == 2 and "is idle" in lines[0] and "time limit" in lines[1], lines
