"""Background jobs as Kubernetes Jobs on the real control plane (c.GpuAllocService.job_pods).

kwok runs no process in a pod, so where a pod would run `jupyter-gpualloc job run ID` the test runs
that command itself, with the pod's env as the API server holds it (the job's token read from the
Secret the service made): a real runner, a real kernel, the job's real notebook in its workdir.
The pods carry kwok's phase annotation (c.UserPods.pod_annotations), so a pod stays Running until
the test ends it, as the kubelet would when its process exits; deleting a pod does not signal the
test's runner, so the test sends SIGTERM to it as the kubelet would.
"""

from __future__ import annotations

import base64
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.kernel.conftest import Kernel, kernel_env
from tests.processes import start_logged
from tests.service.conftest import ALICE, BOB, ROOT

from .test_cluster import PHASE, until
from .test_service_on_cluster import ClusterService, copy_node

client = pytest.importorskip("kubernetes_asyncio.client")

JOB_LABEL = "gpualloc.jupyter.org/job"
LEASE_LABEL = "gpualloc.jupyter.org/lease"
PREEMPT_GRACE = 5
CONFIG = f"""
c.SchedulerPolicy.heartbeat_ttl = 3600
c.SchedulerPolicy.preempt_grace = {PREEMPT_GRACE}
c.GpuAllocService.tick_interval = 0.5
c.GpuAllocService.pod_missing_timeout = 30
c.GpuAllocService.job_pods = True
c.UserPods.pod_annotations = {{"{PHASE}": "Running"}}
"""


class JobPodService(ClusterService):
    """The service with the kubernetes backend and jobs in Kubernetes Jobs (`config` added)."""

    def __init__(self, workdir: Path, kubeconfig: str, config: str = "", *, namespace: str):
        super().__init__(workdir, kubeconfig, config=CONFIG + config, namespace=namespace)

    @property
    def root_url(self) -> str:
        return self.url.removesuffix("api/v1/")


# nodes of this module's own, copies of the demo fleet's (other modules' pods may be left on those)
OWN_NODES = {"gpu-l4-jobs": "gpu-l4-1", "gpu-h100-jobs": "gpu-h100-mig-1", "gpu-a100-jobs": "gpu-a100-1",
             "gpu-l4-shared-jobs": "gpu-l4-shared-1"}


@pytest.fixture(scope="module")
def service(k8s_cluster, tmp_path_factory, install_namespace):
    with own_nodes(k8s_cluster, OWN_NODES):
        svc = JobPodService(tmp_path_factory.mktemp("service-job-pods"), k8s_cluster.kubeconfig,
                            namespace=install_namespace).start()
        try:
            wait_for_nodes(svc, OWN_NODES)
            yield svc
        finally:
            svc.kill()


@pytest.fixture
def namespace(install_pods) -> str:
    """The service's namespace, where its pods are its own; what a test leaves there is deleted after it."""
    return install_pods


@contextlib.contextmanager
def own_nodes(k8s_cluster, copies: dict[str, str]):
    """Nodes named as `copies`' keys, each a copy of the demo fleet's node its value names."""
    async def add(api):
        for name, model in copies.items():
            await copy_node(api, model, name)

    async def remove(api):
        for name in copies:
            await client.CoreV1Api(api).delete_node(name)

    k8s_cluster.run(add)
    try:
        yield
    finally:
        k8s_cluster.run(remove)


def wait_for_nodes(service, names) -> None:
    wait_for(lambda: set(names) <= {n["name"] for n in service.call("GET", "inventory", token=ROOT).json()["nodes"]
                                    if n["unschedulable"] is None}, what="the module's nodes in the inventory")


