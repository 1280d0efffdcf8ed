"""A single-user server under a hub whose allocator is unconfigured or down keeps working:
one log line, no traceback."""

from __future__ import annotations

import time

import pytest

from jupyter_gpualloc.core.devices import make_backend
from jupyter_gpualloc.core.devices.base import DeviceUnavailable

from tests.server.test_server_process import (JupyterServerProcess, ready_kernel_client, run_cell,  # noqa: F401
                                              servers)
from tests.service.conftest import ALICE, ServiceProcess

pytestmark = pytest.mark.slow
FAST = {"GpuAllocExtension": {"report_interval": 0.3, "job_poll_interval": 0.2}}
HUB_ENV = {"JUPYTERHUB_API_TOKEN": "hub-token-for-this-server", "JUPYTERHUB_SERVER_NAME": ""}


def log_of(server: JupyterServerProcess) -> str:
    return (server.workdir / "server.log").read_text(errors="replace")


def wait_for_log(server: JupyterServerProcess, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_of(server):
        assert time.monotonic() < deadline, f"no {text!r} in:\n{log_of(server)[-3000:]}"
        time.sleep(0.2)


def test_no_allocator_configured_is_one_line_and_kernels_start(tmp_path, servers):
    server = JupyterServerProcess(tmp_path, FAST, env=HUB_ENV).start()
    servers.append(server)
    status, kernel = server.call("POST", "api/kernels", {"name": "python3"})
    assert status == 201, kernel
    status = server.call("GET", "gpualloc/api/status")[1]
    assert status["mode"] == "off" and status["reason"].startswith("no GPU allocator is configured for this server ("), status
    assert server.call("GET", "gpualloc/api/slices")[0] == 503
    time.sleep(2)  # several rounds of the periodic work it would do with an allocator
    log = log_of(server)
    assert log.count("gpualloc: no GPU allocator is configured for this server") == 1, log
    assert "Traceback" not in log and "gpualloc: " not in log.replace("gpualloc: no GPU allocator", ""), log


def test_no_gpu_and_no_fleet_says_in_one_line_what_to_set_and_where(tmp_path, servers):
    """A workstation without GPUs, the extension enabled, no fleet file: the server starts, its log
    and the panel's API say which trait to set in which file, and kernels start as usual."""
    try:
        make_backend("nvml").close()
        pytest.skip("NVML finds GPUs on this machine")
    except DeviceUnavailable:
        pass
    server = JupyterServerProcess(tmp_path, {"GpuAllocExtension": {"mode": "embedded"}}).start()
    servers.append(server)
    config_file = str(server.workdir / "config" / "jupyter_server_config.py")
    status, body = server.call("GET", "gpualloc/api/slices")
    assert status == 503
    assert "c.GpuAllocExtension.fleet" in body["message"] and config_file in body["message"], body
    status = server.call("GET", "gpualloc/api/status")[1]
    assert status["mode"] == "off" and status["reason"] == body["message"], status  # the panel's banner
    status, kernel = server.call("POST", "api/kernels", {"name": "python3"})
    assert status == 201, kernel
    # %gpu is there, and says in one line why GPU slices are off and what to set
    client = ready_kernel_client(server.workdir / "runtime" / f"kernel-{kernel['id']}.json", server, 60)
    try:
        stdout, stderr = run_cell(client, "%gpu status")
    finally:
        client.stop_channels()
    assert "UsageError" not in stderr and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and 'c.GpuAllocExtension.fleet = "example:demo"' in stderr, stderr
    log = log_of(server)
    lines = [line for line in log.splitlines() if "gpualloc: " in line]
    assert len(lines) == 1 and "c.GpuAllocExtension.fleet" in lines[0] and config_file in lines[0], log
    assert "Traceback" not in log and "--backend" not in log, log


def test_an_allocator_that_does_not_answer_is_one_line_until_it_is_back(tmp_path, servers):
    service = ServiceProcess(tmp_path / "service")
    root = service.url.removesuffix("api/v1/")
    server = JupyterServerProcess(tmp_path / "server", FAST,
                                  env={**HUB_ENV, "GPUALLOC_URL": root, "GPUALLOC_TOKEN": ALICE})
    server.start()
    servers.append(server)
    status, kernel = server.call("POST", "api/kernels", {"name": "python3"})
    assert status == 201, kernel
    time.sleep(2)
    log = log_of(server)
    assert log.count("does not answer") == 1 and "Traceback" not in log, log
    service.start()
    try:
        wait_for_log(server, f"gpualloc: the GPU allocator at {root} answers again")
        assert server.call("GET", "gpualloc/api/slices")[0] == 200
        assert "Traceback" not in log_of(server)
    finally:
        service.kill()
