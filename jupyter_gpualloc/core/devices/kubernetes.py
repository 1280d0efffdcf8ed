"""GPU capacity of a Kubernetes cluster, read from its Node objects.

What a node offers comes from its allocatable resources, as the NVIDIA device plugin advertises
them: `nvidia.com/gpu` (whole GPUs, or replicas of them when time-slicing or MPS is configured,
or `nvidia.com/gpu.shared` when shared resources are renamed) and, with the `mixed` MIG strategy,
`nvidia.com/mig-<profile>` (a `+me` profile is advertised as `nvidia.com/mig-1g.10gb.me`). The
model, memory and counts come from NVIDIA GPU Feature Discovery labels: `nvidia.com/gpu.product`
(with `-MIG-<profile>` under the `single` strategy and `-SHARED` when shared),
`nvidia.com/gpu.count` (physical GPUs; MIG devices under `single`), `nvidia.com/gpu.memory` (MiB),
`nvidia.com/gpu.replicas`, `nvidia.com/mig.strategy`, `nvidia.com/mig-<profile>.count|.memory|.replicas`.
HAMi nodes advertise `nvidia.com/gpu` as GPUs x deviceSplitCount and list their GPUs in the
`hami.io/node-nvidia-register` annotation; physical GPUs are counted from that list.

MIG on Kubernetes is static: the NVIDIA MIG manager owns the geometry. When a node's
`nvidia.com/mig.config` is one of mig-parted's default named configs (`all-<profile>`,
`all-balanced`) and `nvidia.com/mig.config.state` is `success`, every MIG GPU has that layout;
otherwise the advertised MIG devices are packed onto the node's MIG GPUs by counts (GPUs with the
same instance counts are interchangeable), in time polynomial in the device counts. Pods get their
devices from the device plugin, so the GPU and MIG UUIDs here are stable identifiers for the
scheduler's bookkeeping (derived from node name and index), not driver UUIDs; spawners request
extended resources rather than setting CUDA_VISIBLE_DEVICES, by the names the lease's node
advertises (`node_resources`: the nodes of one cluster differ in MIG strategy and in renaming
shared GPUs). What a plain GPU may carry follows its device plugin (`Gpu.sharing`): a time-sliced
or MPS GPU only shares (its replicas), a GPU without sharing only whole-GPU slices, a HAMi GPU either. Cordoned and not-Ready nodes are
read with the reason (`Node.unschedulable`: the scheduler drains them), and so are nodes with a
NoSchedule or NoExecute taint that the install's pods do not tolerate (`tolerations`: the
kube-scheduler would leave their pods Pending there); nodes without NVIDIA
resources are left out. A node that cannot be read (a MIG model the
catalogue lacks, devices that fit no legal layout) is logged, listed by `unusable_nodes()` and
skipped; the rest of the cluster is served. Each node is read again only when what is read from
it changes.

Pods are read here too (the service's watch, service/cluster_watch.py, holds them): what a bound,
unfinished GPU pod the allocator did not place holds of its node (`outside_use`), and what a pod
made for a lease of this install says of itself (`own_pod`): one in the install's namespace whose
labels name the install (`gpualloc.jupyter.org/instance`) and a lease (`gpualloc.jupyter.org/lease`);
`pod_record` is what those two read of a pod, which is all the watch keeps of it.
"""

from __future__ import annotations

import asyncio
import calendar
import concurrent.futures
import copy
import dataclasses
import json
import logging
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping

from .. import mig
from ..fleet import gpu_uuid, mig_uuid
from . import dra
from ..model import MILLI_PER_GPU, Gpu, MigInstance, MigMode, MigProfile, Node, OutsideUse
from .base import DeviceBackend, DeviceError, DevicePermissionError, GpuProcess, UnusableNode

log = logging.getLogger(__name__)

GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
_ALL_ONE_PROFILE = re.compile(r"all-(\d+g\.\d+gb)(\.me)?")  # a mig-manager config of one profile
LEASE_LABEL = "gpualloc.jupyter.org/lease"  # on every pod made for a lease: the lease's id
INSTANCE_LABEL = "gpualloc.jupyter.org/instance"  # and the install (service) that made the lease
JOB_LABEL = "gpualloc.jupyter.org/job"  # on the Kubernetes Job (and its pod) running a job's attempt: the job's id
_OWN_LABELS = "gpualloc.jupyter.org/"
HAMI_REGISTER = "hami.io/node-nvidia-register"
_PROFILE = r"\d+g\.\d+gb(?:[.+]me)?"
_MIG_RESOURCE = re.compile(rf"^nvidia\.com/mig-({_PROFILE})(?:\.shared)?$")
_MIG_LABEL = re.compile(rf"^nvidia\.com/mig-({_PROFILE})\.(count|memory|replicas)$")
_PRODUCT = re.compile(rf"^(.*?)(?:-MIG-({_PROFILE}))?(?:-SHARED)?$")
_READ_LABELS = frozenset(f"nvidia.com/{name}" for name in (
    "gpu.product", "gpu.count", "gpu.memory", "gpu.replicas", "mig.strategy", "mig.config", "mig.config.state"))
MIB_PER_GIB = 1024
_VENDOR = re.compile(r"^(?:NVIDIA[-\s]+)+", re.IGNORECASE)
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_STATIC = ("MIG geometry on Kubernetes is managed by the NVIDIA MIG manager (label nvidia.com/mig.config); "
           "cannot {action} from here")
# mig-parted's `all-balanced` (deployments/systemd/config-default.yaml): two of the smallest 1g,
# one 2g and one 3g on 8-slice GPUs; two 1g.6gb and one 2g.12gb on the A30.
_ALL_BALANCED = {mig.MigGeometry(8, 7): {19: 2, 14: 1, 9: 1}, mig.MigGeometry(4, 4): {14: 2, 5: 1}}


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("32", "31500m", "128Gi", "1e3") as a number."""
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number)
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from None
    if exponent:
        return amount * Decimal(10) ** int(exponent[1:])
    return amount * Decimal(_SUFFIXES[suffix or ""])


@dataclass(frozen=True)
class NodeResources:
    """The names a node's device plugin advertises its GPUs by, so a pod on it asks for what is there:
    `gpu`, its GPUs' (or their time-sliced or MPS replicas') resource, `nvidia.com/gpu` or, renamed,
    `nvidia.com/gpu.shared`; `mig_single`, its MIG devices advertised as `gpu` (the `single` MIG
    strategy); `mig`, each MIG profile's resource under the `mixed` one (`nvidia.com/mig-1g.10gb`,
    `nvidia.com/mig-1g.10gb.me` for 1g.10gb+me, or `.shared` when renamed). The default: the device
    plugin's own names, mixed strategy."""

    gpu: str = "nvidia.com/gpu"
    mig_single: bool = False
    mig: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Reading:
    """What one Node object says: the Node (None when skipped), each MIG GPU's profile table, and
    the names its GPUs are advertised by."""

    node: Node | None
    profiles: dict[str, dict[int, MigProfile]] = field(default_factory=dict)
    problem: str | None = None
    labels: "_Labels | None" = None
    resources: NodeResources | None = None