def server_pod(service, user: str, home: Path, server_name: str = "") -> dict:
    """A pod as KubeSpawner makes a user's CPU-only server: its labels and annotations, the service's
    URL and the server's own hub token in its env, the home directory mounted."""
    return {
        "metadata": {"name": f"jupyter-{user}{'-' + server_name if server_name else ''}",
                     "labels": {"component": "singleuser-server", "hub.jupyter.org/username": user,
                                "hub.jupyter.org/network-access-hub": "true"},
                     "annotations": {"hub.jupyter.org/username": user, "hub.jupyter.org/servername": server_name,
                                     PHASE: "Running"}},
        "spec": {"nodeName": "cpu-1", "automountServiceAccountToken": False,
                 "securityContext": {"fsGroup": 100},
                 "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook:2025-01-01",
                                 "env": [{"name": "GPUALLOC_URL", "value": service.root_url},
                                         {"name": "JUPYTERHUB_API_TOKEN", "value": "the-servers-own-token"},
                                         {"name": "TEAM_SETTING", "value": "kept"}],
                                 "volumeMounts": [{"name": "home", "mountPath": str(home)}],
                                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                               "limits": {"memory": "2Gi"}},
                                 "securityContext": {"runAsUser": 1000}}],
                 "volumes": [{"name": "home", "hostPath": {"path": str(home)}}]},
    }


@pytest.fixture
def alice_server(service, k8s_cluster, namespace, tmp_path):
    """A server pod of alice's Running in `namespace`, her home in tmp_path (a named server of its own
    for each test: the pods of the tests before may still be there while their namespace goes)."""
    server_name = f"s{uuid.uuid4().hex[:8]}"
    pod = server_pod(service, "alice", tmp_path, server_name=server_name)
    core = lambda api: client.CoreV1Api(api)  # noqa: E731
    k8s_cluster.run(lambda api: core(api).create_namespaced_pod(namespace, pod))

    async def running(api):
        async def check():
            return (await core(api).read_namespaced_pod(pod["metadata"]["name"], namespace)).status.phase == "Running"
        await until(check, what="the server pod Running")

    k8s_cluster.run(running)
    yield SimpleNamespace(name=pod["metadata"]["name"], home=tmp_path, runner=f"server:{server_name}")


def cell_job(home: Path, code: str, spec: dict, **extra) -> dict:
    return {"spec": spec, "workdir": str(home), "name": extra.pop("name", "k8s job"),
            "source": {"kind": "cell", "code": code, **extra.pop("source", {})}, **extra}


def submit(service, request: dict, token: str = ALICE) -> dict:
    """Submit; while the service's watch has not yet seen the server pod (a 400 naming the runner), again."""
    deadline = time.monotonic() + 30
    while (reply := service.call("POST", "jobs", request, token)).status == 400 and time.monotonic() < deadline:
        assert reply.json()["field"] == "runner", reply
        time.sleep(0.2)
    assert reply.status == 201, reply
    return reply.json()


def job_of(service, job_id: str, token: str = ALICE) -> dict:
    return service.call("GET", f"jobs/{job_id}", token=token).json()


def wait_for(check, timeout: float = 60.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kube_jobs(k8s_cluster, namespace: str, job_id: str) -> list:
    async def read(api):
        return (await client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=f"{JOB_LABEL}={job_id}")).items
    return k8s_cluster.run(read)


def jobs_version(k8s_cluster, namespace: str) -> str:
    """The namespace's Jobs' list resourceVersion: a watch from it replays every change since."""
    async def read(api):
        return (await client.BatchV1Api(api).list_namespaced_job(namespace)).metadata.resource_version
    return k8s_cluster.run(read)


def job_history(k8s_cluster, namespace: str, job_id: str, since: str) -> list[tuple[str, bool]]:
    """Every version of the job's Kubernetes Job since `since`, as the API server's watch replays
    them: (event type, spec.suspend)."""
    from kubernetes_asyncio import watch

    async def replay(api):
        batch, seen = client.BatchV1Api(api), []
        async with watch.Watch().stream(batch.list_namespaced_job, namespace, resource_version=since,
                                        label_selector=f"{JOB_LABEL}={job_id}", timeout_seconds=2) as stream:
            async for event in stream:
                seen.append((event["type"], bool(event["object"].spec.suspend)))
        return seen
    return k8s_cluster.run(replay)


