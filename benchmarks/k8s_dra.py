"""Dynamic MIG through DRA on the local control plane: the kube-scheduler's own allocation against the
service's, on the request streams of benchmarks/mig_packing.py.

Each stream (arrival-only, drawn until it asks 1.5x the GPUs' compute slices; mixes `uniform` and
`openb`) is placed on a kwok node of its own whose 8 A100-SXM4-40GB GPUs NVIDIA's DRA driver
publishes with DynamicMIG (the slices of tests/core/devices/dra_slices.py), one request at a time, a
request's pod waited for until it is bound or refused:

* `kube-scheduler`: a ResourceClaim naming only the profile (device class `mig.nvidia.com`, a CEL
  selector on `profile`) and a pod using it, pinned to the node; the kube-scheduler allocates the
  claim (first fit, in device-name order) and binds the pod, or says it is unschedulable.
* `service`: the core (as the service runs it: the cluster watch, the reconciler's claims) grants a
  lease for the profile on the node, writes the claim and its allocation (the partition its MIG
  placer chose), then the pod; the kube-scheduler only binds it. A request the core cannot place
  at once is withdrawn.

Score: compute slices placed, over the clairvoyant bound of mig_packing.py (exact); beside them the
simulated replay of the same stream by the default placer. Pods per second: requests answered
(bound or refused) over the stream's wall time. Run ``python benchmarks/k8s_dra.py`` (needs the
control plane, `make k8s-build`); it writes docs/benchmarks/k8s_dra.md. ``--streams`` sets the
streams per mix.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.mig_packing import (  # noqa: E402
    MIXES, PROFILES, SEED, _mix_weights, clairvoyant_bound, make_stream, run_online)
from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend  # noqa: E402
from jupyter_gpualloc.core.mig import get_mig_placer  # noqa: E402
from jupyter_gpualloc.core.model import LeaseState, SliceKind, SliceSpec  # noqa: E402
from jupyter_gpualloc.core.policy import SchedulerPolicy  # noqa: E402
from jupyter_gpualloc.core.store import Store, sqlite_url  # noqa: E402
from jupyter_gpualloc.core.wiring import open_core  # noqa: E402
from jupyter_gpualloc.service.cluster import ClusterReconciler  # noqa: E402
from tests.core.devices.dra_slices import dynamic_mig  # noqa: E402
from tests.k8s.controlplane import BINARY, ControlPlane  # noqa: E402

MODEL = "A100-SXM4-40GB"
GPUS = 8
OUT = ROOT / "docs" / "benchmarks" / "k8s_dra.md"
NAMESPACE = "bench"


def node_object(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
                         "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {}, "status": {"allocatable": {"cpu": "256", "memory": "2Ti", "pods": "500"},
                                   "capacity": {"cpu": "256", "memory": "2Ti", "pods": "500"}}}


def pod(name: str, node: str, claim: str, labels: dict | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"automountServiceAccountToken": False,
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
                     "containers": [{"name": "main", "image": "python:3.12-slim", "command": ["sleep", "infinity"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


async def publish(api, node: str) -> None:
    from kubernetes_asyncio import client
    await client.CoreV1Api(api).create_node(node_object(node))
    for body in dynamic_mig(node, MODEL, GPUS):
        await client.ResourceV1Api(api).create_resource_slice(body)


async def settled(core, namespace: str, name: str, timeout: float = 30.0) -> bool:
    """Whether the pod was bound (True) or found unschedulable (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = await core.read_namespaced_pod(name, namespace)
        if p.spec.node_name:
            return True
        if any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in p.status.conditions or []):
            return False
        await asyncio.sleep(0.02)
    raise TimeoutError(f"pod {namespace}/{name} neither bound nor refused in {timeout} s")


async def by_kube_scheduler(api, stream: list[int], node: str) -> tuple[int, float]:
    """Compute slices placed and seconds taken, the kube-scheduler allocating each claim."""
    from kubernetes_asyncio import client
    core, resource = client.CoreV1Api(api), client.ResourceV1Api(api)
    placed, started = 0, time.perf_counter()
    for n, pid in enumerate(stream):
        profile = PROFILES[pid]
        name = f"{node}-{n}"
        await resource.create_namespaced_resource_claim(NAMESPACE, {"metadata": {"name": name}, "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com", "selectors": [{"cel": {
                "expression": f"device.attributes['gpu.nvidia.com'].profile == '{profile.name}'"}}]}}]}}})
        await core.create_namespaced_pod(NAMESPACE, pod(name, node, name))
        if await settled(core, NAMESPACE, name):
            placed += profile.compute_slices
        else:  # arrival-only: a request not placed at once is lost
            await core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
            await resource.delete_namespaced_resource_claim(name, NAMESPACE)
    return placed, time.perf_counter() - started


