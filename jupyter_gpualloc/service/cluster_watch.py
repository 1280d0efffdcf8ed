"""The cluster as it changes: a watch of its nodes and pods that tells a listener what changed.

`ClusterWatch` lists the nodes and pods once, then watches both from the list's resourceVersion
(with bookmarks, so a quiet watch still moves on); a watch that ends is resumed from the last
version seen, and one the API server answers `410 Gone` lists again and reports the difference.
While the API server cannot be reached it reports the view stale (and keeps retrying); what it
reports then is the difference between its last view and the fresh one, so nothing is lost or
reported twice across a break.

What it reports, in the running event loop, to a `ClusterListener`:
- the GPU nodes, as the backend reads them: once all of them, then those a batch of events names,
  read again alone: a node whose reading changed (labels, allocatable, cordon, readiness) or that
  came or went, and the nodes of the `gpu.nvidia.com` ResourceSlices (DRA nodes' GPUs) and of the
  devices the ResourceClaims hold that changed (a slice's pool and a claim's allocated devices'
  pools are named after their nodes);
- each pod this install did not create that holds GPU devices on a node (`OutsideUse`), when
  that changes, and None when it ends; each allocated ResourceClaim this install did not write
  the same (where the API server serves resource.k8s.io/v1; where it does not, there are none);
- each pod this install made for a lease, as an `OwnPod`, and None once deleted: one in its
  namespace labelled with its instance and a lease (`own_pod`, core/devices/kubernetes.py) that the
  listener knows (`knows_lease`). A pod labelled so by anyone else (another install, a copied
  manifest) is outside use like any other GPU pod.

It decides nothing: the listener (the service) turns these into the scheduler's calls.

Of the pods it keeps only what is read (a cluster may run tens of thousands, most without GPUs):
the install's server pods in full (kernel and Job pods are made from them, service/user_pods.py),
every pod that asks for NVIDIA devices or carries a lease label as a slim record (`pod_record`),
and nothing of the others. A list decodes only those fields of each pod (service/pod_list.py), then
lists the server pods whole.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable, Iterable, Mapping, Protocol

from ..core.devices import dra
from ..core.devices.kubernetes import (INSTANCE_LABEL, LEASE_LABEL, KubernetesBackend, OwnPod, cluster_configuration,
                                       own_pod, pod_record, reading_key)
from ..core.model import Node, OutsideUse
from .pod_list import decode_pod_list
from .user_pods import SERVER_COMPONENT

log = logging.getLogger(__name__)


class ClusterListener(Protocol):
    def nodes_changed(self, nodes: list[Node], names: list[str] | None = None) -> None: ...
    def outside_use(self, key: str, use: OutsideUse | None) -> None: ...
    def own_pod(self, key: str, pod: OwnPod | None) -> None: ...
    def knows_lease(self, lease_id: str) -> bool: ...
    def lease_active(self, lease_id: str) -> bool: ...
    def stale(self, since: float | None) -> None: ...


class _Resource:
    """One watched kind: its objects by key, the version to resume from, and how to list and watch it."""

    def __init__(self, kind: str, list_call: Callable[..., Any], key: Callable[[Mapping[str, Any]], str],
                 keep: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] = lambda obj: obj):
        """`keep`: what is held of an object (None: nothing)."""
        self.kind, self.list_call, self.key, self.keep = kind, list_call, key, keep
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.version: str | None = None


class ClusterWatch:
    """Lists, then watches, the cluster's nodes and pods for one listener (see the module's docstring)."""

    def __init__(self, backend: KubernetesBackend, listener: ClusterListener, *, namespace: str, instance: str,
                 kubeconfig: str | None = None, retry_seconds: float = 1.0, watch_seconds: int = 300):
        self.backend, self.listener = backend, listener
        self.namespace, self.instance = namespace, instance
        self._kubeconfig, self._retry, self._watch_seconds = kubeconfig, retry_seconds, watch_seconds
        self._node_keys: dict[str, Any] = {}  # node name -> what was read from it (reading_key)
        self._dirty_nodes: set[str] = set()  # named by node events since the last flush
        self._outside: dict[str, OutsideUse] = {}
        self._dirty_pools: set[str] = set()  # the pools of ResourceSlices or claims changed since the last flush
        self._in_pool: dict[str, dict[str, set[str]]] = {"resourceslices": {}, "resourceclaims": {}}  # kind -> pool -> keys
        self._lease_claims: dict[str, set[str]] = {}  # lease id -> the keys of this install's claims for it
        self._reported = False  # whether the nodes were reported once (all of them)
        self._own: dict[str, OwnPod] = {}
        self._own_by_lease: dict[str, dict[str, OwnPod]] = {}  # lease id -> pod key -> its pod
        self._stale_since: float | None = None
        self._broken: set[str] = set()  # the kinds whose last request failed
        self._synced = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._api: Any = None
        self._core: Any = None
        self._resources: tuple[_Resource, ...] = ()

    async def start(self) -> None:
        """Open the client and start watching; returns at once (see synced())."""
        from kubernetes_asyncio import client

        self._api = client.ApiClient(await cluster_configuration(self._kubeconfig))
        self._core = client.CoreV1Api(self._api)
        nodes = _Resource("nodes", self._core.list_node, lambda o: o["metadata"]["name"])
        pods = _Resource("pods", self._core.list_pod_for_all_namespaces,
                         lambda o: f"pod:{o['metadata'].get('namespace')}/{o['metadata']['name']}", self._kept_pod)
        resource = client.ResourceV1Api(self._api)
        slices = _Resource("resourceslices", resource.list_resource_slice, lambda o: o["metadata"]["name"],
                           lambda o: o if (o.get("spec") or {}).get("driver") == dra.DRIVER else None)
        claims = _Resource("resourceclaims", resource.list_resource_claim_for_all_namespaces, dra.claim_key,
                           _claim_record)
        self._resources = (nodes, pods, slices, claims)
        self._tasks = [asyncio.create_task(self._follow(r), name=f"watch {r.kind}") for r in self._resources]

    async def synced(self, timeout: float | None = None) -> None:
        """Wait until both kinds were listed once and reported."""
        await asyncio.wait_for(self._synced.wait(), timeout)

    @property
    def is_synced(self) -> bool:
        """Whether both kinds were listed once and reported."""
        return self._synced.is_set()

    @property
    def stale_since(self) -> float | None:
        return self._stale_since

    @property
    def api_client(self) -> Any:
        """The kubernetes_asyncio ApiClient the watch uses (for the service's own writes)."""
        return self._api

    def pod_labels(self, lease_id: str) -> dict[str, str]:
        """The labels that make a pod in `namespace` the one of lease `lease_id` of this install."""
        return {LEASE_LABEL: lease_id, INSTANCE_LABEL: self.instance}

    def own_pods_of(self, lease_id: str) -> list[OwnPod]:
        """The pods made for one lease, as last seen (without going through every lease's pods)."""
        return list(self._own_by_lease.get(lease_id, {}).values())

    def pods(self) -> list[Mapping[str, Any]]:
        """The pods held, as last seen: the install's server pods as the API returns them, GPU and
        lease pods as their records (see the module's docstring)."""
        return list(self._resources[1].objects.values()) if self._resources else []

    async def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a pod made for a lease; False when it was gone already."""
        from kubernetes_asyncio.client.exceptions import ApiException
        try:
            await self._core.delete_namespaced_pod(name, namespace, _request_timeout=30)
            return True
        except ApiException as err:
            if err.status == 404:
                return False
            raise

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._api is not None:
            await self._api.close()

    # -------------------------------------------------------------- watching
    async def _follow(self, resource: _Resource) -> None:
        """List, then watch from the list's version, forever; relist on 410, retry on errors. A DRA
        kind the API server does not serve (404: Kubernetes < 1.34) is empty, and not watched."""
        from kubernetes_asyncio.client.exceptions import ApiException
        import aiohttp

        while True:
            try:
                if resource.version is None:
                    await self._list(resource)
                await self._watch(resource)
            except asyncio.CancelledError:
                raise
            except ApiException as err:
                if err.status == 410:
                    resource.version = None
                    continue
                if err.status == 404 and resource.kind in ("resourceslices", "resourceclaims"):
                    log.info("the API server serves no resource.k8s.io/v1 %s: no DRA nodes", resource.kind)
                    resource.version = ""
                    self._flush(resource)
                    self._mark_fresh(resource)
                    if all(r.version is not None for r in self._resources):
                        self._synced.set()
                    return
                self._mark_stale(resource, f"{err.status} {err.reason}")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as err:
                self._mark_stale(resource, repr(err))
            except Exception:  # a listener failed on a change: logged, and the kind is listed afresh
                log.exception("applying a change of the cluster's %s failed", resource.kind)
                resource.version = None
            await asyncio.sleep(self._retry)

    async def _list(self, resource: _Resource) -> None:
        response = await resource.list_call(_preload_content=False, _request_timeout=60)
        if resource.kind == "pods":  # what is read of each pod, then the install's server pods whole
            listed = decode_pod_list(await response.read())
            listed["items"] += await self._server_pods()
        else:
            listed = await response.json()
        objects = {resource.key(o): o for o in listed.get("items") or []}
        for key in set(resource.objects) - set(objects):
            self._apply(resource, "DELETED", resource.objects[key])
        for obj in objects.values():
            self._apply(resource, "MODIFIED", obj)
        resource.version = listed["metadata"]["resourceVersion"]
        self._flush(resource)
        self._mark_fresh(resource)
        if all(r.version is not None for r in self._resources):
            self._synced.set()

    async def _server_pods(self) -> list[Mapping[str, Any]]:
        """The install's server pods as the API returns them (kernel and Job pods are made from them)."""
        response = await self._core.list_namespaced_pod(self.namespace, label_selector=f"component={SERVER_COMPONENT}",
                                                        _preload_content=False, _request_timeout=60)
        return (await response.json()).get("items") or []

    async def _watch(self, resource: _Resource) -> None:
        """One watch request, applied batch by batch as its lines arrive."""
        response = await resource.list_call(
            watch=True, resource_version=resource.version, allow_watch_bookmarks=True,
            timeout_seconds=self._watch_seconds, _preload_content=False,
            _request_timeout=self._watch_seconds + 30)
        self._mark_fresh(resource)
        buffered = b""
        try:
            async for chunk in response.content.iter_any():
                *lines, buffered = (buffered + chunk).split(b"\n")
                for line in lines:
                    if line.strip() and not self._event(resource, json.loads(line)):
                        return
                self._flush(resource)
        finally:
            response.close()

    def _event(self, resource: _Resource, event: Mapping[str, Any]) -> bool:
        """Apply one watch event; False when the watch must list again (410 Gone)."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                resource.version = None
            else:
                self._mark_stale(resource, str(obj.get("message")))
            return False
        resource.version = (obj.get("metadata") or {}).get("resourceVersion", resource.version)
        if kind != "BOOKMARK":
            self._apply(resource, kind, obj)
        return True

    def _kept_pod(self, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
        metadata = pod.get("metadata") or {}
        if metadata.get("namespace") == self.namespace \
                and (metadata.get("labels") or {}).get("component") == SERVER_COMPONENT:
            return pod
        return pod_record(pod)

    def _apply(self, resource: _Resource, kind: str, obj: Mapping[str, Any]) -> None:
        key = resource.key(obj)
        kept = None if kind == "DELETED" else resource.keep(obj)
        before = resource.objects.get(key)
        if kept is None:
            resource.objects.pop(key, None)
        else:
            resource.objects[key] = kept
        if resource.kind == "pods":
            self._pod_changed(key, kept)
        elif resource.kind == "nodes":
            self._dirty_nodes.add(key)
        else:
            in_pool = self._in_pool[resource.kind]
            was, now = _pools(resource.kind, before), _pools(resource.kind, kept)
            for pool in was - now:
                in_pool[pool].discard(key)
                if not in_pool[pool]:
                    del in_pool[pool]
            for pool in now:
                in_pool.setdefault(pool, set()).add(key)
            self._dirty_pools |= was | now
            if resource.kind == "resourceclaims":
                self._index_lease_claim(key, self._claim_lease(before), self._claim_lease(kept))

    def _claim_lease(self, claim: Mapping[str, Any] | None) -> str | None:
        """The lease a claim was made for, where this install made it."""
        metadata = (claim or {}).get("metadata") or {}
        labels = metadata.get("labels") or {}
        if metadata.get("namespace") != self.namespace or labels.get(INSTANCE_LABEL) != self.instance:
            return None
        return labels.get(LEASE_LABEL)

    def _index_lease_claim(self, key: str, was: str | None, now: str | None) -> None:
        if was is not None and was != now:
            keys = self._lease_claims.get(was, set())
            keys.discard(key)
            if not keys:
                self._lease_claims.pop(was, None)
        if now is not None:
            self._lease_claims.setdefault(now, set()).add(key)

    def _report_nodes(self, names: set[str]) -> None:
        """Tell the listener what the named nodes are now, read again alone; the first report is every
        node (the listener's fleet was read before the watch, and may hold nodes gone since)."""
        nodes, _, slices, claims = self._resources
        if not self._reported:
            self._reported = True
            self.listener.nodes_changed(self.backend.read_nodes(
                nodes.objects.values(), slices.objects.values(), claims.objects.values()))
            return
        named = sorted(names)
        self.listener.nodes_changed(self.backend.read_named(
            named, nodes.objects, [slices.objects[key] for key in self._in_pools(slices.kind, named)],
            [claims.objects[key] for key in self._in_pools(claims.kind, named)]), names=named)

    def _in_pools(self, kind: str, pools: Iterable[str]) -> list[str]:
        """The keys of the ResourceSlices or claims (`kind`) of these pools (nodes), in order."""
        in_pool = self._in_pool[kind]
        return sorted({key for pool in pools for key in in_pool.get(pool, ())})

    def _flush(self, resource: _Resource) -> None:
        """After a batch of node events: the nodes, if what is read from any of them changed (only
        the nodes named by the batch are read again), then the pods on those nodes, whose devices
        are read by their node's labels. After a batch of ResourceSlice or claim events: the claims'
        holds, then the nodes (a claim's partition is an instance of its node's GPU), then the
        claims' holds as read on the nodes anew. Nothing until every kind was listed once: the fleet
        read from the nodes alone would lack the DRA nodes' GPUs, and end the leases on them."""
        if not all(r.version is not None for r in self._resources):
            return
        self._flush_nodes()
        if self._dirty_pools:
            pools, self._dirty_pools = self._dirty_pools, set()
            self._claims_changed(pools)
            self._report_nodes(pools)
            self._claims_changed(pools)

    def _flush_nodes(self) -> None:
        if not self._dirty_nodes:
            return
        resource = self._resources[0]
        changed = set()
        for name in self._dirty_nodes:
            raw = resource.objects.get(name)
            key = reading_key(raw) if raw is not None else None
            if self._node_keys.get(name) != key:
                changed.add(name)
                if key is None:
                    self._node_keys.pop(name, None)
                else:
                    self._node_keys[name] = key
        self._dirty_nodes.clear()
        if not changed:
            return
        self._report_nodes(changed)
        for key, raw in self._resources[1].objects.items():
            if (raw.get("spec") or {}).get("nodeName") in changed:
                self._pod_changed(key, raw)
        self._claims_changed(changed)

    def _claims_changed(self, pools: set[str] | None = None) -> None:
        """Report each allocated claim's hold that changed (None for a claim gone or deallocated), of
        every claim or of those on `pools` (nodes); the claims this install wrote for its active leases
        hold nothing outside (one left behind by an ended lease does, until it is deleted)."""
        claims = self._resources[3].objects
        if pools is not None:
            claims = {key: claims[key] for key in self._in_pools("resourceclaims", pools)}
        uses = {}
        for key, claim in claims.items():
            labels = (claim.get("metadata") or {}).get("labels") or {}
            if (claim.get("metadata") or {}).get("namespace") == self.namespace \
                    and labels.get(INSTANCE_LABEL) == self.instance and self.listener.lease_active(labels.get(LEASE_LABEL, "")):
                continue
            use = self.backend.claim_use(claim)
            if use is not None:
                uses[key] = use
        for key in [k for k, use in self._outside.items() if k.startswith("claim:") and k not in uses
                    and (pools is None or use.node in pools)]:
            del self._outside[key]
            self.listener.outside_use(key, None)
        for key, use in uses.items():
            if self._outside.get(key) != use:
                self._outside[key] = use
                self.listener.outside_use(key, use)

    def _pod_changed(self, key: str, pod: Mapping[str, Any] | None) -> None:
        mine = own_pod(pod, self.namespace, self.instance) if pod is not None else None
        known = self._own.get(key)
        if mine is not None and (known is None or known.lease_id != mine.lease_id) \
                and not self.listener.knows_lease(mine.lease_id):
            mine = None  # labelled as ours, but for a lease this install never made
        if known != mine:
            if known is not None:
                pods = self._own_by_lease[known.lease_id]
                del pods[key]
                if not pods:
                    del self._own_by_lease[known.lease_id]
            if mine is None:
                del self._own[key]
            else:
                self._own[key] = mine
                self._own_by_lease.setdefault(mine.lease_id, {})[key] = mine
            self.listener.own_pod(key, mine)
        use = self.backend.outside_use(pod) if pod is not None and mine is None else None
        if self._outside.get(key) != use:
            if use is None:
                del self._outside[key]
            else:
                self._outside[key] = use
            self.listener.outside_use(key, use)

    def report_again(self) -> None:
        """Report the whole fleet and every outside use again, as first reported: a core call that the
        store refused left the core behind the cluster, and later reports carry only what changes."""
        if not self._resources or not all(r.version is not None for r in self._resources):
            return  # the first report, once every kind is listed, is whole anyway
        self._reported = False
        self._report_nodes(set())
        for key, use in list(self._outside.items()):
            self.listener.outside_use(key, use)

    def recheck_claims(self, lease_id: str) -> None:
        """A lease ended: judge again the claims on the nodes of its claims (which, while they
        remain, hold their devices outside it), not every claim of the cluster."""
        if len(self._resources) != 4 or not all(r.version is not None for r in self._resources):
            return
        claims = self._resources[3].objects
        pools = {pool for key in self._lease_claims.get(lease_id, ()) for pool in _pools("resourceclaims", claims.get(key))}
        if pools:
            self._claims_changed(pools)

    def _mark_stale(self, resource: _Resource, why: str) -> None:
        self._broken.add(resource.kind)
        if self._stale_since is None:
            self._stale_since = time.time()
            log.warning("the cluster's view is stale: %s: %s", resource.kind, why)
            self.listener.stale(self._stale_since)

    def _mark_fresh(self, resource: _Resource) -> None:
        self._broken.discard(resource.kind)
        if self._stale_since is not None and not self._broken:
            log.info("the cluster's view is current again")
            self._stale_since = None
            self.listener.stale(None)


def _pools(kind: str, obj: Mapping[str, Any] | None) -> set[str]:
    """The pools (named after their nodes) a ResourceSlice publishes to, or a claim holds devices of."""
    if obj is None:
        return set()
    if kind == "resourceslices":
        return {name} if (name := ((obj.get("spec") or {}).get("pool") or {}).get("name")) else set()
    return {pool for pool, _, _ in dra.allocated(obj)}


def _claim_record(claim: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """What is read of a ResourceClaim: its name, the install's labels and the `gpu.nvidia.com` devices its
    allocation holds; None for one that holds none of them."""
    if not dra.allocated(claim):
        return None
    metadata = claim.get("metadata") or {}
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return {"metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace"),
                         "labels": {k: v for k, v in (metadata.get("labels") or {}).items() if k.startswith("gpualloc.")}},
            "status": {"allocation": {"devices": {"results": [
                r for r in (allocation.get("devices") or {}).get("results") or [] if r.get("driver") == dra.DRIVER]}}}}
