"""A kernel's own output and widget messages, sent outside any cell, are not a person's activity.

The idle timeout here is long, so the kernel's start-up (slow on a loaded machine) never races the
release: the test reads the activity itself, in the monitor and in the core's lease, while the noise
flows; what an idle lease then meets is `test_idle.py`'s warning and release."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.conftest import MIG_KERNEL, extension_config, wait_for
from tests.server.test_kernels import lease_of


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, SchedulerPolicy={"idle_timeout": 600.0, "idle_grace": 60.0})


NOISY_CELL = """
import threading, time
from ipykernel.comm import Comm

def speak():  # what the project's own notices and widgets do: output and comm messages outside any cell
    comm = Comm(target_name="gpualloc-test")
    for n in range(200):
        print("notice", n, flush=True)
        comm.send({"n": n})
        time.sleep(0.1)

threading.Thread(target=speak, daemon=True).start()
"""


async def test_a_kernels_own_output_and_widget_messages_are_not_activity(gpualloc, jp_serverapp):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    lease_id = lease_of(gpualloc, kernel_id).id
    scheduler, monitor = gpualloc.embedded.scheduler, gpualloc.monitor
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        reply = await client.execute(NOISY_CELL, reply=True, timeout=60)
        assert reply["content"]["status"] == "ok"
        # the cell itself is activity: wait until the core has it and the kernel is idle again
        await wait_for(lambda: monitor.activity(kernel_id)["busy"] is False)
        await wait_for(lambda: not scheduler.lease(lease_id).busy and scheduler.lease(lease_id).last_activity
                       == monitor.activity(kernel_id)["last_activity"])
        noise_seen = 0
        async def count_noise():
            nonlocal noise_seen
            while True:
                msg = await client.get_iopub_msg(timeout=30)
                if msg["msg_type"] in ("stream", "comm_msg"):
                    noise_seen += 1
        counter = asyncio.ensure_future(count_noise())
        try:
            await wait_for(lambda: noise_seen >= 4, timeout=30)
            monitor_before = monitor.activity(kernel_id)["last_activity"]
            core_before = scheduler.lease(lease_id).last_activity
            seen_before = noise_seen
            await asyncio.sleep(2.0)  # several report intervals (0.3 s) of noise
            assert noise_seen >= seen_before + 5, "the kernel went quiet: the test saw no noise to judge"
        finally:
            counter.cancel()
        assert monitor.activity(kernel_id)["last_activity"] == monitor_before
        assert scheduler.lease(lease_id).last_activity == core_before
        assert scheduler.lease(lease_id).state.value == "granted"
    finally:
        client.stop_channels()
