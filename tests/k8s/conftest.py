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


def create_namespace(cluster: Cluster, name: str) -> None:
    """A namespace with its default service account, which the ServiceAccount admission plugin
    requires of every pod."""
    from kubernetes_asyncio import client

    async def create(api):
        core = client.CoreV1Api(api)
        await core.create_namespace({"metadata": {"name": name}})
        while True:  # kube-controller-manager's service-account controller makes it
            accounts = await core.list_namespaced_service_account(name)
            if any(a.metadata.name == "default" for a in accounts.items):
                return
            await asyncio.sleep(0.1)

    cluster.run(create, timeout=60)


def delete_namespace(cluster: Cluster, name: str) -> None:
    from kubernetes_asyncio import client

    async def delete(api):
        await client.CoreV1Api(api).delete_namespace(name)

    cluster.run(delete)


def clear_namespace(cluster: Cluster, name: str, timeout: float = 60) -> None:
    """Delete the Jobs and pods in a namespace, and wait until its pods are gone."""
    from kubernetes_asyncio import client

    async def clear(api):
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        await batch.delete_collection_namespaced_job(name, propagation_policy="Background")
        await core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        while (await core.list_namespaced_pod(name)).items:
            await asyncio.sleep(0.1)

    cluster.run(clear, timeout=timeout)


@pytest.fixture
def namespace(k8s_cluster) -> str:
    """A namespace of its own for one test, deleted after it."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    create_namespace(k8s_cluster, name)
    yield name
    delete_namespace(k8s_cluster, name)


@pytest.fixture(scope="module")
def install_namespace(k8s_cluster) -> str:
    """The namespace of one module's service (c.GpuAllocService.namespace: its pods are the service's
    own only there), deleted after the module."""
    name = f"i-{uuid.uuid4().hex[:8]}"
    create_namespace(k8s_cluster, name)
    yield name
    delete_namespace(k8s_cluster, name)


@pytest.fixture
def install_pods(k8s_cluster, install_namespace) -> str:
    """For a test of a module's service: its namespace, the pods and Jobs the test left there deleted after it."""
    yield install_namespace
    clear_namespace(k8s_cluster, install_namespace)