def running_pod(k8s_cluster, namespace: str, job_id: str, service=None):
    """The Running pod of the job's Kubernetes Job (waits for it; says where the job is if none comes)."""
    async def find(api):
        async def check():
            pods = (await client.CoreV1Api(api).list_namespaced_pod(
                namespace, label_selector=f"{JOB_LABEL}={job_id}")).items
            return next((p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp), None)
        return await until(check, what=f"a Running pod of job {job_id}")
    try:
        return k8s_cluster.run(find)
    except AssertionError as err:
        if service is None:
            raise
        raise AssertionError(f"{err}; the job: {job_of(service, job_id)}; the leases: "
                             f"{service.call('GET', 'leases', token=ROOT).json()}") from None


def pod_env(k8s_cluster, namespace: str, pod) -> dict[str, str]:
    """The pod's container env as the kubelet would give it: values, and secretKeyRefs read."""
    env: dict[str, str] = {}
    for var in pod.spec.containers[0].env:
        if var.value_from is None:
            env[var.name] = var.value or ""
            continue
        ref = var.value_from.secret_key_ref
        secret = k8s_cluster.run(lambda api: client.CoreV1Api(api).read_namespaced_secret(ref.name, namespace))
        env[var.name] = base64.b64decode(secret.data[ref.key]).decode()
    return env