class KubernetesBackend(DeviceBackend):
    """A cluster's GPU nodes, as their Node objects and (on DRA nodes) the NVIDIA DRA driver's
    ResourceSlices describe them; MIG is static except on DRA nodes with DynamicMIG."""

    name = "kubernetes"

    def __init__(self, list_nodes: Callable[[], list[dict[str, Any]]], tolerations: list[dict] | None = None):
        """`tolerations`: those every pod holding a GPU slice carries (a node with a NoSchedule or NoExecute
        taint none of them tolerates is drained); None judges no taint. Set before the first read."""
        self._list_nodes = list_nodes
        self.tolerations = tolerations
        self._readings: dict[str, tuple[Any, _Reading]] = {}  # node name -> (what was read, reading)
        self._profiles: dict[str, dict[int, MigProfile]] = {}
        self._unusable: dict[str, UnusableNode] = {}  # node name -> why it cannot be used
        self._pools: dict[str, tuple[Any, dra.DraPool | str]] = {}  # node -> (what was read, pool or its problem)
        self._made: dict[str, dict[str, str]] = {}  # node -> dynamic partitions made for leases -> "made"
        # The ResourceSlices and ResourceClaims discover() reads beside the nodes (none: no DRA node).
        self.slices: list[Mapping[str, Any]] = []
        self.claims: list[Mapping[str, Any]] = []

    @classmethod
    def from_node_objects(cls, nodes: Iterable[Mapping[str, Any]]) -> "KubernetesBackend":
        """A backend over fixed Node objects (JSON as the API server returns them)."""
        frozen = copy.deepcopy(list(nodes))
        return cls(lambda: copy.deepcopy(frozen))

    @classmethod
    def from_cluster(cls, *, label_selector: str | None = None, kubeconfig: str | None = None,
                     timeout: float = 30.0) -> "KubernetesBackend":
        """A backend that lists the cluster's nodes, and its ResourceSlices and ResourceClaims where
        it serves resource.k8s.io/v1, at each discover() (in-cluster config, else the kubeconfig),
        with kubernetes_asyncio in a private event loop."""
        backend: KubernetesBackend

        def list_nodes() -> list[dict[str, Any]]:
            coroutine = _list_cluster_nodes(label_selector, kubeconfig, timeout)
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                nodes, backend.slices, backend.claims = pool.submit(asyncio.run, coroutine).result()
            return nodes
        backend = cls(list_nodes)
        return backend

    @property
    def can_change_mig(self) -> bool:
        """True: the MIG GPUs of a DRA node with DynamicMIG are dynamic (the driver makes the
        partition a claim names); those of the device plugin stay static (the MIG manager's)."""
        return True

    @property
    def serves_running_processes(self) -> bool:
        return False

    def discover(self) -> list[Node]:
        """Every usable GPU node; a node is read again only when what is read from it changed."""
        nodes = self._list_nodes()
        return self.read_nodes(nodes, self.slices, self.claims)

    def read_nodes(self, objects: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]] = (),
                   claims: Iterable[Mapping[str, Any]] = ()) -> list[Node]:
        """The usable GPU nodes these Node objects describe (the cluster's nodes now, as a watch
        holds them), with the GPUs the `gpu.nvidia.com` ResourceSlices publish for them and the
        dynamic MIG partitions the ResourceClaims hold (core/devices/dra.py); a node is read again
        only when what is read from it changed."""
        published, held = dra.pool_slices(slices), dra.allocations(claims)
        fleet, names = [], set()
        for raw in objects:
            name = str((raw.get("metadata") or {}).get("name") or "")
            names.add(name)
            node = self._read_one(name, raw, published.get(name, []), held.get(name, {}))
            if node is not None:
                fleet.append(node)
        for name in set(self._readings) - names:
            self._read_one(name, None, [], {})
        return fleet

    def read_named(self, names: Iterable[str], objects: Mapping[str, Mapping[str, Any]],
                   slices: Iterable[Mapping[str, Any]] = (), claims: Iterable[Mapping[str, Any]] = ()) -> list[Node]:
        """The usable GPU nodes among `names`, read again as read_nodes reads them: their Node objects
        by name in `objects` (a name absent: gone), with their pools' slices and the claims allocated
        from those; every other node stays as last read. O(the named nodes), whatever the cluster's size."""
        published, held = dra.pool_slices(slices), dra.allocations(claims)
        read = (self._read_one(name, objects.get(name), published.get(name, []), held.get(name, {}))
                for name in names)
        return [node for node in read if node is not None]

    def _read_one(self, name: str, raw: Mapping[str, Any] | None, slices: list[Mapping[str, Any]],
                  held: Mapping[str, str]) -> Node | None:
        """Read node `name` (None: it is gone) with its pool's slices and the devices claims hold there,
        into what is remembered of it; its Node (a copy down to its GPUs, which the scheduler adjusts),
        None when it is gone, has no GPU or cannot be used."""
        for cached in (self._readings.get(name), self._pools.get(name)):
            if cached is not None and not isinstance(cached[1], str):
                for uuid in cached[1].profiles:
                    self._profiles.pop(uuid, None)
        self._unusable.pop(name, None)
        if raw is None:
            self._readings.pop(name, None)
            self._pools.pop(name, None)
            return None
        key = reading_key(raw)
        cached = self._readings.get(name)
        reading = cached[1] if cached is not None and cached[0] == key else _read(raw, name, self.tolerations)
        self._readings[name] = (key, reading)
        pool = None
        if slices:  # a partition made for a lease is its GPU's instance until its claim holds it
            pool = self._read_pool(name, slices, {**self._made.get(name, {}), **held})
        else:
            self._pools.pop(name, None)
        problem = reading.problem or (pool if isinstance(pool, str) else None)
        if problem is not None:
            self._unusable[name] = UnusableNode(name or "(unnamed)", problem)
            return None
        node = reading.node
        if pool is not None and pool.gpus:
            node = node or _plain_node(raw, name, self.tolerations)
            node = dataclasses.replace(node, gpus=[*node.gpus, *pool.gpus])
            self._profiles.update(pool.profiles)
        if node is None:
            return None
        self._profiles.update(reading.profiles)
        return dataclasses.replace(node, gpus=[dataclasses.replace(g, instances=list(g.instances)) for g in node.gpus])

    def _read_pool(self, node: str, slices: list[Mapping[str, Any]], held: Mapping[str, str]) -> dra.DraPool | str:
        """Node `node`'s DRA pool (its problem, when it cannot be read), read again only when changed."""
        key = (_slices_key(slices), json.dumps(held, sort_keys=True))
        cached = self._pools.get(node)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            pool: dra.DraPool | str = dra.read_pool(node, slices, held)
        except (DeviceError, KeyError, TypeError, ValueError, AttributeError, StopIteration, IndexError) as exc:
            log.warning("skipping the DRA devices of Kubernetes node %s: %s", node, exc)
            pool = str(exc) if isinstance(exc, DeviceError) else f"node {node}: cannot read its ResourceSlices: {exc!r}"
        self._pools[node] = (key, pool)
        return pool

    def pool(self, node: str) -> dra.DraPool | None:
        """Node `node`'s GPUs as the DRA driver publishes them, as last read (None: not a DRA node)."""
        cached = self._pools.get(node)
        return cached[1] if cached is not None and not isinstance(cached[1], str) else None

    def claim_use(self, claim: Mapping[str, Any]) -> OutsideUse | None:
        """What an allocated ResourceClaim holds of a DRA node's devices, as an outside holder
        (`claim:<namespace>/<name>`), as read when its node was last read (None: nothing)."""
        nodes = {pool for pool, _, _ in dra.allocated(claim)}
        node = next(iter(nodes), None)
        pool = self.pool(node) if node is not None else None
        if pool is None:
            return None
        whole, shares, migs, named = dra.held_by_claim(pool, claim, node)
        use = OutsideUse(dra.claim_key(claim), node, whole=whole, shares=shares, mig=migs, devices=named)
        return None if use.is_empty() else use

    def unusable_nodes(self) -> list[UnusableNode]:
        return list(self._unusable.values())

    def node_resources(self, node: str) -> NodeResources | None:
        """The resource names GPU node `node` advertises, as last read (None: no GPU node of that name)."""
        cached = self._readings.get(node)
        return cached[1].resources if cached is not None else None

    def outside_use(self, pod: Mapping[str, Any]) -> OutsideUse | None:
        """What a pod bound to a GPU node and not finished holds of that node's devices, as read
        when its node was last read (None: nothing). Whole GPUs on nodes without replicas; a
        share per replica of a time-sliced GPU; MIG devices by profile (under the single
        strategy `nvidia.com/gpu` counts MIG devices). Nothing for a pod whose extended resources the
        kube-scheduler gave it through a DRA claim (`extendedResourceClaimStatus`, KEP-5004: the DRA
        driver serves `nvidia.com/gpu` there): that claim holds its devices, counted as the claim's."""
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName")
        cached = self._readings.get(node or "")
        if not node or status.get("phase") in ("Succeeded", "Failed") or cached is None or cached[1].labels is None \
                or status.get("extendedResourceClaimStatus"):
            return None
        labels, gpus = cached[1].labels, 0
        mig_devices: dict[str, int] = {}
        for resource, count in pod_resources(spec).items():
            if resource in GPU_RESOURCES:
                gpus += count
            elif match := _MIG_RESOURCE.match(resource):
                profile = _profile_name(match.group(1))
                replicas = max(labels.mig.get(profile, {}).get("replicas") or 1, 1)
                mig_devices[profile] = mig_devices.get(profile, 0) + -(-count // replicas)
        product = _PRODUCT.match(labels.product)
        if gpus and labels.strategy == "single" and product.group(2):
            mig_devices[_profile_name(product.group(2))] = -(-gpus // labels.replicas)
            gpus = 0
        metadata = pod.get("metadata") or {}
        use = OutsideUse(f"pod:{metadata.get('namespace')}/{metadata.get('name')}", node,
                         whole=gpus if labels.replicas == 1 else 0,
                         shares=(MILLI_PER_GPU // labels.replicas,) * gpus if labels.replicas > 1 else (),
                         mig=mig_devices)
        return None if use.is_empty() else use

    def mig_profiles(self, gpu_uuid: str) -> dict[int, MigProfile]:
        if gpu_uuid not in self._profiles:
            self.discover()
        if gpu_uuid not in self._profiles:
            raise DeviceError(f"no GPU {gpu_uuid} in this cluster")
        return dict(self._profiles[gpu_uuid])

    def create_mig_instance(self, gpu_uuid: str, profile_id: int, start: int) -> MigInstance:
        """On a DRA GPU with DynamicMIG: the partition at this placement, which the driver creates
        when the claim naming it is prepared (service/dra_claims.py writes it); no other MIG GPU
        here can change."""
        node, device = self._dynamic(gpu_uuid, profile_id, start)
        if device is None:
            raise DevicePermissionError(_STATIC.format(action="create MIG instances"))
        self._made.setdefault(node, {})[device.name] = "made"
        return MigInstance(uuid=dra.dra_mig_uuid(gpu_uuid, device.name), profile_id=profile_id, start=start,
                           size=device.size)

    def destroy_mig_instance(self, gpu_uuid: str, mig_uuid: str) -> None:
        """On a DRA GPU with DynamicMIG nothing to do: the driver destroys a partition when its
        claim is unprepared."""
        for node in list(self._pools):
            pool = self.pool(node)
            device = pool.named_by(mig_uuid) if pool is not None else None
            if device is not None and device.dynamic and device.gpu_uuid == gpu_uuid:
                self._made.get(node, {}).pop(device.name, None)
                return
        raise DevicePermissionError(_STATIC.format(action="destroy MIG instances"))

    def restore_mig_instance(self, gpu_uuid: str, instance: MigInstance) -> bool:
        """A DynamicMIG partition the core made for a lease whose claim was not written before the
        service stopped: its GPU's instance again (the claim is written when its pod is made)."""
        node, device = self._dynamic(gpu_uuid, instance.profile_id, instance.start)
        if device is None or dra.dra_mig_uuid(gpu_uuid, device.name) != instance.uuid:
            return False
        self._made.setdefault(node, {})[device.name] = "made"
        return True

    def _dynamic(self, gpu_uuid: str, profile_id: int, start: int) -> tuple[str | None, dra.DraDevice | None]:
        """The DRA node holding GPU `gpu_uuid` and its dynamic partition at this placement (None, None: none)."""
        for node in self._pools:
            pool = self.pool(node)
            device = pool.device_of(gpu_uuid, profile_id, start) if pool is not None else None
            if device is not None and device.dynamic:
                return node, device
        return None, None

    def process_memory(self) -> list[GpuProcess]:
        """Always empty: per-process GPU memory is only visible on the node itself (NVML inside the
        node's driver namespace), not from the scheduler through the Kubernetes API."""
        return []


@dataclass(frozen=True)
class OwnPod:
    """A pod made for a lease, as the cluster shows it. `unschedulable` is the kube-scheduler's
    message while it cannot place the pod, `unschedulable_since` when it first said so; `job_id`
    the job whose attempt it runs (a Kubernetes Job's pod), `ended` why it ended, as the kubelet says
    (e.g. "Evicted: ...", "OOMKilled (exit code 137)"), once it has."""

    lease_id: str
    namespace: str
    name: str
    phase: str
    node: str | None
    deleting: bool
    unschedulable: str | None = None
    unschedulable_since: float | None = None
    job_id: str | None = None
    ended: str = ""
    ip: str | None = None

    @property
    def key(self) -> str:
        return f"pod:{self.namespace}/{self.name}"


def own_pod(pod: Mapping[str, Any], namespace: str, instance: str) -> OwnPod | None:
    """The lease pod a Pod object is, or None for a pod not made for a lease of the install `instance`
    in `namespace` (whether the lease is one this install made is the caller's to check)."""
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = metadata.get("labels") or {}
    lease_id = labels.get(LEASE_LABEL)
    if not lease_id or metadata.get("namespace") != namespace or labels.get(INSTANCE_LABEL) != instance:
        return None
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    refused = scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
    phase = status.get("phase", "Pending")
    return OwnPod(lease_id, metadata.get("namespace", ""), metadata.get("name", ""), phase,
                  spec.get("nodeName"), bool(metadata.get("deletionTimestamp")),
                  scheduled.get("message") or "unschedulable" if refused else None,
                  _timestamp(scheduled.get("lastTransitionTime")) if refused else None,
                  (metadata.get("labels") or {}).get(JOB_LABEL),
                  _why_ended(status) if phase in ("Succeeded", "Failed") else "", status.get("podIP"))


def _slices_key(slices: list[Mapping[str, Any]]) -> Any:
    """What identifies these ResourceSlices' contents: each one's name and resourceVersion, which the
    API server moves on every change (a pool's slices are large: encoding them on each claim event
    cost seconds at a thousand nodes); their specs where a slice has none (not read from a cluster)."""
    versions = [((s.get("metadata") or {}).get("name"), (s.get("metadata") or {}).get("resourceVersion"))
                for s in slices]
    if all(name and version for name, version in versions):
        return tuple(sorted(versions))
    return json.dumps([s.get("spec") for s in slices], sort_keys=True)


def pod_record(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """What `own_pod` and `outside_use` read of a Pod object, in the same shape, or None for a pod
    neither can ever count: one that asks for no NVIDIA device and carries no lease label. A pod's
    resources are immutable, so a pod left out now stays out until its labels change (each change
    is judged again). The record keeps the gpualloc labels, the node, the devices asked for (as one
    container's limits), the phase, IP, scheduling condition, how it ended and the DRA claim that
    serves its extended resources; nothing else (env,
    volumes, managedFields, annotations)."""
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = {k: v for k, v in (metadata.get("labels") or {}).items() if k.startswith(_OWN_LABELS)}
    devices = pod_resources(spec)
    if not devices and LEASE_LABEL not in labels:
        return None
    record_metadata = {"name": metadata.get("name"), "namespace": metadata.get("namespace"), "labels": labels}
    if metadata.get("deletionTimestamp"):
        record_metadata["deletionTimestamp"] = metadata["deletionTimestamp"]
    record_status = {k: status[k] for k in ("phase", "podIP", "reason", "message", "extendedResourceClaimStatus")
                     if k in status}
    scheduled = [c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"]
    if scheduled:
        record_status["conditions"] = scheduled
    ended = [{"state": {"terminated": c["state"]["terminated"]}} for c in status.get("containerStatuses") or []
             if (c.get("state") or {}).get("terminated")]
    if ended:
        record_status["containerStatuses"] = ended
    record_spec: dict[str, Any] = {"containers": [{"resources": {"limits": {k: str(v) for k, v in devices.items()}}}]}
    if spec.get("nodeName"):
        record_spec["nodeName"] = spec["nodeName"]
    return {"metadata": record_metadata, "spec": record_spec, "status": record_status}


def _why_ended(status: Mapping[str, Any]) -> str:
    """Why an ended pod ended: the pod's reason (Evicted, DeadlineExceeded, ...) or its first
    terminated container's (OOMKilled, Error, Completed) with the exit code."""
    if status.get("reason"):
        return f"{status['reason']}: {status.get('message', '')}".rstrip(": ")
    for container in status.get("containerStatuses") or []:
        ended = (container.get("state") or {}).get("terminated")
        if ended:
            return f"{ended.get('reason') or 'ended'} (exit code {ended.get('exitCode')})"
    return status.get("phase", "ended").lower()


def _timestamp(text: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 time as the API server writes it (UTC, 'Z')."""
    if not text:
        return None
    return float(calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S")))


def is_gpu_resource(name: str) -> bool:
    """Whether a pod's resource name is an NVIDIA device (a GPU, a shared GPU or a MIG profile's)."""
    return name in GPU_RESOURCES or _MIG_RESOURCE.match(name) is not None


def pod_resources(spec: Mapping[str, Any]) -> dict[str, int]:
    """The NVIDIA device counts a pod spec asks for: its containers' together, or an init
    container's where that is more (extended resources are set as limits; requests equal them)."""
    def of(container: Mapping[str, Any]) -> dict[str, int]:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        return {k: int(parse_quantity(v)) for k, v in asked.items() if is_gpu_resource(k)}

    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for resource, count in of(container).items():
            total[resource] = total.get(resource, 0) + count
    for container in spec.get("initContainers") or []:
        for resource, count in of(container).items():
            total[resource] = max(total.get(resource, 0), count)
    return total


def resource_limits(slice_: Mapping[str, Any], node: NodeResources | None = None, *,
                    shared_resources: Mapping[str, str] | None = None) -> dict[str, str]:
    """The extended resources a pod needs for a slice (values are strings, as Kubernetes wants), by
    the names `node`, the slice's node, advertises (None: unknown, the device plugin's defaults).

    `shared_resources` values are templates: `{memory_mib}`, `{memory_gib}`, `{percent}`
    (of the GPU, rounded up) and `{milli}` are filled in from the slice; a key naming the device
    plugin's GPU resource (`nvidia.com/gpu` or `nvidia.com/gpu.shared`) is the one a known node advertises.
    """
    known, node = node is not None, node or NodeResources()
    kind = slice_["kind"]
    if kind == "mig":
        if node.mig_single:
            return {node.gpu: "1"}
        profile = str(slice_["profile"])
        # The device plugin writes a profile's '+' as '.': 1g.10gb+me is nvidia.com/mig-1g.10gb.me.
        return {node.mig.get(profile) or f"nvidia.com/mig-{profile.replace('+', '.')}": "1"}
    if kind == "whole":
        return {node.gpu: str(len(slice_["gpu_uuids"]))}
    milli = int(slice_.get("milli", 1000))
    values = {"memory_mib": int(slice_["memory_mib"]), "memory_gib": int(slice_["memory_mib"]) // MIB_PER_GIB,
              "percent": -(-milli // 10), "milli": milli}
    return {node.gpu if known and name in GPU_RESOURCES else name: str(template).format(**values)
            for name, template in (shared_resources or {}).items()}


def node_affinity(node: str, label: str = "kubernetes.io/hostname") -> dict[str, Any]:
    """A NodeSelectorTerm pinning the pod to the lease's node."""
    return {"matchExpressions": [{"key": label, "operator": "In", "values": [node]}]}


def node_from_object(raw: Mapping[str, Any]) -> Node | None:
    """The Node (with its GPUs) a Kubernetes Node object describes, or None for nodes to skip;
    DeviceError for a node that cannot be read."""
    return _read_node(raw).node


def _plain_node(raw: Mapping[str, Any], name: str, tolerations: list[dict] | None) -> Node:
    """A node without device-plugin GPUs (a DRA node's GPUs are added to it): its CPU, memory and whether
    it is schedulable."""
    allocatable: Mapping[str, Any] = (raw.get("status") or {}).get("allocatable") or {}
    return Node(name=name, cpu_milli=int(_quantity(allocatable.get("cpu", 0), name, "cpu") * 1000),
                memory_mib=int(_quantity(allocatable.get("memory", 0), name, "memory") / 2**20),
                unschedulable=_unschedulable(raw) or _untolerated(raw, tolerations))


def _read(raw: Mapping[str, Any], name: str, tolerations: list[dict] | None = None) -> _Reading:
    """Read one node; a node that cannot be read is logged and marked with its problem."""
    try:
        return _read_node(raw, tolerations)
    except DeviceError as exc:
        log.warning("skipping Kubernetes node %s: %s", name or "(unnamed)", exc)
        return _Reading(None, problem=str(exc))


def reading_key(raw: Mapping[str, Any]) -> Any:
    """Everything `_read_node` looks at, so an unchanged key means an unchanged reading."""
    metadata, status = raw.get("metadata") or {}, raw.get("status") or {}
    labels = metadata.get("labels") or {}
    return (json.dumps({k: v for k, v in labels.items() if k in _READ_LABELS or _MIG_LABEL.match(k)}, sort_keys=True),
            (metadata.get("annotations") or {}).get(HAMI_REGISTER),
            json.dumps(status.get("allocatable") or {}, sort_keys=True),
            bool((raw.get("spec") or {}).get("unschedulable")), _ready(status),
            json.dumps((raw.get("spec") or {}).get("taints") or [], sort_keys=True))


@dataclass(frozen=True)
class _Labels:
    """The GPU Feature Discovery labels of one node, parsed."""

    product: str
    strategy: str
    count: int | None
    memory_mib: int | None
    replicas: int
    mig_config: str | None
    mig: dict[str, dict[str, int]]  # profile -> {"count", "memory", "replicas"}

    @classmethod
    def of(cls, node: str, labels: Mapping[str, str]) -> "_Labels":
        per_profile: dict[str, dict[str, int]] = {}
        for key in labels:
            if match := _MIG_LABEL.match(key):
                profile, what = match.groups()
                per_profile.setdefault(_profile_name(profile), {})[what] = _label_int(labels, key, node)
        config = labels.get("nvidia.com/mig.config") if labels.get("nvidia.com/mig.config.state") == "success" else None
        return cls(product=labels.get("nvidia.com/gpu.product", ""),
                   strategy=labels.get("nvidia.com/mig.strategy", "none"),
                   count=_label_int(labels, "nvidia.com/gpu.count", node),
                   memory_mib=_label_int(labels, "nvidia.com/gpu.memory", node),
                   replicas=max(_label_int(labels, "nvidia.com/gpu.replicas", node) or 1, 1),
                   mig_config=config, mig=per_profile)


def _read_node(raw: Mapping[str, Any], tolerations: list[dict] | None = None) -> _Reading:
    metadata, status = raw.get("metadata") or {}, raw.get("status") or {}
    name = metadata.get("name")
    if not name:
        raise DeviceError("a Kubernetes Node object without metadata.name")
    labels = _Labels.of(name, metadata.get("labels") or {})
    allocatable: Mapping[str, Any] = status.get("allocatable") or {}
    advertised = sum(_count(allocatable.get(r, 0), name, r) for r in GPU_RESOURCES)
    mig_devices: dict[str, int] = {}
    for key, value in allocatable.items():
        if match := _MIG_RESOURCE.match(key):
            profile = _profile_name(match.group(1))
            replicas = max(labels.mig.get(profile, {}).get("replicas") or 1, 1)
            mig_devices[profile] = mig_devices.get(profile, 0) + -(-_count(value, name, key) // replicas)
    mig_devices = {profile: n for profile, n in mig_devices.items() if n > 0}
    if advertised == 0 and not mig_devices:
        return _Reading(None)
    product = _PRODUCT.match(labels.product)
    model_name, single_profile = _VENDOR.sub("", product.group(1)), product.group(2)
    renamed = _count(allocatable.get("nvidia.com/gpu.shared", 0), name, "nvidia.com/gpu.shared") > 0 \
        and _count(allocatable.get("nvidia.com/gpu", 0), name, "nvidia.com/gpu") == 0
    mig_names: dict[str, str] = {}
    for key in sorted(allocatable):  # a profile's plain name before its `.shared` one
        if (match := _MIG_RESOURCE.match(key)) and _count(allocatable[key], name, key) > 0:
            mig_names.setdefault(_profile_name(match.group(1)), key)
    reading = _Reading(Node(name=name, cpu_milli=int(_quantity(allocatable.get("cpu", 0), name, "cpu") * 1000),
                            memory_mib=int(_quantity(allocatable.get("memory", 0), name, "memory") / 2**20),
                            unschedulable=_unschedulable(raw) or _untolerated(raw, tolerations)),
                       labels=labels,
                       resources=NodeResources(gpu="nvidia.com/gpu.shared" if renamed else "nvidia.com/gpu",
                                               mig_single=labels.strategy == "single" and bool(single_profile),
                                               mig=mig_names))
    hami = _hami_gpus(metadata.get("annotations") or {}, name)
    if hami and not model_name:
        model_name = _VENDOR.sub("", hami[0][0])
    if labels.strategy == "single" and single_profile:
        _add_single_strategy_gpus(reading, labels, _catalogue(model_name, name), _profile_name(single_profile),
                                  advertised)
    else:
        _add_gpus(reading, labels, model_name or "unknown", advertised, mig_devices, hami)
    return reading


def _add_single_strategy_gpus(reading: _Reading, labels: _Labels, model: mig.GpuModel, profile_name: str,
                              advertised: int) -> None:
    """The single strategy: every MIG device is one profile, GFD counts devices, not GPUs, and its
    memory label is a device's."""
    name = reading.node.name
    profile = _profile(model, profile_name, name)
    devices = labels.count if labels.count is not None else -(-advertised // labels.replicas)
    profiles = _node_profiles(model, {profile.name: {"memory": labels.memory_mib}} if labels.memory_mib else {})
    per_gpu = _named_config(labels.mig_config, model) or {
        profile.profile_id: mig.room_for(mig.Layout(model.geometry), profile)}
    if set(per_gpu) != {profile.profile_id}:
        raise DeviceError(f"node {name}: the single MIG strategy advertises only {profile.name}, but "
                          f"its MIG config {labels.mig_config} makes other profiles too")
    full, rest = divmod(devices, per_gpu[profile.profile_id])
    layouts = [per_gpu] * full + ([{profile.profile_id: rest}] if rest else [])
    _add_mig_gpus(reading, model, model.memory_mib, profiles, [_place(model, counts, name) for counts in layouts])


def _add_gpus(reading: _Reading, labels: _Labels, model_name: str, advertised: int, mig_devices: dict[str, int],
              hami: list[tuple[str, int]]) -> None:
    """Whole GPUs and, under the mixed strategy, MIG GPUs. Physical GPUs are GFD's count (or HAMi's
    list): replicas and HAMi's split count are undone, and a stale `nvidia.com/gpu` beside MIG
    devices counts only the GPUs the MIG devices leave."""
    name = reading.node.name
    catalogue = mig.lookup_model(model_name)
    whole = -(-advertised // labels.replicas)
    physical = labels.count if labels.count is not None else (len(hami) if hami else None)
    if mig_devices:
        catalogue = _catalogue(model_name, name)
        wanted = {_profile(catalogue, p, name).profile_id: n for p, n in mig_devices.items()}
        mig_layouts = _mig_layouts(catalogue, wanted, physical, whole, labels.mig_config, name)
        whole = min(whole, physical - len(mig_layouts)) if physical is not None else whole
    else:
        mig_layouts = []
        whole = min(whole, physical) if physical is not None else whole
    memory_mib = labels.memory_mib or (catalogue.memory_mib if catalogue else 0) or (hami[0][1] if hami else 0)
    # Time-sliced or MPS replicas go to pods one by one, never a GPU whole; HAMi splits memory or
    # gives it all; a plain device plugin gives each GPU to one pod.
    sharing = "any" if hami else ("shared" if labels.replicas > 1 else "whole")
    for _ in range(whole):
        uuid = gpu_uuid(name, len(reading.node.gpus))
        reading.node.gpus.append(Gpu(uuid=uuid, index=len(reading.node.gpus),
                                     model=catalogue.name if catalogue else model_name, memory_mib=memory_mib,
                                     node=name, mig_capable=bool(catalogue and catalogue.mig_capable),
                                     sharing=sharing))
        reading.profiles[uuid] = {}
    if mig_layouts:
        _add_mig_gpus(reading, catalogue, memory_mib, _node_profiles(catalogue, labels.mig), mig_layouts)


def _add_mig_gpus(reading: _Reading, model: mig.GpuModel, memory_mib: int, profiles: dict[int, MigProfile],
                  layouts: list[tuple[tuple[MigProfile, int], ...]]) -> None:
    """One static MIG GPU per layout, its instances as placed."""
    node = reading.node
    for layout in layouts:
        index = len(node.gpus)
        uuid = gpu_uuid(node.name, index)
        instances = [MigInstance(uuid=mig_uuid(uuid, start, profile.profile_id, n), profile_id=profile.profile_id,
                                 start=start, size=profile.memory_slices, gi_id=n + 1, ci_id=0)
                     for n, (profile, start) in enumerate(layout)]
        node.gpus.append(Gpu(uuid=uuid, index=index, model=model.name, memory_mib=memory_mib,
                             node=node.name, mig_capable=True, mig_mode=MigMode.STATIC, instances=instances))
        reading.profiles[uuid] = profiles


def _node_profiles(model: mig.GpuModel, labelled: Mapping[str, Mapping[str, int | None]]) -> dict[int, MigProfile]:
    """The model's profiles, with the memory GFD measured on this node where it labels one."""
    profiles = dict(model.profiles)
    for pid, profile in model.profiles.items():
        memory = labelled.get(profile.name, {}).get("memory")
        if memory:
            profiles[pid] = dataclasses.replace(profile, memory_mib=memory)
    return profiles


def _mig_layouts(model: mig.GpuModel, wanted: dict[int, int], physical: int | None, whole: int,
                 config: str | None, node: str) -> list[tuple[tuple[MigProfile, int], ...]]:
    """The layout of each MIG GPU holding the advertised MIG devices (`wanted`: count per id)."""
    per_gpu = _named_config(config, model)
    if per_gpu and set(per_gpu) == set(wanted):
        gpus, rest = divmod(next(iter(wanted.values())), next(iter(per_gpu.values())))
        if not rest and gpus and all(wanted[pid] == gpus * n for pid, n in per_gpu.items()) \
                and (physical is None or gpus <= physical):
            return [_place(model, per_gpu, node)] * gpus
    shape = _shape(model)
    pids = tuple(sorted(wanted))
    counts = tuple(wanted[pid] for pid in pids)
    fewest = _fewest_gpus(shape, pids, counts, physical)
    if fewest is None:
        summary = ", ".join(f"{n}x {model.profile(pid).name}" for pid, n in sorted(wanted.items()))
        raise DeviceError(f"node {node}: the advertised MIG devices ({summary}) do not fit on "
                          f"{physical if physical is not None else sum(counts)} {model.name} GPU(s)")
    gpus = fewest if physical is None else min(physical, max(fewest, physical - whole))
    per_gpu_counts = _pack(shape, pids, counts, gpus)
    return [_place(model, dict(zip(pids, c)), node) for c in per_gpu_counts]


def _named_config(config: str | None, model: mig.GpuModel) -> dict[int, int] | None:
    """Instances per GPU of one of mig-parted's default named configs on this model, or None."""
    if not config:
        return None
    if config == "all-balanced":
        return _ALL_BALANCED.get(model.geometry)
    if match := _ALL_ONE_PROFILE.fullmatch(config):
        name = match.group(1) + ("+me" if match.group(2) else "")
        try:
            profile = model.profile(name)
        except KeyError:
            return None
        return {profile.profile_id: mig.room_for(mig.Layout(model.geometry), profile)}
    return None


def _shape(model: mig.GpuModel) -> tuple[tuple[int, int, int, int, tuple[int, ...]], ...]:
    """The model's placement rules alone (no names or sizes), so equal geometries share caches."""
    return tuple((p.profile_id, p.compute_slices, p.memory_slices, p.max_instances, p.starts)
                 for _, p in sorted(model.profiles.items()))


def _shape_profiles(shape) -> dict[int, MigProfile]:
    return {pid: MigProfile(profile_id=pid, name=str(pid), compute_slices=c, memory_slices=m, memory_mib=0,
                            max_instances=n, starts=starts) for pid, c, m, n, starts in shape}


@lru_cache(maxsize=64)
def _one_gpu_layouts(shape) -> dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]:
    """Every instance count one GPU can hold (as Layout.counts), with one legal placement of it:
    ((profile id, start), ...)."""
    profiles = _shape_profiles(shape)
    empty = mig.Layout(mig.MigGeometry.of(profiles))
    seen = {empty: ()}
    frontier = [empty]
    while frontier:
        layout = frontier.pop()
        for profile in profiles.values():
            for start in mig.legal_starts(layout, profile):
                grown = layout.with_instance(profile, start)
                if grown not in seen:
                    seen[grown] = seen[layout] + ((profile.profile_id, start),)
                    frontier.append(grown)
    placements: dict[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]] = {}
    for layout, placed in seen.items():
        placements.setdefault(layout.counts, placed)
    return placements


@lru_cache(maxsize=1024)
def _fits_one_gpu(shape, pids: tuple[int, ...]) -> frozenset[tuple[int, ...]]:
    """The count vectors (over `pids`) one GPU can hold, using no other profile."""
    return frozenset(tuple(dict(counts).get(pid, 0) for pid in pids) for counts in _one_gpu_layouts(shape)
                     if all(pid in pids for pid, _ in counts))


@lru_cache(maxsize=1024)
def _fewest_gpus(shape, pids: tuple[int, ...], counts: tuple[int, ...], limit: int | None) -> int | None:
    """The fewest GPUs that hold these instance counts (at most `limit`), or None."""
    top = sum(counts) if limit is None else min(limit, sum(counts))
    for gpus in range(1, top + 1):
        if _pack(shape, pids, counts, gpus) is not None:
            return gpus
    return None if sum(counts) else 0


@lru_cache(maxsize=1024)
def _pack(shape, pids: tuple[int, ...], counts: tuple[int, ...], gpus: int) -> tuple[tuple[int, ...], ...] | None:
    """Instance counts for each of `gpus` GPUs adding up to `counts`, or None when impossible.

    GPUs with the same counts are interchangeable, so this searches count vectors, not placements:
    a state is the counts still to place and the GPUs left. Each GPU takes a vector that fits it
    and cannot take one more of any remaining profile (any solution can be changed into one of
    those by moving instances onto earlier GPUs), and failed states are remembered, so the work
    is bounded by the number of count vectors below `counts` times the vectors one GPU can hold."""
    fits = _fits_one_gpu(shape, pids)
    failed: set[tuple[tuple[int, ...], int]] = set()
    rules = {pid: (compute, memory, most) for pid, compute, memory, most, _ in shape}
    geometry = mig.MigGeometry.of(_shape_profiles(shape))
    compute = [rules[pid][0] for pid in pids]
    memory = [rules[pid][1] for pid in pids]
    most = [rules[pid][2] for pid in pids]

    def maximal(remaining: tuple[int, ...]) -> list[tuple[int, ...]]:
        out = []
        for vector in fits:
            if any(v > r for v, r in zip(vector, remaining)):
                continue
            if any(vector[i] < remaining[i] and vector[:i] + (vector[i] + 1,) + vector[i + 1:] in fits
                   for i in range(len(vector))):
                continue
            out.append(vector)
        return sorted(out, reverse=True)

    def solve(remaining: tuple[int, ...], left: int) -> list[tuple[int, ...]] | None:
        if not any(remaining):
            return [tuple(0 for _ in remaining)] * left
        if left == 0 or (remaining, left) in failed \
                or sum(c * r for c, r in zip(compute, remaining)) > left * geometry.compute_slices \
                or sum(m * r for m, r in zip(memory, remaining)) > left * geometry.memory_slices \
                or any(r > left * n for r, n in zip(remaining, most)):
            return None
        for vector in maximal(remaining):
            rest = solve(tuple(r - v for r, v in zip(remaining, vector)), left - 1)
            if rest is not None:
                return [vector, *rest]
        failed.add((remaining, left))
        return None

    solution = solve(counts, gpus)
    return tuple(solution) if solution is not None else None


def _place(model: mig.GpuModel, counts: Mapping[int, int], node: str) -> tuple[tuple[MigProfile, int], ...]:
    """A legal placement of these instance counts on one GPU of the model."""
    key = tuple(sorted((pid, n) for pid, n in counts.items() if n))
    placed = _one_gpu_layouts(_shape(model)).get(key)
    if placed is None:
        summary = ", ".join(f"{n}x {model.profile(pid).name}" for pid, n in key)
        raise DeviceError(f"node {node}: {summary} do not fit on one {model.name} GPU")
    return tuple(sorted(((model.profile(pid), start) for pid, start in placed), key=lambda item: item[1]))


def _hami_gpus(annotations: Mapping[str, str], node: str) -> list[tuple[str, int]]:
    """(type, memory MiB) of each GPU HAMi registered on the node: JSON records, or the older
    `uuid,count,devmem,devcore,type,numa,health[,...]:` records."""
    raw = annotations.get(HAMI_REGISTER)
    if not raw:
        return []
    try:
        if raw.lstrip().startswith("["):
            return [(str(d.get("type", "")), int(d.get("devmem", 0))) for d in json.loads(raw)]
        return [(fields[4], int(fields[2])) for record in raw.split(":") if record.strip()
                for fields in [record.split(",")]]
    except (ValueError, IndexError, TypeError, AttributeError):
        raise DeviceError(f"node {node}: cannot read the annotation {HAMI_REGISTER}: {raw[:80]!r}") from None


def _profile_name(advertised: str) -> str:
    """The catalogue's name of an advertised profile: `1g.10gb.me` (resource names allow no `+`) is `1g.10gb+me`."""
    return advertised.replace(".me", "+me")


def _label_int(labels: Mapping[str, str], key: str, node: str) -> int | None:
    value = labels.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DeviceError(f"node {node}: label {key} is not an integer: {value!r}") from None


def _unschedulable(raw: Mapping[str, Any]) -> str | None:
    """Why nothing new may run on the node (cordoned, not Ready), or None."""
    if (raw.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    if not _ready(raw.get("status") or {}):
        return "not Ready"
    return None


def _untolerated(raw: Mapping[str, Any], tolerations: list[dict] | None) -> str | None:
    """The node's first NoSchedule or NoExecute taint that none of `tolerations` tolerates, as a reason."""
    if tolerations is None:
        return None
    for taint in (raw.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(tolerates(t, taint) for t in tolerations):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"tainted {taint.get('key')}{value}:{taint['effect']}, which this install's GPU pods do not tolerate"
    return None


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether a pod's toleration tolerates a node's taint, as the kube-scheduler matches them."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    if toleration.get("operator") == "Exists":
        return not key or key == taint.get("key")
    return key == taint.get("key") and (toleration.get("value") or "") == (taint.get("value") or "")


def _ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions")
    if not conditions:
        return True
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _count(value: Any, node: str, resource: str) -> int:
    try:
        return int(parse_quantity(value))
    except ValueError:
        raise DeviceError(f"node {node}: allocatable {resource} is not a count: {value!r}") from None


def _quantity(value: Any, node: str, resource: str) -> Decimal:
    try:
        return parse_quantity(value)
    except ValueError:
        raise DeviceError(f"node {node}: allocatable {resource} is not a quantity: {value!r}") from None


def _catalogue(model_name: str, node: str) -> mig.GpuModel:
    model = mig.lookup_model(model_name)
    if model is None or not model.mig_capable:
        raise DeviceError(f"node {node}: advertises MIG devices on {model_name or 'an unlabelled GPU'}, "
                          "which is not a MIG-capable model this allocator knows")
    return model


def _profile(model: mig.GpuModel, profile_name: str, node: str) -> MigProfile:
    try:
        return model.profile(profile_name)
    except KeyError:
        raise DeviceError(f"node {node}: {model.name} has no MIG profile {profile_name!r}") from None


async def cluster_configuration(kubeconfig: str | None) -> Any:
    """A kubernetes_asyncio Configuration: the kubeconfig when given, else in-cluster, else the default kubeconfig."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config import ConfigException

    configuration = client.Configuration()
    if kubeconfig:
        await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException:
            await config.load_kube_config(client_configuration=configuration)
    return configuration


async def _list_cluster_nodes(label_selector: str | None, kubeconfig: str | None,
                              timeout: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The nodes, and the ResourceSlices and ResourceClaims (none where resource.k8s.io/v1 is not served)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    async with client.ApiClient(await cluster_configuration(kubeconfig)) as api:
        kwargs: dict[str, Any] = {"_request_timeout": timeout}
        if label_selector:
            kwargs["label_selector"] = label_selector
        # The raw JSON, as the API server sent it (no client-side model validation).
        response = await client.CoreV1Api(api).list_node(_preload_content=False, **kwargs)
        nodes = (await response.json())["items"]
        resource = client.ResourceV1Api(api)
        listed = []
        for call in (resource.list_resource_slice, resource.list_resource_claim_for_all_namespaces):
            try:
                listed.append((await (await call(_preload_content=False, _request_timeout=timeout)).json())["items"])
            except ApiException as err:
                if err.status != 404:
                    raise
                listed.append([])
        return nodes, listed[0], listed[1]
