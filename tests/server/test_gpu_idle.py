"""GPU-aware idleness end to end: the real watchdog samples the simulated backend's per-process
utilisation and reports it through the REST API; under idle_signal = "gpu" a kernel busy on CPU
work whose GPU stays idle loses its slice, while one keeping its GPU busy keeps it; and the watchdog
over the NVML backend (pynvml against the fake C library) reports what belongs to this server."""

from __future__ import annotations

import os
import time

import pytest
from jupyter_client.multikernelmanager import MultiKernelManager

from jupyter_gpualloc.client import NotFound
from jupyter_gpualloc.core.devices.base import GpuUtilization, slice_utilization
from jupyter_gpualloc.core.devices.nvml import NvmlBackend
from jupyter_gpualloc.server.watchdog import Watchdog
from tests.core.devices.fake_nvml import gpu_host, install
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
    return extension_config(tmp_path, SchedulerPolicy={"idle_signal": "gpu", "idle_timeout": 8.0, "idle_grace": 1.0})


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
        await wait_for(lambda: idle not in km, timeout=40)
        await wait_for(lambda: any(t == "kernel.gpu_shutdown" for t, _ in events))  # sent once the shutdown ends
        ended = scheduler.lease(idle_lease)
        assert ended.state.value == "expired" and "idle" in ended.reason
        types = [(t, d.get("lease_id")) for t, d in events]
        assert types.index(("lease.idle_warning", idle_lease)) < types.index(("lease.expired", idle_lease))
        assert next(d for t, d in events if t == "kernel.gpu_shutdown")["kernel_id"] == idle
        assert busy in km and km.get_kernel(busy).execution_state == "busy"
        assert scheduler.lease(busy_lease).state.value == "granted"
        assert ("lease.expired", busy_lease) not in types

        def busy_hours(lease_id: str) -> float | None:
            rows = {r["lease_id"]: r for r in scheduler.usage.efficiency(0, 2e9, time.time())}
            return rows[lease_id]["busy_gpu_hours"] if lease_id in rows else None

        await wait_for(lambda: (busy_hours(busy_lease) or 0) > 0)  # from its second sample on
        assert busy_hours(idle_lease) == 0
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


async def test_the_watchdog_reports_nvml_samples_of_the_servers_own_processes(monkeypatch, caplog):
    fake = install(monkeypatch, gpu_host())
    backend = NvmlBackend(node_name="host")
    a100, l4 = fake.gpus
    l4.utilization_samples = [(os.getpid(), 1_000, 40), (os.getpid(), 2_000, 60), (999_999, 2_000, 99)]
    two_g = a100.instances[0].compute_instances[0]
    leases = [{"id": "whole-l4", "state": "granted", "slice": {"kind": "whole", "gpu_uuids": [l4.uuid]}},
              {"id": "mig", "state": "granted", "slice": {"kind": "mig", "gpu_uuids": [a100.uuid], "mig_uuid": two_g}}]
    sent: list[tuple[str, float]] = []

    async def send(lease_id: str, sm_percent: float) -> None:
        if lease_id == "gone":
            raise NotFound("no such lease", 404)
        sent.append((lease_id, sm_percent))

    watchdog = Watchdog(backend, MultiKernelManager(), lambda kernel_id: None, None,
                        server_leases=lambda: leases, send_utilization=send)
    a100.gpm, a100.instances[0].sm_percent = True, 30.0
    await watchdog.report(now=0.0)
    # another user's process (999999) is not this server's; the MIG instance has its first GPM sample only
    assert sent == [("whole-l4", 50.0)]
    leases.append({"id": "gone", "state": "granted", "slice": {"kind": "whole", "gpu_uuids": [l4.uuid]}})
    await watchdog.report(now=5.0)  # no new process sample: the L4 is idle; a lease just ended is skipped
    assert sent[1:] == [("whole-l4", 0.0), ("mig", 30.0)]
    l4.lost = True
    await watchdog.report(now=15.0)
    assert len(sent) == 3 and "cannot sample GPU utilisation: GPU index 1 is lost" in caplog.text
    backend.close()