def start_runner(k8s_cluster, namespace: str, pod, job_id: str, log: Path) -> subprocess.Popen:
    """What the pod's container would run, with the pod's env, in the job's workdir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "CUDA_"))}
    env.update(pod_env(k8s_cluster, namespace, pod))
    command = pod.spec.containers[0].command
    assert command == ["jupyter-gpualloc", "job", "run", job_id]
    return start_logged([sys.executable, "-m", "jupyter_gpualloc.cli", *command[1:]], log,
                        cwd=pod.spec.containers[0].working_dir, env=env)


def wait_until_gone(k8s_cluster, namespace: str, name: str) -> None:
    async def gone(api):
        async def check():
            pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace)).items
            return all(p.metadata.name != name for p in pods)
        await until(check, what=f"pod {name} gone")
    k8s_cluster.run(gone)


def end_pod(k8s_cluster, namespace: str, pod, phase: str) -> None:
    """The pod's process exited: kwok ends the pod as the kubelet would (exit 0 or 1), unless the
    service deleted it first (the runner's report ended the lease, and with it the Job)."""
    from kubernetes_asyncio.client.exceptions import ApiException

    async def end(api):
        try:
            await client.CoreV1Api(api).patch_namespaced_pod(
                pod.metadata.name, namespace, {"metadata": {"annotations": {PHASE: phase}}})
        except ApiException as err:
            if err.status != 404:
                raise
    k8s_cluster.run(end)


def test_offers_say_jobs_run_here_and_kernels_do_not(service):
    refused = service.call("GET", "offers", token=ALICE).json()["refused_holders"]
    assert list(refused) == ["kernel"], refused


def test_a_job_without_a_server_pod_is_refused_naming_the_field(service):
    reply = service.call("POST", "jobs", cell_job(Path("/home/bob"), "1", {"kind": "whole", "node": "gpu-l4-jobs"}), BOB)
    assert reply.status == 400 and reply.json()["field"] == "runner", reply
    assert "no running pod of bob's server" in reply.json()["error"], reply


def test_a_job_runs_as_a_kubernetes_job_with_the_leases_resources_and_its_outputs_come_back(
        service, k8s_cluster, namespace, alice_server):
    home = alice_server.home
    inputs = home / ".gpualloc" / "inputs" / "k8s.pkl"  # as %%gpu job writes a cell's inputs
    inputs.parent.mkdir(parents=True)
    inputs.write_bytes(pickle.dumps({"y": 6}))
    since = jobs_version(k8s_cluster, namespace)
    code = "import os\nx = y * 7\nprint('working on', os.environ.get('GPUALLOC_SLICE_KIND'), os.getcwd())"
    job = submit(service, cell_job(home, code, {"kind": "mig", "profile": "1g.10gb", "node": "gpu-h100-jobs"},
                                   source={"inputs": ["y"], "inputs_file": ".gpualloc/inputs/k8s.pkl",
                                           "outputs": ["x"]}, runner=alice_server.runner))
    assert job["runner"] == "pod" and "pod" not in job and "token_sha256" not in job, job
    pod = running_pod(k8s_cluster, namespace, job["id"], service)
    lease = job_of(service, job["id"])["lease"]

    # made suspended, resumed only once its token's Secret was made: a crash or a refusal in between
    # leaves a Job with no pod, never a pod waiting for a Secret that will not come
    history = job_history(k8s_cluster, namespace, job["id"], since)
    assert history[0] == ("ADDED", True) and ("MODIFIED", False) in history, history

    # the Job: one attempt, the lease's resources and node, the server's image, env and home
    [kube_job] = kube_jobs(k8s_cluster, namespace, job["id"])
    assert kube_job.spec.backoff_limit == 0 and kube_job.spec.ttl_seconds_after_finished == 3600
    assert kube_job.metadata.labels[LEASE_LABEL] == lease["id"]
    spec = pod.spec
    container = spec.containers[0]
    assert container.resources.limits == {"nvidia.com/mig-1g.10gb": "1", "memory": "2Gi"}
    assert container.resources.requests["cpu"] == "500m"
    assert pod.spec.node_name == lease["slice"]["node"] == "gpu-h100-jobs"
    terms = spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert terms[0].match_expressions[0].values == ["gpu-h100-jobs"]
    assert container.image == "quay.io/jupyter/base-notebook:2025-01-01"
    assert [m.mount_path for m in container.volume_mounts] == [str(home)]
    assert container.security_context.run_as_user == 1000 and spec.security_context.fs_group == 100
    assert spec.automount_service_account_token is False and spec.restart_policy == "Never"
    assert spec.termination_grace_period_seconds == PREEMPT_GRACE
    names = [e.name for e in container.env]
    assert "JUPYTERHUB_API_TOKEN" not in names and "TEAM_SETTING" in names and "CUDA_VISIBLE_DEVICES" not in names
    assert len(names) == len(set(names)), names
    secret_ref = next(e for e in container.env if e.name == "GPUALLOC_TOKEN").value_from.secret_key_ref
    secret = k8s_cluster.run(lambda api: client.CoreV1Api(api).read_namespaced_secret(secret_ref.name, namespace))
    assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("Job", kube_job.metadata.uid)]

    # the job's token: its own job's runner calls, nothing else
    token = base64.b64decode(secret.data[secret_ref.key]).decode()
    assert service.call("GET", f"jobs/{job['id']}", token=token).status == 200
    assert service.call("GET", "leases", token=token).status == 403
    assert service.call("GET", "jobs", token=token).status == 403
    assert service.call("DELETE", f"jobs/{job['id']}", token=token).status == 403

    runner = start_runner(k8s_cluster, namespace, pod, job["id"], home / "runner.log")
    assert runner.wait(120) == 0, (home / "runner.log").read_text()
    end_pod(k8s_cluster, namespace, pod, "Succeeded")
    done = job_of(service, job["id"])
    assert (done["state"], done["attempts"]) == ("succeeded", 1), done
    log = (home / ".gpualloc" / "jobs" / job["id"] / "job.log").read_text()
    assert f"working on mig {home}" in log, log
    assert not inputs.exists()  # the runner deleted the pickled inputs of a job that ended for good
    assert service.call("GET", f"jobs/{job['id']}", token=token).status == 401  # its token ended with it
    wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job deleted")

    # the result comes back in the notebook's kernel as on one machine
    kernel = Kernel(kernel_env(SimpleNamespace(url=service.root_url), ALICE), home)
    try:
        loaded = kernel.run(f"%gpu job result {job['id']}\nprint(x)")
        assert loaded.status == "ok" and loaded.stdout.strip().endswith("42"), loaded
        logs = kernel.run(f"%gpu job logs {job['id']}")
        assert f"working on mig {home}" in logs.stdout, logs
    finally:
        kernel.shutdown()
    with open(home / ".gpualloc" / "jobs" / job["id"] / "outputs.pkl", "rb") as outputs:
        assert pickle.load(outputs)["x"] == 42


