"""A person's activity in a kernel: the cells clients run, never what the kernel says on its own.

jupyter_server's `last_activity` moves on every IOPub message, so a kernel's own output (the
%gpu magic's idle notice, a widget's update, a background thread's print) would count as use, and
an idle slice would never be released. `PersonActivity` listens to each kernel's IOPub itself
and counts only executions a client asked for: an `execute_input` (the kernel starts a cell a
client sent; silent executions publish none) and the `idle` status that ends that cell. A cell
waiting for `input()` is running, so the person's answer falls within it. Widget messages
(`comm_msg`), kernel info and completion requests, and any output outside a cell are not activity.
Each kernel's IOPub is read once: a comm the kernel closes is passed on to `on_comm_close` (the
kernel's answer to a slice it was told of, server/kernel_slices.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from jupyter_client.session import Session
from zmq.eventloop.zmqstream import ZMQStream


@dataclass
class _Watch:
    """One kernel's IOPub subscription and what it saw."""

    kernel_id: str
    stream: Any
    session: Session
    last_activity: float | None = None  # when a cell last started or ended; None: none seen yet
    running: set[str] = field(default_factory=set)  # msg ids of the execute requests whose cells run


class PersonActivity:
    """Each watched kernel's last cell run by a client, and whether one runs now."""

    def __init__(self, kernel_manager: Any, clock: Callable[[], float] = time.time,
                 log: logging.Logger | None = None,
                 on_comm_close: Callable[[str, dict], None] | None = None):
        self.kernel_manager = kernel_manager
        self.clock = clock
        self.log = log or logging.getLogger(__name__)
        self.on_comm_close = on_comm_close  # (kernel id, the comm_close message's content)
        self._watches: dict[str, _Watch] = {}

    def watch(self, kernel_id: str) -> None:
        """Start listening to a kernel's IOPub (once); cells run before this are not known."""
        if kernel_id in self._watches:
            return
        kernel = self.kernel_manager.get_kernel(kernel_id)
        socket = kernel.connect_iopub()
        stream = socket if isinstance(socket, ZMQStream) else ZMQStream(socket)
        watch = self._watches[kernel_id] = _Watch(
            kernel_id, stream, Session(config=kernel.session.config, key=kernel.session.key))
        stream.on_recv(lambda parts: self._receive(watch, parts))

    def forget(self, kernel_id: str) -> None:
        """Stop listening to a kernel (it ended)."""
        watch = self._watches.pop(kernel_id, None)
        if watch is not None and not watch.stream.closed():
            watch.stream.close()

    def watched(self) -> set[str]:
        return set(self._watches)

    def of(self, kernel_id: str) -> dict[str, Any]:
        """{"last_activity": epoch seconds or None, "busy": a client's cell runs now}."""
        watch = self._watches.get(kernel_id)
        if watch is None:
            return {"last_activity": None, "busy": False}
        kernel = self.kernel_manager.get_kernel(kernel_id)
        # jupyter_server's execution state ends a cell cut short by a restart or a crash too
        busy = bool(watch.running) and getattr(kernel, "execution_state", "") == "busy"
        if not busy:
            watch.running.clear()
        return {"last_activity": watch.last_activity, "busy": busy}

    def _receive(self, watch: _Watch, parts: list) -> None:
        try:
            _, parts = watch.session.feed_identities(parts)
            message = watch.session.deserialize(parts, content=False)
        except Exception as err:  # a message this session cannot read says nothing of a person
            self.log.debug("gpualloc: unreadable IOPub message: %s", err)
            return
        kind = message["header"]["msg_type"]
        parent = (message.get("parent_header") or {}).get("msg_id")
        if kind == "execute_input" and parent:
            watch.running.add(parent)
            watch.last_activity = self.clock()
        elif kind == "status" and parent in watch.running:
            if watch.session.unpack(message["content"]).get("execution_state") == "idle":
                watch.running.discard(parent)
                watch.last_activity = self.clock()
        elif kind == "comm_close" and self.on_comm_close is not None:
            self.on_comm_close(watch.kernel_id, watch.session.unpack(message["content"]))
