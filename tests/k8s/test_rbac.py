"""The service's RBAC (hub_config/gpualloc-rbac.yaml) is enough and no more: on the local control
plane, the service runs as the `hub` service account bound to exactly those rules, sees the
cluster, deletes the pod of a lease it ended, runs a background job as a Kubernetes Job, and may
do nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.service.conftest import ALICE, ROOT

from .test_service_on_cluster import ClusterService, lease_pod, request, wait_until_deleted

client = pytest.importorskip("kubernetes_asyncio.client")

RBAC = Path(__file__).parents[2] / "hub_config" / "gpualloc-rbac.yaml"
NAMESPACE = "jhub"


@pytest.fixture(scope="module")
def hub_kubeconfig(k8s_cluster, tmp_path_factory) -> Path:
    """A kubeconfig with a token of service account jhub/hub, bound by the project's RBAC file only."""
    async def setup(api):
        core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
        await core.create_namespace({"metadata": {"name": NAMESPACE}})
        await core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "hub"}})
        for obj in yaml.safe_load_all(RBAC.read_text()):
            kind = obj["kind"]
            if kind == "ClusterRole":
                await rbac.create_cluster_role(obj)
            elif kind == "ClusterRoleBinding":
                await rbac.create_cluster_role_binding(obj)
            elif kind == "Role":
                await rbac.create_namespaced_role(NAMESPACE, obj)
            else:
                await rbac.create_namespaced_role_binding(NAMESPACE, obj)
        token = await core.create_namespaced_service_account_token(
            "hub", NAMESPACE, {"spec": {"expirationSeconds": 3600}})
        return token.status.token

    token = k8s_cluster.run(setup)
    config = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    config["users"] = [{"name": "hub", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "hub"
    path = tmp_path_factory.mktemp("rbac") / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


API_GROUPS = {"jobs": "batch", "roles": "rbac.authorization.k8s.io", "rolebindings": "rbac.authorization.k8s.io"}


def allowed(k8s_cluster, verb: str, resource: str, namespace: str = "") -> bool:
    """Whether jhub/hub may do it, as the API server's authorizer answers (SubjectAccessReview)."""
    async def review(api):
        answer = await client.AuthorizationV1Api(api).create_subject_access_review({"spec": {
            "user": f"system:serviceaccount:{NAMESPACE}:hub", "groups": ["system:serviceaccounts"],
            "resourceAttributes": {"verb": verb, "resource": resource, "namespace": namespace,
                                   "group": API_GROUPS.get(resource, "")}}})
        return answer.status.allowed

    return k8s_cluster.run(review)


def test_the_rules_allow_what_the_service_needs_and_nothing_more(k8s_cluster, hub_kubeconfig):
    for verb in ("get", "list", "watch"):
        assert allowed(k8s_cluster, verb, "nodes") and allowed(k8s_cluster, verb, "pods")
    assert allowed(k8s_cluster, "delete", "pods", NAMESPACE)
    assert not allowed(k8s_cluster, "delete", "pods", "default")
    for verb, resource in (("create", "jobs"), ("get", "jobs"), ("delete", "jobs"), ("create", "secrets"),
                           ("update", "secrets"), ("create", "pods")):
        assert allowed(k8s_cluster, verb, resource, NAMESPACE), (verb, resource)
        assert not allowed(k8s_cluster, verb, resource, "default"), (verb, resource)
    for verb, resource in (("patch", "nodes"), ("update", "pods"), ("get", "secrets"),
                           ("create", "pods/exec"), ("list", "secrets"), ("delete", "nodes"), ("list", "jobs"),
                           ("delete", "secrets"), ("create", "roles"), ("create", "rolebindings")):
        assert not allowed(k8s_cluster, verb, resource, NAMESPACE), (verb, resource)


def test_the_service_works_under_them(k8s_cluster, hub_kubeconfig, tmp_path):
    service = ClusterService(tmp_path / "service", hub_kubeconfig, namespace=NAMESPACE).start()
    try:
        assert service.call("GET", "health").json()["cluster"] == "current"
        names = {n["name"] for n in service.call("GET", "inventory", token=ROOT).json()["nodes"]}
        assert {"gpu-a100-1", "gpu-l4-1"} <= names
        lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, "server:rbac")
        k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
            NAMESPACE, lease_pod(lease, "jupyter-rbac", {"nvidia.com/gpu": "1"}, "gpu-l4-1")))
        assert service.call("DELETE", f"leases/{lease['id']}", token=ROOT).status == 200
        wait_until_deleted(k8s_cluster, NAMESPACE, "jupyter-rbac")
        assert "Forbidden" not in service.log_tail()
    finally:
        service.kill()


def test_a_background_job_runs_as_a_kubernetes_job_under_them(k8s_cluster, hub_kubeconfig, tmp_path):
    from .test_job_pods import JobPodService, cell_job, kube_jobs, running_pod, server_pod, submit, wait_for

    service = JobPodService(tmp_path / "service", str(hub_kubeconfig), namespace=NAMESPACE).start()
    try:
        server = server_pod(service, "alice", tmp_path, server_name="rbac")
        k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(NAMESPACE, server))
        job = submit(service, cell_job(tmp_path, "1", {"kind": "whole", "node": "gpu-l4-1"}, runner="server:rbac"))
        running_pod(k8s_cluster, NAMESPACE, job["id"])
        assert service.call("DELETE", f"jobs/{job['id']}", token=ALICE).status == 200
        wait_for(lambda: not kube_jobs(k8s_cluster, NAMESPACE, job["id"]), what="the Kubernetes Job deleted")
        assert "Forbidden" not in service.log_tail() and "forbidden" not in service.log_tail()
    finally:
        service.kill()
        k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod(
            "jupyter-alice-rbac", NAMESPACE, grace_period_seconds=0))