def test_a_pod_that_ends_without_the_runners_report_is_a_failed_attempt_with_the_kubelets_reason(
        service, k8s_cluster, namespace, alice_server):
    job = submit(service, cell_job(alice_server.home, "1", {"kind": "whole", "node": "gpu-l4-jobs"}, retries=1,
                                   runner=alice_server.runner))
    first = running_pod(k8s_cluster, namespace, job["id"], service)
    end_pod(k8s_cluster, namespace, first, "Failed")  # no runner: the container exited 1
    requeued = wait_for(lambda: (j := job_of(service, job["id"]))["attempts"] == 1 and j["state"] == "queued" and j,
                        what="the first attempt failed and requeued")
    assert "ended without the runner's report: Error (exit code 1)" in requeued["reason"], requeued

    second = running_pod(k8s_cluster, namespace, job["id"], service)  # the retry: a new Kubernetes Job
    assert second.metadata.labels[LEASE_LABEL] != first.metadata.labels[LEASE_LABEL]
    k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod(
        second.metadata.name, namespace, grace_period_seconds=0))
    failed = wait_for(lambda: (j := job_of(service, job["id"]))["state"] == "failed" and j, what="the job failed")
    assert failed["attempts"] == 2 and f"its pod {namespace}/{second.metadata.name} was deleted" in failed["reason"]
    wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Jobs deleted")
    assert service.call("GET", "leases", token=ALICE).json()["leases"] == []


def test_cancel_deletes_the_kubernetes_job_and_another_user_cannot_see_or_cancel_it(
        service, k8s_cluster, namespace, alice_server):
    job = submit(service, cell_job(alice_server.home, "1", {"kind": "whole", "node": "gpu-l4-jobs"},
                                   runner=alice_server.runner))
    running_pod(k8s_cluster, namespace, job["id"], service)
    assert service.call("GET", f"jobs/{job['id']}", token=BOB).status == 404
    assert service.call("DELETE", f"jobs/{job['id']}", token=BOB).status == 404
    assert kube_jobs(k8s_cluster, namespace, job["id"])
    assert service.call("DELETE", f"jobs/{job['id']}", token=ALICE).json()["state"] == "cancelled"
    wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job deleted")
    wait_for(lambda: service.call("GET", "leases", token=ALICE).json()["leases"] == [], what="the slice back")


def test_preemption_deletes_the_pod_the_job_sees_sigterm_and_is_requeued(service, k8s_cluster, namespace, alice_server):
    home = alice_server.home
    code = ("import signal, time, pathlib\n"
            "def stop(*_):\n"
            "    pathlib.Path('sigterm-seen').write_text('checkpointed')\n"
            "    raise SystemExit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\n"
            "print('working', flush=True)\n"
            "time.sleep(300)")
    whole_node = {"kind": "whole", "node": "gpu-l4-jobs", "count": 2}
    job = submit(service, cell_job(home, code, whole_node, runner=alice_server.runner))
    pod = running_pod(k8s_cluster, namespace, job["id"], service)
    runner = start_runner(k8s_cluster, namespace, pod, job["id"], home / "runner.log")
    log = home / ".gpualloc" / "jobs" / job["id"] / "job.log"
    wait_for(lambda: log.exists() and "working" in log.read_text(), 60, "the job working")

    # an interactive request for the node goes first: the job's pod is deleted with its grace
    lease = service.call("POST", "leases", {"spec": whole_node, "holder": "server:urgent"}, ROOT).json()
    assert lease.get("state") == "queued", lease
    requeued = wait_for(lambda: (j := job_of(service, job["id"]))["state"] == "queued" and j, what="the preemption")
    assert requeued["preemptions"] == 1, requeued

    async def deleting(api):
        async def check():
            pods = (await client.CoreV1Api(api).list_namespaced_pod(namespace)).items
            mine = [p for p in pods if p.metadata.name == pod.metadata.name]
            return not mine or mine[0].metadata.deletion_timestamp is not None
        await until(check, what="the pod deleted")
    k8s_cluster.run(deleting)  # (kwok removes a deleted pod at once: its kubelet has no process to wait for)
    runner.send_signal(signal.SIGTERM)  # what the kubelet does to the container's process
    assert runner.wait(60) == 1
    assert (home / "sigterm-seen").read_text() == "checkpointed"
    assert "stopped: its pod was stopped" in log.read_text()
    wait_for(lambda: service.call("GET", f"leases/{lease['id']}", token=ROOT).json()["state"] == "granted",
             what="the interactive lease granted once the job's pod is gone")
    assert service.call("DELETE", f"leases/{lease['id']}?holder_gone=true", token=ROOT).status == 200
    running_pod(k8s_cluster, namespace, job["id"], service)  # the requeued job runs again
    assert service.call("DELETE", f"jobs/{job['id']}", token=ALICE).status == 200


