"""Time-boxed kernel leases and usage quotas as the kernel user sees them: `%gpu status`, the
lease view's Extend button, and the one-line notices of the service's warnings, in real kernels."""

from __future__ import annotations

import re
import time

import pytest

from jupyter_gpualloc.client import SyncGpuAllocClient
from jupyter_gpualloc.kernel.notices import LeaseNotices, notice_line
from jupyter_gpualloc.kernel.widget import LeaseView
from tests.kernel.conftest import ALICE, BOB, POLICY, Service

TIME_BOXED = POLICY + """
c.GpuAllocService.tick_interval = 0.5
c.SchedulerPolicy.max_duration = {"kernel": 20}
c.SchedulerPolicy.deadline_warning = 15
c.SchedulerPolicy.max_extensions = 1
c.SchedulerPolicy.extension = 5
c.SchedulerPolicy.usage_quotas = {"*": {"gpu_hours": 40, "window": "calendar_week"},
                                  "bob": {"gpu_hours": 0.001, "window": "calendar_week"}}
"""
UNTIL = r"until \d{4}-\d\d-\d\d \d\d:\d\d UTC \(in (\d+)s\)"
ALICE_STANDING = r"you have used \d+\.\d\d of 40 GPU-hours this week \(resets Mon \d{4}-\d\d-\d\d 00:00 UTC\)"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = Service(tmp_path_factory.mktemp("service"), policy=TIME_BOXED).start()
    yield svc
    svc.stop()


@pytest.fixture
def client(service):
    with SyncGpuAllocClient(service.url, ALICE) as c:
        yield c
    service.release_all()


def test_status_shows_the_time_limit_and_where_the_user_stands(service, start_kernel):
    kernel = start_kernel(ALICE)
    before = kernel.run("%gpu status")
    assert before.status == "ok" and not before.stderr, before
    assert re.fullmatch(r"gpu: this kernel holds no GPU slice \(%gpu request 10GB asks for one\)\n"
                        rf"  usage: {ALICE_STANDING}\n", before.stdout)
    assert kernel.run("%gpu request 4GB").status == "ok"
    status = kernel.run("%gpu status")
    assert status.status == "ok" and not status.stderr, status
    text = status.displays[0]["text/plain"]  # the lease view's text, as a terminal frontend shows it
    limit = re.search(rf"\n  time limit: {UNTIL}, 1 extension left \(%gpu extend\)\n", text)
    assert limit and 15 <= int(limit.group(1)) <= 20, text
    assert re.search(rf"\n  usage: {ALICE_STANDING}$", text), text
    extended = kernel.run("%gpu extend")
    assert re.fullmatch(rf"gpu: lease \w+ extended {UNTIL}, 0 extensions left\n", extended.stdout), extended
    refused = kernel.run("%gpu extend")
    assert refused.stdout == "" and re.fullmatch(
        r"gpu: cannot extend lease \w+: this lease has used its 1 extension\(s\); it ends at its deadline\n",
        refused.stderr), refused
    assert kernel.run("%gpu release").status == "ok"


def test_the_views_extend_button_moves_the_deadline_and_says_a_refusal_in_one_line(client):
    lease = client.request_lease({"kind": "shared", "memory_gib": 8, "model": "L4"}, "kernel:view", wait=0)
    view = LeaseView(client, lease, environ={}, memory_used=lambda: None, quotas=["you have used 0.00 of 40"])
    assert re.fullmatch(rf"time limit: {UNTIL}, 1 extension left \(%gpu extend\)", view.deadline.value)
    assert "usage: you have used 0.00 of 40" in view.usage.value and not view.extend_button.disabled
    first = lease["deadline"]["at"]
    view.extend_button._handle_custom_msg({"event": "click"}, [])  # what the frontend's click sends
    assert re.fullmatch(rf"extended {UNTIL}, 0 extensions left", view.message.value)
    assert client.lease(lease["id"])["deadline"]["at"] == first + 5
    assert view.extend_button.disabled and view.deadline.value.endswith("0 extensions left")
    view._extend(view.extend_button)  # a stale view (another frontend) still asks: refused in words
    assert view.message.value == (f"gpu: cannot extend lease {lease['id']}: this lease has used its 1 "
                                  "extension(s); it ends at its deadline")


