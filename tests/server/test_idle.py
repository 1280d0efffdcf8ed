"""Idle release with a short idle timeout (3 s: a kernel starting on a loaded machine is idle too): an idle kernel
is warned, then shut down; a busy one is left alone."""

from __future__ import annotations

import asyncio

import pytest

from tests.server.conftest import MIG_KERNEL, extension_config, wait_for
from tests.server.test_kernels import lease_of


@pytest.fixture
def jp_server_config(tmp_path):
    return extension_config(tmp_path, SchedulerPolicy={"idle_timeout": 3.0, "idle_grace": 1.0})


async def test_idle_kernel_is_warned_then_shut_down_while_a_busy_one_is_left_alone(gpualloc, jp_serverapp, events):
    km = jp_serverapp.kernel_manager
    idle = await km.start_kernel(kernel_name=MIG_KERNEL)
    busy = await km.start_kernel(kernel_name=MIG_KERNEL)
    idle_lease, busy_lease = lease_of(gpualloc, idle).id, lease_of(gpualloc, busy).id
    client = km.get_kernel(busy).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=30)
        client.execute("import time; time.sleep(60)")
        await wait_for(lambda: km.get_kernel(busy).execution_state == "busy")
        # from when the core has the busy report (on a loaded machine it comes a report interval later)
        await wait_for(lambda: gpualloc.embedded.scheduler.lease(busy_lease).busy)
        busy_since = len(events)  # (both kernels may be warned while they start: they are idle then)
        await wait_for(lambda: idle not in km, timeout=15)
        # the event follows the shutdown's end: the kernel leaves the manager a turn of the loop before it
        await wait_for(lambda: any(t == "kernel.gpu_shutdown" for t, _ in events))
        types = [(t, d.get("lease_id")) for t, d in events]
        assert ("lease.idle_warning", idle_lease) in types
        assert ("lease.expired", idle_lease) in types
        assert types.index(("lease.idle_warning", idle_lease)) < types.index(("lease.expired", idle_lease))
        shutdown = [d for t, d in events if t == "kernel.gpu_shutdown"]
        assert shutdown and shutdown[0]["kernel_id"] == idle and shutdown[0]["state"] == "expired"
        assert gpualloc.embedded.scheduler.lease(idle_lease).state.value == "expired"
        assert busy in km and gpualloc.embedded.scheduler.lease(busy_lease).state.value == "granted"
        assert ("lease.idle_warning", busy_lease) not in types[busy_since:]
        assert ("lease.expired", busy_lease) not in types
    finally:
        client.stop_channels()


async def test_a_person_s_cell_is_activity_and_a_silent_execution_is_not(gpualloc, jp_serverapp):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    monitor = gpualloc.monitor
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=30)
        monitor.person.watch(kernel_id)
        before = monitor.activity(kernel_id)["last_activity"]
        await client.execute("x = 1", silent=True, reply=True, timeout=30)
        assert monitor.activity(kernel_id)["last_activity"] == before
        await client.execute("x = 2", reply=True, timeout=30)
        await wait_for(lambda: (monitor.activity(kernel_id)["last_activity"] or 0) > (before or 0))
        await wait_for(lambda: monitor.activity(kernel_id)["busy"] is False)  # the cell's idle status arrives
    finally:
        client.stop_channels()


async def test_a_gpu_kernel_is_told_under_its_cell_that_it_is_idle_before_it_is_released(gpualloc, jp_serverapp):
    """A kernel that got its slice at launch (a GPU kernelspec) hears its lease's idle warning, with
    when the slice goes, on its output, before idle release shuts it down: with no %gpu typed."""
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    told: list[str] = []

    async def listen():
        while True:
            msg = await client.get_iopub_msg(timeout=60)
            if msg["msg_type"] == "stream":
                told.append(msg["content"]["text"])

    listener = asyncio.ensure_future(listen())
    try:
        await wait_for(lambda: kernel_id not in km, timeout=30)
        await wait_for(lambda: any("is idle: it is released" in text for text in told), timeout=5)
    finally:
        listener.cancel()
        client.stop_channels()
