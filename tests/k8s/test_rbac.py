"""The service's RBAC is enough and no more, and two installs' rules coexist.

On the local control plane the service runs as the `hub` service account bound by exactly the rules
of hub_config/gpualloc-rbac.yaml (and as the `gpualloc` account of hub_config/gpualloc-deployment.yaml,
the service in a Deployment of its own): it sees the cluster, deletes the pod of a lease it ended,
runs a background job as a Kubernetes Job (also one whose Job an earlier run of the service made),
and may do nothing else, as the API server's authorizer answers (SubjectAccessReview)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from tests.service.conftest import ALICE, ROOT

from .conftest import create_namespace
from .test_service_on_cluster import ClusterService, lease_pod, request, wait_until_deleted

client = pytest.importorskip("kubernetes_asyncio.client")

HUB_CONFIG = Path(__file__).parents[2] / "hub_config"
RBAC = HUB_CONFIG / "gpualloc-rbac.yaml"
DEPLOYMENT = HUB_CONFIG / "gpualloc-deployment.yaml"
NAMESPACE = "jhub"  # the release's namespace as the files name it
EXTERNAL_NAMESPACE = "jhub-external"  # the Deployment's file rendered for a release of its own
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


def rendered(path: Path, namespace: str) -> list[dict]:
    """The file's objects for a release in `namespace`, as its header says to make them (sed)."""
    return list(yaml.safe_load_all(path.read_text().replace(NAMESPACE, namespace)))


async def apply(api, objects: list[dict], namespace: str) -> None:
    """Create the file's service account and RBAC objects (create, not apply: a name taken is a 409);
    its other objects are checked by a dry run."""
    core, rbac, apps = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api), client.AppsV1Api(api)
    for obj in objects:
        kind = obj["kind"]
        if kind == "ServiceAccount":
            await core.create_namespaced_service_account(namespace, obj)
        elif kind == "ClusterRole":
            await rbac.create_cluster_role(obj)
        elif kind == "ClusterRoleBinding":
            await rbac.create_cluster_role_binding(obj)
        elif kind == "Role":
            await rbac.create_namespaced_role(namespace, obj)
        elif kind == "RoleBinding":
            await rbac.create_namespaced_role_binding(namespace, obj)
        elif kind == "Deployment":
            await apps.create_namespaced_deployment(namespace, obj, dry_run="All")
        elif kind == "Service":
            await core.create_namespaced_service(namespace, obj, dry_run="All")
        else:
            assert kind == "PersistentVolumeClaim", kind
            await core.create_namespaced_persistent_volume_claim(namespace, obj, dry_run="All")


def kubeconfig_of(k8s_cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig with a token of service account namespace/account."""
    async def token(api):
        made = await client.CoreV1Api(api).create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 3600}})
        return made.status.token

    config = yaml.safe_load(Path(k8s_cluster.kubeconfig).read_text())
    config["users"] = [{"name": account, "user": {"token": k8s_cluster.run(token)}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def hub_kubeconfig(k8s_cluster, tmp_path_factory) -> Path:
    """A kubeconfig with a token of service account jhub/hub, bound by the project's RBAC file only."""
    create_namespace(k8s_cluster, NAMESPACE)

    async def setup(api):
        await client.CoreV1Api(api).create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "hub"}})
        await apply(api, rendered(RBAC, NAMESPACE), NAMESPACE)

    k8s_cluster.run(setup)
    return kubeconfig_of(k8s_cluster, NAMESPACE, "hub", tmp_path_factory.mktemp("rbac") / "kubeconfig")


@pytest.fixture(scope="module")
def external_kubeconfig(k8s_cluster, tmp_path_factory) -> Path:
    """A kubeconfig of the `gpualloc` account of the Deployment's file, installed for a release of its own."""
    create_namespace(k8s_cluster, EXTERNAL_NAMESPACE)
    k8s_cluster.run(lambda api: apply(api, rendered(DEPLOYMENT, EXTERNAL_NAMESPACE), EXTERNAL_NAMESPACE))
    return kubeconfig_of(k8s_cluster, EXTERNAL_NAMESPACE, "gpualloc",
                         tmp_path_factory.mktemp("rbac-external") / "kubeconfig")


API_GROUPS = {"jobs": "batch", "roles": "rbac.authorization.k8s.io", "rolebindings": "rbac.authorization.k8s.io",
              "resourceslices": "resource.k8s.io", "resourceclaims": "resource.k8s.io"}


