"""GPU capacity of a Kubernetes cluster, read from its Node objects.

What a node offers comes from its allocatable resources, as the NVIDIA device plugin advertises
them: `nvidia.com/gpu` (whole GPUs, or replicas of them when time-slicing is configured) and,
with the `mixed` MIG strategy, `nvidia.com/mig-<profile>`. The model, memory and GPU count come
from NVIDIA GPU Feature Discovery labels (`nvidia.com/gpu.product`, `nvidia.com/gpu.memory` in
MiB, `nvidia.com/gpu.count`, `nvidia.com/mig.strategy`, `nvidia.com/gpu.replicas`).

MIG on Kubernetes is static: the NVIDIA MIG manager owns the geometry (`nvidia.com/mig.config`).
Advertised MIG devices become existing instances, placed legally on the node's MIG GPUs. Pods
get their devices from the device plugin, so the GPU and MIG UUIDs here are stable identifiers
for the scheduler's bookkeeping (derived from node name and index), not driver UUIDs; spawners
request extended resources rather than setting CUDA_VISIBLE_DEVICES. Cordoned and not-Ready
nodes, and nodes without NVIDIA resources, are left out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterable, Mapping

from .. import mig
from ..fleet import gpu_uuid, mig_uuid
from ..model import Gpu, MigInstance, MigMode, MigProfile, Node
from .base import DeviceBackend, DeviceError, DevicePermissionError, GpuProcess

GPU_RESOURCE = "nvidia.com/gpu"
_MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb(?:\+me)?)$")
_SINGLE_PRODUCT = re.compile(r"^(.*)-MIG-(\d+g\.\d+gb(?:\+me)?)$")
_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
             "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
             "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$")
_STATIC = ("MIG geometry on Kubernetes is managed by the NVIDIA MIG manager (label nvidia.com/mig.config); "
           "cannot {action} from here")


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


class KubernetesBackend(DeviceBackend):
    """A cluster's GPU nodes, as their Node objects describe them; MIG is static here."""

    name = "kubernetes"

    def __init__(self, list_nodes: Callable[[], list[dict[str, Any]]]):
        self._list_nodes = list_nodes
        self._profiles: dict[str, dict[int, MigProfile]] = {}

    @classmethod
    def from_node_objects(cls, nodes: Iterable[Mapping[str, Any]]) -> "KubernetesBackend":
        """A backend over fixed Node objects (JSON as the API server returns them)."""
        frozen = copy.deepcopy(list(nodes))
        return cls(lambda: copy.deepcopy(frozen))

    @classmethod
    def from_cluster(cls, *, label_selector: str | None = None, kubeconfig: str | None = None,
                     timeout: float = 30.0) -> "KubernetesBackend":
        """A backend that lists the cluster's nodes at each discover() (in-cluster config, else
        the kubeconfig), with kubernetes_asyncio in a private event loop."""
        def list_nodes() -> list[dict[str, Any]]:
            coroutine = _list_cluster_nodes(label_selector, kubeconfig, timeout)
            with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
                return pool.submit(asyncio.run, coroutine).result()
        return cls(list_nodes)

    @property
    def can_change_mig(self) -> bool:
        return False

    def discover(self) -> list[Node]:
        fleet = []
        for raw in self._list_nodes():
            node = node_from_object(raw)
            if node is not None:
                fleet.append(node)
        self._profiles = {g.uuid: _model_profiles(g) for n in fleet for g in n.gpus}
        return fleet

    def mig_profiles(self, gpu_uuid: str) -> dict[int, MigProfile]:
        if gpu_uuid not in self._profiles:
            self.discover()
        if gpu_uuid not in self._profiles:
            raise DeviceError(f"no GPU {gpu_uuid} in this cluster")
        return dict(self._profiles[gpu_uuid])

    def create_mig_instance(self, gpu_uuid: str, profile_id: int, start: int) -> MigInstance:
        raise DevicePermissionError(_STATIC.format(action="create MIG instances"))

    def destroy_mig_instance(self, gpu_uuid: str, mig_uuid: str) -> None:
        raise DevicePermissionError(_STATIC.format(action="destroy MIG instances"))

    def process_memory(self) -> list[GpuProcess]:
        """Always empty: per-process GPU memory is only visible on the node itself (NVML inside the
        node's driver namespace), not from the scheduler through the Kubernetes API."""
        return []


