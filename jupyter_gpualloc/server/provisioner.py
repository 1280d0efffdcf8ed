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
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.provisioning import LocalProvisioner
from traitlets import Dict, Float, Unicode

from ..client import GpuAllocClient, GpuAllocError, NotFound, discover
from ..core.holders import kernel_holder
from ..lease_env import SLICE_ENV_NAMES, slice_env
from .idle import KernelActivityMonitor

POLL_SECONDS = 1.0
MAGIC_EXTENSION = "jupyter_gpualloc"


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

    @classmethod
    def from_environment(cls) -> "KernelLink":
        """Outside a server with the extension (e.g. a console): the service named by the environment."""
        endpoint = discover()
        return cls(GpuAllocClient(endpoint.url, endpoint.token), endpoint.url, endpoint.token)

    def base_env(self, kernel_id: str) -> dict[str, str]:
        env = {"GPUALLOC_URL": self.kernel_url, "GPUALLOC_TOKEN": self.kernel_token,
               "GPUALLOC_HOLDER": kernel_holder(kernel_id)}
        if self.events_url:
            env["GPUALLOC_EVENTS_URL"] = self.events_url
        return env


_link: KernelLink | None = None


def install_link(link: KernelLink | None) -> None:
    """Set (or clear) the link the provisioners of this process use."""
    global _link
    _link = link


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
    offer = Unicode("", help="The offer the kernelspec was made from (for messages).").tag(config=True)
    priority = Unicode("interactive", help="Priority class of the kernel's lease.").tag(config=True)
    idle_timeout = Float(None, allow_none=True, help="The offer's idle timeout in seconds (None: policy's).").tag(config=True)
    wait_timeout = Float(
        None, allow_none=True, help="Seconds a kernel start waits for a queued slice (None: the extension's).",
    ).tag(config=True)

    lease_id: str | None = None

    @property
    def holder(self) -> str:
        return kernel_holder(self.kernel_id)

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        link = current_link()
        if link is None:
            if self.spec:
                raise NoService(f"this kernel asks for a GPU slice ({self.offer or self.spec}), but no gpualloc "
                                "service is configured: enable the jupyter_gpualloc.server extension or set GPUALLOC_URL")
            return kwargs  # a plain kernel, as LocalProvisioner would start it
        env = kwargs["env"]
        env.update(link.base_env(self.kernel_id))
        if not self.spec:  # a GPU kernelspec asks for its own slice: jobs from it run in the default kernel
            env["GPUALLOC_KERNEL_NAME"] = getattr(self.parent, "kernel_name", "") or "python3"
        if any("ipykernel" in part for part in kwargs.get("cmd", ())):
            kwargs["cmd"] = [*kwargs["cmd"], f"--ext={MAGIC_EXTENSION}"]  # %gpu is there from the start
        try:
            lease = await self._active_lease(link)
        except GpuAllocError as err:
            if self.spec:
                raise
            self.log.debug("kernel %s: starts without a GPU slice, the allocator does not answer: %s",
                           self.kernel_id, err)
            return kwargs  # a kernel that asks for no slice starts all the same
        if lease is None and self.spec:
            lease = await link.client.request_lease(self.spec, self.holder, priority=self.priority,
                                                    idle_timeout=self.idle_timeout)
        if lease is not None and lease["state"] == "queued":
            lease = await self._wait_for_grant(link, lease)
        if lease is not None:
            for name in SLICE_ENV_NAMES:
                env.pop(name, None)
            env.update(slice_env(lease, service_url=link.kernel_url, mps=link.mps))
            self.lease_id = lease["id"]
            if link.monitor is not None:
                link.monitor.attach(self.kernel_id, lease)
            self.log.info("kernel %s: GPU slice %s (lease %s)", self.kernel_id,
                          lease["slice"]["visible_devices"], lease["id"])
        return kwargs

    async def _active_lease(self, link: KernelLink) -> dict | None:
        """The kernel's queued or granted lease, however it was obtained."""
        for lease in await link.client.leases():
            if lease["holder"] == self.holder and lease["state"] in ("queued", "granted"):
                return lease
        return None

    async def _wait_for_grant(self, link: KernelLink, lease: dict) -> dict:
        """Long-poll the queued lease until granted; cancel it and fail after the wait timeout."""
        timeout = self.wait_timeout if self.wait_timeout is not None else link.wait_timeout
        deadline = time.monotonic() + timeout
        what = self.offer or lease["spec"]
        while lease["state"] == "queued":
            left = deadline - time.monotonic()
            if left <= 0:
                await self._release(link, lease["id"])
                raise SliceWaitTimeout(
                    f"No GPU slice ({what}) became free within {timeout:g} s: the kernel was not started. "
                    f"It was number {lease.get('position')} in the queue; try again later or pick a smaller slice.")
            await asyncio.sleep(min(POLL_SECONDS, left))
            lease = await link.client.lease(lease["id"])
            if lease["state"] not in ("queued", "granted"):
                raise SliceWaitTimeout(f"The GPU request for this kernel ended ({lease['state']}: "
                                       f"{lease.get('reason', '')}): the kernel was not started.")
        return lease

    @staticmethod
    async def _release(link: KernelLink, lease_id: str) -> None:
        try:
            await link.client.release(lease_id)
        except NotFound:
            pass  # it ended already (expired, or released by the user)

    async def cleanup(self, restart: bool = False) -> None:
        """At shutdown, its process ended: report the kernel gone; a restart keeps its lease."""
        await super().cleanup(restart=restart)
        if restart:
            return
        link = current_link()
        if link is None:
            return
        if link.monitor is not None:
            link.monitor.detach(self.kernel_id)
        if link.released_by_server:
            return
        try:
            await link.client.holders_gone([self.holder])
        except GpuAllocError as err:  # the kernel still stops; its lease ends with the heartbeat TTL
            self.log.warning("kernel %s: cannot report its end to the GPU allocator: %s", self.kernel_id, err)
            if link.monitor is not None:
                link.monitor.unreported.add(self.holder)  # the next report tries again
        self.lease_id = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        info = await super().get_provisioner_info()
        info["lease_id"] = self.lease_id
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        await super().load_provisioner_info(provisioner_info)
        self.lease_id = provisioner_info.get("lease_id")
