"""Real ipykernels under the gpualloc provisioner, the extension in embedded mode over the simulated fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.server.conftest import BIG_KERNEL, MIG_KERNEL, kernel_env


def lease_of(ext, kernel_id):
    """The kernel's active lease in the embedded core, or None."""
    holder = f"kernel:{kernel_id}"
    return next((l for l in ext.embedded.scheduler.leases() if l.holder == holder), None)


async def test_gpu_kernel_gets_its_slice_keeps_it_on_restart_and_releases_it(gpualloc, jp_serverapp):
    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name=MIG_KERNEL)
    lease = lease_of(gpualloc, kernel_id)
    assert lease is not None and lease.state.value == "granted" and lease.slice.profile == "1g.5gb"
    env = kernel_env(km, kernel_id)
    assert env["CUDA_VISIBLE_DEVICES"] == lease.slice.mig_uuid
    assert env["GPUALLOC_LEASE_ID"] == lease.id
    assert env["GPUALLOC_HOLDER"] == f"kernel:{kernel_id}"
    assert env["GPUALLOC_URL"] == gpualloc.embedded_url()

    first_pid = km.get_kernel(kernel_id).provisioner.pid
    await km.restart_kernel(kernel_id, now=True)
    assert km.get_kernel(kernel_id).provisioner.pid != first_pid
    assert kernel_env(km, kernel_id)["CUDA_VISIBLE_DEVICES"] == lease.slice.mig_uuid
    assert lease_of(gpualloc, kernel_id).id == lease.id

    await km.shutdown_kernel(kernel_id)
    ended = gpualloc.embedded.scheduler.lease(lease.id)
    assert ended.state.value == "released"
    assert lease_of(gpualloc, kernel_id) is None


async def test_every_kernel_can_reach_the_api_with_its_env(gpualloc, jp_serverapp, http_server_client):
    from tornado.httpclient import AsyncHTTPClient

    km = jp_serverapp.kernel_manager
    kernel_id = await km.start_kernel(kernel_name="python3")
    env = kernel_env(km, kernel_id)
    assert "GPUALLOC_LEASE_ID" not in env and lease_of(gpualloc, kernel_id) is None
    assert env["GPUALLOC_HOLDER"] == f"kernel:{kernel_id}"
    cmdline = Path(f"/proc/{km.get_kernel(kernel_id).provisioner.pid}/cmdline").read_bytes().split(b"\0")
    assert b"--ext=jupyter_gpualloc" in cmdline  # the %gpu magic is loaded at start
    http = AsyncHTTPClient()
    response = await http.fetch(env["GPUALLOC_URL"] + "api/v1/user",
                                headers={"Authorization": f"token {env['GPUALLOC_TOKEN']}"})
    assert json.loads(response.body)["user"] == gpualloc.owner
    # a lease the kernel obtains itself (as the %gpu magic does) is applied when it restarts
    response = await http.fetch(env["GPUALLOC_URL"] + "api/v1/leases", method="POST",
                                headers={"Authorization": f"token {env['GPUALLOC_TOKEN']}"},
                                body=json.dumps({"spec": {"profile": "1g.5gb"}, "holder": env["GPUALLOC_HOLDER"]}))
    granted = json.loads(response.body)
    assert response.code == 201
    await km.restart_kernel(kernel_id, now=True)
    assert kernel_env(km, kernel_id)["CUDA_VISIBLE_DEVICES"] == granted["slice"]["mig_uuid"]
    await km.shutdown_kernel(kernel_id)
    assert gpualloc.embedded.scheduler.lease(granted["id"]).state.value == "released"


async def test_a_queued_slice_that_does_not_come_fails_the_start_clearly(gpualloc, jp_serverapp):
    km = jp_serverapp.kernel_manager
    big = await km.start_kernel(kernel_name=BIG_KERNEL)  # the whole A100 as one 7g.40gb instance
    with pytest.raises(RuntimeError, match=r"No GPU slice \(mig-1g.5gb\) became free within 2 s"):
        await km.start_kernel(kernel_name=MIG_KERNEL)
    assert [l.holder for l in gpualloc.embedded.scheduler.leases()] == [f"kernel:{big}"]
    for failed in set(km.list_kernel_ids()) - {big}:
        km.remove_kernel(failed)  # jupyter_client keeps a kernel whose start failed in its table


async def test_a_port_settled_at_bind_relinks_kernels_and_the_stop_restores_the_default_provisioner(
        jp_serverapp, http_server_client, gpu_kernelspecs):
    """The server binds another port than it was given (port retries): the kernels are linked to the
    bound one at start, and the stop still puts back the provisioner that was the default before."""
    from jupyter_client.provisioning.factory import KernelProvisionerFactory

    factory = KernelProvisionerFactory.instance()
    ext = jp_serverapp.extension_manager.extensions["jupyter_gpualloc.server"].extension_points["gpualloc"].app
    assert factory.default_provisioner_name == "gpualloc"
    jp_serverapp.port += 1  # what the server does when the port it was given is taken
    await jp_serverapp.extension_manager.start_all_extensions()
    bound = f"http://127.0.0.1:{jp_serverapp.port}{jp_serverapp.base_url}gpualloc/"
    assert ext.client.url == ext.kernel_link.kernel_url == bound
    await jp_serverapp.extension_manager.stop_all_extensions()
    assert factory.default_provisioner_name == "local-provisioner"