def test_a_job_queued_while_its_owners_server_stops_still_runs(service, k8s_cluster, namespace, tmp_path):
    server = server_pod(service, "alice", tmp_path, server_name="evening")  # a named server of her own
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(namespace, server))
    blocker = service.call("POST", "leases", {"spec": {"kind": "whole", "node": "gpu-a100-jobs", "count": 4},
                                              "holder": "server:blocker"}, ROOT).json()
    job = submit(service, cell_job(tmp_path, "print('ran without the server')",
                                   {"kind": "whole", "node": "gpu-a100-jobs"}, runner="server:evening"))
    assert job["position"] >= 1, job
    k8s_cluster.run(lambda api: client.CoreV1Api(api).delete_namespaced_pod(
        server["metadata"]["name"], namespace, grace_period_seconds=0))
    wait_until_gone(k8s_cluster, namespace, server["metadata"]["name"])
    time.sleep(1)  # the service's watch hears of it
    refused = service.call("POST", "jobs", cell_job(tmp_path, "1", {"kind": "whole"}, runner="server:evening"), ALICE)
    assert refused.status == 400 and refused.json()["field"] == "runner", refused  # no new job without a server
    assert service.call("DELETE", f"leases/{blocker['id']}?holder_gone=true", token=ROOT).status == 200
    pod = running_pod(k8s_cluster, namespace, job["id"], service)
    assert pod.spec.containers[0].image == "quay.io/jupyter/base-notebook:2025-01-01"
    runner = start_runner(k8s_cluster, namespace, pod, job["id"], tmp_path / "runner.log")
    assert runner.wait(120) == 0, (tmp_path / "runner.log").read_text()
    end_pod(k8s_cluster, namespace, pod, "Succeeded")
    listed = {j["id"]: j for j in service.call("GET", "jobs", token=ALICE).json()["jobs"]}
    assert listed[job["id"]]["state"] == "succeeded", listed[job["id"]]


def test_a_shared_jobs_pod_asks_for_what_its_node_advertises(service, k8s_cluster, namespace, alice_server):
    """The demo's time-sliced L4s are not renamed: a shared slice there is one `nvidia.com/gpu` replica."""
    job = submit(service, cell_job(alice_server.home, "1", {"kind": "shared", "memory_gib": 4,
                                                             "node": "gpu-l4-shared-jobs"}, runner=alice_server.runner))
    [kube_job] = wait_for(lambda: kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job")
    limits = kube_job.spec.template.spec.containers[0].resources.limits
    assert limits == {"nvidia.com/gpu": "1", "memory": "2Gi"}, limits
    pod = running_pod(k8s_cluster, namespace, job["id"], service)  # bound there by kube-scheduler
    assert pod.spec.node_name == "gpu-l4-shared-jobs"
    assert service.call("DELETE", f"jobs/{job['id']}", token=ALICE).status == 200
    wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job deleted")


def test_a_jobs_pod_carries_z2jhs_network_policy_labels_and_metadata_blocker(service, k8s_cluster, namespace, tmp_path):
    """z2jh's singleuser NetworkPolicy selects a user's pods by `component`, `app` and `release`, and its
    `block-cloud-metadata` init container keeps them from the cloud's metadata server: a job's pod,
    made from the server's, is fenced in as the server is (another init container is not copied)."""
    server = server_pod(service, "alice", tmp_path, server_name="netpol")
    z2jh = {"component": "singleuser-server", "app": "jupyterhub", "release": "jhub", "chart": "jupyterhub-4.2.0"}
    server["metadata"]["labels"].update(z2jh)
    blocker = {"name": "block-cloud-metadata", "image": "quay.io/jupyterhub/k8s-network-tools:4.2.0",
               "command": ["iptables", "--append", "OUTPUT", "--protocol", "tcp", "--destination", "169.254.169.254",
                           "--destination-port", "80", "--jump", "DROP"],
               "securityContext": {"runAsUser": 0, "capabilities": {"add": ["NET_ADMIN"]}}}
    server["spec"]["initContainers"] = [blocker, {"name": "fix-home", "image": "busybox", "command": ["true"]}]
    k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(namespace, server))
    job = submit(service, cell_job(tmp_path, "1", {"kind": "whole", "node": "gpu-l4-jobs"}, runner="server:netpol"))
    pod = running_pod(k8s_cluster, namespace, job["id"], service)
    for key in ("component", "app", "release"):
        assert pod.metadata.labels[key] == z2jh[key], pod.metadata.labels
    assert "chart" not in pod.metadata.labels
    assert pod.metadata.labels["hub.jupyter.org/network-access-hub"] == "true"
    assert [c.name for c in pod.spec.init_containers] == ["block-cloud-metadata"]
    assert pod.spec.init_containers[0].command == blocker["command"]
    assert pod.spec.init_containers[0].security_context.capabilities.add == ["NET_ADMIN"]
    service.call("DELETE", f"jobs/{job['id']}", token=ALICE)


