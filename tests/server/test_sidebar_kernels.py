"""The sidebar's slices of running kernels: Release shuts the kernel down before its slice is given again."""

from __future__ import annotations

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