def wait_for_stderr(kernel, pattern: str, seconds: float) -> str:
    """Run a cell that sleeps; the stderr notices printed while it ran (they show under the running cell)."""
    cell = kernel.run(f"import time; time.sleep({seconds})", timeout=seconds + 30)
    assert re.search(pattern, cell.stderr), cell
    return cell.stderr


def test_a_warned_lease_prints_one_line_and_its_end_another(service, start_kernel):
    kernel = start_kernel(ALICE)
    assert kernel.run("%gpu request 4GB").status == "ok"
    warned = wait_for_stderr(kernel, r"reaches its time limit", 8)
    lines = warned.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"gpu: lease \w+ reaches its time limit at \d{4}-\d\d-\d\d \d\d:\d\d UTC \(in 1\ds\); 1 extension left: "
        r"%gpu extend moves it later", lines[0]), lines
    ended = wait_for_stderr(kernel, r"expired", 16)
    assert re.search(r"^gpu: lease \w+ expired: reached its maximum duration of 20s$", ended, re.M), ended
    assert kernel.run("%gpu status").stdout.startswith("gpu: no GPU slice; lease ")


def test_a_usage_quota_warning_reaches_the_kernel(service, start_kernel):
    kernel = start_kernel(BOB)  # 0.001 GPU-hours: 3.6 s of a whole GPU's time this week
    assert kernel.run("%gpu request --whole").status == "ok"
    said = wait_for_stderr(kernel, r"usage quota used up", 8)
    assert re.search(r"^gpu: usage quota used up: you have used 0\.00 of 0\.001 GPU-hours this week "
                     r"\(resets Mon \d{4}-\d\d-\d\d 00:00 UTC\)$", said, re.M), said
    # the 90% warning comes first, unless one tick saw the quota pass from under 90% to used up
    assert said.find("usage quota nearly used up") < said.find("usage quota used up")
    assert kernel.run("%gpu release").status == "ok"
    refused = kernel.run("%gpu request --whole")
    assert re.fullmatch(r"gpu: you have used 0\.00 of 0\.001 GPU-hours this week \(resets .* UTC\)\n",
                        refused.stderr), refused


def test_only_what_the_user_must_act_on_becomes_a_notice():
    def event(kind: str, **data) -> dict:
        return {"type": kind, "time": 1796644800.0, "lease_id": "L1", "user": "alice", "data": data}

    assert notice_line(event("lease.idle_warning", idle_s=1800, release_at=1796645100.0)) == \
        "gpu: lease L1 is idle: it is released in 5m unless this kernel is used"
    assert notice_line(event("lease.deadline_warning", deadline=1796645700.0, extensions_left=0)) == \
        "gpu: lease L1 reaches its time limit at 2026-12-07 12:15 UTC (in 15m); it cannot be extended: save your work"
    assert notice_line(event("lease.preempted", reason="preempted for an interactive request")) == \
        "gpu: lease L1 preempted for an interactive request"
    for quiet in ("lease.granted", "lease.released", "lease.extended", "lease.idle_cleared"):
        assert notice_line(event(quiet)) is None


def test_notices_follow_only_the_lease_the_kernel_holds():
    shown: list[str] = []
    notices = LeaseNotices(lambda: None, lambda: "L1", show=shown.append)
    expired = {"type": "lease.expired", "time": 0.0, "data": {"reason": "idle for 1900 s"}}
    for lease_id in ("L2", None, "L1"):
        notices._on_event({**expired, "lease_id": lease_id})
    assert shown == ["gpu: lease L1 expired: idle for 1900 s"]
