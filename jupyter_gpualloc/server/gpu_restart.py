"""A running kernel restarted as a GPU kernel, where GPU kernels run in pods of their own (Kubernetes).

A running pod cannot gain a device, so on Kubernetes `%gpu request 10GB` in a CPU kernel cannot
give that kernel a slice: the kernel must start again, in a pod of its own with the slice, and its
variables are lost. That happens only when the user confirms it: `%gpu request 10GB --restart`
(the kernel calls `POST <base_url>gpualloc/relay/api/v1/kernels/{id}/restart` with its kernels'
token) or the sidebar's Request button after its dialog (`POST <base_url>gpualloc/api/request` with
`restart`). The kernel's provisioner is given the slice, as a GPU kernelspec's would be, and the
kernel manager restarts it: the start asks the service for the pod and waits in the queue.

The kernel's clients (JupyterLab's websocket) are told it is restarting, and once it runs in its
pod their connections are closed: a client reconnects by itself, and jupyter_server opens the
reconnected client's channels to the pod's address (the provisioner took fresh ports for that).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Mapping

from ..client import GpuAllocError
from ..core.model import SliceSpec, SpecError
from .kernelspecs import slice_words
from .provisioner import GpuAllocProvisioner, current_link
from .relay import KernelsApiHandler

RESTART_AFTER_SECONDS = 0.5  # the calling cell finishes (and its reply reaches its client) first
RESTART_PATH = r"/api/v1/kernels/([^/]+)/restart"  # under RELAY_ROOT: the kernels' paths of this server


class RestartRefused(Exception):
    """The kernel cannot restart as a GPU kernel: `status` and why, for people."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


class GpuKernelRestarts:
    """Restarts of this server's kernels into GPU kernels in pods of their own, each once at a time."""

    def __init__(self, kernel_manager: Any, log: logging.Logger | None = None):
        self.kernel_manager = kernel_manager
        self.log = log or logging.getLogger(__name__)
        self.restarts: dict[str, asyncio.Task] = {}

    async def start(self, kernel_id: str, spec: Mapping[str, Any], *, offer: str = "") -> str:
        """Give the kernel's provisioner the slice (`offer`, a name, or else `spec`) and restart the
        kernel soon; the note for people."""
        if kernel_id not in self.kernel_manager:
            raise RestartRefused(404, f"no kernel {kernel_id} on this server")
        link = current_link()
        if link is None:
            raise RestartRefused(409, "no GPU allocator is configured for this server")
        provisioner = self.kernel_manager.get_kernel(kernel_id).provisioner
        if not isinstance(provisioner, GpuAllocProvisioner):
            raise RestartRefused(409, "this kernel was not started by the gpualloc provisioner "
                                      "(c.GpuAllocExtension.all_kernels): it cannot become a GPU kernel")
        try:
            in_pods = await link.gpu_kernels_in_pods()
        except GpuAllocError as err:
            raise RestartRefused(503, f"the GPU allocator does not answer: {err}") from None
        if not in_pods:
            raise RestartRefused(409, "GPU kernels do not run in pods of their own here: this kernel can get a "
                                      "slice as it is, with %gpu request (no --restart)")
        if provisioner.in_pod or kernel_id in self.restarts:
            raise RestartRefused(409, "this kernel is a GPU kernel in a pod of its own already (or becoming one): "
                                      "shut it down to give its slice back, then start another")
        what = offer or slice_words(spec, with_model=True)
        provisioner.spec, provisioner.offer = dict(spec), offer
        task = self.restarts[kernel_id] = asyncio.ensure_future(self._restart(kernel_id, provisioner))
        task.add_done_callback(lambda _: self.restarts.pop(kernel_id, None))
        return (f"restarting this kernel as a GPU kernel ({what}) in a pod of its own: its variables are lost; "
                "it waits in the queue until the slice is free (the GPU panel and %gpu status show where)")

    async def _restart(self, kernel_id: str, provisioner: GpuAllocProvisioner) -> None:
        await asyncio.sleep(RESTART_AFTER_SECONDS)
        tell_clients(kernel_id, "restarting")
        try:
            await self.kernel_manager.restart_kernel(kernel_id)
        except Exception as err:  # e.g. no slice within the wait: it stays a CPU kernel for the next start
            provisioner.spec = {}
            self.log.warning("gpualloc: kernel %s did not restart as a GPU kernel: %s", kernel_id, err)
        close_clients(kernel_id)

    async def close(self) -> None:
        for task in list(self.restarts.values()):
            task.cancel()
        await asyncio.gather(*self.restarts.values(), return_exceptions=True)


def _connections(kernel_id: str) -> list[Any]:
    """The open websocket handlers of the kernel's clients (jupyter_server keeps them by session key)."""
    from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

    sessions = getattr(ZMQChannelsWebsocketConnection, "_open_sessions", {})
    return [handler for key, handler in list(sessions.items()) if key.startswith(f"{kernel_id}:")]


def tell_clients(kernel_id: str, state: str) -> None:
    """An iopub status message to each client of the kernel, as jupyter_server sends one at a restart."""
    for handler in _connections(kernel_id):
        send = getattr(getattr(handler, "connection", None), "_send_status_message", None)
        if send is not None:
            send(state)


def close_clients(kernel_id: str) -> None:
    """Close the kernel's websockets: each client reconnects, to channels opened at the kernel's new address."""
    for handler in _connections(kernel_id):
        handler.close(1012, "the kernel restarted as a GPU kernel")


class KernelRestartHandler(KernelsApiHandler):
    """POST {"spec": {...}}: the calling kernel (or another of this server's) restarts as a GPU kernel."""

    def initialize(self, restarts: GpuKernelRestarts, kernels_token: str) -> None:  # type: ignore[override]
        super().initialize(kernels_token)
        self.restarts = restarts

    async def post(self, kernel_id: str) -> None:
        if not self.admitted():
            return
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            self.refuse(400, "the body must be JSON", "body")
            return
        if not isinstance(body, dict) or not isinstance(body.get("spec"), dict):
            self.refuse(400, "give the slice as a spec object (REST API v1)", "spec")
            return
        try:
            SliceSpec.from_json(body["spec"])
        except SpecError as err:
            self.refuse(400, err.message, f"spec.{err.field}")
            return
        try:
            note = await self.restarts.start(kernel_id, body["spec"])
        except RestartRefused as err:
            self.refuse(err.status, str(err), "kernel_id" if err.status == 404 else "restart")
            return
        self.set_status(202)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"kernel_id": kernel_id, "restarting": True, "note": note}))
