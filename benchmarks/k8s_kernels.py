"""From request to a runnable GPU kernel pod and to a Running job pod, beside KubeSpawner's start().

    python benchmarks/k8s_kernels.py [--runs 20] [--out FILE]

Needs the local control plane built (`make k8s-build`). It starts one with the demo fleet
(examples/fleets/k8s-demo.yaml), the service as a process (--backend kubernetes, SQLite,
c.GpuAllocService.kernel_pods and job_pods on) and alice's CPU-only server pod as KubeSpawner
makes it, then, after one round that is not counted (KubeSpawner's pod and event watches start,
the service's code paths warm), runs --runs rounds of these, in this order, each asking for one
whole L4 on gpu-l4-1 and each ended (its pod gone) before the next starts:

- KubeSpawner starts a plain pod (the baseline): jupyterhub-kubespawner's own `KubeSpawner`, its
  `start()` from the call to its return with the pod's URL, which is when its pod watch (its
  reflector) shows the pod Running with an IP; then `stop(now=True)`. No hub runs: `start()` needs
  only the `user` and `hub` objects a hub gives a spawner (a name, an id, URLs) and an API token,
  which it puts in the pod's env. KubeSpawner waits for Running with JupyterHub's
  `exponential_backoff` (full jitter: a first sleep of up to 0.2 s, then up to 0.4 s, ...), so its
  time includes that wait, as it does in a hub. The hub's own work around a spawn (its database,
  the proxy, the HTTP check of the server) is not in it.
- plain pod through the API: the same request's pod (a whole L4 by `nvidia.com/gpu: 1`, pinned
  to gpu-l4-1) created with one API call and polled every 10 ms, as the allocator's rows are:
  what a pod start costs without KubeSpawner's wait.
- kernel pod: what a user's server's kernel provisioner (server/provisioner.py) does for a GPU
  kernel: `POST /api/v1/kernels/{id}/pod` with the body its `launch_kernel` builds (the slice, the
  server, the kernelspec's argv with `{connection_file}` and `--ext=jupyter_gpualloc`, the GPUALLOC_
  env, the workdir, the connection key and ports), alice's token, then `GET` every 10 ms until
  the state is "running" (the pod Running with its IP: the provisioner connects to it then; the
  provisioner itself asks 50 ms after its POST, then twice as long after each answer, so a real
  kernel start sees it a few tens of ms later). It includes the lease's grant, the
  pod written, kube-scheduler and kwok. The service writes the pod's Secret (connection file,
  env) just after the pod; kwok may run the pod before the Secret is there, where a kubelet would
  wait to mount it: a line under the table says in how many runs it was not there yet when the
  pod was reported running. Then `DELETE` (the kernel's shutdown).
- kernel answers: the same start, on until a kernel_info reply from the kernel at the pod's IP.
  kwok runs no process, so once the pod is Running and its Secret there this process plays the
  kubelet with tests/k8s/test_kernel_pods.py's helper: it reads the Secret and starts the pod's
  command (a real ipykernel with the %gpu extension) with the pod's env and connection file,
  listening on the pod's IP. So it adds Python's and ipykernel's start-up on this machine, which
  on a cluster also comes after Running (a kernel pod has no readiness probe).
- job pod: `POST /api/v1/jobs` for the same slice, until its Kubernetes Job's pod is Running (and,
  on a row of its own, until the Job object exists): the grant, the job's token, the Job and its
  Secret written, then the Job controller, kube-scheduler and kwok. Then the job is cancelled.

kwok starts a pod without a container, so no row includes pulling an image or starting a
container; a real cluster adds the same to every row. Prints a markdown table: p50, p90 and max,
and each row's p50 over KubeSpawner's p50 (writes it to --out when given).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# tests.k8s's other modules import kubernetes_asyncio's config, which reads $KUBECONFIG once, on
# import, for KubeSpawner: they are imported once main() has set it
from tests.k8s.controlplane import BINARY, ControlPlane  # noqa: E402
from tests.service.conftest import ALICE  # noqa: E402

POLL = 0.01
NODE = "gpu-l4-1"
L4 = {"nvidia.com/gpu": "1"}
WHOLE_L4 = {"kind": "whole", "node": NODE}
IMAGE = "quay.io/jupyter/base-notebook:2025-01-01"
NAMESPACE = "bench"
SPAWNED_USER = "bench-spawner"  # KubeSpawner's user: its pod is jupyter-bench-spawner

BASELINE = "KubeSpawner.start(): plain pod Running"
PLAIN = "plain pod through the API"
KERNEL = "kernel pod: POST until running (its IP)"
ANSWERS = "kernel answers: POST until kernel_info reply"
JOB = "job pod: submit until Running"
JOB_OBJECT = "job: its Job object made"


async def until_running(core, selector: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = (await core.list_namespaced_pod(NAMESPACE, label_selector=selector)).items
        if any(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in pods):
            return
        await asyncio.sleep(POLL)
    raise TimeoutError(f"no Running pod for {selector} in {timeout:.0f} s")


async def until_secret(core, name: str, timeout: float = 60.0) -> bool:
    """Until the Secret exists (the kubelet mounts it before it starts the container); whether it
    was not there at first."""
    from kubernetes_asyncio.client.exceptions import ApiException

    deadline, missing = time.monotonic() + timeout, False
    while time.monotonic() < deadline:
        try:
            await core.read_namespaced_secret(name, NAMESPACE)
            return missing
        except ApiException as err:
            if err.status != 404:
                raise
        missing = True
        await asyncio.sleep(POLL)
    raise TimeoutError(f"no Secret {name} after {timeout:.0f} s")


async def until_none(core, selector: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (await core.list_namespaced_pod(NAMESPACE, label_selector=selector)).items:
            return
        await asyncio.sleep(POLL)
    raise TimeoutError(f"pods for {selector} still there after {timeout:.0f} s")


def on_an_l4(pod) -> bool:
    return pod.spec.node_name == NODE and pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"


def kube_spawner():
    """jupyterhub-kubespawner's KubeSpawner as a hub would configure it for a GPU server on this
    cluster ($KUBECONFIG), with the user and hub objects a hub gives it (no hub runs: start() and
    stop() only talk to the API server)."""
    from kubespawner import KubeSpawner

    spawner = KubeSpawner(
        user=SimpleNamespace(name=SPAWNED_USER, id=1, url=f"/user/{SPAWNED_USER}/"),
        hub=SimpleNamespace(public_host="", url="http://hub:8081/hub/", base_url="/hub/",
                            api_url="http://hub:8081/hub/api"),
        namespace=NAMESPACE, image=IMAGE, extra_resource_limits=L4,
        node_selector={"kubernetes.io/hostname": NODE}, start_timeout=60, http_timeout=5)
    spawner.api_token = "unused-no-hub-runs"
    return spawner


def kernel_request(kernel_id: str, service, home: Path, ports: list[int]) -> dict:
    """The body server/provisioner.py's launch_kernel sends for a GPU kernelspec's kernel of alice's
    default server (the kernelspec's argv, the %gpu extension added, the GPUALLOC_ env)."""
    from jupyter_gpualloc.core.holders import kernel_holder

    names = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
    return {"spec": WHOLE_L4, "server": "server", "priority": "interactive",
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}", "--ext=jupyter_gpualloc"],
            "env": {"GPUALLOC_URL": service.root_url, "GPUALLOC_TOKEN": ALICE,
                    "GPUALLOC_HOLDER": kernel_holder(kernel_id)},
            "workdir": str(home),
            "connection": {"key": uuid.uuid4().hex, "signature_scheme": "hmac-sha256", **dict(zip(names, ports))}}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


