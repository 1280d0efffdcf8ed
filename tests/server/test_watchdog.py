"""The watchdog over real processes under a kernel, against the simulated backend's per-process memory."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.base import GpuProcess
from jupyter_gpualloc.server.watchdog import cap_mechanisms, classify, process_tree_map
from tests.server.conftest import SHARED_KERNEL, extension_config, wait_for

# Run in the kernel: a child process that reports it holds `mib` MiB on `gpu`, then waits.
SPAWN = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import os, time
from jupyter_gpualloc.core.devices.simulated import report_process_memory
report_process_memory({process_dir!r}, os.getpid(), {gpu!r}, {mib})
time.sleep(120)
'''])
print(child.pid)
"""


async def run_in_kernel(km, kernel_id: str, code: str) -> str:
    """Execute code in the kernel; its stdout."""
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=30)
        out: list[str] = []
        reply = await client.execute_interactive(
            code, timeout=30, output_hook=lambda msg: out.append(msg["content"].get("text", "")))
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        client.stop_channels()


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, Watchdog={"action": "shutdown", "grace": 3.0, "interval": 0.3})


async def test_over_cap_process_under_a_kernel_is_warned_then_its_kernel_shut_down(
        gpualloc, jp_serverapp, events):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=SHARED_KERNEL)
    lease = gpualloc.monitor.lease_of(kernel_id)
    assert lease["slice"]["kind"] == "shared" and lease["slice"]["memory_mib"] == 8192
    gpu = lease["slice"]["gpu_uuids"][0]
    child = int(await run_in_kernel(km, kernel_id, SPAWN.format(
        process_dir=gpualloc.process_dir, gpu=gpu, mib=12000)))

    owners = process_tree_map(gpualloc.watchdog.kernel_pids())
    assert owners[child] == kernel_id
    assert owners[km.get_kernel(kernel_id).provisioner.pid] == kernel_id

    await wait_for(lambda: kernel_id not in km, timeout=20)
    await wait_for(lambda: any(t == "watchdog.action" for t, _ in events))  # sent once the shutdown ends
    kinds = [t for t, d in events if t.startswith("watchdog.")]
    assert kinds[:2] == ["watchdog.over_cap", "watchdog.action"]
    warning = next(d for t, d in events if t == "watchdog.over_cap")
    assert (warning["pid"], warning["kernel_id"], warning["used_mib"], warning["cap_mib"]) == (
        child, kernel_id, 12000, 8192)
    action = next(d for t, d in events if t == "watchdog.action")
    assert action["action"] == "shutdown" and action["pid"] == child
    assert gpualloc.embedded.scheduler.lease(lease["id"]).state.value == "released"


async def test_process_on_a_gpu_its_kernel_holds_no_lease_on_is_reported_only(gpualloc, jp_serverapp, events):
    gpualloc.watchdog.action = "report"
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name="python3")
    l4 = next(g["uuid"] for n in gpualloc.embedded.scheduler.inventory()["nodes"] for g in n["gpus"] if g["model"] == "L4")
    child = int(await run_in_kernel(km, kernel_id, SPAWN.format(
        process_dir=gpualloc.process_dir, gpu=l4, mib=100)))
    await wait_for(lambda: any(t == "watchdog.action" for t, _ in events), timeout=15)
    warning = next(d for t, d in events if t == "watchdog.unleased_gpu")
    assert (warning["pid"], warning["kernel_id"], warning["gpu_uuid"]) == (child, kernel_id, l4)
    assert next(d for t, d in events if t == "watchdog.action")["action"] == "report"
    assert kernel_id in km  # report only: the kernel keeps running


def test_classify_against_the_slices_a_kernel_may_use():
    shared = {"kind": "shared", "gpu_uuids": ["GPU-a"], "memory_mib": 8192}
    mig = {"kind": "mig", "gpu_uuids": ["GPU-b"], "mig_uuid": "MIG-1", "memory_mib": 4864}
    assert classify(GpuProcess(1, "GPU-a", 8192), [shared]) == (None, shared)
    assert classify(GpuProcess(1, "GPU-a", 8193), [shared]) == ("over_cap", shared)
    assert classify(GpuProcess(1, "GPU-b", 100, "MIG-1"), [mig]) == (None, mig)
    assert classify(GpuProcess(1, "GPU-b", 100, "MIG-2"), [mig]) == ("unleased_gpu", None)
    assert classify(GpuProcess(1, "GPU-b", 100), [mig]) == ("unleased_gpu", None)  # the parent GPU, not its slice
    assert classify(GpuProcess(1, "GPU-a", None), [shared]) == (None, shared)  # unknown usage is not over


def test_cap_mechanisms_in_force():
    shared = {"slice": {"kind": "shared"}}
    assert cap_mechanisms(shared, env={}) == ["framework", "watchdog"]
    assert cap_mechanisms(shared, env={"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps",
                                       "LD_PRELOAD": "/usr/lib/libvgpu.so"}) == [
        "mps", "hami-core", "framework", "watchdog"]
    assert cap_mechanisms({"slice": {"kind": "mig"}}, env={}, watchdog=False) == ["mig"]
    assert cap_mechanisms({"slice": {"kind": "whole"}}, env={}) == ["watchdog"]
