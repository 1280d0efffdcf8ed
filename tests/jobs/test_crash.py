"""SIGKILL of the server in the middle of a job: after a restart no slice is held and the job runs again."""

from __future__ import annotations

import signal
import time

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
        status, job = server.call("POST", API + "jobs", {
            "spec": {"kind": "whole", "model": "L4"}, "workdir": str(workdir),
            "source": {"kind": "cell", "code": SLEEPS_ON_FIRST_ATTEMPT}})
        assert status == 201, job
        log = workdir / ".gpualloc" / "jobs" / job["id"] / "job.log"
        wait_until(lambda: log.exists() and "working, attempt 1" in log.read_text(), 60, "the first attempt")
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