def allowed(k8s_cluster, verb: str, resource: str, namespace: str = "", *,
            account: tuple[str, str] = (NAMESPACE, "hub")) -> bool:
    """Whether the service account may do it, as the API server's authorizer answers (SubjectAccessReview);
    `resource` may name a subresource (resourceclaims/status)."""
    resource, _, subresource = resource.partition("/")

    async def review(api):
        answer = await client.AuthorizationV1Api(api).create_subject_access_review({"spec": {
            "user": f"system:serviceaccount:{account[0]}:{account[1]}", "groups": ["system:serviceaccounts"],
            "resourceAttributes": {"verb": verb, "resource": resource, "subresource": subresource,
                                   "namespace": namespace, "group": API_GROUPS.get(resource, "")}}})
        return answer.status.allowed

    return k8s_cluster.run(review)


def assert_exactly_what_the_service_needs(k8s_cluster, namespace: str, account: tuple[str, str]) -> None:
    def may(verb: str, resource: str, where: str = "") -> bool:
        return allowed(k8s_cluster, verb, resource, where, account=account)

    for resource in ("nodes", "pods", "resourceslices", "resourceclaims"):  # the watch: list, then watch
        assert may("list", resource) and may("watch", resource), resource
        assert not may("get", resource), resource  # never read one by name
    for verb, resource in (("create", "pods"), ("delete", "pods"), ("create", "jobs"), ("patch", "jobs"),
                           ("delete", "jobs"), ("create", "secrets"), ("create", "resourceclaims"), ("delete", "resourceclaims"),
                           ("patch", "resourceclaims/status")):
        assert may(verb, resource, namespace), (verb, resource)
        assert not may(verb, resource, "default"), (verb, resource)
    for verb, resource in (("patch", "nodes"), ("update", "pods"), ("get", "secrets"), ("update", "secrets"),
                           ("patch", "secrets"), ("delete", "secrets"), ("list", "secrets"), ("get", "jobs"),
                           ("list", "jobs"), ("create", "pods/exec"), ("delete", "nodes"), ("create", "roles"),
                           ("create", "rolebindings"), ("create", "resourceslices"), ("update", "resourceclaims"),
                           ("patch", "resourceclaims"), ("update", "resourceclaims/status")):
        assert not may(verb, resource, namespace), (verb, resource)


def test_the_rules_allow_what_the_service_needs_and_nothing_more(k8s_cluster, hub_kubeconfig):
    assert_exactly_what_the_service_needs(k8s_cluster, NAMESPACE, (NAMESPACE, "hub"))


def test_a_second_release_gets_cluster_rules_of_its_own_and_the_first_keeps_its(k8s_cluster, hub_kubeconfig):
    staging = "jhub-staging"
    create_namespace(k8s_cluster, staging)
    second = rendered(RBAC, staging)
    first_names = {o["metadata"]["name"] for o in rendered(RBAC, NAMESPACE) if not o["metadata"].get("namespace")}
    second_names = {o["metadata"]["name"] for o in second if not o["metadata"].get("namespace")}
    assert not first_names & second_names and all(staging in name for name in second_names)

    async def setup(api):
        await client.CoreV1Api(api).create_namespaced_service_account(staging, {"metadata": {"name": "hub"}})
        await apply(api, second, staging)

    k8s_cluster.run(setup)
    assert_exactly_what_the_service_needs(k8s_cluster, staging, (staging, "hub"))
    assert_exactly_what_the_service_needs(k8s_cluster, NAMESPACE, (NAMESPACE, "hub"))
    assert not allowed(k8s_cluster, "create", "pods", NAMESPACE, account=(staging, "hub"))
    assert not allowed(k8s_cluster, "delete", "pods", staging, account=(NAMESPACE, "hub"))


def test_the_deployments_account_gets_the_same_rules_and_the_hubs_none(k8s_cluster, external_kubeconfig):
    objects = rendered(DEPLOYMENT, EXTERNAL_NAMESPACE)
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    for binding in (o for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": EXTERNAL_NAMESPACE}]
    rules = {o["kind"]: o["rules"] for o in objects if o["kind"] in ("ClusterRole", "Role")}
    assert rules == {o["kind"]: o["rules"] for o in rendered(RBAC, EXTERNAL_NAMESPACE) if o["kind"] in rules}
    assert_exactly_what_the_service_needs(k8s_cluster, EXTERNAL_NAMESPACE, (EXTERNAL_NAMESPACE, account))
    assert not allowed(k8s_cluster, "list", "pods", account=(EXTERNAL_NAMESPACE, "hub"))


@pytest.mark.parametrize("install", ["hub", "external"])
def test_the_service_works_under_them(k8s_cluster, install_of, install, tmp_path):
    kubeconfig, namespace = install_of(install)
    service = ClusterService(tmp_path / "service", kubeconfig, namespace=namespace).start()
    pod_name = f"jupyter-rbac-{install}"
    try:
        assert service.call("GET", "health").json()["cluster"] == "current"
        names = {n["name"] for n in service.call("GET", "inventory", token=ROOT).json()["nodes"]}
        assert {"gpu-a100-1", "gpu-l4-1"} <= names
        lease = request(service, {"kind": "whole", "node": "gpu-l4-1"}, f"server:rbac-{install}")
        k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(
            namespace, lease_pod(lease, pod_name, {"nvidia.com/gpu": "1"}, "gpu-l4-1")))
        assert service.call("DELETE", f"leases/{lease['id']}", token=ROOT).status == 200
        wait_until_deleted(k8s_cluster, namespace, pod_name)
        assert "Forbidden" not in service.log_tail()
    finally:
        service.kill()


