"""The Kubernetes cluster kept in step with the core: what the watch sees becomes the scheduler's
calls, and every lease is tied to the pod made for it.

Only this install's pods are its own: in its namespace, labelled with its instance and a lease it
made (`pod_labels`). It deletes no other pod, and every other GPU pod is outside use. A granted
lease tells its spawner the extended resources its pod asks for, by the names its node advertises
(`pod`), since the nodes of a cluster name them differently.

- Nodes and pods the allocator did not place reach `Scheduler.nodes_changed` and
  `Scheduler.outside_use` (ClusterWatch reports them on the IOLoop; no decision reads the cluster).
- A lease's pod deleted, `Failed` or `Succeeded` releases the lease (its holder is gone), saying so.
- A job's pod (service/job_pods.py) that ends or goes before its runner reported is a failed
  attempt of the job, with the kubelet's reason.
- A lease that ended while its pod remains has the pod deleted: the spawner's own stop usually
  did it first; this is the backstop, logged and recorded (`pod.deleted`, in the audit log).
- A pod the kube-scheduler cannot place for `pod_unschedulable_timeout` seconds ends its lease
  with the kube-scheduler's message, and is deleted.
- A granted lease with no pod in the cluster `pod_missing_timeout` seconds after its grant is
  released: its spawner never made the pod, or the pod went while the service was not watching.
- While the API server cannot be reached the core goes on deciding from its last view, and
  `stale_since` says since when (/health, the gpualloc_cluster_stale metric).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Callable

from ..core.devices.kubernetes import KubernetesBackend, OwnPod
from .cluster_watch import ClusterWatch
from ..core.errors import NotFound, StoreFailed
from ..core.holders import is_server
from ..core.model import Event, Lease, LeaseState, Node, OutsideUse
from ..core.scheduler import Scheduler
from ..kube.gpu import KubeGpu
from .dra_claims import LeaseClaims

log = logging.getLogger(__name__)

ENDED = frozenset({"lease.released", "lease.expired", "lease.preempted", "lease.cancelled"})


class ClusterReconciler:
    """Listens to a ClusterWatch and the scheduler's events; acts for the leases' pods."""

    def __init__(self, scheduler: Scheduler, backend: KubernetesBackend, *, namespace: str, instance: str,
                 kubeconfig: str | None = None, pod_unschedulable_timeout: float = 300.0,
                 pod_missing_timeout: float = 120.0, clock: Callable[[], float] = time.time,
                 record: Callable[[Event], None] | None = None, gpu: KubeGpu | None = None):
        """`namespace` and `instance`: where this install's pods run and the name they carry;
        `record`: where what the reconciler does to the cluster is written (the audit log);
        `gpu`: how the cluster's pods get their slice (the resources a lease's pod asks for)."""
        self.scheduler, self.clock, self.record = scheduler, clock, record
        self.backend, self.gpu = backend, gpu or KubeGpu()
        self.namespace, self.instance = namespace, instance
        self.pod_unschedulable_timeout = pod_unschedulable_timeout
        self.pod_missing_timeout = pod_missing_timeout
        self.watch = ClusterWatch(backend, self, namespace=namespace, instance=instance, kubeconfig=kubeconfig)
        self.claims = LeaseClaims(backend, self.watch)  # the leases' ResourceClaims on DRA nodes
        self._claims_ready: dict[str, str] = {}  # server lease -> its claim, allocated
        self.stale_since: float | None = None
        self._pods: dict[str, OwnPod] = {}  # pod key -> the lease pod as last seen
        self._deleting: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self.report_again_seconds = 5.0  # after a store refusal, how soon the watch reports everything again
        self._reporting_again = False
        self.job_pods = None  # service.job_pods.JobPods when jobs run in Kubernetes Jobs
        scheduler.subscribe(self._on_event)

    async def start(self, sync_timeout: float = 120.0) -> None:
        """Watch the cluster; returns once nodes and pods were listed once and applied. The granted
        servers' claims are then allocated again (where they are, it finds them so; where the service
        stopped between a grant and its allocation, it makes them): which is ready lives in memory."""
        await self.watch.start()
        await self.watch.synced(sync_timeout)
        for lease in self.scheduler.leases():
            if lease.state is LeaseState.GRANTED and lease.slice is not None and is_server(lease.holder) \
                    and self.claims.devices(lease.slice.to_json()) is not None:
                self._claim_for_server(lease.id)

    async def close(self) -> None:
        await self.watch.close()
        for task in list(self._tasks):
            task.cancel()

    def status(self) -> str:
        """'current', or 'stale since <UTC time>' while the API server cannot be reached."""
        if self.stale_since is None:
            return "current"
        return "stale since " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.stale_since))

    # ----------------------------------------------------- the watch's reports
    def nodes_changed(self, nodes: list[Node], names: list[str] | None = None) -> None:
        self._core(self.scheduler.nodes_changed, nodes, names=names)

    def outside_use(self, key: str, use: OutsideUse | None) -> None:
        self._core(self.scheduler.outside_use, key, use)

    def own_pod(self, key: str, pod: OwnPod | None) -> None:
        known = self._pods.pop(key, None)
        if pod is None:
            self._deleting.discard(key)
            if known is not None:
                self._job_pod_ended(known, f"its pod {known.namespace}/{known.name} was deleted")
                self._end(known.lease_id, f"its pod {known.namespace}/{known.name} was deleted")
                self._delete_claim(known.lease_id, known.namespace)
            return
        self._pods[key] = pod
        if pod.phase in ("Succeeded", "Failed"):
            self._job_pod_ended(pod, f"its pod {pod.namespace}/{pod.name} ended without the runner's report: "
                                     f"{pod.ended}")
            self._end(pod.lease_id, f"its pod {pod.namespace}/{pod.name} {pod.phase.lower()}")
            self._delete(pod, "it has ended")
        elif not self._lease_active(pod.lease_id):
            self._delete(pod, f"its lease {pod.lease_id} has ended")

    def stale(self, since: float | None) -> None:
        self.stale_since = since

    def knows_lease(self, lease_id: str) -> bool:
        """Whether this install's store made the lease (while the store cannot answer: as labelled)."""
        try:
            self.scheduler.lease(lease_id)
        except NotFound:
            return False
        except StoreFailed:
            return True
        return True

    def pod(self, lease: Lease) -> dict[str, object]:
        """Where `lease`'s pod must run, the labels it must carry to be the lease's and, once granted,
        the extended resources it asks for, by the names its node advertises; on a DRA node none, but
        `claim`, the lease's ResourceClaim, once the service allocated it (null until then: the pod
        must not exist before, or the kube-scheduler would allocate the claim itself)."""
        pod: dict[str, object] = {"namespace": self.namespace, "labels": self.watch.pod_labels(lease.id)}
        if lease.slice is not None:
            if self.claims.devices(lease.slice.to_json()) is not None:
                pod["resources"], pod["claim"] = {}, self._claims_ready.get(lease.id)
            else:
                pod["resources"] = self.gpu.limits(lease.slice.to_json(),
                                                   self.backend.node_resources(lease.slice.node))
        return pod

    # ---------------------------------------------------------------- leases
    def tick(self) -> None:
        """End the leases whose pods the kube-scheduler could not place for too long, and those
        granted long enough ago that have no pod (judged only on a current view)."""
        now = self.clock()
        for pod in list(self._pods.values()):
            since = pod.unschedulable_since
            if since is None or pod.node or now - since < self.pod_unschedulable_timeout:
                continue
            why = f"its pod could not be scheduled for {now - since:.0f} s: {pod.unschedulable}"
            self._job_pod_ended(pod, why)
            self._end(pod.lease_id, why)
            self._delete(pod, "it could not be scheduled")
        if not self.watch.is_synced or self.stale_since is not None:
            return
        with_pods = {pod.lease_id for pod in self._pods.values()}
        for lease in self.scheduler.leases():
            granted = lease.granted_at
            if (lease.state is LeaseState.GRANTED and not lease.returning and lease.id not in with_pods
                    and granted is not None and now - granted >= self.pod_missing_timeout):
                self._end(lease.id, f"it has no pod in the cluster {now - granted:.0f} s after its grant")

    def _on_event(self, event: Event) -> None:
        if event.type == "lease.granted" and event.lease_id is not None and is_server(str(event.data.get("holder"))):
            self._claim_for_server(event.lease_id)
        if event.type not in ENDED or event.lease_id is None:
            return
        self._claims_ready.pop(event.lease_id, None)
        pods = self.watch.own_pods_of(event.lease_id)
        for pod in pods:
            self._delete(pod, f"its lease ended ({event.data.get('reason', event.type)})")
        if not pods:  # no pod holds its claim (if it has one): it goes now, else once its pod is gone
            self._delete_claim(event.lease_id, self.namespace)
        with contextlib.suppress(RuntimeError):  # its claim, while it remains, holds its device outside
            asyncio.get_running_loop().call_soon(self.watch.recheck_claims, event.lease_id)  # after the core's call that ended it

    def _claim_for_server(self, lease_id: str) -> None:
        """A server's lease granted on a DRA node: its claim, allocated before its spawner makes the pod
        (the kernel and job pods' own claims are made where those pods are)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return

        async def allocate() -> None:
            try:
                lease = self.scheduler.lease(lease_id)
            except (NotFound, StoreFailed):
                return
            if lease.state is not LeaseState.GRANTED:
                return
            try:
                name = await self.claims.ensure(lease.to_json(), self.namespace)
            except Exception as err:  # noqa: BLE001 - the lease cannot be used: it ends, saying why
                self._end(lease_id, f"its ResourceClaim could not be written: {err}")
                return
            if name is not None and self._lease_active(lease_id):
                self._claims_ready[lease_id] = name

        task = loop.create_task(allocate())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def lease_active(self, lease_id: str) -> bool:
        """Whether the lease is queued or granted (its claim is its own, not outside use)."""
        return self._lease_active(lease_id)

    def _delete_claim(self, lease_id: str, namespace: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no IOLoop (the core driven directly)
            return
        task = loop.create_task(self._delete_claim_now(lease_id, namespace))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_claim_now(self, lease_id: str, namespace: str) -> None:
        try:
            await self.claims.delete(lease_id, namespace)
        except Exception as err:  # noqa: BLE001 - logged; the claim holds its device outside until deleted by hand
            log.warning("could not delete the ResourceClaim of lease %s: %s", lease_id, err)

    def _job_pod_ended(self, pod: OwnPod, why: str) -> None:
        if pod.job_id is not None and self.job_pods is not None:
            self.job_pods.pod_ended(pod, why)

    def _lease_active(self, lease_id: str) -> bool:
        try:
            lease = self.scheduler.lease(lease_id)
        except (NotFound, StoreFailed):
            return False
        return lease.state in (LeaseState.QUEUED, LeaseState.GRANTED)

    def _end(self, lease_id: str, reason: str) -> None:
        """Release a lease whose pod is gone or hopeless (its holder is gone with it)."""
        try:
            lease = self.scheduler.lease(lease_id)
        except (NotFound, StoreFailed):
            return
        if lease.state in (LeaseState.QUEUED, LeaseState.GRANTED) or lease.returning:
            log.info("lease %s ends: %s", lease_id, reason)
            self._core(self.scheduler.release, lease_id, reason=reason, holder_gone=True)

    def _delete(self, pod: OwnPod, why: str) -> None:
        if pod.key in self._deleting or pod.deleting:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no IOLoop (the core driven directly): the pod's next report deletes it
            return
        self._deleting.add(pod.key)
        log.info("deleting pod %s/%s of lease %s: %s", pod.namespace, pod.name, pod.lease_id, why)
        task = loop.create_task(self._delete_now(pod, why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_now(self, pod: OwnPod, why: str) -> None:
        try:
            deleted = await self.watch.delete_pod(pod.namespace, pod.name)
        except Exception as err:  # the next report of the pod tries again
            self._deleting.discard(pod.key)
            log.warning("could not delete pod %s/%s: %s", pod.namespace, pod.name, err)
            return
        if deleted and self.record is not None:
            try:
                lease = self.scheduler.lease(pod.lease_id)
                user, holder = lease.user, lease.holder
            except (NotFound, StoreFailed):
                user = holder = None
            self.record(Event("pod.deleted", self.clock(), pod.lease_id, user,
                              {"pod": f"{pod.namespace}/{pod.name}", "holder": holder, "reason": why}))

    def _core(self, call, *args, **kwargs) -> None:
        """One core call at the present time. A store failure is logged, and the watch reports the
        whole cluster again `report_again_seconds` later (again while the store refuses): later
        events carry only what changes, so the refused change would otherwise wait for its node's
        or pod's next one."""
        try:
            call(*args, now=self.clock(), **kwargs)
        except StoreFailed as err:
            log.warning("the store refused a change from the cluster (reported again in %.0f s): %s",
                        self.report_again_seconds, err)
            if not self._reporting_again:
                with contextlib.suppress(RuntimeError):  # no loop: nothing runs later anyway
                    asyncio.get_running_loop().call_later(self.report_again_seconds, self._report_again)
                    self._reporting_again = True

    def _report_again(self) -> None:
        self._reporting_again = False
        self.watch.report_again()