def node_from_object(raw: Mapping[str, Any]) -> Node | None:
    """The Node (with its GPUs) a Kubernetes Node object describes, or None for nodes to skip."""
    metadata, status = raw.get("metadata") or {}, raw.get("status") or {}
    name = metadata.get("name")
    if not name:
        raise DeviceError("a Kubernetes Node object without metadata.name")
    if (raw.get("spec") or {}).get("unschedulable") or not _ready(status):
        return None
    labels: Mapping[str, str] = metadata.get("labels") or {}
    allocatable: Mapping[str, Any] = status.get("allocatable") or {}
    whole = _count(allocatable.get(GPU_RESOURCE, 0), name, GPU_RESOURCE)
    mig_devices = {m.group(1): _count(v, name, key) for key, v in allocatable.items()
                   if (m := _MIG_RESOURCE.match(key))}
    mig_devices = {profile: n for profile, n in mig_devices.items() if n > 0}
    if whole == 0 and not mig_devices:
        return None
    node = Node(name=name, cpu_milli=int(parse_quantity(allocatable.get("cpu", 0)) * 1000),
                memory_mib=int(parse_quantity(allocatable.get("memory", 0)) / 2**20))
    product = labels.get("nvidia.com/gpu.product", "")
    strategy = labels.get("nvidia.com/mig.strategy", "none")
    single = _SINGLE_PRODUCT.match(product)
    if strategy == "single" and single:
        model_name, profile_name = single.groups()
        per_gpu = _max_per_gpu(_catalogue(model_name, name), profile_name, name)
        mig_devices = {profile_name: whole}
        whole, mig_gpus = 0, -(-mig_devices[profile_name] // per_gpu)
        memory = None  # the memory label describes one MIG device under the single strategy
    else:
        model_name = product.removesuffix("-SHARED")  # time-slicing renames the product
        whole = -(-whole // max(_label_int(labels, "nvidia.com/gpu.replicas", name) or 1, 1))
        total = _label_int(labels, "nvidia.com/gpu.count", name)
        mig_gpus = total - whole if mig_devices and total and total > whole else None
        memory = _label_int(labels, "nvidia.com/gpu.memory", name)
    model_name = re.sub(r"^NVIDIA[-\s]+", "", model_name) or "unknown"
    catalogue = mig.lookup_model(model_name)
    model = catalogue.name if catalogue else model_name
    memory_mib = memory or (catalogue.memory_mib if catalogue else 0)
    for _ in range(whole):
        node.gpus.append(Gpu(uuid=gpu_uuid(name, len(node.gpus)), index=len(node.gpus), model=model,
                             memory_mib=memory_mib, node=name, mig_capable=bool(catalogue and catalogue.mig_capable)))
    if mig_devices:
        catalogue = _catalogue(model_name, name)
        layouts = _pack(name, catalogue, mig_devices, mig_gpus)
        for layout in layouts:
            index = len(node.gpus)
            uuid = gpu_uuid(name, index)
            instances = [MigInstance(uuid=mig_uuid(uuid, start, profile.profile_id, n), profile_id=profile.profile_id,
                                     start=start, size=profile.memory_slices, gi_id=n + 1, ci_id=0)
                         for n, (profile, start) in enumerate(layout)]
            node.gpus.append(Gpu(uuid=uuid, index=index, model=catalogue.name, memory_mib=catalogue.memory_mib,
                                 node=name, mig_capable=True, mig_mode=MigMode.STATIC, instances=instances))
    return node


def _label_int(labels: Mapping[str, str], key: str, node: str) -> int | None:
    value = labels.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise DeviceError(f"node {node}: label {key} is not an integer: {value!r}") from None


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


def _catalogue(model_name: str, node: str) -> mig.GpuModel:
    model = mig.lookup_model(re.sub(r"^NVIDIA[-\s]+", "", model_name))
    if model is None or not model.mig_capable:
        raise DeviceError(f"node {node}: advertises MIG devices on {model_name or 'an unlabelled GPU'}, "
                          "which is not a MIG-capable model this allocator knows")
    return model


def _profile(model: mig.GpuModel, profile_name: str, node: str) -> MigProfile:
    try:
        return model.profile(profile_name)
    except KeyError:
        raise DeviceError(f"node {node}: {model.name} has no MIG profile {profile_name!r}") from None


def _max_per_gpu(model: mig.GpuModel, profile_name: str, node: str) -> int:
    """How many instances of one profile fit on one GPU (what `all-<profile>` configs make)."""
    profile = _profile(model, profile_name, node)
    layout, count = mig.Layout(model.geometry), 0
    while starts := mig.legal_starts(layout, profile):
        layout, count = layout.with_instance(profile, starts[0]), count + 1
    return count


def _pack(node: str, model: mig.GpuModel, devices: Mapping[str, int],
          gpus: int | None) -> list[list[tuple[MigProfile, int]]]:
    """Place the advertised MIG devices legally on `gpus` GPUs (None: on as few as hold them)."""
    wanted = sorted((_profile(model, name, node) for name, n in devices.items() for _ in range(n)),
                    key=lambda p: (-p.memory_slices, -p.compute_slices, p.profile_id))
    for count in ([gpus] if gpus else range(1, len(wanted) + 1)):
        layout = _pack_on(wanted, count, model.geometry)
        if layout is not None:
            return layout
    summary = ", ".join(f"{n}x {name}" for name, n in sorted(devices.items()))
    raise DeviceError(f"node {node}: the advertised MIG devices ({summary}) do not fit on "
                      f"{gpus or len(wanted)} {model.name} GPU(s)")


def _pack_on(wanted: list[MigProfile], gpus: int,
             geometry: mig.MigGeometry) -> list[list[tuple[MigProfile, int]]] | None:
    """A legal placement of `wanted` (largest first) on `gpus` GPUs, by backtracking; or None."""
    layouts = [mig.Layout(geometry) for _ in range(gpus)]
    placed: list[list[tuple[MigProfile, int]]] = [[] for _ in range(gpus)]
    dead_ends: set[tuple[int, tuple[Any, ...]]] = set()

    def place(k: int) -> bool:
        if k == len(wanted):
            return True
        state = (k, tuple(sorted((lay.occupied, lay.compute_used, lay.counts) for lay in layouts)))
        if state in dead_ends:
            return False
        profile = wanted[k]
        tried: set[mig.Layout] = set()
        for g in range(gpus):
            before = layouts[g]
            if before in tried:
                continue  # GPUs with the same layout are interchangeable
            tried.add(before)
            for start in mig.legal_starts(before, profile):
                layouts[g] = before.with_instance(profile, start)
                placed[g].append((profile, start))
                if place(k + 1):
                    return True
                placed[g].pop()
                layouts[g] = before
        dead_ends.add(state)
        return False

    if not place(0):
        return None
    return [sorted(p, key=lambda item: item[1]) for p in placed]


def _model_profiles(gpu: Gpu) -> dict[int, MigProfile]:
    if gpu.mig_mode is MigMode.OFF:
        return {}
    model = mig.lookup_model(gpu.model)
    return dict(model.profiles) if model else {}


async def _list_cluster_nodes(label_selector: str | None, kubeconfig: str | None,
                              timeout: float) -> list[dict[str, Any]]:
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
    async with client.ApiClient(configuration) as api:
        kwargs: dict[str, Any] = {"_request_timeout": timeout}
        if label_selector:
            kwargs["label_selector"] = label_selector
        # The raw JSON, as the API server sent it (no client-side model validation).
        response = await client.CoreV1Api(api).list_node(_preload_content=False, **kwargs)
        return (await response.json())["items"]