@pytest.fixture
def install_of(request):
    """The kubeconfig and namespace of an install: 'hub' (the RBAC file) or 'external' (the Deployment's file)."""
    def get(install: str) -> tuple[Path, str]:
        if install == "hub":
            return request.getfixturevalue("hub_kubeconfig"), NAMESPACE
        return request.getfixturevalue("external_kubeconfig"), EXTERNAL_NAMESPACE
    return get


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


def test_a_job_made_before_a_restart_is_made_again_without_reading_or_updating_a_secret(
        k8s_cluster, hub_kubeconfig, tmp_path):
    """The service made a job's Job and Secret, then restarted before the Job had a pod (a quota keeps
    it from getting one here): the token it holds now is not the Secret's, which it may not update,
    so it deletes that Job and makes the attempt's Job again, with a Secret of a new name."""
    from .test_job_pods import JobPodService, cell_job, kube_jobs, job_of, server_pod, submit, wait_for

    def token_secret(kube_job) -> str:
        env = kube_job.spec.template.spec.containers[0].env
        return next(e for e in env if e.name == "GPUALLOC_TOKEN").value_from.secret_key_ref.name

    async def secret_named(api, name: str):
        try:
            return await client.CoreV1Api(api).read_namespaced_secret(name, NAMESPACE)
        except client.exceptions.ApiException as err:
            if err.status == 404:
                return None
            raise

    core = lambda api: client.CoreV1Api(api)  # noqa: E731
    # the lease keeps waiting for its pod throughout (it is released 30 s after its grant otherwise)
    service = JobPodService(tmp_path / "service", str(hub_kubeconfig), "c.GpuAllocService.pod_missing_timeout = 600",
                            namespace=NAMESPACE).start()
    try:
        k8s_cluster.run(lambda api: core(api).create_namespaced_pod(
            NAMESPACE, server_pod(service, "alice", tmp_path, server_name="restart")))
        k8s_cluster.run(lambda api: core(api).create_namespaced_resource_quota(
            NAMESPACE, {"metadata": {"name": "no-more-pods"}, "spec": {"hard": {"pods": "0"}}}))
        job = submit(service, cell_job(tmp_path, "1", {"kind": "whole", "node": "gpu-l4-1"}, runner="server:restart"))
        first = wait_for(lambda: kube_jobs(k8s_cluster, NAMESPACE, job["id"]), what="the job's Kubernetes Job")[0]
        service.kill()
        service.start()
        again = wait_for(lambda: [j for j in kube_jobs(k8s_cluster, NAMESPACE, job["id"])
                                  if j.metadata.uid != first.metadata.uid and not j.metadata.deletion_timestamp],
                         what="the Job made again")[0]
        assert again.metadata.name == first.metadata.name  # the same attempt, on the same lease
        assert token_secret(again) != token_secret(first)
        assert "made before for a token no longer valid" in service.log_tail()
        secret = wait_for(lambda: k8s_cluster.run(lambda api: secret_named(api, token_secret(again))),
                          what="its Secret")
        assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("Job", again.metadata.uid)]
        token = base64.b64decode(secret.data["token"]).decode()
        assert service.call("GET", f"jobs/{job['id']}", token=token).status == 200  # the runner's token works
        assert job_of(service, job["id"])["state"] == "queued"
        assert "Forbidden" not in service.log_tail() and "forbidden" not in service.log_tail()
    finally:
        service.kill()
        k8s_cluster.run(lambda api: core(api).delete_namespaced_resource_quota("no-more-pods", NAMESPACE))
        k8s_cluster.run(lambda api: core(api).delete_namespaced_pod(
            "jupyter-alice-restart", NAMESPACE, grace_period_seconds=0))
        k8s_cluster.run(lambda api: client.BatchV1Api(api).delete_collection_namespaced_job(
            NAMESPACE, propagation_policy="Background"))
