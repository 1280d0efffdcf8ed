"""The sidebar's slices of running kernels: Release shuts the kernel down before its slice is given again;
a slice requested for a running kernel takes effect in it without a %gpu command."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from tests.server.conftest import BIG_KERNEL, wait_for
from tests.server.test_kernels import lease_of


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


async def post(jp_fetch, path: str, body: dict) -> dict:
    response = await jp_fetch("gpualloc", "api", path, method="POST", body=json.dumps(body))
    return json.loads(response.body)


async def test_releasing_a_kernel_s_slice_shuts_the_kernel_down_before_the_slice_is_given_again(
        gpualloc, jp_serverapp, jp_fetch):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=BIG_KERNEL)  # the whole A100, as one 7g.40gb instance
    lease = lease_of(gpualloc, kernel_id)
    pid = km.get_kernel(kernel_id).provisioner.pid
    waiting = await post(jp_fetch, "request", {"offer": "whole-a100"})  # the server's own request waits for it
    assert waiting["state"] == "queued"
    kernel_alive_at_grant = []

    def on_core_event(event) -> None:
        data = event.to_json()
        if data["type"] == "lease.granted" and data["lease_id"] == waiting["id"]:
            kernel_alive_at_grant.append(alive(pid))

    gpualloc.embedded.broker.add_listener(on_core_event)
    released = await post(jp_fetch, "release", {"lease_id": lease.id})

    assert kernel_id not in km and not alive(pid)
    assert released["state"] == "released" and not released["returning"] and "shut down" in released["note"]
    await wait_for(lambda: gpualloc.embedded.scheduler.lease(waiting["id"]).state.value == "granted")
    assert kernel_alive_at_grant == [False]


async def test_withdrawing_a_kernel_s_queued_request_leaves_the_kernel_running(gpualloc, jp_serverapp, jp_fetch):
    km = jp_serverapp.kernel_manager
    big = await km.start_kernel(kernel_name=BIG_KERNEL)
    kernel_id = await km.start_kernel(kernel_name="python3")
    queued = await post(jp_fetch, "request", {"offer": "whole-a100", "kernel_id": kernel_id})
    assert queued["state"] == "queued"
    withdrawn = await post(jp_fetch, "release", {"lease_id": queued["id"]})
    assert withdrawn["state"] == "cancelled" and "note" not in withdrawn
    assert kernel_id in km and big in km


async def cuda_visible_devices(km, kernel_id: str) -> str | None:
    """A cell run in the kernel, as a person runs it: os.environ's CUDA_VISIBLE_DEVICES there."""
    client = km.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=30)
        reply = await client.execute("import os", reply=True, timeout=30,
                                     user_expressions={"cvd": "os.environ.get('CUDA_VISIBLE_DEVICES')"})
    finally:
        client.stop_channels()
    value = reply["content"]["user_expressions"]["cvd"]
    assert value["status"] == "ok", value
    return ast.literal_eval(value["data"]["text/plain"])  # the repr of a str, or None


async def listed_without_note(jp_fetch, lease_id: str) -> bool:
    """Whether the sidebar's listing shows the slice, with no note."""
    slices = json.loads((await jp_fetch("gpualloc", "api", "slices")).body)["slices"]
    return [s.get("note") for s in slices if s["id"] == lease_id] == [None]


async def test_a_slice_requested_for_a_running_kernel_takes_effect_before_its_next_cell(
        gpualloc, jp_serverapp, jp_fetch):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name="python3")
    assert await cuda_visible_devices(km, kernel_id) in (None, "")  # the kernel runs, with no slice
    granted = await post(jp_fetch, "request", {"offer": "mig-1g.5gb", "kernel_id": kernel_id})
    assert granted["state"] == "granted"
    assert await cuda_visible_devices(km, kernel_id) == granted["slice"]["mig_uuid"]
    assert granted["note"] == "the kernel uses the slice from its next cell"
    # the kernel said it applied the slice: the sidebar's note (and its Restart kernel button) is gone
    await wait_for(lambda: listed_without_note(jp_fetch, granted["id"]), timeout=5)
    assert gpualloc.embedded.scheduler.lease(granted["id"]).state.value == "granted"


async def test_a_queued_request_for_a_running_kernel_takes_effect_in_it_once_granted(
        gpualloc, jp_serverapp, jp_fetch):
    km = jp_serverapp.kernel_manager
    big = await km.start_kernel(kernel_name=BIG_KERNEL)
    kernel_id = await km.start_kernel(kernel_name="python3")
    queued = await post(jp_fetch, "request", {"offer": "whole-a100", "kernel_id": kernel_id})
    assert queued["state"] == "queued"
    await km.shutdown_kernel(big)
    await wait_for(lambda: gpualloc.embedded.scheduler.lease(queued["id"]).state.value == "granted")
    slice_ = gpualloc.embedded.scheduler.lease(queued["id"]).slice
    # the grant is told to the kernel as the event arrives, which may be after a cell run at once: this
    # test's cell waits for the kernel's answer
    told = await wait_for(lambda: gpualloc.monitor.slices.told.get(kernel_id))
    await wait_for(lambda: told.answer is not None)
    assert told.lease_id == queued["id"] and told.answer["in_effect"]
    assert await cuda_visible_devices(km, kernel_id) == slice_.mig_uuid
    await wait_for(lambda: listed_without_note(jp_fetch, queued["id"]), timeout=5)