def test_with_readwriteonce_homes_a_job_runs_on_its_servers_node(service, k8s_cluster, namespace, tmp_path):
    """A default zero-to-jupyterhub home mounts on one node: the job's pod goes where the server runs."""
    rwo = JobPodService(tmp_path / "rwo", k8s_cluster.kubeconfig,
                        "c.UserPods.home_access_mode = 'ReadWriteOnce'\nc.GpuAllocService.instance = 'rwo'\n",
                        namespace=namespace)
    rwo.start()
    try:
        pod = server_pod(rwo, "alice", tmp_path, server_name="rwo")
        pod["spec"]["nodeName"] = "gpu-a100-jobs"  # the server runs on a GPU node, with no GPU of its own
        k8s_cluster.run(lambda api: client.CoreV1Api(api).create_namespaced_pod(namespace, pod))
        elsewhere = cell_job(tmp_path, "1", {"kind": "whole", "node": "gpu-l4-jobs"}, runner="server:rwo")
        refused = wait_for(lambda: (r := rwo.call("POST", "jobs", elsewhere, ALICE)).json().get("field") != "runner"
                           and r, what="the service seeing the server pod")
        assert refused.status == 400 and refused.json()["field"] == "spec.node", refused
        assert "job runs on its server's node gpu-a100-jobs" in refused.json()["error"], refused
        job = submit(rwo, cell_job(tmp_path, "1", {"kind": "whole"}, runner="server:rwo"))
        assert job["spec"]["node"] == "gpu-a100-jobs", job
        job_pod = running_pod(k8s_cluster, namespace, job["id"], rwo)
        assert job_pod.spec.node_name == "gpu-a100-jobs"
        terms = job_pod.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_expressions[0].values == ["gpu-a100-jobs"]
        assert rwo.call("DELETE", f"jobs/{job['id']}", token=ALICE).status == 200
        wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job deleted")
    finally:
        rwo.kill()


def test_a_service_crash_loses_nothing_the_running_job_reports_to_the_restarted_service(
        service, k8s_cluster, namespace, alice_server):
    job = submit(service, cell_job(alice_server.home, "print('after the crash')", {"kind": "whole", "node": "gpu-l4-jobs"},
                                   runner=alice_server.runner))
    pod = running_pod(k8s_cluster, namespace, job["id"], service)
    service.kill()  # SIGKILL: the job's token, its pod template and its lease are in the store
    service.start()
    assert job_of(service, job["id"])["state"] == "queued"  # its slice granted, its runner not started yet
    time.sleep(2)  # a few ticks: the restarted service finds the Job's pod and makes no second Job
    assert [j.metadata.name for j in kube_jobs(k8s_cluster, namespace, job["id"])] == [pod.metadata.labels["job-name"]]
    runner = start_runner(k8s_cluster, namespace, pod, job["id"], alice_server.home / "runner.log")
    assert runner.wait(120) == 0, (alice_server.home / "runner.log").read_text()
    assert job_of(service, job["id"])["state"] == "succeeded"
    wait_for(lambda: not kube_jobs(k8s_cluster, namespace, job["id"]), what="the Kubernetes Job deleted")
