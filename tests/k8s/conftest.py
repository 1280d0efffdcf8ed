"""A real Kubernetes control plane for the tests of the Kubernetes path: kube-apiserver with etcd,
kube-scheduler, kube-controller-manager and kwok, built from Go modules by `make k8s-build`
(k8s/), with the GPU nodes of examples/fleets/k8s-demo.yaml. One per test session, on free
loopback ports, in a temporary directory; every process it started is ended at the end.

Where the binary has not been built the tests skip, saying so; under CI=true they fail instead
(.ci/run builds it before make test)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable

import pytest

from .controlplane import BINARY, ControlPlane

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


class Cluster:
    """The running control plane: its kubeconfig, and kubernetes_asyncio clients on it."""

    def __init__(self, control_plane: ControlPlane):
        self.control_plane = control_plane
        self.kubeconfig = str(control_plane.kubeconfig)

    @contextlib.asynccontextmanager
    async def api(self) -> AsyncIterator[Any]:
        """A kubernetes_asyncio ApiClient on this cluster (in the running event loop)."""
        from kubernetes_asyncio import client, config

        configuration = client.Configuration()
        await config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
        async with client.ApiClient(configuration) as api:
            yield api

    def run(self, body: Callable[[Any], Awaitable[Any]], timeout: float = 120) -> Any:
        """Run `body(api)` in a fresh event loop with a fresh client; a test's whole conversation."""
        async def main():
            async with self.api() as api:
                return await asyncio.wait_for(body(api), timeout)
        return asyncio.run(main())


def require_binary() -> None:
    """Skip where the control plane is not built; under CI=true, fail."""
    if not BINARY.exists():
        message = f"{BINARY.relative_to(BINARY.parents[2])} is not built (make k8s-build: Go modules, minutes cold)"
        if CI:
            pytest.fail(message + "; .ci/run builds it before make test")
        pytest.skip(message)


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory) -> Cluster:
    require_binary()
    control_plane = ControlPlane(tmp_path_factory.mktemp("k8s"))
    control_plane.start()
    try:
        yield Cluster(control_plane)
    finally:
        control_plane.stop()


@pytest.fixture
def namespace(k8s_cluster) -> str:
    """A namespace of its own for one test (with its default service account, which pods need),
    deleted after it."""
    from kubernetes_asyncio import client

    name = f"t-{uuid.uuid4().hex[:8]}"

    async def create(api):
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": name}})
        while True:  # kube-controller-manager's service-account controller makes it
            accounts = await core.list_namespaced_service_account(name)
            if any(a.metadata.name == "default" for a in accounts.items):
                return
            await asyncio.sleep(0.1)

    k8s_cluster.run(create, timeout=60)
    yield name

    async def delete(api):
        await client.CoreV1Api(api).delete_namespace(name)

    k8s_cluster.run(delete)
