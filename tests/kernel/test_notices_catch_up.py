"""A kernel's lease notices across a break in its event stream: what the lease went through while
the stream was down (it expired; its usage quota passed its warning level) is told once the
stream is back, read from the lease itself and the user's quotas; a warning already told live is
not told again."""

from __future__ import annotations

import time
from typing import Callable

from jupyter_gpualloc.client import SyncGpuAllocClient
from jupyter_gpualloc.kernel.notices import LeaseNotices, usage_event_type
from tests.cuttable_proxy import CuttableProxy
from tests.service.conftest import ALICE, ServiceProcess

MIG = {"kind": "mig", "profile": "1g.5gb"}
# a 1g.5gb slice (a seventh of a GPU) passes 2 % of 0.01 GPU-hours after about 5 s, the limit after 4 min
TINY_QUOTA = ('c.SchedulerPolicy.usage_quotas = {"*": {"gpu_hours": 0.01, "window": "1d"}}\n'
              "c.SchedulerPolicy.usage_warn_fraction = 0.02\n")


def wait_until(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def told_across_a_cut(tmp_path, config: str, meanwhile: Callable[[SyncGpuAllocClient, dict], None]):
    """The lines a kernel's notices tell of its lease when its connection to a real service is cut
    until `meanwhile(client, lease)` returns (nothing during the cut), then restored; and the lease."""
    service = ServiceProcess(tmp_path / "service", config="c.GpuAllocService.tick_interval = 0.2\n" + config).start()
    proxy = CuttableProxy(service.port)
    direct = SyncGpuAllocClient(f"http://127.0.0.1:{service.port}/", ALICE)
    through_proxy = SyncGpuAllocClient(f"http://127.0.0.1:{proxy.port}/", ALICE, retries=1, backoff=0.05)
    lines: list[str] = []
    try:
        lease = direct.request_lease(MIG, "kernel:k1", wait=5)
        notices = LeaseNotices(lambda: through_proxy, lambda: lease["id"], read_lease=through_proxy.lease,
                               read_quotas=lambda: through_proxy.usage()["quotas"], show=lines.append, retry=0.2)
        notices.start()
        time.sleep(0.5)  # the stream is open
        proxy.cut()  # the kernel reaches nothing, and sends no heartbeat
        meanwhile(direct, lease)
        assert lines == []
        proxy.restore()
        wait_until(lambda: lines, 10)
        time.sleep(1)  # more reconnects would not tell it again
        notices.stop()
        return lines, direct.lease(lease["id"])
    finally:
        proxy.cut()
        for client in (direct, through_proxy):
            client.close()
        service.kill()


def test_a_lease_that_expired_while_the_stream_was_down_is_told_when_it_is_back(tmp_path):
    def expired(direct, lease):
        wait_until(lambda: direct.lease(lease["id"])["state"] == "expired", 15)
    lines, lease = told_across_a_cut(tmp_path, "c.SchedulerPolicy.heartbeat_ttl = 4\n", expired)
    assert len(lines) == 1 and lines[0].startswith(f"gpu: lease {lease['id']} expired: "), lines


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


def test_a_usage_warning_given_while_the_stream_was_down_is_told_when_it_is_back(tmp_path):
    def warned(direct, lease):
        wait_until(lambda: usage_event_type(direct.usage()["quotas"][0]) == "usage.warning", 20)
        time.sleep(0.5)  # a tick or two: the service has sent its warning, to no one
    lines, lease = told_across_a_cut(tmp_path, TINY_QUOTA, warned)
    assert len(lines) == 1 and lines[0].startswith("gpu: usage quota nearly used up: you have used "), lines
    assert lease["state"] == "granted"


def test_a_quota_warning_is_told_once_per_level_however_it_arrives_and_again_after_it_cleared():
    user = {"scope": "user", "who": "alice", "gpu_hours": 9.5, "limit": 10.0, "warn_fraction": 0.9,
            "standing": "warning", "message": "you have used 9.50 of 10 GPU-hours in the last 7d"}
    quotas = [dict(user)]
    lines: list[str] = []
    notices = LeaseNotices(lambda: None, lambda: "L1", read_lease=lambda lease_id: {"id": "L1", "state": "granted"},
                           read_quotas=lambda: quotas, show=lines.append)
    notices._on_event({"type": "usage.warning", "time": 1000.0, "lease_id": "L1", "data": dict(user)})
    notices._catch_up()
    assert lines == ["gpu: usage quota nearly used up: you have used 9.50 of 10 GPU-hours in the last 7d"]
    quotas[0] = {**user, "gpu_hours": 10.0, "standing": "exceeded",
                 "message": "you have used 10.00 of 10 GPU-hours in the last 7d"}
    notices._catch_up()
    notices._on_event({"type": "usage.exceeded", "time": 1010.0, "lease_id": "L1", "data": quotas[0]})
    assert lines[1:] == ["gpu: usage quota used up: you have used 10.00 of 10 GPU-hours in the last 7d"]
    quotas[0] = {**user, "gpu_hours": 5.0, "standing": "ok"}  # the rolling window let it fall back
    notices._catch_up()
    quotas[0] = dict(user)
    notices._catch_up()
    assert len(lines) == 3 and lines[2] == lines[0]


def test_a_catch_up_that_cannot_read_the_quotas_still_tells_what_the_lease_says():
    def unanswered():
        raise ConnectionError("the usage report did not answer")
    lines: list[str] = []
    notices = LeaseNotices(lambda: None, lambda: "L1", show=lines.append, read_quotas=unanswered,
                           read_lease=lambda lease_id: {"id": "L1", "state": "granted", "idle_warned_at": 1000.0})
    notices._catch_up()
    assert len(lines) == 1 and "is idle" in lines[0], lines


def test_an_idle_warning_missed_while_the_stream_was_down_says_when_the_slice_goes():
    lease = {"id": "L1", "state": "granted", "idle_warned_at": 1000.0,
             "idle_release": {"since": 700.0, "warn_at": 1000.0, "release_at": 1120.0, "grace": 120.0, "warned": True}}
    lines: list[str] = []
    notices = LeaseNotices(lambda: None, lambda: "L1", read_lease=lambda lease_id: lease, show=lines.append)
    notices._catch_up()
    assert lines == ["gpu: lease L1 is idle: it is released in 2m unless this kernel is used"]
