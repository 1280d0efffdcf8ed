"""GPU-aware idleness end to end: the real watchdog samples the simulated backend's per-process
utilisation and reports it through the REST API; under idle_signal = "gpu" a kernel busy on CPU
work whose GPU stays idle loses its slice, while one keeping its GPU busy keeps it."""

from __future__ import annotations

import time

import pytest

from jupyter_gpualloc.core.devices.base import GpuUtilization
from jupyter_gpualloc.server.watchdog import slice_utilization
from tests.server.conftest import MIG_KERNEL, extension_config, wait_for
from tests.server.test_kernels import lease_of
from tests.server.test_watchdog import run_in_kernel

# Run in the kernel: a child process on the kernel's MIG slice that keeps `sm` percent of its SMs busy.
SPAWN = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", '''
import os, time
from jupyter_gpualloc.core.devices.simulated import report_process_memory
report_process_memory({process_dir!r}, os.getpid(), {gpu!r}, 1024, mig_uuid={mig!r}, sm_percent={sm})
time.sleep(120)
'''])
print(child.pid)
"""


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, SchedulerPolicy={"idle_signal": "gpu", "idle_timeout": 4.0, "idle_grace": 1.0})


async def start_busy_kernel(gpualloc, km, sm: float):
    """A MIG kernel whose child process uses `sm` % of the slice, running a long CPU-bound cell."""
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    lease = lease_of(gpualloc, kernel_id)
    await run_in_kernel(km, kernel_id, SPAWN.format(process_dir=gpualloc.process_dir, gpu=lease.slice.gpu_uuids[0],
                                                    mig=lease.slice.mig_uuid, sm=sm))
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    await client.wait_for_ready(timeout=30)
    client.execute("import time\nend = time.time() + 60\nwhile time.time() < end: pass")  # CPU work
    await wait_for(lambda: km.get_kernel(kernel_id).execution_state == "busy")
    return kernel_id, lease.id, client


async def test_a_kernel_busy_on_cpu_but_idle_on_its_gpu_loses_its_slice(gpualloc, jp_serverapp, events):
    km = jp_serverapp.kernel_manager
    scheduler = gpualloc.embedded.scheduler
    idle, idle_lease, idle_client = await start_busy_kernel(gpualloc, km, sm=0)
    busy, busy_lease, busy_client = await start_busy_kernel(gpualloc, km, sm=85)
    try:
        await wait_for(lambda: idle not in km, timeout=30)
        ended = scheduler.lease(idle_lease)
        assert ended.state.value == "expired" and "idle" in ended.reason
        types = [(t, d.get("lease_id")) for t, d in events]
        assert types.index(("lease.idle_warning", idle_lease)) < types.index(("lease.expired", idle_lease))
        assert next(d for t, d in events if t == "kernel.gpu_shutdown")["kernel_id"] == idle
        assert busy in km and km.get_kernel(busy).execution_state == "busy"
        assert scheduler.lease(busy_lease).state.value == "granted"
        assert ("lease.expired", busy_lease) not in types
        rows = {r["lease_id"]: r for r in scheduler.usage.efficiency(0, 2e9, time.time())}
        assert rows[busy_lease]["busy_gpu_hours"] > 0 and rows[idle_lease]["busy_gpu_hours"] == 0
    finally:
        idle_client.stop_channels()
        busy_client.stop_channels()


def test_slice_utilization_counts_the_holders_processes_on_its_devices():
    shared = {"kind": "shared", "gpu_uuids": ["GPU-a"]}
    mig = {"kind": "mig", "gpu_uuids": ["GPU-b"], "mig_uuid": "MIG-1"}
    whole = {"kind": "whole", "gpu_uuids": ["GPU-a", "GPU-c"]}
    samples = [GpuUtilization("GPU-a", processes={1: 30.0, 2: 50.0, 9: 70.0}),
               GpuUtilization("GPU-b", "MIG-1", sm_percent=40.0),
               GpuUtilization("GPU-c", sm_percent=90.0)]
    assert slice_utilization(shared, {1, 2}, samples) == 80.0  # another holder's process 9 is not ours
    assert slice_utilization(shared, {3}, samples) == 0.0  # sampled, and none of ours ran: idle
    assert slice_utilization(mig, {1}, samples) == 40.0  # per instance: the MIG slice is the holder's alone
    assert slice_utilization(whole, {1, 2, 9}, samples) == 95.0  # capped at 100 on GPU-a, 90 on GPU-c
    assert slice_utilization({"kind": "shared", "gpu_uuids": ["GPU-c"]}, {1}, samples) is None  # not attributable
    assert slice_utilization({"kind": "mig", "gpu_uuids": ["GPU-b"], "mig_uuid": "MIG-2"}, {1}, samples) is None
