"""The `gpualloc` kernel provisioner: a kernel's slice, before launch, and the %gpu magic's link to the service.

Every kernel it launches gets GPUALLOC_URL, GPUALLOC_TOKEN and GPUALLOC_HOLDER=kernel:<id> (and, in
a server relaying the service's events, GPUALLOC_EVENTS_URL), and an IPython kernel loads the %gpu
magic (`--ext=jupyter_gpualloc`). A kernel whose kernelspec asks for a slice
(`metadata.kernel_provisioner.config.spec`) gets a `kernel:<id>` lease before launch, with
CUDA_VISIBLE_DEVICES and the cap variables in its env.
On restart the kernel's active lease (however it was obtained, e.g. by the %gpu magic) is found
by its holder and applied again (when the allocator does not answer, a kernel that asks for no
slice starts without one); once its process has ended, at shutdown, the kernel is reported gone
(`holders_gone`): its lease ends and its slice, ended or not, returns to the pool. Waiting for a queued slice is an
async long-poll, so the server's event loop keeps running; past `wait_timeout` the kernel start
fails with a message saying so.

Where GPU kernels run in pods of their own (Kubernetes: the service's `kernel_pods`, learnt from
its offers), a kernel asking for a slice is not started here: its command line, env and
connection key go to the service (`POST /kernels/{id}/pod`), which makes its pod once the slice is
granted; the start waits, logging its place in the queue, then connects to the pod's IP. Its
shutdown ends the lease and the pod; its process is the pod (polled through the service). No
signal reaches another pod: it is interrupted by an `interrupt_request` message. A service that
restarted forgets the request: the provisioner tells it again (`resume`), and the service takes
back the kernel's lease and pod as they are. A restart into a pod (from the server's own, or from
another pod) takes fresh ports: jupyter_server re-opens its clients' channels only when they change.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.connect import LocalPortCache
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Float, Unicode

from ..client import GpuAllocClient, GpuAllocError, NotFound, ServiceUnavailable, discover
from ..core.holders import kernel_holder
from ..holder import Waiting, WaitGaveUp
from ..holder_lease import HolderLease
from ..lease_env import IN_A_POD_VARIABLE, KEPT_ALIVE_VARIABLE, OFF_VARIABLE, SLICE_ENV_NAMES
from .idle import ENDS_KERNEL, KernelActivityMonitor

POLL_SECONDS = 1.0
FIRST_POD_POLL_SECONDS = 0.05  # where a kernel's pod is: asked this soon after the request, then twice as long each time up to POLL_SECONDS
MAGIC_EXTENSION = "jupyter_gpualloc"
PORT_NAMES = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


@dataclass
class KernelLink:
    """How this process's kernels reach the service: the server's client and what kernels are given."""

    client: GpuAllocClient
    kernel_url: str
    kernel_token: str
    monitor: KernelActivityMonitor | None = None
    wait_timeout: float = 300.0
    mps: bool = field(default_factory=lambda: bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY")))
    events_url: str = ""  # the server's relay of the service's events (server/relay.py); empty: none
    # embedded mode, at server stop: the API is not served any more, the extension releases kernels' leases in-process
    released_by_server: bool = False
    kernel_pods: bool | None = None  # GPU kernels run in pods of their own (Kubernetes); None: not asked yet

    @classmethod
    def from_environment(cls) -> "KernelLink":
        """Outside a server with the extension (e.g. a console): the service named by the environment."""
        endpoint = discover()
        return cls(GpuAllocClient(endpoint.url, endpoint.token), endpoint.url, endpoint.token)

    async def gpu_kernels_in_pods(self) -> bool:
        """Whether the service runs GPU kernels in pods of their own (its offer sheet says; asked once)."""
        if self.kernel_pods is None:
            self.kernel_pods = bool((await self.client.offer_sheet()).get("kernel_pods"))
        return self.kernel_pods

    def base_env(self, kernel_id: str) -> dict[str, str]:
        env = {"GPUALLOC_URL": self.kernel_url, "GPUALLOC_TOKEN": self.kernel_token,
               "GPUALLOC_HOLDER": kernel_holder(kernel_id)}
        if self.monitor is not None:  # its report heartbeats every kernel of the server
            env[KEPT_ALIVE_VARIABLE] = "1"
        if self.events_url:
            env["GPUALLOC_EVENTS_URL"] = self.events_url
        return env


_link: KernelLink | None = None


def install_link(link: KernelLink | None) -> None:
    """Set (or clear) the link the provisioners of this process use."""
    global _link
    _link = link


_off_reason = ""  # why this server's GPU features are off (its extension found no allocator), for %gpu to say


def install_off_reason(reason: str) -> None:
    """Set (or clear, with "") why GPU slices are off for the kernels of this process."""
    global _off_reason
    _off_reason = reason


def current_link() -> KernelLink | None:
    """The installed link, else one from the environment, else None (no service known)."""
    if _link is not None:
        return _link
    try:
        return KernelLink.from_environment()
    except ValueError:
        return None


class NoService(RuntimeError):
    """A kernel asks for a GPU slice, but no gpualloc service is known to this process."""


class SliceWaitTimeout(RuntimeError):
    """A queued slice was not granted within the kernel's wait timeout."""


