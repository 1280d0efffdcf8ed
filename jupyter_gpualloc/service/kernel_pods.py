"""GPU kernels in pods of their own (c.GpuAllocService.kernel_pods), and their REST API.

A running pod cannot gain a device, so on Kubernetes a kernel started from a GPU kernelspec runs in
a pod next to its user's CPU-only server pod. The server's kernel provisioner (server/provisioner.py)
asks with `POST /kernels/{kernel_id}/pod`: the slice, the server it belongs to, the kernel's command
line and env, and its connection key and ports. The service queues a `kernel:<id>` lease; once it
is granted it makes the kernel's pod from the server's pod (service/user_pods.py) with the lease's
resources and node affinity, an owner reference to the server pod (stopping the server removes
its kernel pods), and a Secret owned by the kernel pod holding the connection file and the env
(the kernel's token among it). The kernel listens on the pod's IP; `GET` says where the request
is (queued with its position, starting, running with the pod's IP, or ended with why) and the
provisioner connects once it runs. `DELETE` (kernel shutdown) ends the lease, and the lease's end
deletes the pod (service/cluster.py), as idle release, time limits, usage quotas and preemption
do; the pod's end ends the lease.

What a request carries (the kernel's connection key and token among it) lives in memory only. After
a restart the service knows the kernel's lease (from the store) and its pod (from the watch), not
the request: the provisioner, answered 404, sends it again with `resume`, and the service takes
back the lease and the pod as they are, or makes the pod of a lease granted meanwhile. A request
never told again is released after `pod_missing_timeout`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..core.errors import HolderBusy, NotFound, SchedulerError, StoreFailed
from ..core.holders import kernel_holder, kernel_of
from ..core.model import Event, Lease, LeaseState, PriorityClass, SpecError
from ..core.scheduler import Scheduler
from .handlers import ApiError, ApiHandler
from .dra_claims import ClaimError, LeaseClaims
from .user_pods import UserPods, api_message

log = logging.getLogger(__name__)

KERNEL_LABEL = "gpualloc.jupyter.org/kernel"
CONNECTION_DIR = "/var/run/gpualloc-kernel"
CONNECTION_FILE = f"{CONNECTION_DIR}/connection.json"
CONNECTION_PLACEHOLDER = "{connection_file}"  # in a request's argv: where the pod's connection file goes
PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
KERNEL_GRACE_SECONDS = 10
KERNEL_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,54}[a-z0-9])?")  # fits a label value, and the pod's name


@dataclass
class KernelPodRequest:
    """What a kernel's pod is made from, kept until the pod is made."""

    user: str
    kernel_id: str
    lease_id: str
    template: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    connection: dict[str, Any]
    workdir: str
    made: bool = False
    creating: bool = False


