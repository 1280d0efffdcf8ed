"""The kernel activity monitor's round: a kernel found gone is reported once, and a kernel still
starting (its provisioner holds the lease before the kernel manager lists it) is not gone."""

from __future__ import annotations

import asyncio
import logging

from jupyter_gpualloc.server.idle import KernelActivityMonitor


class Manager:
    """The kernel manager as the monitor reads it: the kernels it lists (none is watched here)."""

    def __init__(self):
        self.listed: list[str] = []

    def list_kernel_ids(self) -> list[str]:
        return list(self.listed)


class Service:
    """The allocator's side of the round, recorded."""

    def __init__(self):
        self.gone: list[list[str]] = []

    async def holders_gone(self, holders):
        self.gone.append(list(holders))

    async def heartbeat(self, holders):
        return []

    async def touch(self, lease_id, **activity):
        return {"id": lease_id, "state": "granted"}


def test_a_starting_kernel_keeps_its_lease_and_an_ended_one_is_reported_gone(monkeypatch):
    manager, service = Manager(), Service()
    monitor = KernelActivityMonitor(service, manager, events=None, log=logging.getLogger("test"))
    monkeypatch.setattr(monitor, "activity", lambda kernel_id: {})  # no IOPub to listen to here
    monkeypatch.setattr(monitor.person, "watch", lambda kernel_id: None)
    monitor.attach("k1", {"id": "lease-1", "holder": "kernel:k1"})

    asyncio.run(monitor.report())  # k1's provisioner has its lease; the manager lists it once started
    assert service.gone == [] and monitor.lease_of("k1") is not None

    manager.listed = ["k1"]
    asyncio.run(monitor.report())
    assert service.gone == []

    manager.listed = []  # its process ended
    asyncio.run(monitor.report())
    assert service.gone == [["kernel:k1"]] and monitor.lease_of("k1") is None
    asyncio.run(monitor.report())
    assert service.gone == [["kernel:k1"]]
