"""REST API v1 for jobs on a standalone service process (two users and an admin), over real HTTP."""

from __future__ import annotations

import http.client
import json
import signal

import pytest

from tests.service.conftest import ALICE, BOB, ROOT, ServiceProcess

WHOLE_L4 = {"kind": "whole", "model": "L4"}


def cell_job(tmp_path, **extra) -> dict:
    return {"spec": WHOLE_L4, "workdir": str(tmp_path), "name": "train",
            "source": {"kind": "cell", "code": "x = 1", "outputs": ["x"]}, **extra}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    service = ServiceProcess(tmp_path_factory.mktemp("jobs-service")).start()
    yield service
    service.kill(signal.SIGTERM)


def test_submit_list_and_the_runner_calls(svc, tmp_path):
    made = svc.call("POST", "jobs", cell_job(tmp_path), ALICE)
    assert made.status == 201, made
    job = made.json()
    assert made.headers["Location"].endswith(f"/api/v1/jobs/{job['id']}")
    assert (job["state"], job["position"], job["priority"], job["attempts"]) == ("queued", 0, "batch", 0)
    assert job["lease"]["holder"] == f"job:{job['id']}" and job["slice"]["kind"] == "whole"
    second = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    third = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    assert (second["position"], third["position"]) == (0, 1)  # two L4s: the third waits
    assert [j["id"] for j in svc.call("GET", "jobs", token=ALICE).json()["jobs"]][:3] == \
        [third["id"], second["id"], job["id"]]
    started = svc.call("POST", f"jobs/{job['id']}/start", token=ALICE).json()
    assert (started["state"], started["attempts"]) == ("running", 1)
    assert svc.call("POST", f"jobs/{job['id']}/start", token=ALICE).status == 409
    done = svc.call("POST", f"jobs/{job['id']}/finish", {"attempt": 1, "outcome": "succeeded"}, ALICE).json()
    assert done["state"] == "succeeded" and done["lease"] is None
    assert svc.call("GET", f"jobs/{third['id']}", token=ALICE).json()["position"] == 0  # its turn
    for j in (second, third):
        assert svc.call("DELETE", f"jobs/{j['id']}", token=ALICE).json()["state"] == "cancelled"
    again = svc.call("POST", f"jobs/{job['id']}/rerun", token=ALICE)
    assert again.status == 201 and again.json()["rerun_of"] == job["id"]
    svc.call("DELETE", f"jobs/{again.json()['id']}", token=ALICE)
    types = [json.loads(line)["type"] for line in svc.audit_log.read_text().splitlines()]
    for kind in ("job.queued", "job.started", "job.succeeded", "job.cancelled"):
        assert kind in types
    metrics = svc.call("GET", "metrics", token=ROOT).text
    assert 'gpualloc_jobs_total{event="succeeded",priority="batch"} 1.0' in metrics
    assert 'gpualloc_job_queue_wait_seconds_count{priority="batch"} 1.0' in metrics


def test_a_foreign_user_neither_sees_nor_cancels_a_job(svc, tmp_path):
    job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    assert job["id"] not in [j["id"] for j in svc.call("GET", "jobs", token=BOB).json()["jobs"]]
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/log"), ("POST", "/rerun"), ("POST", "/start")):
        answer = svc.call(method, f"jobs/{job['id']}{path}", token=BOB)
        assert answer.status == 404, (method, path, answer)
    assert svc.call("GET", "jobs?all=1", token=BOB).status == 403
    assert job["id"] in [j["id"] for j in svc.call("GET", "jobs?all=1", token=ROOT).json()["jobs"]]
    assert svc.call("DELETE", f"jobs/{job['id']}", token=ROOT).json()["reason"] == "cancelled by root"
    assert svc.call("DELETE", f"jobs/{job['id']}", token=ALICE).json()["state"] == "cancelled"


def test_delete_of_an_ended_job_is_a_conflict(svc, tmp_path):
    job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)
    answer = svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)
    assert answer.status == 409 and answer.json()["state"] == "cancelled"


@pytest.mark.parametrize("change, field", [
    ({"spec": {"kind": "nope"}}, "spec.kind"),
    ({"workdir": "relative/dir"}, "workdir"),
    ({"source": {"kind": "cell", "code": ""}}, "source.code"),
    ({"source": {"kind": "notebook", "path": "a.txt"}}, "source.path"),
    ({"source": {"kind": "cell", "code": "x", "inputs": ["a"]}}, "source.inputs_file"),
    ({"timeout": -1}, "timeout"),
    ({"retries": "2"}, "retries"),
    ({"priority": "interactive"}, "priority"),
    ({"colour": "red"}, "colour"),
])
def test_bad_requests_name_the_field(svc, tmp_path, change, field):
    answer = svc.call("POST", "jobs", {**cell_job(tmp_path), **change}, ALICE)
    assert answer.status == 400 and answer.json()["field"] == field, answer


def test_finish_checks_its_body(svc, tmp_path):
    job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    svc.call("POST", f"jobs/{job['id']}/start", token=ALICE)
    for body, field in (({"attempt": 0, "outcome": "succeeded"}, "attempt"),
                        ({"attempt": 1, "outcome": "great"}, "outcome"),
                        ({"attempt": 1, "outcome": "failed", "why": "x"}, "why")):
        answer = svc.call("POST", f"jobs/{job['id']}/finish", body, ALICE)
        assert answer.status == 400 and answer.json()["field"] == field, answer
    assert svc.call("POST", f"jobs/{job['id']}/finish", {"attempt": 2, "outcome": "failed"}, ALICE).status == 409
    svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)


