"""What one ResourceClaim event costs the service on a fleet of DRA nodes, without a cluster.

    python benchmarks/dra_claim_event.py [--nodes 100,300,1000] [--events 20] [--out FILE]

Each node is an 8-GPU H100 under NVIDIA's DRA driver with DynamicMIG, its ResourceSlices in the
driver's exact format (every placement of every profile, with the counters; about 230 KiB of JSON a
node), versioned as an API server returns them. The Kubernetes backend reads them into the core
(`open_core`). Then, --events times, one foreign claim is allocated or deleted on one node and the
service does what its watch does on such an event: `read_named` of that node alone (its slices and
the claims on it, as the watch indexes them by pool), then `Scheduler.nodes_changed` with its name.
Reported per fleet size: the first full read, an event's p50 and p99, and their ratio (an event
should cost a small part of a full read, whatever the fleet's size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend  # noqa: E402
from jupyter_gpualloc.core.policy import SchedulerPolicy  # noqa: E402
from jupyter_gpualloc.core.store import Store, sqlite_url  # noqa: E402
from jupyter_gpualloc.core.wiring import open_core  # noqa: E402
from tests.core.devices.dra_slices import allocated_claim, dynamic_mig, mig_device  # noqa: E402

MODEL = "H100 80GB HBM3"


def node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def fleet(count: int) -> tuple[list[dict], list[dict]]:
    """`count` DynamicMIG nodes and their slices, each slice named and versioned."""
    nodes, slices = [], []
    for i in range(count):
        name = f"dra-h100-{i:04d}"
        nodes.append(node(name))
        for j, body in enumerate(dynamic_mig(name, MODEL, 8)):
            body = json.loads(json.dumps(body))
            body["metadata"].update(name=f"{name}-slice-{j}", resourceVersion=str(1000 + i * 10 + j))
            slices.append(body)
    return nodes, slices


def measure(count: int, events: int, workdir: Path) -> dict:
    nodes, slices = fleet(count)
    backend = KubernetesBackend.from_node_objects(nodes)
    backend.slices = slices
    started = time.perf_counter()
    core = open_core(backend, Store(sqlite_url(str(workdir / f"dra{count}.sqlite"))),
                     SchedulerPolicy(wait_for_holders=False, heartbeat_ttl=1e9), now=time.time())
    first = time.perf_counter() - started
    objects = {n["metadata"]["name"]: n for n in nodes}
    in_pool: dict[str, list[dict]] = {}  # the watch's index of the slices by pool
    for body in slices:
        in_pool.setdefault(body["spec"]["pool"]["name"], []).append(body)
    claims: list[dict] = []
    costs = []
    try:
        for k in range(events):
            if k % 2 == 0:  # a foreign pod's claim allocated on one node's first 1g.10gb placement
                target = f"dra-h100-{k * 7 % count:04d}"
                claims.append(allocated_claim("ml", f"train-{k}", target, mig_device(0, "1g.10gb", 0, MODEL)))
            else:  # and deleted
                claims.pop()
            started = time.perf_counter()
            read = backend.read_named([target], objects, in_pool[target], claims)
            core.scheduler.nodes_changed(read, now=time.time(), names=[target])
            costs.append(time.perf_counter() - started)
    finally:
        core.close()
    return {"nodes": count, "slice_mib": len(json.dumps(slices)) / 2**20, "first_s": first,
            "p50_ms": float(np.percentile(costs, 50)) * 1000, "p99_ms": float(np.percentile(costs, 99)) * 1000}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,300,1000")
    parser.add_argument("--events", type=int, default=20)
    parser.add_argument("--out")
    args = parser.parse_args()
    import tempfile
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for count in (int(n) for n in args.nodes.split(",")):
            r = measure(count, args.events, Path(tmp))
            rows.append(f"| {r['nodes']} ({r['nodes'] * 8} GPUs) | {r['slice_mib']:.0f} MiB | {r['first_s']:.2f} s | "
                        f"{r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms | {r['p50_ms'] / 1000 / r['first_s']:.3f} |")
            print(rows[-1], file=sys.stderr)
    text = "\n".join(["| DRA nodes | their slices | first read into the core | a claim event p50 / p99 | "
                      "event p50 / first read |", "|---|---:|---:|---:|---:|", *rows]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