class GpuAllocProvisioner(LocalProvisioner):
    """A local kernel with its GPU slice (when its kernelspec asks for one) and the %gpu magic's env."""

    spec = Dict(help="The slice this kernel asks for (REST API v1 spec); empty: no slice at launch.").tag(config=True)
    offer = Unicode("", help="""The name of the offer the kernelspec was made from: the kernel asks for it by
        name, and its lease gets the offer's idle timeout and time limit (empty: it asks for `spec`).""").tag(config=True)
    priority = Unicode("interactive", help="Priority class of the kernel's lease.").tag(config=True)
    idle_timeout = Float(None, allow_none=True, help="""A shorter idle timeout (seconds) for the kernel's lease than
        the policy's for its offer; it can only shorten it (None: the policy's).""").tag(config=True)
    wait_timeout = Float(
        None, allow_none=True, help="Seconds a kernel start waits for a queued slice (None: the extension's).",
    ).tag(config=True)

    _lease: HolderLease | None = None
    in_pod: bool = False  # this kernel runs in a pod of its own
    pod_state: str = ""  # its pod's last state: queued, starting, running, ended
    local_ip: str = ""  # the kernel manager's own address, before it took the pod's
    pod_request: dict | None = None  # what the service was asked for this kernel's pod (told again after its restart)

    @property
    def holder(self) -> str:
        return kernel_holder(self.kernel_id)

    def gpu_lease(self, link: KernelLink | None = None) -> HolderLease:
        """The kernel's lease (holder_lease.HolderLease), through `link`'s client when given."""
        if self._lease is None:
            self._lease = HolderLease(None, self.holder)
        if link is not None:
            self._lease.client = link.client
        return self._lease

    @property
    def lease_id(self) -> str | None:
        return self.gpu_lease().lease_id or None

    def slice_request(self) -> dict[str, Any]:
        """What the kernel asks for: its offer, by name, or its spec (and a shorter idle timeout)."""
        request: dict[str, Any] = {"offer": self.offer} if self.offer else {"spec": self.spec}
        if self.idle_timeout is not None:
            request["idle_timeout"] = self.idle_timeout
        return request

    @property
    def has_process(self) -> bool:
        return self.pod_state in ("queued", "starting", "running") if self.in_pod else super().has_process

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        link = current_link()
        if link is None:
            if self.spec:
                raise NoService(f"this kernel asks for a GPU slice ({self.offer or self.spec}), but "
                                + (_off_reason or "no gpualloc service is configured: enable the "
                                   "jupyter_gpualloc.server extension or set GPUALLOC_URL"))
            if _off_reason and any("ipykernel" in part for part in kwargs.get("cmd", ())):
                kwargs["env"][OFF_VARIABLE] = _off_reason  # %gpu says why, in one line
                kwargs["cmd"] = [*kwargs["cmd"], f"--ext={MAGIC_EXTENSION}"]
            return kwargs  # a plain kernel, as LocalProvisioner would start it
        env = kwargs["env"]
        env.update(link.base_env(self.kernel_id))
        if not self.spec:  # a GPU kernelspec asks for its own slice: jobs from it run in the default kernel
            env["GPUALLOC_KERNEL_NAME"] = getattr(self.parent, "kernel_name", "") or "python3"
        if any("ipykernel" in part for part in kwargs.get("cmd", ())):
            kwargs["cmd"] = [*kwargs["cmd"], f"--ext={MAGIC_EXTENSION}"]  # %gpu is there from the start
        if self.spec and await link.gpu_kernels_in_pods():
            self.in_pod = True
            return kwargs  # launch_kernel asks the service for its pod
        holder_lease = self.gpu_lease(link)
        try:
            lease = await holder_lease.find()  # however it was obtained (e.g. by the %gpu magic): applied again
        except GpuAllocError as err:
            if self.spec:
                raise
            self.log.debug("kernel %s: starts without a GPU slice, the allocator does not answer: %s",
                           self.kernel_id, err)
            return kwargs  # a kernel that asks for no slice starts all the same
        if lease is None and self.spec:
            lease = await holder_lease.acquire(self.offer or None, spec=self.spec, priority=self.priority,
                                               idle_timeout=self.idle_timeout)
        if lease is not None and lease["state"] == "queued":
            lease = await self._wait_for_grant(link, holder_lease)
        if lease is not None:
            for name in SLICE_ENV_NAMES:
                env.pop(name, None)
            env.update(holder_lease.env(service_url=link.kernel_url, mps=link.mps))
            if link.monitor is not None:
                link.monitor.attach(self.kernel_id, lease)
            self.log.info("kernel %s: GPU slice %s (lease %s)", self.kernel_id,
                          lease["slice"]["visible_devices"], lease["id"])
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> dict[str, Any]:
        if not self.in_pod:
            return await super().launch_kernel(cmd, **kwargs)
        link = current_link()
        connection = self.parent.get_connection_info()
        key = connection["key"].decode() if isinstance(connection["key"], bytes) else connection["key"]
        ports = {name: connection[name] for name in PORT_NAMES}
        argv = ["{connection_file}" if part == self.parent.connection_file else part for part in cmd]
        # the server's event relay listens on its own loopback: a kernel in a pod follows the service's events
        env = {k: v for k, v in kwargs.get("env", {}).items() if k.startswith("GPUALLOC_") and k != "GPUALLOC_EVENTS_URL"}
        env[IN_A_POD_VARIABLE] = "1"  # the %gpu magic's own words for a kernel in a pod
        request = {**self.slice_request(), "server": link.client.server, "priority": self.priority, "argv": argv,
                   "env": env, "workdir": kwargs.get("cwd") or "",
                   "connection": {"key": key, "signature_scheme": connection["signature_scheme"], **ports}}
        self.pod_request = request
        pod = await link.client.request_kernel_pod(self.kernel_id, request)
        self.pod_state = pod["state"]
        try:
            pod = await self._wait_for_pod(link, pod)
        except asyncio.CancelledError:  # the start was given up: the request is withdrawn
            await asyncio.shield(self._end_pod(link))
            raise
        self.gpu_lease(link).adopt(pod["lease"])
        if link.monitor is not None:
            link.monitor.attach(self.kernel_id, pod["lease"])
        self.log.info("kernel %s: runs in pod %s at %s (lease %s)", self.kernel_id, pod.get("pod"), pod["ip"],
                      self.lease_id)
        self.local_ip = connection["ip"]
        self.parent.kernel_spec.interrupt_mode = "message"  # no signal reaches another pod
        return {**connection, "ip": pod["ip"], "transport": "tcp"}

    async def _wait_for_pod(self, link: KernelLink, pod: dict) -> dict:
        """Until the kernel's pod runs: its place in the queue is logged; past the wait timeout in the
        queue the request is withdrawn and the start fails saying so."""
        timeout = self.wait_timeout if self.wait_timeout is not None else link.wait_timeout
        what, said = self.offer or self.spec, []

        def tell(waiting: Waiting) -> None:
            view = waiting.view
            if view["state"] == "ended":
                return
            where = f"waiting for a GPU slice: position {view['position']}" if view["state"] == "queued" \
                else f"waiting for its pod {view.get('pod') or ''} to start {view.get('reason') or ''}".rstrip()
            self._log_once(said, where)

        async def read(view: dict) -> dict:
            try:
                view = await self._pod_view(link)
            except ServiceUnavailable as err:  # e.g. the service restarts: the request is told again after
                self._log_once(said, f"{err}; still waiting", warning=True)
                return view
            self.pod_state = view["state"]
            return view

        try:
            pod = await self.gpu_lease(link).wait(read=read, view=pod, patience=timeout, on_round=tell,
                                                  poll=POLL_SECONDS, first_poll=FIRST_POD_POLL_SECONDS,
                                                  waiting=lambda view: view["state"] not in ("running", "ended"))
        except WaitGaveUp as gave_up:
            await self._end_pod(link)
            raise SliceWaitTimeout(
                f"No GPU slice ({what}) became free within {timeout:g} s: the kernel was not started. "
                f"It was number {gave_up.waiting.position} in the queue; try again later or pick a smaller slice.")
        if pod["state"] == "ended":
            self.pod_state = "ended"
            raise SliceWaitTimeout(f"The GPU kernel's pod ({what}) did not start: {pod.get('reason', '')}")
        return pod

    def _log_once(self, said: list[str], words: str, warning: bool = False) -> None:
        """Log where the kernel's start stands, when that changed."""
        if not said or said[-1] != words:
            (self.log.warning if warning else self.log.info)("kernel %s: %s", self.kernel_id, words)
            said.append(words)

    async def _pod_view(self, link: KernelLink) -> dict:
        """Where the kernel's pod is; a service that restarted since is told the request again."""
        try:
            return await link.client.kernel_pod(self.kernel_id)
        except NotFound:
            if self.pod_request is None:
                raise
        try:
            return await link.client.request_kernel_pod(self.kernel_id, {**self.pod_request, "resume": True})
        except NotFound as err:  # its lease ended meanwhile
            return {"state": "ended", "reason": str(err), "lease": None}

    async def _end_pod(self, link: KernelLink) -> None:
        try:
            await link.client.end_kernel_pod(self.kernel_id)
        except NotFound:
            pass
        self.pod_state = "ended"

    async def poll(self) -> int | None:
        if not self.in_pod:
            return await super().poll()
        link = current_link()
        if self.pod_state != "ended" and link is not None:
            try:
                pod = await self._pod_view(link)
            except NotFound:
                pod = {"state": "ended"}
            except GpuAllocError:  # the service does not answer now: the kernel is taken to be alive
                return None
            if pod["state"] == "ended" and link.monitor is not None and \
                    (pod.get("lease") or {}).get("state") in ENDS_KERNEL:
                return None  # its slice was taken back: the server's monitor shuts it down, not restarted first
            self.pod_state = pod["state"]
        return None if self.pod_state != "ended" else 1

    async def wait(self) -> int | None:
        if not self.in_pod:
            return await super().wait()
        while (status := await self.poll()) is None:
            await asyncio.sleep(POLL_SECONDS)
        return status

    async def send_signal(self, signum: int) -> None:
        if not self.in_pod:
            return await super().send_signal(signum)
        self.log.warning("kernel %s runs in a pod of its own: signal %d is not passed on", self.kernel_id, signum)

    async def kill(self, restart: bool = False) -> None:
        if not self.in_pod:
            return await super().kill(restart)
        link = current_link()
        if link is not None:
            await self._end_pod(link)

    async def terminate(self, restart: bool = False) -> None:
        if not self.in_pod:
            return await super().terminate(restart)
        await self.kill(restart)

    async def _wait_for_grant(self, link: KernelLink, holder_lease: HolderLease) -> dict:
        """Wait while the lease is queued, logging its place; withdraw it and fail after the wait timeout."""
        timeout = self.wait_timeout if self.wait_timeout is not None else link.wait_timeout
        what, said = self.offer or holder_lease.view["spec"], []

        def tell(waiting: Waiting) -> None:
            why = f" ({waiting.reason})" if waiting.reason else ""
            self._log_once(said, f"waiting for a GPU slice: position {waiting.position}{why}")

        def unavailable(err: Exception) -> None:  # the service restarts, or this server stops: asked again after
            self._log_once(said, f"{err}; still waiting", warning=True)

        try:
            lease = await holder_lease.wait(patience=timeout, on_round=tell, poll=POLL_SECONDS,
                                            on_unavailable=unavailable)
        except WaitGaveUp as gave_up:
            await holder_lease.release()
            raise SliceWaitTimeout(
                f"No GPU slice ({what}) became free within {timeout:g} s: the kernel was not started. "
                f"It was number {gave_up.waiting.position} in the queue; try again later or pick a smaller slice.")
        if lease["state"] != "granted":
            raise SliceWaitTimeout(f"The GPU request for this kernel ended ({lease['state']}: "
                                   f"{lease.get('reason', '')}): the kernel was not started.")
        return lease

    async def cleanup(self, restart: bool = False) -> None:
        """At shutdown, its process ended: report the kernel gone; a restart keeps its lease. A kernel in
        a pod of its own ends its pod's lease, at a restart too (a pod whose kernel exited by itself may
        hold it still, and the next start asks for a new one); the pod's end returns the slice."""
        await super().cleanup(restart=restart)
        link = current_link()
        if self.in_pod:
            if link is not None:
                try:
                    await self._end_pod(link)
                except GpuAllocError as err:  # its pod's deletion or absence ends the lease all the same
                    self.log.warning("kernel %s: cannot end its pod's lease now: %s", self.kernel_id, err)
                if link.monitor is not None:
                    link.monitor.detach(self.kernel_id)
            if restart and self.local_ip:  # the kernel manager starts kernels on local addresses only
                self.parent.ip = self.local_ip
                self._fresh_ports()
            self.gpu_lease().load_state({})
            self.in_pod, self.pod_request = restart, None
            return
        if restart:
            if self.spec and link is not None and link.kernel_pods:  # it moves into a pod of its own
                self._fresh_ports()
            return
        if link is None:
            return
        if link.monitor is not None:
            link.monitor.detach(self.kernel_id)
        if link.released_by_server:
            return
        try:
            await self.gpu_lease(link).gone()  # its lease, or one its %gpu magic got, ends; the slice returns
        except GpuAllocError as err:  # the kernel still stops; its lease ends with the heartbeat TTL
            self.log.warning("kernel %s: cannot report its end to the GPU allocator: %s", self.kernel_id, err)
            if link.monitor is not None:
                link.monitor.unreported.add(self.holder)  # the next report tries again

    def _fresh_ports(self) -> None:
        """New ports and a new connection file for the next start (the cached ones go back to the cache)."""
        kernel_manager = self.parent
        if self.ports_cached:
            cache = LocalPortCache.instance()
            for name in PORT_NAMES:
                cache.return_port(getattr(kernel_manager, name))
            self.ports_cached = False
        for name in PORT_NAMES:
            setattr(kernel_manager, name, 0)
        kernel_manager.cleanup_connection_file()

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info.update(self.gpu_lease().get_state())
        info["in_pod"] = self.in_pod
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.gpu_lease().load_state(provisioner_info)
        self.in_pod = bool(provisioner_info.get("in_pod"))