async def kernel_info_reply(connection: dict, ip: str, timeout: float = 60.0) -> None:
    """A kernel_info request to the kernel at `ip` (sent at once: ZeroMQ holds it until the kernel
    listens), and its reply."""
    from jupyter_client.asynchronous import AsyncKernelClient

    kc = AsyncKernelClient()
    kc.load_connection_info({**connection, "ip": ip, "transport": "tcp"})
    kc.start_channels(iopub=False, stdin=False, hb=False, control=False)
    try:
        reply = await kc.kernel_info(reply=True, timeout=timeout)
        assert reply["content"]["status"] == "ok", reply
    finally:
        kc.stop_channels()


async def measure(runs: int, kubeconfig: str, service, home: Path) -> tuple[dict[str, list[float]], int]:
    """Each row's times, and in how many runs the kernel pod was reported running before its
    Secret was there."""
    from kubernetes_asyncio import client, config
    from kubespawner import KubeSpawner

    from tests.k8s.test_job_pods import JOB_LABEL, cell_job, server_pod
    from tests.k8s.test_kernel_pods import KERNEL_LABEL, play_the_kubelet

    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    times: dict[str, list[float]] = {name: [] for name in (BASELINE, PLAIN, KERNEL, ANSWERS, JOB, JOB_OBJECT)}
    late_secrets = 0  # runs whose kernel pod ran before its Secret was there
    async with client.ApiClient(configuration) as api:
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        await core.create_namespace({"metadata": {"name": NAMESPACE}})
        while not any(a.metadata.name == "default" for a in (await core.list_namespaced_service_account(NAMESPACE)).items):
            await asyncio.sleep(0.1)
        await core.create_namespaced_pod(NAMESPACE, server_pod(service, "alice", home))
        await until_running(core, "component=singleuser-server,hub.jupyter.org/username=alice")
        await asyncio.sleep(1)  # the service's watch has seen it
        spawner = kube_spawner()

        async def one_round(record: bool) -> None:
            nonlocal late_secrets

            def took(row: str, started: float) -> None:
                if record:
                    times[row].append(time.perf_counter() - started)

            # KubeSpawner
            started = time.perf_counter()
            url = await spawner.start()
            took(BASELINE, started)
            made = await core.read_namespaced_pod(spawner.pod_name, NAMESPACE)
            assert on_an_l4(made) and url == f"http://{made.status.pod_ip}:8888", (url, made.spec)
            await spawner.stop(now=True)

            # plain pod through the API
            name = f"plain-{uuid.uuid4().hex[:6]}"
            pod = {"metadata": {"name": name, "labels": {"bench": name}},
                   "spec": {"automountServiceAccountToken": False, "nodeSelector": {"kubernetes.io/hostname": NODE},
                            "containers": [{"name": "notebook", "image": IMAGE,
                                            "resources": {"limits": L4, "requests": L4}}]}}
            started = time.perf_counter()
            await core.create_namespaced_pod(NAMESPACE, pod)
            await until_running(core, f"bench={name}")
            took(PLAIN, started)
            await core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            await until_none(core, f"bench={name}")

            # kernel pod, and the kernel answering there
            kernel_id = str(uuid.uuid4())
            request = kernel_request(kernel_id, service, home, free_ports(5))
            process = None
            started = time.perf_counter()
            reply = await asyncio.to_thread(service.call, "POST", f"kernels/{kernel_id}/pod", request, ALICE)
            assert reply.status == 201, reply
            view = reply.json()
            try:
                while view["state"] != "running":
                    assert view["state"] in ("queued", "starting"), view
                    await asyncio.sleep(POLL)
                    view = (await asyncio.to_thread(service.call, "GET", f"kernels/{kernel_id}/pod", None,
                                                    ALICE)).json()
                took(KERNEL, started)
                if await until_secret(core, view["pod"].partition("/")[2]) and record:
                    late_secrets += 1
                pod, process = await play_the_kubelet(api, NAMESPACE, kernel_id, home / "kernel.log")
                assert on_an_l4(pod), pod.spec
                await kernel_info_reply(request["connection"], view["ip"])
                took(ANSWERS, started)
            finally:
                if process is not None:  # the pod's end ends its process
                    process.kill()
                    process.wait(10)
                assert (await asyncio.to_thread(service.call, "DELETE", f"kernels/{kernel_id}/pod", None,
                                                ALICE)).status == 200
            await until_none(core, f"{KERNEL_LABEL}={kernel_id}")

            # job pod
            started = time.perf_counter()
            reply = await asyncio.to_thread(service.call, "POST", "jobs", cell_job(home, "1", WHOLE_L4), ALICE)
            assert reply.status == 201, reply
            job_id = reply.json()["id"]
            while not (await batch.list_namespaced_job(NAMESPACE, label_selector=f"{JOB_LABEL}={job_id}")).items:
                await asyncio.sleep(POLL)
            took(JOB_OBJECT, started)
            await until_running(core, f"{JOB_LABEL}={job_id}")
            took(JOB, started)
            assert (await asyncio.to_thread(service.call, "DELETE", f"jobs/{job_id}", None, ALICE)).status == 200
            await until_none(core, f"{JOB_LABEL}={job_id}")

        try:
            await one_round(record=False)
            for run in range(runs):
                await one_round(record=True)
                print(f"run {run + 1}: " + ", ".join(f"{row.split(':')[0]} {times[row][-1] * 1000:.0f} ms"
                                                     for row in (BASELINE, PLAIN, KERNEL, ANSWERS, JOB)),
                      file=sys.stderr)
        finally:
            await KubeSpawner._stop_all_reflectors()
    return times, late_secrets


