"""SIGKILL of the server in the middle of a job: after a restart no slice is held and the job runs again."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.jobs.conftest import sleeps_on_first_attempt
from tests.server.conftest import FLEET
from tests.server.test_server_process import JupyterServerProcess

API = "gpualloc/api/v1/"
SLEEPS_ON_FIRST_ATTEMPT = sleeps_on_first_attempt("attempts", "working, attempt", 120)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def start_job_until_its_first_attempt_runs(server: JupyterServerProcess, workdir) -> tuple[dict, Path]:
    """Submit the job that sleeps on its first attempt; its record and log once that attempt works."""
    status, job = server.call("POST", API + "jobs", {
        "spec": {"kind": "whole", "model": "L4"}, "workdir": str(workdir),
        "source": {"kind": "cell", "code": SLEEPS_ON_FIRST_ATTEMPT}})
    assert status == 201, job
    log = workdir / ".gpualloc" / "jobs" / job["id"] / "job.log"
    wait_until(lambda: log.exists() and "working, attempt 1" in log.read_text(), 60, "the first attempt")
    return job, log


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def killed_kernels():
    """Job kernels orphaned by the SIGKILL, killed at the end."""
    orphans: list[psutil.Process] = []
    yield orphans
    for process in orphans:
        if process.is_running():
            process.kill()


def test_sigkill_mid_job_requeues_it_and_holds_no_slice(tmp_path, killed_kernels):
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    config = {"GpuAllocExtension": {"fleet": str(FLEET), "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
                                    "tick_interval": 0.2, "job_poll_interval": 0.2}}
    server = JupyterServerProcess(tmp_path / "server", config)
    server.start()
    try:
        job, log = start_job_until_its_first_attempt_runs(server, workdir)
        first_lease = server.call("GET", API + f"jobs/{job['id']}")[1]["lease_id"]
        killed_kernels.extend(psutil.Process(server.proc.pid).children(recursive=True))
        server.stop(signal.SIGKILL)
        # the job's kernel sees its parent gone and exits: the GPU is not used twice when the job runs again
        wait_until(lambda: not [p for p in killed_kernels if alive(p)], 15, "the orphaned job kernel to exit")

        server.start()
        # the restarted runner finds the job running with no attempt of its own: interrupted, its lease ended
        lease = wait_until(lambda: (lambda l: l if l["state"] != "granted" else None)(
            server.call("GET", API + f"leases/{first_lease}")[1]), 10, "the first attempt's lease to end")
        assert lease["state"] == "released", lease
        done = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "running") else None)(
            server.call("GET", API + f"jobs/{job['id']}")[1]), 90, "the job's end")
        assert (done["state"], done["attempts"]) == ("succeeded", 2), done
        assert "working, attempt 2" in log.read_text()
        assert server.call("GET", API + "leases")[1]["leases"] == []
    finally:
        killed_kernels.extend(psutil.Process(server.proc.pid).children(recursive=True) if server.proc else [])
        server.stop()


def test_sigterm_mid_job_reports_it_interrupted_in_process_and_it_runs_again(tmp_path, killed_kernels):
    """Embedded mode: the server has stopped listening when its runner closes, so the runner reports the
    running attempt interrupted in-process (the job is requeued as it stops, not only after a restart)."""
    workdir = tmp_path / "notebooks"
    workdir.mkdir()
    audit = tmp_path / "audit.jsonl"
    config = {"GpuAllocExtension": {"fleet": str(FLEET), "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
                                    "tick_interval": 0.2, "job_poll_interval": 0.2, "audit_log": str(audit)}}
    server = JupyterServerProcess(tmp_path / "server", config)
    server.start()
    try:
        job, log = start_job_until_its_first_attempt_runs(server, workdir)
        killed_kernels.extend(psutil.Process(server.proc.pid).children(recursive=True))
        server.stop(signal.SIGTERM)
        stopped_log = server.log_tail()
        assert "cannot report job" not in stopped_log, stopped_log
        events = [json.loads(line) for line in audit.read_text().splitlines()]
        requeued = [e for e in events if e["type"] == "job.requeued" and e["data"]["job_id"] == job["id"]]
        assert [e["data"]["reason"] for e in requeued] == [
            "interrupted (the server running it stopped); requeued"], requeued
        released = [e for e in events if e["type"] == "lease.released" and e["data"]["holder"] == f"job:{job['id']}"]
        assert released, "the first attempt's lease ended as the server stopped"

        server.start()
        done = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "running") else None)(
            server.call("GET", API + f"jobs/{job['id']}")[1]), 90, "the job's end")
        assert (done["state"], done["attempts"]) == ("succeeded", 2), done
        assert "the server running it restarted" not in audit.read_text()  # nothing left for the restart to report
        assert server.call("GET", API + "leases")[1]["leases"] == []
    finally:
        killed_kernels.extend(psutil.Process(server.proc.pid).children(recursive=True) if server.proc else [])
        server.stop()
