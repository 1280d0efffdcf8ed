"""What the sidebar reads for its sparkline and its usage chart: each granted slice's SM utilisation samples of
the last minutes, as the real watchdog samples the simulated backend's per-process utilisation, and my
GPU-hours per day, split by offer; and the memory used on a slice the server itself holds."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from jupyter_gpualloc.core.devices.simulated import report_process_memory
from tests.server.conftest import MIG_KERNEL, wait_for
from tests.server.test_gpu_idle import SPAWN
from tests.server.test_kernels import lease_of
from tests.server.test_watchdog import run_in_kernel


async def test_slices_carry_recent_utilization_and_usage_its_history(gpualloc, jp_serverapp, jp_fetch):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    lease = lease_of(gpualloc, kernel_id)

    async def my_slice() -> dict:
        slices = json.loads((await jp_fetch("gpualloc", "api", "slices")).body)["slices"]
        return next(s for s in slices if s["id"] == lease.id)

    unsampled = await my_slice()  # no process of the kernel on its GPU yet: nothing measured
    assert unsampled["utilization"]["samples"] == [] and unsampled["utilization"]["window"] == 600
    await run_in_kernel(km, kernel_id, SPAWN.format(process_dir=gpualloc.process_dir, gpu=lease.slice.gpu_uuids[0],
                                                    mig=lease.slice.mig_uuid, sm=70))
    await wait_for(lambda: len(gpualloc.embedded.scheduler.usage.recent_samples(lease.id, time.time())) >= 3,
                   timeout=20)
    sampled = (await my_slice())["utilization"]
    assert {s["sm_percent"] for s in sampled["samples"][-2:]} == {70}
    assert all(sampled["now"] - 600 < s["at"] <= sampled["now"] for s in sampled["samples"])

    usage = json.loads((await jp_fetch("gpualloc", "api", "usage")).body)
    [today] = usage["history"]
    assert today["day"] == time.strftime("%Y-%m-%d", time.gmtime()) and today["gpu_hours"] > 0
    assert list(today["offers"]) == ["mig-1g.5gb"]  # the kernel's offer
    await km.shutdown_kernel(kernel_id)


async def test_a_slice_the_server_holds_shows_the_memory_its_processes_use(gpualloc, jp_fetch):
    answer = await jp_fetch("gpualloc", "api", "request", method="POST", body=json.dumps({"offer": "mig-1g.5gb"}))
    lease = json.loads(answer.body)
    assert lease["holder"] == "server" and lease["state"] == "granted", lease
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a process of this server

    async def used_mib():
        slices = json.loads((await jp_fetch("gpualloc", "api", "slices")).body)["slices"]
        return next(s for s in slices if s["id"] == lease["id"])["used_mib"]

    try:
        assert await used_mib() is None  # no process of the server on its slice: not measured
        report_process_memory(gpualloc.process_dir, child.pid, lease["slice"]["gpu_uuids"][0], 1536,
                              mig_uuid=lease["slice"]["mig_uuid"])
        assert await used_mib() == 1536
    finally:
        child.kill()
        child.wait()
        await jp_fetch("gpualloc", "api", "release", method="POST", body=json.dumps({"lease_id": lease["id"]}))
