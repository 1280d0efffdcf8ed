"""Time-boxed leases over HTTP: the deadline in every lease answer and POST /leases/<id>/extend."""

from __future__ import annotations

import signal

import pytest

from .conftest import ALICE, BOB, POLICY, ServiceProcess

TIMEBOX = POLICY + """
c.SchedulerPolicy.max_duration = {"kernel": 3600}
c.SchedulerPolicy.max_extensions = 1
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    svc = ServiceProcess(tmp_path_factory.mktemp("timebox"), config=TIMEBOX).start()
    yield svc
    svc.kill(signal.SIGTERM)


def test_deadline_extend_once_then_refused(service):
    granted = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:t"},
                           ALICE)
    assert granted.status == 201, granted
    lease = granted.json()
    assert lease["deadline"]["at"] == pytest.approx(lease["granted_at"] + 3600)
    assert lease["deadline"]["extensions_left"] == 1
    assert service.call("POST", f"leases/{lease['id']}/extend", token=BOB).status == 404
    extended = service.call("POST", f"leases/{lease['id']}/extend", token=ALICE)
    assert extended.status == 200, extended
    assert extended.json()["deadline"]["at"] == pytest.approx(lease["granted_at"] + 7200)
    assert extended.json()["deadline"]["extensions"] == 1
    again = service.call("POST", f"leases/{lease['id']}/extend", token=ALICE)
    assert again.status == 409 and "used its 1 extension" in again.json()["reason"]
    listed = service.call("GET", f"leases/{lease['id']}", token=ALICE).json()
    assert listed["deadline"]["extensions_left"] == 0
    server = service.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "server"},
                          ALICE).json()
    assert server["deadline"] is None
    assert service.call("DELETE", f"leases/{server['id']}", token=ALICE).status == 200
    assert service.call("DELETE", f"leases/{lease['id']}", token=ALICE).status == 200
    assert service.call("POST", f"leases/{lease['id']}/extend", token=ALICE).status == 404


def test_deadline_and_usage_events_reach_the_sidebars_stream():
    import json as _json
    import logging

    from jupyter_events import EventLogger

    from jupyter_gpualloc.server.events import GpuAllocEvents

    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.records = []

        def emit(self, record):
            self.records.append(record.msg if isinstance(record.msg, dict) else _json.loads(record.getMessage()))

    keep = Keep()
    events = GpuAllocEvents(EventLogger(handlers=[keep]))
    events.relay_lease_event({"type": "lease.deadline_warning", "lease_id": "L1",
                              "data": {"holder": "kernel:k1", "state": "granted", "release_at": 1796284800.0}})
    events.relay_lease_event({"type": "usage.exceeded", "lease_id": "L1", "data": {
        "holder": "server", "state": "granted", "message": "you have used 10.00 of 10 GPU-hours this week"}})
    assert [r["message"] for r in keep.records] == [
        "The GPU slice of kernel k1 reaches its time limit at 2026-12-03 08:00 UTC; it will be released then "
        "unless extended (%gpu extend).",
        "GPU usage of this server: you have used 10.00 of 10 GPU-hours this week."]
    assert keep.records[0]["release_at"] == 1796284800.0