def table(times: dict[str, list[float]], late_secrets: int) -> str:
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    baseline = statistics.median(times[BASELINE])
    lines = ["| start | runs | p50 ms | p90 ms | max ms | p50 / KubeSpawner p50 |",
             "|---|---:|---:|---:|---:|---:|"]
    for kind, values in times.items():
        lines.append(f"| {kind} | {len(values)} | {statistics.median(values) * 1000:.0f} | {p(values, 0.9):.0f} | "
                     f"{max(values) * 1000:.0f} | {statistics.median(values) / baseline:.2f} |")
    lines += ["", f"The kernel pod's Secret was not there yet when the pod was reported running in "
                  f"{late_secrets} of {len(times[KERNEL])} runs (kwok does not wait for it, a kubelet would)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    if not BINARY.exists():
        print(f"{BINARY} is not built: run `make k8s-build` first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        os.environ["KUBECONFIG"] = str(workdir / "k8s" / "kubeconfig")  # KubeSpawner's cluster
        from tests.k8s.test_job_pods import JobPodService

        control_plane = ControlPlane(workdir / "k8s").start()
        service = None
        try:
            service = JobPodService(workdir / "service", str(control_plane.kubeconfig),
                                    "c.GpuAllocService.kernel_pods = True\n", namespace=NAMESPACE).start()
            home = workdir / "home"
            home.mkdir()
            times, late_secrets = asyncio.run(measure(args.runs, str(control_plane.kubeconfig), service, home))
        finally:
            if service is not None:
                service.kill()
            control_plane.stop()
    text = table(times, late_secrets)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
