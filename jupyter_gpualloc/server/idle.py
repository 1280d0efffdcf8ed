"""Idle release, the server's side: report each GPU kernel's activity, heartbeat every kernel.

The decision is the scheduler's (policy `idle_timeout`, `idle_grace`, `release_busy`): this
monitor only tells it, every `report_interval`, each GPU kernel's last activity as a person made
it (server/activity.py: cells clients ran, never the kernel's own output), whether such a cell
is running and how many clients are connected, and heartbeats every kernel's holder (the
process's one holder.Keepalive, beaten by this round) so a crashed server loses its slices after
the heartbeat TTL. When the scheduler ends a kernel's lease
(idle expiry, preemption), the monitor shuts that kernel down and emits `kernel.gpu_shutdown`;
a kernel found gone is reported gone (`holders_gone`), so the slice its lease kept returns.

Every kernel shutdown the extension starts goes through `shut_down`: one task per kernel, never
cancelled with the caller (a shutdown cut midway leaves jupyter_client's kernel half stopped, and
shutting it down again then fails), and awaited, bounded, when the server stops.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Mapping

from ..client import GpuAllocClient, GpuAllocError, NotFound
from ..core.holders import kernel_holder, kernel_of
from ..holder import Keepalive
from ..holder_lease import HolderLease
from .activity import PersonActivity
from .events import GpuAllocEvents
from .kernel_slices import KernelSlices

ENDS_KERNEL = ("expired", "preempted")


class KernelActivityMonitor:
    """Which of this server's kernels hold which lease, and their activity reports."""

    def __init__(self, client: GpuAllocClient, kernel_manager: Any, events: GpuAllocEvents,
                 log: logging.Logger | None = None):
        self.client = client
        self.kernel_manager = kernel_manager
        self.events = events
        self.log = log or logging.getLogger(__name__)
        self.held: dict[str, HolderLease] = {}  # kernel id -> its granted lease
        self.extra_holders: set[str] = set()  # other holders this server keeps alive (e.g. "server")
        self.keepalive = Keepalive(client.heartbeat, log=self.log)  # every kernel's, beaten by report()
        self.shutdowns: dict[str, asyncio.Task] = {}  # kernel id -> its shutdown in progress
        self.person = PersonActivity(kernel_manager, log=self.log, on_comm_close=self._comm_closed)
        self.slices = KernelSlices(kernel_manager, self.person.watch, log=self.log)
        self.unreported: set[str] = set()  # holders of kernels found gone, not yet reported gone
        # Kernels with a lease seen in the kernel manager: one still starting (its provisioner
        # holds the lease before the manager lists it) is not gone.
        self.seen: set[str] = set()

    def attach(self, kernel_id: str, lease: Mapping[str, Any]) -> None:
        self.held[kernel_id] = HolderLease(self.client, kernel_holder(kernel_id))
        self.held[kernel_id].adopt(dict(lease))

    def detach(self, kernel_id: str) -> dict | None:
        self.seen.discard(kernel_id)
        held = self.held.pop(kernel_id, None)
        return held.view if held is not None else None

    def lease_of(self, kernel_id: str) -> dict | None:
        """The kernel's granted lease (JSON of REST API v1) as last reported, or None."""
        held = self.held.get(kernel_id)
        return held.view if held is not None else None

    def activity(self, kernel_id: str) -> dict[str, Any]:
        """What the scheduler is told about a kernel: a person's last activity, busy, connections."""
        self.person.watch(kernel_id)
        connections = getattr(self.kernel_manager, "_kernel_connections", {}).get(kernel_id, 0)
        return {**self.person.of(kernel_id), "connections": int(connections)}

    async def report(self) -> None:
        """One round: report kernels found gone, tell kernels again of slices they did not answer for,
        heartbeat every kernel's holder, touch each GPU kernel's lease."""
        running = set(self.kernel_manager.list_kernel_ids())
        for kernel_id in running:
            self.person.watch(kernel_id)
        for kernel_id in self.person.watched() - running:
            self.person.forget(kernel_id)
            self.slices.forget(kernel_id)
        for kernel_id in (set(self.held) & self.seen) - running:
            self.detach(kernel_id)
            self.unreported.add(kernel_holder(kernel_id))
        self.seen |= running & set(self.held)
        self.slices.tell_again()
        await self.report_gone()
        self.keepalive.keep_only({kernel_holder(k) for k in running} | self.extra_holders)
        for lease in await self.keepalive.beat(strict=True):
            kernel_id = kernel_of(lease["holder"])
            if kernel_id in running and kernel_id not in self.held and lease["state"] == "granted":
                self.attach(kernel_id, lease)  # e.g. obtained by the %gpu magic inside the kernel
        for kernel_id, held in list(self.held.items()):
            if kernel_id not in running:  # still starting: the manager does not list it yet
                continue
            try:
                await held.report_activity(**self.activity(kernel_id))
            except NotFound:
                await self.lease_ended(kernel_id, await self.client.lease(held.lease_id))

    async def report_gone(self) -> None:
        """Tell the service which kernels' processes ended; those it did not hear of wait for the next round."""
        if not self.unreported:
            return
        holders = sorted(self.unreported)
        try:
            await self.client.holders_gone(holders)
        except GpuAllocError as err:
            self.log.warning("gpualloc: cannot report ended kernels %s: %s", holders, err)
            return
        self.unreported.difference_update(holders)

    def _comm_closed(self, kernel_id: str, content: dict) -> None:
        self.slices.answered(kernel_id, content)

    async def on_event(self, event: Mapping[str, Any]) -> None:
        """React at once to a scheduler event that grants a slice asked for a running kernel of this
        server (it is told to the kernel), or ends one of this server's kernels' leases."""
        if event.get("type") == "lease.granted" and event.get("lease_id"):
            self.slices.granted(event["lease_id"])
        data = event.get("data") or {}
        kernel_id = kernel_of(data.get("holder"))
        if kernel_id is not None and data.get("state") in ENDS_KERNEL:
            await self.lease_ended(kernel_id, {"id": event.get("lease_id"), "state": data["state"],
                                               "reason": data.get("reason", ""), "holder": data["holder"]})

    async def lease_ended(self, kernel_id: str, lease: Mapping[str, Any]) -> None:
        """The scheduler ended a kernel's lease: shut the kernel down if its slice was taken away."""
        held = self.lease_of(kernel_id)
        if held is None or held["id"] != lease["id"]:
            return
        self.detach(kernel_id)
        if lease["state"] not in ENDS_KERNEL or kernel_id not in self.kernel_manager:
            return
        reason = lease.get("reason", "")
        self.log.warning("shutting down kernel %s: its GPU lease %s %s (%s)", kernel_id, lease["id"],
                         lease["state"], reason)
        if await self.shut_down(kernel_id):
            self.events.emit("kernel.gpu_shutdown", kernel_id=kernel_id, lease_id=lease["id"],
                             holder=kernel_holder(kernel_id), state=lease["state"], reason=reason, action="shutdown",
                             message=f"Kernel {kernel_id} was shut down: its GPU lease {lease['state']} ({reason}).")

    async def shut_down(self, kernel_id: str) -> bool:
        """Shut a kernel down once (joining a shutdown already in progress); whether it went without error.

        The shutdown runs in its own task, shielded: cancelling the caller leaves it running to its end.
        """
        return await asyncio.shield(self._start_shutdown(kernel_id))

    def _start_shutdown(self, kernel_id: str) -> asyncio.Task:
        task = self.shutdowns.get(kernel_id)
        if task is None:
            task = self.shutdowns[kernel_id] = asyncio.ensure_future(self._shut_down(kernel_id))
            task.add_done_callback(lambda _: self.shutdowns.pop(kernel_id, None))
        return task

    async def _shut_down(self, kernel_id: str) -> bool:
        try:
            await self.kernel_manager.shutdown_kernel(kernel_id)
        except Exception as err:  # e.g. a kernel whose start failed: there is nothing left to stop
            self.log.warning("gpualloc: cannot shut down kernel %s: %s", kernel_id, err)
            return False
        return True

    async def shut_down_all(self, timeout: float) -> list[str]:
        """Server stop: shut every kernel down (joining those already stopping), waiting at most `timeout`
        seconds; returns the kernels still stopping then (jupyter_server's own cleanup awaits those)."""
        for kernel_id in self.kernel_manager.list_kernel_ids():
            self._start_shutdown(kernel_id)
        if self.shutdowns:
            await asyncio.wait(list(self.shutdowns.values()), timeout=timeout)
        return sorted(k for k, task in self.shutdowns.items() if not task.done())
