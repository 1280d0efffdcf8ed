"""The one way the core is put together, for the service and for embedded mode alike.

`open_core` builds the scheduler and the jobs over a device backend and a store, with the
listeners subscribed before recovery: the events recovery emits (a slice lost, an instance
found, a job moved on while the scheduler was stopped) reach them like any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from .devices import make_backend
from .devices.base import DeviceBackend
from .jobs import Jobs
from .model import Event
from .policy import SchedulerPolicy
from .reservations import Reservations
from .scheduler import Scheduler
from .store import Store
from .usage import UsageLedger


@dataclass
class Core:
    """The core's parts as one: where GPUs come from, the store, the scheduler and the jobs over it."""

    backend: DeviceBackend
    store: Store
    scheduler: Scheduler
    jobs: Jobs

    @property
    def usage(self) -> UsageLedger:
        """The usage ledger over the scheduler's leases: reports, efficiency, windows and usage quotas."""
        return self.scheduler.usage

    @property
    def reservations(self) -> Reservations:
        """Capacity held for members in time windows: create, delete, list and usage per reservation."""
        return self.scheduler.reservations

    def tick(self, now: float) -> None:
        """End dead and idle leases and grant (Scheduler.tick), then move the jobs on (Jobs.tick)."""
        self.scheduler.tick(now)
        self.jobs.tick(now)

    def close(self) -> None:
        self.store.close()
        self.backend.close()


def device_backend(name: str, *, fleet: str = "", state_file: str | None = None,
                   process_dir: str | None = None) -> DeviceBackend:
    """The backend by name; without a name, simulated when a fleet file is given, else NVML."""
    name = name or ("simulated" if fleet else "nvml")
    if name != "simulated":
        return make_backend(name)
    return make_backend(name, fleet=fleet or None, state_file=state_file or None, process_dir=process_dir or None)


def open_core(backend: DeviceBackend, store: Store, policy: SchedulerPolicy, *, now: float,
              listeners: Sequence[Callable[[Event], None]] = ()) -> Core:
    """The scheduler and the jobs, recovered from `store`; `listeners` hear every event, recovery's included."""
    scheduler = Scheduler(backend, store, policy, now=now, listeners=listeners)
    jobs = Jobs(scheduler, now=now, listeners=listeners)
    return Core(backend, store, scheduler, jobs)
