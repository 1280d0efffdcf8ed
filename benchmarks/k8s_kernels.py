"""From a job's submit to its Kubernetes Job's pod Running, beside a plain pod, on the local control plane.

    python benchmarks/k8s_kernels.py [--runs 20] [--out FILE]

Needs the control plane built (`make k8s-build`). It starts one with the demo fleet
(examples/fleets/k8s-demo.yaml), the service as a process (--backend kubernetes,
c.GpuAllocService.job_pods on, SQLite) and a user's CPU-only server pod as KubeSpawner makes it,
then alternates, --runs times each:

- plain pod: what KubeSpawner does to start a server, one pod with a whole L4 (`nvidia.com/gpu: 1`)
  and node affinity created through the API, until the API server says it is Running (bound by
  kube-scheduler, started by kwok);
- job pod: `POST /api/v1/jobs` for a whole L4, until its Kubernetes Job's pod is Running (and,
  on a row of its own, until the Job object exists): the service queues and grants the lease,
  copies the server pod, creates the Job and its Secret, then the Job controller, kube-scheduler
  and kwok do their part.

Both are polled every 10 ms from this process. The difference is what the allocator adds to
a pod start (the service's grant and its two API writes, and the Job controller's turn). kwok
starts a pod without a process, so neither includes pulling an image or starting a container;
a real cluster adds the same to both. Prints a markdown table (and writes it to --out when given).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.k8s.controlplane import BINARY, ControlPlane  # noqa: E402
from tests.k8s.test_job_pods import JOB_LABEL, JobPodService, cell_job, server_pod  # noqa: E402
from tests.service.conftest import ALICE  # noqa: E402

POLL = 0.01
L4 = {"nvidia.com/gpu": "1"}


async def until_running(core, namespace: str, selector: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = (await core.list_namespaced_pod(namespace, label_selector=selector)).items
        if any(p.status.phase == "Running" and not p.metadata.deletion_timestamp for p in pods):
            return
        await asyncio.sleep(POLL)
    raise TimeoutError(f"no Running pod for {selector} in {timeout:.0f} s")


async def until_none(core, namespace: str, selector: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not (await core.list_namespaced_pod(namespace, label_selector=selector)).items:
            return
        await asyncio.sleep(POLL)
    raise TimeoutError(f"pods for {selector} still there after {timeout:.0f} s")


async def measure(runs: int, kubeconfig: str, service: JobPodService, home: Path) -> dict[str, list[float]]:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    times: dict[str, list[float]] = {"plain pod": [], "job pod": []}
    async with client.ApiClient(configuration) as api:
        core = client.CoreV1Api(api)
        namespace = "bench"
        await core.create_namespace({"metadata": {"name": namespace}})
        while not any(a.metadata.name == "default" for a in (await core.list_namespaced_service_account(namespace)).items):
            await asyncio.sleep(0.1)
        await core.create_namespaced_pod(namespace, server_pod(service, "alice", home))
        await until_running(core, namespace, "component=singleuser-server")
        await asyncio.sleep(1)  # the service's watch has seen it
        for run in range(runs):
            # plain pod
            name = f"plain-{uuid.uuid4().hex[:6]}"
            pod = {"metadata": {"name": name, "labels": {"bench": name}, "annotations": {"gpualloc.test/phase": "Running"}},
                   "spec": {"automountServiceAccountToken": False,
                            "containers": [{"name": "notebook", "image": "quay.io/jupyter/base-notebook:2025-01-01",
                                            "resources": {"limits": L4, "requests": L4}}],
                            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{"matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gpu-l4-1"]}]}]}}},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
            started = time.perf_counter()
            await core.create_namespaced_pod(namespace, pod)
            await until_running(core, namespace, f"bench={name}")
            times["plain pod"].append(time.perf_counter() - started)
            await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            await until_none(core, namespace, f"bench={name}")
            # job pod
            started = time.perf_counter()
            reply = await asyncio.to_thread(service.call, "POST", "jobs",
                                            cell_job(home, "1", {"kind": "whole", "node": "gpu-l4-1"}), ALICE)
            assert reply.status == 201, reply
            job_id = reply.json()["id"]
            batch = client.BatchV1Api(api)
            while not (await batch.list_namespaced_job(namespace, label_selector=f"{JOB_LABEL}={job_id}")).items:
                await asyncio.sleep(POLL)
            times.setdefault("job: its Job object made", []).append(time.perf_counter() - started)
            await until_running(core, namespace, f"{JOB_LABEL}={job_id}")
            times["job pod"].append(time.perf_counter() - started)
            assert (await asyncio.to_thread(service.call, "DELETE", f"jobs/{job_id}", None, ALICE)).status == 200
            await until_none(core, namespace, f"{JOB_LABEL}={job_id}")
            print(f"run {run + 1}: plain {times['plain pod'][-1] * 1000:.0f} ms, job {times['job pod'][-1] * 1000:.0f} ms",
                  file=sys.stderr)
    return times


def table(times: dict[str, list[float]]) -> str:
    def p(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    plain = statistics.median(times["plain pod"])
    lines = ["| start | runs | p50 ms | p90 ms | max ms | p50 / plain pod p50 |", "|---|---:|---:|---:|---:|---:|"]
    for kind, values in times.items():
        lines.append(f"| {kind} | {len(values)} | {statistics.median(values) * 1000:.0f} | {p(values, 0.9):.0f} | "
                     f"{max(values) * 1000:.0f} | {statistics.median(values) / plain:.2f} |")
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
        control_plane = ControlPlane(workdir / "k8s").start()
        service = None
        try:
            service = JobPodService(workdir / "service", str(control_plane.kubeconfig)).start()
            home = workdir / "home"
            home.mkdir()
            times = asyncio.run(measure(args.runs, str(control_plane.kubeconfig), service, home))
        finally:
            if service is not None:
                service.kill()
            control_plane.stop()
    text = table(times)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
