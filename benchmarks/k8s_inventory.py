"""The kubernetes backend's view of a large cluster, on the real local control plane.

    python benchmarks/k8s_inventory.py [--nodes 1000] [--pods 2000] [--plain-pods 0] [--changes 100] [--ops 300]
                                       [--out FILE] [--profile]

Needs the control plane built (`make k8s-build`). It starts one with --nodes kwok nodes of 8 GPUs
each, a third of each kind (whole A100-80GB; H100 under MIG all-balanced, mixed strategy;
L4 time-sliced x4), creates --pods GPU pods the allocator did not place (bound directly to
nodes, one device each, spread over the kinds) and --plain-pods pods without GPUs (a web app's
pod: labels, annotations, env, ports, volumes; bound directly too), then runs the service's parts in this process
(store on a SQLite file, the scheduler, ClusterReconciler with its watch) and measures:

- start-up: from opening the core (listing the nodes) to a full view (nodes and pods applied), and
  this process's CPU seconds in it: the service's own work, which the control plane's load on the
  same cores does not add to (in a cluster the API server runs elsewhere);
- from a change written to the API server to the scheduler's call for it: a foreign pod created
  (bound) and a node cordoned or uncordoned, --changes of each, p50 and p99;
- the process's resident memory (RSS) with the full view, and the watch's pod cache: its size
  (every object it holds, counted once) beside the size of every pod as the API returns them,
  what the cache held before it kept only what is read (the RSS with those held too is shown);
- decision latency: a shared `submit` then its `release`, --ops of each, p50 and p99, with the
  watch running, beside the same on the simulated backend over the same nodes in the same run
  (the ratio is what the watch and the cluster's size cost a decision).

Prints a markdown table (and writes it to --out when given).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core_memory import rss_mib  # noqa: E402  (this folder is on sys.path when run as a script)

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend  # noqa: E402
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend  # noqa: E402
from jupyter_gpualloc.core.model import SliceKind, SliceSpec  # noqa: E402
from jupyter_gpualloc.core.policy import SchedulerPolicy  # noqa: E402
from jupyter_gpualloc.core.store import Store, sqlite_url  # noqa: E402
from jupyter_gpualloc.core.wiring import open_core  # noqa: E402
from jupyter_gpualloc.service.cluster import ClusterReconciler  # noqa: E402
from tests.k8s.controlplane import BINARY, ControlPlane  # noqa: E402

KINDS = ("a100", "h100mig", "l4ts")
DEVICE = {"a100": "nvidia.com/gpu", "h100mig": "nvidia.com/mig-1g.10gb", "l4ts": "nvidia.com/gpu"}


def node_entry(i: int) -> dict:
    """One 8-GPU node of kind i % 3, with the labels and resources GFD and the device plugin give it."""
    kind = KINDS[i % 3]
    common = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8"}
    if kind == "a100":
        labels = {**common, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
                  "nvidia.com/gpu.replicas": "1", "nvidia.com/mig.strategy": "mixed"}
        resources = {"nvidia.com/gpu": "8"}
    elif kind == "h100mig":
        labels = {**common, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
                  "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config": "all-balanced",
                  "nvidia.com/mig.config.state": "success"}
        resources = {"nvidia.com/mig-1g.10gb": "16", "nvidia.com/mig-2g.20gb": "8", "nvidia.com/mig-3g.40gb": "8"}
    else:
        labels = {**common, "nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.memory": "23034",
                  "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
        resources = {"nvidia.com/gpu": "32"}
    return {"name": f"gpu-{kind}-{i:04d}", "cpu_milli": 96000, "memory_mib": 1048576, "labels": labels,
            "resources": resources}


def pod(i: int, nodes: int) -> dict:
    """A foreign GPU pod bound to node i % nodes, holding one device of it."""
    node = node_entry(i % nodes)
    resource = DEVICE[KINDS[(i % nodes) % 3]]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"train-{i}"},
            "spec": {"nodeName": node["name"], "automountServiceAccountToken": False,
                     "containers": [{"name": "main", "image": "train:1",
                                     "resources": {"limits": {resource: "1"}, "requests": {resource: "1"}}}]}}


def plain_pod(i: int, nodes: int) -> dict:
    """A pod without GPUs bound to node i % nodes, as a web app's Deployment makes one."""
    app = f"web-{i % 40}"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{app}-{i:06d}", "labels": {"app": app, "pod-template-hash": "5d8f7c9b6d",
                                                              "team": "platform", "tier": "frontend"},
                         "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9100"}},
            "spec": {"nodeName": node_entry(i % nodes)["name"], "automountServiceAccountToken": False,
                     "containers": [{"name": "app", "image": f"registry.example.org/{app}:1.4.2",
                                     "ports": [{"containerPort": 8080, "name": "http"}],
                                     "env": [{"name": f"SETTING_{k}", "value": f"value-{k}-{i % 7}"} for k in range(8)],
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                                   "limits": {"memory": "256Mi"}},
                                     "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
                     "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}}]}}


def deep_size(obj, seen: set | None = None) -> int:
    """Bytes of `obj` and everything it holds (dicts, lists, strings, ...), each object counted once."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, dict):
        size += sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set)):
        size += sum(deep_size(v, seen) for v in obj)
    return size


def percentiles(values: list[float]) -> tuple[float, float]:
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


class Timed:
    """Wraps the reconciler's listener calls to note when each change reached the scheduler."""

    def __init__(self, reconciler: ClusterReconciler):
        self.seen: dict[str, float] = {}
        outside, nodes = reconciler.outside_use, reconciler.nodes_changed

        def outside_use(key, use):
            outside(key, use)
            self.seen[key] = time.perf_counter()

        def nodes_changed(new, names=None):
            nodes(new, names)
            self.seen["nodes"] = time.perf_counter()

        reconciler.outside_use, reconciler.nodes_changed = outside_use, nodes_changed

    async def wait(self, key: str, since: float, timeout: float = 60) -> float:
        deadline = time.perf_counter() + timeout
        while self.seen.get(key, 0) < since:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{key} never reached the scheduler")
            await asyncio.sleep(0.0005)
        return self.seen[key] - since


async def create_pods(core_api, count: int, nodes: int, make=None) -> None:
    for start in range(0, count, 50):
        await asyncio.gather(*(core_api.create_namespaced_pod("default", (make or pod)(i, nodes))
                               for i in range(start, min(start + 50, count))))


def decisions(scheduler, ops: int, now: float) -> tuple[list[float], list[float]]:
    spec = SliceSpec(kind=SliceKind.SHARED, memory_mib=4096, model="L4")  # the time-sliced L4s share
    submits, releases = [], []
    for i in range(ops):
        t = time.perf_counter()
        lease = scheduler.submit(f"user{i % 50}", f"server:bench-{i}", spec, now=now + i)
        submits.append(time.perf_counter() - t)
        t = time.perf_counter()
        scheduler.release(lease.id, now=now + i, holder_gone=True)
        releases.append(time.perf_counter() - t)
    return submits, releases


async def measure(args, control_plane: ControlPlane, workdir: Path) -> dict:
    from kubernetes_asyncio import client, config

    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)
    out: dict = {}
    async with client.ApiClient(configuration) as api:
        core_api = client.CoreV1Api(api)
        started = time.perf_counter()
        await create_pods(core_api, args.pods, args.nodes)
        await create_pods(core_api, args.plain_pods, args.nodes, plain_pod)
        out["pods_created_s"] = time.perf_counter() - started

        policy = SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9)
        store = Store(sqlite_url(str(workdir / "k8s.sqlite")))
        backend = KubernetesBackend.from_cluster(kubeconfig=str(control_plane.kubeconfig))
        profile = cProfile.Profile() if args.profile else None
        if profile:
            profile.enable()
        started, started_cpu = time.perf_counter(), time.process_time()
        core = open_core(backend, store, policy, now=time.time())  # lists the nodes (blocking, as the service does)
        out["core_s"] = time.perf_counter() - started
        reconciler = ClusterReconciler(core.scheduler, backend, namespace="default", instance="default.gpualloc",
                                       kubeconfig=str(control_plane.kubeconfig))
        timed = Timed(reconciler)
        await reconciler.start(sync_timeout=600)
        out["startup_s"] = time.perf_counter() - started
        # the service's own CPU in that time (every thread of this process, none of the control plane's)
        out["startup_cpu_s"] = time.process_time() - started_cpu
        if profile:
            profile.disable()
            stats = io.StringIO()
            pstats.Stats(profile, stream=stats).sort_stats("cumulative").print_stats(40)
            print(stats.getvalue(), file=sys.stderr)
        out["rss_mib"] = rss_mib()
        cache = reconciler.watch._resources[1].objects
        out["cache_pods"], out["cache_mib"] = len(cache), deep_size(cache) / 2**20
        listed = await (await core_api.list_pod_for_all_namespaces(_preload_content=False)).json()
        full = {f"pod:{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in listed["items"]}
        out["full_pods"], out["full_mib"] = len(full), deep_size(full) / 2**20
        out["rss_full_mib"] = rss_mib()
        del listed, full
        inventory = core.scheduler.inventory()
        out["gpus"] = sum(len(n["gpus"]) for n in inventory["nodes"])
        out["outside"] = sum(1 for n in inventory["nodes"] for g in n["gpus"]
                             for h in g.get("shares", []) + g.get("instances", []) if h.get("outside"))

        pod_latency = []
        for i in range(args.changes):
            body = pod(args.pods + i, args.nodes)
            t = time.perf_counter()
            await core_api.create_namespaced_pod("default", body)
            pod_latency.append(await timed.wait(f"pod:default/{body['metadata']['name']}", t))
        node_latency = []
        for i in range(args.changes):
            name = node_entry(i // 2 % args.nodes)["name"]  # cordoned, then uncordoned
            t = time.perf_counter()
            await core_api.patch_node(name, {"spec": {"unschedulable": i % 2 == 0}})
            node_latency.append(await timed.wait("nodes", t))
        out["pod_change"], out["node_change"] = percentiles(pod_latency), percentiles(node_latency)

        out["watch_decisions"] = decisions(core.scheduler, args.ops, time.time())
        simulated = SimulatedBackend(KubernetesBackend.from_cluster(
            kubeconfig=str(control_plane.kubeconfig)).discover())
        plain = open_core(simulated, Store(sqlite_url(str(workdir / "sim.sqlite"))), policy, now=time.time())
        out["simulated_decisions"] = decisions(plain.scheduler, args.ops, time.time())
        await reconciler.close()
        core.close()
        plain.close()
    return out


def table(args, out: dict) -> str:
    ws, wr = (percentiles(v) for v in out["watch_decisions"])
    ss, sr = (percentiles(v) for v in out["simulated_decisions"])
    ms = 1000
    rows = [
        ("nodes x GPUs, foreign pods", f"{args.nodes} x 8 = {out['gpus']} GPUs, {args.pods} GPU pods "
                                       f"({out['outside']} devices held outside), {args.plain_pods} pods without GPUs"),
        ("start-up to a full view", f"{out['startup_s']:.1f} s, {out['core_s']:.1f} s of it opening the core "
                                    f"(pods created in {out['pods_created_s']:.0f} s before)"),
        ("the service's CPU in the start-up", f"{out['startup_cpu_s']:.1f} s (the rest of the start-up waited for "
                                              f"the API server, on the same cores here)"),
        ("pod created -> scheduler, p50 / p99", f"{out['pod_change'][0] * ms:.1f} / {out['pod_change'][1] * ms:.1f} ms"),
        ("node cordoned -> scheduler, p50 / p99", f"{out['node_change'][0] * ms:.1f} / {out['node_change'][1] * ms:.1f} ms"),
        ("service RSS with the full view", f"{out['rss_mib']:.0f} MiB"),
        ("the watch's pod cache", f"{out['cache_pods']} pods held, {out['cache_mib']:.1f} MiB"),
        ("every pod as the API returns them (the cache before)",
         f"{out['full_pods']} pods, {out['full_mib']:.1f} MiB (RSS with them held too: {out['rss_full_mib']:.0f} MiB)"),
        ("submit p50 / p99: watch vs simulated", f"{ws[0] * ms:.2f} / {ws[1] * ms:.2f} ms vs {ss[0] * ms:.2f} / "
                                                  f"{ss[1] * ms:.2f} ms (p50 x{ws[0] / ss[0]:.2f})"),
        ("release p50 / p99: watch vs simulated", f"{wr[0] * ms:.2f} / {wr[1] * ms:.2f} ms vs {sr[0] * ms:.2f} / "
                                                   f"{sr[1] * ms:.2f} ms (p50 x{wr[0] / sr[0]:.2f})"),
    ]
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--plain-pods", type=int, default=0)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--out")
    parser.add_argument("--profile", action="store_true", help="print the start-up's top frames (cProfile)")
    args = parser.parse_args()
    if not BINARY.exists():
        print(f"{BINARY} is not built: run `make k8s-build` first", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        fleet = workdir / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"nodes": [node_entry(i) for i in range(args.nodes)]}))
        control_plane = ControlPlane(workdir / "k8s", fleet=fleet)
        started = time.perf_counter()
        control_plane.start(timeout=900)
        print(f"control plane with {args.nodes} nodes ready in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        try:
            out = asyncio.run(measure(args, control_plane, workdir))
        finally:
            control_plane.stop()
    text = table(args, out)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
