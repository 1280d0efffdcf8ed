"""Remote mode (as under JupyterHub): the scheduler service keeps the jobs, the user's server runs them."""

from __future__ import annotations

import signal
import time

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


def test_a_stopped_servers_queued_job_waits_for_it_without_a_slice_or_a_quota_slot(tmp_path):
    """Stop My Server (SIGINT, stdin not a terminal) with a job queued: once the GPU frees, the job is not
    granted to nobody, so alice's quota slot stays hers; her server's return runs it."""
    service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config=(
        "c.SchedulerPolicy.heartbeat_ttl = 120\nc.GpuAllocService.tick_interval = 0.2\n"
        "c.SchedulerPolicy.quotas = {'alice': {'slices': 1}}\n")).start()
    env = {"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE}
    config = {"GpuAllocExtension": {"job_poll_interval": 0.2}}
    servers = [JupyterServerProcess(tmp_path / "server", config, env=env)]
    kernels: list[psutil.Process] = []
    try:
        both = service.call("POST", "leases", {"spec": {"kind": "whole", "model": "L4", "count": 2},
                                               "holder": "kernel:b"}, BOB).json()
        servers[0].start()
        workdir = tmp_path / "notebooks"
        workdir.mkdir()
        job = service.call("POST", "jobs", {"spec": {"kind": "whole", "model": "L4"}, "workdir": str(workdir),
                                            "source": {"kind": "cell", "code": "print('ran')"}}, ALICE).json()
        assert job["position"] == 1, job  # behind bob's two L4s
        servers[0].proc.send_signal(signal.SIGINT)  # as JupyterHub stops it
        servers[0].proc.wait(30)
        service.call("DELETE", f"leases/{both['id']}?holder_gone=true", token=BOB)  # the L4s are free
        time.sleep(1.0)  # five ticks
        waiting = service.call("GET", f"jobs/{job['id']}", token=ALICE).json()
        assert (waiting["state"], waiting["lease"], waiting["position"]) == ("queued", None, None), waiting
        assert waiting["reason"] == "waiting for your server to run it: start your server again"
        mine = service.call("POST", "leases", {"spec": {"profile": "1g.5gb"}, "holder": "kernel:a"}, ALICE)
        assert mine.status == 201, mine.json()  # alice's one quota slot is hers
        service.call("DELETE", f"leases/{mine.json()['id']}?holder_gone=true", token=ALICE)
        servers.append(JupyterServerProcess(tmp_path / "again", config, env=env).start())  # her server is back
        done = wait_until(lambda: (lambda j: j if j["state"] not in ("queued", "running") else None)(
            service.call("GET", f"jobs/{job['id']}", token=ALICE).json()), 60, "the job's end")
        kernels.extend(psutil.Process(servers[1].proc.pid).children(recursive=True))
        assert done["state"] == "succeeded", done
    finally:
        for server in servers:
            server.stop()
        for process in kernels:
            if process.is_running():
                process.kill()
        service.kill(signal.SIGTERM)
