"""The provisioner outside a server with the extension: plain kernels still start, GPU ones fail clearly."""

from __future__ import annotations

import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.provisioning.factory import KernelProvisionerFactory

from jupyter_gpualloc.server import provisioner
from jupyter_gpualloc.server.provisioner import GpuAllocProvisioner, NoService

SERVICE_VARIABLES = ("GPUALLOC_URL", "GPUALLOC_TOKEN", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_PUBLIC_HUB_URL",
                     "JUPYTERHUB_PUBLIC_URL")


@pytest.fixture
def no_service(monkeypatch):
    for name in SERVICE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(provisioner, "_link", None)


def make_provisioner(config: dict) -> GpuAllocProvisioner:
    spec = KernelSpec(argv=["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"], display_name="x",
                      language="python", metadata={"kernel_provisioner": {"provisioner_name": "gpualloc",
                                                                          "config": config}})
    return KernelProvisionerFactory.instance().create_provisioner_instance("k1", spec, parent=None)


async def test_a_plain_kernel_launches_as_local_ones_do(no_service):
    assert provisioner.current_link() is None
    prov = make_provisioner({})
    kwargs = await prov.pre_launch(env={"PATH": "/bin"})
    assert "GPUALLOC_HOLDER" not in kwargs["env"] and "CUDA_VISIBLE_DEVICES" not in kwargs["env"]


async def test_a_gpu_kernel_without_a_service_says_what_to_configure(no_service):
    prov = make_provisioner({"spec": {"kind": "mig", "profile": "1g.10gb"}, "offer": "MIG 1g.10gb"})
    with pytest.raises(NoService, match="MIG 1g.10gb.*GPUALLOC_URL"):
        await prov.pre_launch(env={"PATH": "/bin"})