class KernelPods:
    """The kernel pod requests of every user, their leases and their pods."""

    def __init__(self, scheduler: Scheduler, watch: Any, pods: UserPods, *, clock: Callable[[], float],
                 claims: LeaseClaims | None = None):
        """`claims`: the leases' ResourceClaims on DRA nodes (None: no claims are written)."""
        self.scheduler, self.watch, self.pods, self.clock, self.claims = scheduler, watch, pods, clock, claims
        self._requests: dict[str, KernelPodRequest] = {}  # kernel id -> its request
        self._tasks: set[asyncio.Task] = set()
        scheduler.subscribe(self._on_event)

    def request(self, user: str, groups: tuple[str, ...], kernel_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Queue the kernel's lease and keep what its pod is made from; the request's view."""
        if not KERNEL_ID.fullmatch(kernel_id):
            raise SpecError("kernel_id", "must be a kernel's id as Jupyter makes them (lower-case letters, digits "
                                         "and '-', at most 56): it names the kernel's pod")
        spec = self.scheduler.requested_spec(body, groups)
        template = self.pods.server_template(self.watch.pods(), user, body.get("server", "server"), self.watch.namespace)
        if body.get("resume"):
            return self._resume(user, kernel_id, template, body)
        spec = self.pods.placed(spec, template, "GPU kernel")
        lease = self.scheduler.submit(user, kernel_holder(kernel_id), spec,
                                      PriorityClass(body.get("priority", "interactive")), now=self.clock(),
                                      groups=groups, wait=True, idle_timeout=body.get("idle_timeout"),
                                      own_pod=True)
        return self._keep(user, kernel_id, lease, template, body)

    def _resume(self, user: str, kernel_id: str, template: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
        """The request told again after a restart of the service: its active lease and pod, as they are."""
        holder = kernel_holder(kernel_id)
        lease = next((l for l in self.scheduler.leases(user) if l.holder == holder), None)
        if lease is None:
            raise NotFound(f"kernel {kernel_id}'s lease has ended")
        known = self._requests.get(kernel_id)
        if known is not None and known.lease_id == lease.id:
            return self.view(user, kernel_id)
        made = bool(self.watch.own_pods_of(lease.id))
        return self._keep(user, kernel_id, lease, template, body, made=made)

    def _keep(self, user: str, kernel_id: str, lease: Lease, template: dict[str, Any], body: Mapping[str, Any],
              made: bool = False) -> dict[str, Any]:
        """Keep what the pod is made from; a granted lease's pod is made next (unless `made`)."""
        self._requests[kernel_id] = KernelPodRequest(
            user, kernel_id, lease.id, template, list(body["argv"]), dict(body.get("env", {})),
            dict(body["connection"]), body.get("workdir") or template["container"].get("workingDir", ""), made=made)
        if lease.state is LeaseState.GRANTED:
            self._soon(kernel_id)
        return self.view(user, kernel_id)

    def view(self, user: str, kernel_id: str) -> dict[str, Any]:
        """Where the kernel's pod is: queued (position), starting, running (ip) or ended (reason)."""
        request = self._requests.get(kernel_id)
        if request is None or request.user != user:
            raise NotFound(f"no kernel pod {kernel_id}")
        try:
            lease = self.scheduler.lease(request.lease_id)
        except NotFound:
            return {"kernel_id": kernel_id, "state": "ended", "reason": "its lease is gone", "lease": None}
        view: dict[str, Any] = {"kernel_id": kernel_id, "lease": lease.to_json(), "position": None, "ip": None}
        if lease.state is LeaseState.QUEUED:
            return {**view, "state": "queued", "position": self.scheduler.position(lease.id)}
        if lease.state is not LeaseState.GRANTED:
            return {**view, "state": "ended", "reason": lease.reason or lease.state.value}
        pod = next(iter(self.watch.own_pods_of(lease.id)), None)
        if pod is not None and pod.phase == "Running" and pod.ip and not pod.deleting:
            return {**view, "state": "running", "ip": pod.ip, "pod": f"{pod.namespace}/{pod.name}"}
        if pod is not None and pod.phase in ("Succeeded", "Failed"):
            return {**view, "state": "ended", "reason": f"its pod ended: {pod.ended}"}
        return {**view, "state": "starting", "pod": f"{pod.namespace}/{pod.name}" if pod else None,
                "reason": (pod.unschedulable or "") if pod else ""}

    def release(self, user: str, kernel_id: str) -> dict[str, Any]:
        """The kernel shuts down (or its start is cancelled): its lease ends, and with it its pod."""
        view = self.view(user, kernel_id)
        request = self._requests[kernel_id]
        try:
            self.scheduler.release(request.lease_id, now=self.clock(), reason="kernel shut down")
        except (NotFound, SchedulerError):  # it ended already (idle, time limit, preempted, its pod gone)
            pass
        return {**view, "state": "ended", "reason": "kernel shut down"}

    # ----------------------------------------------------------------- leases
    def _on_event(self, event: Event) -> None:
        kernel_id = kernel_of(event.data.get("holder"))
        request = self._requests.get(kernel_id or "")
        if request is None or event.lease_id != request.lease_id:
            return
        if event.type == "lease.granted":
            self._soon(request.kernel_id)
        elif event.type in ("lease.released", "lease.expired", "lease.preempted", "lease.cancelled"):
            self._forget_later(request)

    def _soon(self, kernel_id: str) -> None:
        """Make the pod once the change that granted the lease is over."""
        try:
            asyncio.get_running_loop().call_soon(self._make, kernel_id)
        except RuntimeError:
            pass

    def _forget_later(self, request: KernelPodRequest, after: float = 300.0) -> None:
        """An ended request still answers GET (the provisioner learns why) for a while; a new request
        of the same kernel (a restart) is not forgotten with it."""
        def forget() -> None:
            if self._requests.get(request.kernel_id) is request:
                del self._requests[request.kernel_id]
        try:
            asyncio.get_running_loop().call_later(after, forget)
        except RuntimeError:
            forget()

    def _make(self, kernel_id: str) -> None:
        request = self._requests.get(kernel_id)
        if request is None or request.made or request.creating:
            return
        try:
            lease = self.scheduler.lease(request.lease_id)
        except (NotFound, StoreFailed):
            return
        if lease.state is not LeaseState.GRANTED:
            return
        request.creating = True
        task = asyncio.get_running_loop().create_task(self._create(request, lease.to_json()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _create(self, request: KernelPodRequest, lease: Mapping[str, Any]) -> None:
        """The pod, then the Secret it owns (the kubelet waits for the Secret to mount it)."""
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        namespace = request.template.get("namespace", "default")
        try:
            claim = await self.claims.ensure(lease, namespace) if self.claims is not None else None
        except (ClaimError, OSError, asyncio.TimeoutError) as err:
            request.creating = False
            self._end(request, str(err))
            return
        manifest = self.pod_manifest(request, lease, claim)
        name = manifest["metadata"]["name"]
        core = client.CoreV1Api(self.watch.api_client)
        try:
            made = await core.create_namespaced_pod(namespace, manifest, _request_timeout=30)
            owner = {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": made.metadata.uid}
            connection = {**request.connection, "ip": "0.0.0.0", "transport": "tcp"}
            data = {"connection.json": json.dumps(connection), **request.env}
            secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {"name": name, "namespace": namespace, "labels": manifest["metadata"]["labels"],
                                   "ownerReferences": [owner]},
                      "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
            await core.create_namespaced_secret(namespace, secret, _request_timeout=30)
            request.made = True
            log.info("kernel %s: pod %s/%s created on node %s", request.kernel_id, namespace, name,
                     lease["slice"]["node"])
        except ApiException as err:
            if err.status == 409 and not request.made:  # made before a restart of the service, not seen yet
                request.made = True
                return
            # the pod cannot be made: the lease ends, and the start fails saying why
            self._end(request, f"its pod could not be created: {err.status} {api_message(err)}")
        except (OSError, asyncio.TimeoutError) as err:
            self._end(request, f"its pod could not be created: {err}")
        finally:
            request.creating = False

    def _end(self, request: KernelPodRequest, why: str) -> None:
        log.warning("kernel %s: %s", request.kernel_id, why)
        try:
            self.scheduler.release(request.lease_id, now=self.clock(), reason=why, holder_gone=True)
        except (NotFound, StoreFailed):
            pass

    def pod_manifest(self, request: KernelPodRequest, lease: Mapping[str, Any],
                     claim: str | None = None) -> dict[str, Any]:
        """The kernel's pod on granted `lease`: the server pod's copy, the kernel's command line with
        its connection file mounted from the Secret, and its env from the Secret; on a DRA node it
        uses the lease's claim `claim`."""
        template = request.template
        name = f"kernel-{request.kernel_id}-{lease['id']}"  # a restarted kernel's pod beside the old one going
        argv = [CONNECTION_FILE if part == CONNECTION_PLACEHOLDER else part for part in request.argv]
        env = [{"name": key, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}} for key in request.env]
        spec = self.pods.pod_spec(template, lease, container="kernel", command=argv, working_dir=request.workdir,
                                  env=env, grace_seconds=KERNEL_GRACE_SECONDS, claim=claim)
        spec["volumes"] = [*spec.get("volumes", []),
                           {"name": "gpualloc-kernel", "secret": {"secretName": name, "defaultMode": 0o400,
                                                                  "items": [{"key": "connection.json",
                                                                             "path": "connection.json"}]}}]
        kernel = spec["containers"][0]
        kernel["volumeMounts"] = [*kernel.get("volumeMounts", []),
                                  {"name": "gpualloc-kernel", "mountPath": CONNECTION_DIR, "readOnly": True}]
        kernel["ports"] = [{"name": port.replace("_port", ""), "containerPort": request.connection[port]}
                           for port in PORTS]
        labels = self.pods.labels(template, "kernel", **self.watch.pod_labels(lease["id"]), **{KERNEL_LABEL: request.kernel_id})
        owner = {"apiVersion": "v1", "kind": "Pod", "name": template.get("server_pod", ""),
                 "uid": template.get("server_pod_uid", ""), "blockOwnerDeletion": False}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": template.get("namespace", "default"), "labels": labels,
                             "annotations": dict(self.pods.pod_annotations), "ownerReferences": [owner]},
                "spec": spec}

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class KernelPodHandler(ApiHandler):
    """POST: a GPU kernel's pod; GET: where it is; DELETE: the kernel shut down. The caller's own only."""

    @property
    def kernel_pods(self) -> KernelPods:
        if self.ctx.kernel_pods is None:
            raise ApiError(404, "kernel pods are off here (c.GpuAllocService.kernel_pods)")
        return self.ctx.kernel_pods

    def post(self, kernel_id: str) -> None:
        body = self.json_body()
        try:
            view = self.kernel_pods.request(self.identity.user, self.identity.groups, kernel_id, body)
        except HolderBusy:
            raise ApiError(409, f"kernel {kernel_id} has a lease already") from None
        self.write_json(view, 201)

    def get(self, kernel_id: str) -> None:
        self.write_json(self._view(lambda: self.kernel_pods.view(self.identity.user, kernel_id)))

    def delete(self, kernel_id: str) -> None:
        self.write_json(self._view(lambda: self.kernel_pods.release(self.identity.user, kernel_id)))

    @staticmethod
    def _view(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            return call()
        except NotFound as err:
            raise ApiError(404, str(err)) from None


# (path template under <prefix>api/v1, handler, route name): appended to the service's ROUTES
KERNEL_POD_ROUTES: list[tuple[str, type[ApiHandler], str]] = [
    ("/kernels/{kernel_id}/pod", KernelPodHandler, "kernel_pod"),
]
