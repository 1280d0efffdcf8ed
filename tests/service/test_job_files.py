"""The files a user names to a standalone service (a job's workdir, its log): served only as their
user would read them, or not at all; a job's paths normalised and confined at submit.

The service runs as root here, as the test does: alice and bob have no local account (their logs
must be owned by the service's account, root), `nobody` has one (uid 65534) and is confined to a
root of c.GpuAllocService.job_workdir_roots."""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from tests.service.conftest import ALICE, TOKENS, ServiceProcess

NOBODY = "nobody-token-006"
NOBODY_UID = 65534
SHARE = {"kind": "shared", "memory_gib": 1}


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The root nobody's job folders may be in (besides nobody's home, which does not exist)."""
    folder = tmp_path_factory.mktemp("shared")
    (folder / "nobody").mkdir()
    return folder


@pytest.fixture(scope="module")
def svc(tmp_path_factory, shared):
    config = (f"c.SchedulerPolicy.heartbeat_ttl = 3600\nc.SchedulerPolicy.wait_for_holders = False\n"
              f"c.GpuAllocService.job_workdir_roots = ['{{home}}', '{shared}/{{user}}']\n")
    service = ServiceProcess(tmp_path_factory.mktemp("job-files"), tokens={**TOKENS, NOBODY: {"user": "nobody"}},
                             config=config).start()
    yield service
    service.kill(signal.SIGTERM)


@pytest.fixture
def submit(svc):
    """submit(workdir, token=ALICE) -> (job, its folder, made): the job's folder is not made; the jobs
    are cancelled at the end."""
    made = []

    def submit(workdir, token=ALICE):
        answer = svc.call("POST", "jobs", {"spec": SHARE, "workdir": str(workdir),
                                           "source": {"kind": "cell", "code": "x = 1"}}, token)
        assert answer.status == 201, answer
        made.append((answer.json()["id"], token))
        return answer.json(), workdir / ".gpualloc" / "jobs" / answer.json()["id"]

    yield submit
    for job_id, token in made:
        svc.call("DELETE", f"jobs/{job_id}", token=token)


def get_log(svc, job_id, token=ALICE, *, follow=False, limit=1 << 20, timeout=10.0) -> tuple[int, bytes]:
    """(status, at most `limit` bytes of the body): a log that never ends cannot hang the test."""
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=timeout)
    try:
        conn.request("GET", f"/api/v1/jobs/{job_id}/log" + ("?follow=1" if follow else ""),
                     headers={"Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        return response.status, response.read(limit)
    finally:
        conn.close()


def refused(answer: tuple[int, bytes], why: str) -> bool:
    status, body = answer
    return status == 403 and why in json.loads(body)["error"]


def test_a_log_linked_to_the_services_config_is_refused(svc, submit, tmp_path):
    job, folder = submit(tmp_path)
    folder.mkdir(parents=True)
    svc.config_path.chmod(0o600)  # the service's config: its admin token, readable by its account only
    (folder / "job.log").symlink_to(svc.config_path)
    answer = get_log(svc, job["id"])
    assert refused(answer, "symbolic link"), answer
    assert b"root-token" not in answer[1]


@pytest.mark.parametrize("linked", ["workdir", ".gpualloc", "jobs/<id>"])
def test_a_link_on_any_folder_of_the_path_is_refused(svc, submit, tmp_path, linked):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    workdir = tmp_path / "work"
    if linked == "workdir":
        workdir.symlink_to(elsewhere)
    else:
        workdir.mkdir()
    job, folder = submit(workdir)
    if linked == ".gpualloc":
        (workdir / ".gpualloc").symlink_to(elsewhere)
        real = elsewhere / "jobs" / job["id"]
    elif linked == "jobs/<id>":
        folder.parent.mkdir(parents=True)
        folder.symlink_to(elsewhere)
        real = elsewhere
    else:
        real = elsewhere / ".gpualloc" / "jobs" / job["id"]
    real.mkdir(parents=True, exist_ok=True)
    (real / "job.log").write_text("not through a link\n")
    answer = get_log(svc, job["id"])
    assert refused(answer, "symbolic link"), answer


def test_a_fifo_is_refused_and_never_stops_the_service(svc, submit, tmp_path):
    job, folder = submit(tmp_path)
    folder.mkdir(parents=True)
    fifo = folder / "job.log"
    os.mkfifo(fifo)
    answers = []
    asking = threading.Thread(target=lambda: answers.append(get_log(svc, job["id"], timeout=30)))
    asking.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert svc.call("GET", "health", timeout=5).status == 200
        assert time.monotonic() - started < 2
    finally:
        try:  # what blocks on it (an open for reading) ends when a writer comes and goes
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
        asking.join(30)
    assert refused(answers[0], "a FIFO"), answers


@pytest.mark.parametrize("device", ["made", "linked"])
def test_a_device_is_refused(svc, submit, tmp_path, device):
    job, folder = submit(tmp_path)
    folder.mkdir(parents=True)
    if device == "made":  # /dev/zero's numbers, under the log's own name
        os.mknod(folder / "job.log", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    else:
        (folder / "job.log").symlink_to("/dev/zero")
    answer = get_log(svc, job["id"])
    assert refused(answer, "character device" if device == "made" else "symbolic link"), answer[0]


def test_a_directory_is_refused(svc, submit, tmp_path):
    job, folder = submit(tmp_path)
    (folder / "job.log").mkdir(parents=True)
    assert refused(get_log(svc, job["id"]), "a directory")


def test_a_file_of_another_owner_or_hard_linked_is_refused(svc, submit, tmp_path):
    job, folder = submit(tmp_path)
    folder.mkdir(parents=True)
    log = folder / "job.log"
    log.write_text("someone else's\n")
    os.chown(log, NOBODY_UID, NOBODY_UID)  # alice has no account: her files are the service's (root's)
    assert refused(get_log(svc, job["id"]), "not owned by its user")
    log.unlink()
    secret = tmp_path / "secret"
    secret.write_text("the service's own\n")
    secret.chmod(0o600)
    os.link(secret, log)
    assert refused(get_log(svc, job["id"]), "hard links")


def test_a_user_with_an_account_is_served_only_their_own_files_in_their_roots(svc, submit, shared, tmp_path):
    outside = svc.call("POST", "jobs", {"spec": SHARE, "workdir": str(tmp_path),
                                        "source": {"kind": "cell", "code": "x = 1"}}, NOBODY)
    assert outside.status == 400 and outside.json()["field"] == "workdir", outside
    job, folder = submit(shared / "nobody" / "project", NOBODY)
    folder.mkdir(parents=True)
    log = folder / "job.log"
    log.write_text("epoch 1\n")
    assert refused(get_log(svc, job["id"], NOBODY), "not owned by its user")  # root's, not nobody's
    os.chown(log, NOBODY_UID, NOBODY_UID)
    assert get_log(svc, job["id"], NOBODY) == (200, b"epoch 1\n")


def test_the_log_is_sent_as_far_as_it_reached_when_asked(svc, submit, tmp_path):
    job, folder = submit(tmp_path)
    folder.mkdir(parents=True)
    log = folder / "job.log"
    size = 32 << 20  # far more than the sockets between the two hold
    log.write_bytes(b"a" * size)
    conn = http.client.HTTPConnection("127.0.0.1", svc.port, timeout=30)
    try:
        conn.request("GET", f"/api/v1/jobs/{job['id']}/log", headers={"Authorization": f"Bearer {ALICE}"})
        response = conn.getresponse()
        body = response.read(64 * 1024)
        with log.open("ab") as grows:
            grows.write(b"X" * (1 << 20))
        body += response.read()
    finally:
        conn.close()
    assert response.status == 200 and len(body) == size and b"X" not in body


def follow_a_running_jobs_log(svc, submit, tmp_path) -> tuple[dict, Path, threading.Thread, list]:
    """A started job whose log says 'epoch 1', followed for a second by a thread that puts the
    (status, body) it gets in the list."""
    job, folder = submit(tmp_path)
    assert svc.call("POST", f"jobs/{job['id']}/start", token=ALICE).status == 200
    folder.mkdir(parents=True)
    log = folder / "job.log"
    log.write_text("epoch 1\n")
    answers: list = []
    following = threading.Thread(target=lambda: answers.append(get_log(svc, job["id"], follow=True, timeout=30)))
    following.start()
    time.sleep(1.0)
    return job, log, following, answers


def test_follow_sends_what_the_log_gains_until_the_job_ends(svc, submit, tmp_path):
    job, log, following, answers = follow_a_running_jobs_log(svc, submit, tmp_path)
    with log.open("a") as grows:
        grows.write("epoch 2\n")
    time.sleep(1.0)
    svc.call("POST", f"jobs/{job['id']}/finish", {"attempt": 1, "outcome": "succeeded"}, ALICE)
    following.join(30)
    assert answers == [(200, b"epoch 1\nepoch 2\n")]


def test_a_followed_log_is_checked_again_at_each_round(svc, submit, tmp_path):
    job, log, following, answers = follow_a_running_jobs_log(svc, submit, tmp_path)
    log.unlink()
    log.symlink_to(svc.config_path)
    following.join(5)  # the stream ends at the next round, while the job runs on
    svc.call("POST", f"jobs/{job['id']}/finish", {"attempt": 1, "outcome": "succeeded"}, ALICE)
    following.join(30)
    assert answers == [(200, b"epoch 1\n\n(the log stopped: it is a symbolic link, not a regular file)\n")]


def test_a_log_the_service_cannot_open_is_refused(svc, submit, tmp_path):
    job, _ = submit(tmp_path / ("x" * 300))  # a name longer than any file system takes
    assert refused(get_log(svc, job["id"]), "the service cannot open it")


def test_a_log_not_written_yet_is_empty(svc, submit, tmp_path):
    job, _ = submit(tmp_path)
    assert get_log(svc, job["id"]) == (200, b"")


@pytest.mark.parametrize("change, field", [
    ({"workdir": "/tmp/../etc"}, "workdir"),
    ({"workdir": "/proc/self/cwd"}, "workdir"),
    ({"workdir": "/dev/shm"}, "workdir"),
    ({"workdir": "/tmp/./x"}, "workdir"),
    ({"workdir": "//tmp"}, "workdir"),
    ({"workdir": "/tmp/"}, "workdir"),
    ({"workdir": "/"}, "workdir"),
    ({"source": {"kind": "notebook", "path": "../other/analysis.ipynb"}}, "source.path"),
    ({"source": {"kind": "notebook", "path": "/etc/analysis.ipynb"}}, "source.path"),
    ({"source": {"kind": "notebook", "path": "a/../../analysis.ipynb"}}, "source.path"),
    ({"source": {"kind": "cell", "code": "x", "inputs": ["a"], "inputs_file": "../../etc/passwd"}},
     "source.inputs_file"),
    ({"source": {"kind": "cell", "code": "x", "inputs": ["a"], "inputs_file": "/etc/passwd"}}, "source.inputs_file"),
    ({"source": {"kind": "cell", "code": "x", "inputs_file": ".gpualloc//inputs/a.pkl"}}, "source.inputs_file"),
])
def test_paths_out_of_bounds_are_refused_naming_the_field(svc, tmp_path, change, field):
    body = {"spec": SHARE, "workdir": str(tmp_path), "source": {"kind": "cell", "code": "x = 1"}, **change}
    answer = svc.call("POST", "jobs", body, ALICE)
    assert answer.status == 400 and answer.json()["field"] == field, answer
