"""Remote mode (as under JupyterHub): the scheduler service keeps the jobs, the user's server runs them."""

from __future__ import annotations

import signal

import psutil

from tests.jobs.test_crash import wait_until
from tests.service.conftest import ALICE, BOB, ROOT, TOKENS, ServiceProcess
from tests.server.test_server_process import JupyterServerProcess


def test_the_users_server_runs_the_job_the_service_queued(tmp_path):
    service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config=(
        "c.SchedulerPolicy.heartbeat_ttl = 30\nc.GpuAllocService.tick_interval = 0.2\n")).start()
    server = JupyterServerProcess(tmp_path / "server", {"GpuAllocExtension": {"job_poll_interval": 0.2}},
                                  env={"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE})
    kernels: list[psutil.Process] = []
    try:
        server.start()
        workdir = tmp_path / "notebooks"
        workdir.mkdir()
        made = service.call("POST", "jobs", {
            "spec": {"kind": "shared", "memory_gib": 4, "model": "L4"}, "workdir": str(workdir),
            "source": {"kind": "cell", "code": "import os\nprint('slice', os.environ['CUDA_VISIBLE_DEVICES'])"}},
            ALICE)
        assert made.status == 201, made
        job = made.json()
        done = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "running") else None)(
            service.call("GET", f"jobs/{job['id']}", token=ALICE).json()), 60, "the job's end")
        kernels.extend(psutil.Process(server.proc.pid).children(recursive=True))
        assert done["state"] == "succeeded", done
        log = service.call("GET", f"jobs/{job['id']}/log", token=ALICE).text
        assert f"slice {job['slice']['visible_devices']}" in log
        assert service.call("GET", f"jobs/{job['id']}/log", token=BOB).status == 404
        assert service.call("GET", "leases?all=1", token=ROOT).json()["leases"] == []
    finally:
        server.stop()
        for process in kernels:
            if process.is_running():
                process.kill()
        service.kill(signal.SIGTERM)