async def by_service(api, reconciler: ClusterReconciler, stream: list[int], node: str) -> tuple[int, float]:
    """Compute slices placed and seconds taken, the core placing and the service allocating each claim."""
    from kubernetes_asyncio import client
    core = client.CoreV1Api(api)
    scheduler = reconciler.scheduler
    placed, started = 0, time.perf_counter()
    for n, pid in enumerate(stream):
        profile = PROFILES[pid]
        lease = scheduler.submit("bench", f"server:b{uuid.uuid4().hex[:12]}", SliceSpec(
            kind=SliceKind.MIG, profile=profile.name, model=MODEL, node=node), now=time.time())
        if lease.state is not LeaseState.GRANTED:
            scheduler.release(lease.id, now=time.time(), reason="arrival-only: not placed at once", holder_gone=True)
            continue
        claim = await reconciler.claims.ensure(lease.to_json(), NAMESPACE)
        name = f"{node}-{n}"
        await core.create_namespaced_pod(NAMESPACE, pod(name, node, claim, reconciler.watch.pod_labels(lease.id)))
        if not await settled(core, NAMESPACE, name):
            raise AssertionError(f"the kube-scheduler refused pod {name}, whose claim the service allocated")
        placed += profile.compute_slices
    return placed, time.perf_counter() - started


async def run(streams: dict[str, list[list[int]]], kubeconfig: str, workdir: Path) -> list[dict]:
    from kubernetes_asyncio import client, config
    configuration = client.Configuration()
    await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration) as api:
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
        while not any(a.metadata.name == "default" for a in
                      (await client.CoreV1Api(api).list_namespaced_service_account(NAMESPACE)).items):
            await asyncio.sleep(0.1)
        for name, kind in {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}.items():
            await client.ResourceV1Api(api).create_device_class({"metadata": {"name": name}, "spec": {"selectors": [
                {"cel": {"expression": f"device.driver == 'gpu.nvidia.com' && "
                                       f"device.attributes['gpu.nvidia.com'].type == '{kind}'"}}]}})
        nodes = [(mix, i) for mix in streams for i in range(len(streams[mix]))]
        for mix, i in nodes:
            await publish(api, f"ks-{mix}-{i}")
            await publish(api, f"svc-{mix}-{i}")
        backend = KubernetesBackend.from_cluster(kubeconfig=kubeconfig)
        core = open_core(backend, Store(sqlite_url(str(workdir / "bench.sqlite"))),
                         SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9), now=time.time())
        reconciler = ClusterReconciler(core.scheduler, backend, namespace=NAMESPACE, instance="bench.gpualloc",
                                       kubeconfig=kubeconfig)
        await reconciler.start()
        rows = []
        try:
            for mix, i in nodes:
                stream = streams[mix][i]
                ks, ks_s = await by_kube_scheduler(api, stream, f"ks-{mix}-{i}")
                svc, svc_s = await by_service(api, reconciler, stream, f"svc-{mix}-{i}")
                rows.append({"mix": mix, "index": i, "requests": len(stream), "kube-scheduler": ks,
                             "kube-scheduler_s": ks_s, "service": svc, "service_s": svc_s})
                print(rows[-1], flush=True)
        finally:
            await reconciler.close()
            core.close()
        return rows