def test_a_store_outage_answers_503_changes_nothing_and_passes(svc, tmp_path):
    from sqlalchemy import create_engine, text

    job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    database = create_engine(svc.db)
    try:
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE jobs RENAME TO jobs_away"))
        for method, path in (("POST", "jobs"), ("GET", "jobs"), ("DELETE", f"jobs/{job['id']}"),
                             ("POST", f"jobs/{job['id']}/start"), ("GET", "jobs/0123456789ab")):
            answer = svc.call(method, path, cell_job(tmp_path) if path == "jobs" and method == "POST" else None, ALICE)
            assert answer.status == 503 and answer.headers["Retry-After"] == "5", (method, path, answer)
        assert svc.call("GET", f"jobs/{job['id']}", token=ALICE).json()["state"] == "queued"  # as it was
    finally:
        with database.begin() as conn:
            conn.execute(text("ALTER TABLE jobs_away RENAME TO jobs"))
        database.dispose()
    after = svc.call("POST", "jobs", cell_job(tmp_path), ALICE)
    assert after.status == 201, after
    for made in (job, after.json()):
        assert svc.call("DELETE", f"jobs/{made['id']}", token=ALICE).json()["state"] == "cancelled"


def test_the_log_is_served_from_the_jobs_folder(svc, tmp_path):
    job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
    folder = tmp_path / ".gpualloc" / "jobs" / job["id"]
    folder.mkdir(parents=True)
    (folder / "job.log").write_text("epoch 1\n")
    answer = svc.call("GET", f"jobs/{job['id']}/log", token=ALICE)
    assert answer.status == 200 and answer.text == "epoch 1\n"
    svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)
    assert svc.call("GET", f"jobs/{job['id']}/log?follow=1", token=ALICE).text == "epoch 1\n"


class EventStream:
    """GET /events as one user, read line by line."""

    def __init__(self, svc, token: str):
        from urllib.parse import urlparse

        url = urlparse(svc.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=15)
        self.conn.request("GET", url.path + "events", headers={"Authorization": f"Bearer {token}"})
        self.response = self.conn.getresponse()
        assert self.response.status == 200
        assert self.response.readline().startswith(b": connected")

    def until(self, predicate) -> list[dict]:
        """Events up to and including the first one `predicate` accepts."""
        seen = []
        while True:
            line = self.response.readline()
            if line.startswith(b"data: "):
                seen.append(json.loads(line[6:]))
                if predicate(seen[-1]):
                    return seen

    def close(self) -> None:
        self.conn.close()


def test_job_events_reach_their_owner_only(svc, tmp_path):
    alice, bob = EventStream(svc, ALICE), EventStream(svc, BOB)
    try:
        job = svc.call("POST", "jobs", cell_job(tmp_path), ALICE).json()
        mine = alice.until(lambda e: e["type"] == "job.queued")
        assert mine[-1]["data"]["job_id"] == job["id"] and mine[-1]["user"] == "alice"
        lease = svc.call("POST", "leases", {"spec": {"kind": "mig", "profile": "1g.5gb"}, "holder": "kernel:b"},
                         BOB).json()
        theirs = bob.until(lambda e: e.get("lease_id") == lease["id"])  # after alice's job in the stream
        assert not [e for e in theirs if e["type"].startswith("job.") or e.get("user") == "alice"]
        svc.call("DELETE", f"leases/{lease['id']}", token=BOB)
        svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)
        assert alice.until(lambda e: e["type"] == "job.cancelled")[-1]["data"]["job_id"] == job["id"]
    finally:
        alice.close()
        bob.close()


def test_a_stopped_runners_jobs_wait_for_it_until_its_heartbeat_names_them(svc, tmp_path):
    job = svc.call("POST", "jobs", cell_job(tmp_path, runner="server:gone"), ALICE).json()
    assert job["position"] == 0 and not job["waiting_for_runner"]
    refused = svc.call("POST", "jobs/runners/gone", {"runner": "pod"}, ALICE)
    assert refused.status == 400 and refused.json()["field"] == "runner"
    gone = svc.call("POST", "jobs/runners/gone", {"runner": "server:gone"}, ALICE)
    assert gone.status == 200 and [j["id"] for j in gone.json()["jobs"]] == [job["id"]]
    waiting = svc.call("GET", f"jobs/{job['id']}", token=ALICE).json()
    assert (waiting["lease"], waiting["position"], waiting["waiting_for_runner"]) == (None, None, True)
    assert waiting["reason"] == "waiting for your server 'gone' to run it: start your server 'gone' again"
    assert job["lease"]["id"] not in [l["id"] for l in svc.call("GET", "leases", token=ALICE).json()["leases"]]
    holder = {"holders": [f"job:{job['id']}"]}
    assert svc.call("POST", "heartbeat", holder, BOB).status == 200  # not bob's job: it waits on
    assert svc.call("GET", f"jobs/{job['id']}", token=ALICE).json()["waiting_for_runner"]
    assert svc.call("POST", "heartbeat", holder, ALICE).status == 200  # its runner is back
    back = svc.call("GET", f"jobs/{job['id']}", token=ALICE).json()
    assert not back["waiting_for_runner"] and back["position"] == 0 and back["reason"] == ""
    svc.call("DELETE", f"jobs/{job['id']}", token=ALICE)
