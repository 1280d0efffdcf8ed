"""A slice the sidebar asks for a running kernel reaches that kernel at once, not at its next %gpu command.

Once the lease is granted (at once, or later from the queue: `lease.granted`), the extension opens
a comm with target kernel/granted.py's `COMM_TARGET` on the kernel's shell channel, naming the
lease (the socket stays open until the kernel answers, so a kernel still starting gets it once it
listens); the kernel makes the slice take effect before its next cell, as `%gpu status` would, and
closes the comm with its answer on IOPub (read by server/activity.py's watch of that kernel). A
kernel idle at a report round with no answer yet (its answer came before its IOPub was read) is
told again, up to `TELLS` times in all. The sidebar's note on the slice follows from the answer:
the kernel has yet to apply the slice, must restart for it (CUDA already runs in it), or none once
it is in effect. A restarted kernel got the slice at its launch (server/provisioner.py), so a note
is about the process that was told only.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from zmq.eventloop.zmqstream import ZMQStream

from ..kernel.granted import COMM_TARGET

TOLD_NOTE = "the kernel uses the slice from its next cell"
RESTART_NOTE = "restart the kernel to use the slice: CUDA already runs in it on another GPU"
TELLS = 3


@dataclass
class _Told:
    """What a kernel's process was told: the lease, the comm that told it, and its answer (None: none yet)."""

    lease_id: str
    pid: int | None
    comm_id: str
    shell: Any  # the socket it was told on, open until the answer
    answer: Mapping[str, Any] | None = None
    tells: int = 1

    def close(self) -> None:
        if self.shell is not None:
            self.shell.close()
            self.shell = None


class KernelSlices:
    """The leases granted to this server's running kernels from outside them, told to each kernel."""

    def __init__(self, kernel_manager: Any, watch: Callable[[str], None], log: logging.Logger | None = None):
        self.kernel_manager = kernel_manager
        self.watch = watch  # start reading the kernel's IOPub, where its answer comes
        self.log = log or logging.getLogger(__name__)
        self.awaiting: dict[str, str] = {}  # lease id -> kernel id: queued requests for running kernels
        self.told: dict[str, _Told] = {}  # kernel id -> what its process was told last

    def granted(self, lease_id: str) -> None:
        """A lease was granted: tell its kernel when it was asked for here while the kernel ran."""
        kernel_id = self.awaiting.pop(lease_id, None)
        if kernel_id is not None and kernel_id in self.kernel_manager:
            self.tell(kernel_id, lease_id)

    def tell(self, kernel_id: str, lease_id: str) -> None:
        """Open the comm that makes the kernel apply the granted lease before its next cell."""
        kernel = self.kernel_manager.get_kernel(kernel_id)
        self.watch(kernel_id)
        before = self.told.pop(kernel_id, None)
        if before is not None:
            before.close()
        comm_id = uuid.uuid4().hex
        shell = kernel.connect_shell()
        kernel.session.send(shell.socket if isinstance(shell, ZMQStream) else shell, "comm_open",
                            {"comm_id": comm_id, "target_name": COMM_TARGET, "data": {"lease_id": lease_id}})
        tells = before.tells + 1 if before is not None and before.lease_id == lease_id else 1
        self.told[kernel_id] = _Told(lease_id, self._pid(kernel_id), comm_id, shell, tells=tells)

    def tell_again(self) -> None:
        """Report round: tell again each idle kernel whose answer has not come."""
        for kernel_id, told in list(self.told.items()):
            if told.answer is not None or told.tells >= TELLS or kernel_id not in self.kernel_manager:
                continue
            if told.pid == self._pid(kernel_id) and self.kernel_manager.get_kernel(kernel_id).execution_state == "idle":
                self.tell(kernel_id, told.lease_id)

    def answered(self, kernel_id: str, content: Mapping[str, Any]) -> None:
        """A comm of a kernel closed: the kernel's answer, when it is the comm that told it."""
        told = self.told.get(kernel_id)
        if told is not None and content.get("comm_id") == told.comm_id:
            told.close()
            told.answer = content.get("data") or {}
            if not told.answer.get("in_effect"):
                self.log.info("gpualloc: kernel %s: %s", kernel_id, told.answer.get("line", ""))

    def note(self, kernel_id: str, lease_id: str, uses_gpu: Callable[[], bool]) -> str | None:
        """What the sidebar says of the lease's slice in the kernel, or None: in effect, or not told here.
        `uses_gpu()`: whether CUDA may run in the kernel (a kernel still to answer will need a restart)."""
        told = self.told.get(kernel_id)
        if told is None or told.lease_id != lease_id or told.pid != self._pid(kernel_id):
            return None
        if told.answer is None:
            return RESTART_NOTE if uses_gpu() else TOLD_NOTE
        return None if told.answer.get("in_effect") else RESTART_NOTE

    def forget(self, kernel_id: str) -> None:
        """The kernel ended."""
        told = self.told.pop(kernel_id, None)
        if told is not None:
            told.close()
        self.awaiting = {lease: kernel for lease, kernel in self.awaiting.items() if kernel != kernel_id}

    def _pid(self, kernel_id: str) -> int | None:
        if kernel_id not in self.kernel_manager:
            return None
        return getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "pid", None)