def report(rows: list[dict], wall: float) -> str:
    lines = ["# Dynamic MIG through DRA: the kube-scheduler's allocation against the service's", "",
             f"Generated by `python benchmarks/k8s_dra.py --streams {1 + max(r['index'] for r in rows)}` in "
             f"{wall:.0f} s on the local control plane "
             f"(kube-scheduler 1.36.3, kwok), {GPUS} x {MODEL} per node (DynamicMIG slices as NVIDIA's DRA "
             "driver publishes them), one node per stream and path. Method: the module's docstring.", "",
             "| mix | streams | requests | clairvoyant bound (compute slices) | replay, default placer | "
             "replay, one default placer through every stream | replay, first fit | service on the control plane "
             "| kube-scheduler | service / bound | kube-scheduler / bound | lead (points of the bound) | "
             "pods/s, service | pods/s, kube-scheduler |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mix in dict.fromkeys(r["mix"] for r in rows):
        sel = [r for r in rows if r["mix"] == mix]
        total = {k: sum(r[k] for r in sel)
                 for k in ("requests", "bound", "replay", "carried", "firstfit", "service", "kube-scheduler")}
        rate = {k: sum(r["requests"] for r in sel) / sum(r[f"{k}_s"] for r in sel) for k in ("service", "kube-scheduler")}
        lead = 100 * (total["service"] - total["kube-scheduler"]) / total["bound"]
        lines.append(f"| {mix} | {len(sel)} | {total['requests']} | {total['bound']} | {total['replay']} | "
                     f"{total['carried']} | {total['firstfit']} | {total['service']} | {total['kube-scheduler']} | "
                     f"{total['service'] / total['bound']:.3f} | {total['kube-scheduler'] / total['bound']:.3f} | "
                     f"{lead:.1f} | {rate['service']:.1f} | {rate['kube-scheduler']:.1f} |")
    same_service = sum(r["service"] == r["carried"] for r in rows)
    same_kube = sum(r["kube-scheduler"] == r["firstfit"] for r in rows)
    lines += ["", f"Streams on which the service placed exactly what the simulated default placer places when one "
              f"placer takes every stream in the service's order (as the service's one core does, learning the "
              f"mix as it goes): {same_service} of {len(rows)}; on which the kube-scheduler placed exactly what "
              f"the simulated first fit (`mig_packing.py`'s `firstfit`) places: {same_kube} of {len(rows)}. "
              "`replay, default placer` starts a placer afresh for each stream, as `mig_packing.py` does. Where "
              "both checks hold on every stream, each path on the control plane places what its simulation "
              "places, stream by stream, and the lead is the simulated one.",
              "", "Pods per second are of one request at a time, each waited for until bound or refused (the "
              "round trips, not either allocator's throughput), on a shared 2-core machine: compare the two "
              "paths of one run only. The service's path reads the claim's node again at each claim (a "
              "claim's partition is an instance of its GPU).",
              "", "Per stream:", "",
              "| mix | stream | requests | bound | replay | replay, one placer | replay, first fit | service | "
              "kube-scheduler |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mix']} | {r['index']} | {r['requests']} | {r['bound']} | {r['replay']} | {r['carried']} | "
              f"{r['firstfit']} | {r['service']} | {r['kube-scheduler']} |" for r in rows]
    return "\n".join(lines) + "\n"


def score(rows: list[dict], streams: dict[str, list[list[int]]]) -> None:
    """Each row's simulated replays (a fresh default placer, one default placer through every stream
    in the rows' order, first fit) and clairvoyant bound."""
    carried = get_mig_placer("default")  # one placer through every stream in the service's order, as its core
    for row in rows:
        stream = streams[row["mix"]][row["index"]]
        row["replay"] = run_online(get_mig_placer("default"), stream, GPUS)
        row["carried"] = run_online(carried, stream, GPUS)
        row["firstfit"] = run_online(get_mig_placer("firstfit"), stream, GPUS)
        row["bound"] = clairvoyant_bound(stream, GPUS, max(row["replay"], row["carried"], row["firstfit"],
                                                           row["service"], row["kube-scheduler"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3, help="streams per mix")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if not BINARY.exists():
        sys.exit(f"{BINARY} is not built: make k8s-build")
    started = time.perf_counter()
    streams = {mix: [make_stream(_mix_weights(mix), GPUS, (SEED, MIXES.index(mix), GPUS, i))
                     for i in range(args.streams)] for mix in MIXES}
    with tempfile.TemporaryDirectory(prefix="k8s-dra-") as tmp:
        workdir = Path(tmp)
        (workdir / "fleet.yaml").write_text(yaml.safe_dump({"nodes": [
            {"name": "cpu-1", "cpu_milli": 8000, "memory_mib": 32768, "labels": {}, "resources": {}}]}))
        with ControlPlane(workdir / "k8s", fleet=workdir / "fleet.yaml").start() as control_plane:
            rows = asyncio.run(run(streams, str(control_plane.kubeconfig), workdir))
    score(rows, streams)
    text = report(rows, time.perf_counter() - started)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
