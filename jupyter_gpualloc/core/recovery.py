"""What recovery reads back onto the fleet: the MIG instances the store knows, and the slices of stored leases."""

from __future__ import annotations

from typing import Callable

from .devices.base import DeviceBackend
from .fleet_state import FleetState, GpuState
from .journal import SchedulerJournal
from .lease_book import LeaseBook
from .model import Lease, LeaseState, MigInstance, MigMode, SliceKind, SliceSpec, SpecError
from .plans import Plan, host_demand, slice_demand
from .store import StoredState


def reconcile_instances(state: StoredState, fleet: FleetState, journal: SchedulerJournal, now: float,
                        emit: Callable[..., None], backend: DeviceBackend) -> None:
    """Reconcile the devices' MIG instances with the store's records. An instance the store does
    not know is the administrator's, unless a MIG intent names its place: then the core made it
    before a crash (and destroys it once recovered, as no lease was recorded for it). One the core
    made that the devices no longer show has vanished, unless the backend holds it again (a DRA
    partition whose claim was not yet written) on a dynamic GPU where nothing overlaps it."""
    first_start = state.seq == 0 and not state.instances and not state.intents
    intents = {(i.gpu_uuid, i.profile_id, i.start): i.id for i in state.intents}
    recorded = {r.instance.uuid: r for r in state.instances}
    for gs in fleet.gpus.values():
        for inst in gs.instances.values():
            record = recorded.pop(inst.uuid, None)
            made_by_core = record is None and intents.pop((gs.gpu.uuid, inst.profile_id, inst.start), None)
            if made_by_core:
                journal.instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
                gs.created.add(inst.uuid)
            elif record is None:
                journal.instance_changes.append((gs.gpu.uuid, inst.uuid, inst, False))
                if not first_start:
                    emit("reconcile.instance_found", now, gpu=gs.gpu.uuid, instance=inst.uuid,
                         profile=gs.profiles[inst.profile_id].name, start=inst.start)
            elif record.created_by_core:
                gs.created.add(inst.uuid)
    for record in recorded.values():
        if record.created_by_core and _restored(fleet.gpus.get(record.gpu_uuid), record.instance, backend):
            gs = fleet.gpus[record.gpu_uuid]
            gs.instances[record.instance.uuid] = record.instance
            gs.created.add(record.instance.uuid)
            fleet.changed(gs)
            continue
        journal.instance_changes.append((record.gpu_uuid, record.instance.uuid, None, False))
        emit("reconcile.instance_vanished", now, gpu=record.gpu_uuid, instance=record.instance.uuid)


def _restored(gs: GpuState | None, instance: MigInstance, backend: DeviceBackend) -> bool:
    if gs is None or gs.gpu.mig_mode is not MigMode.DYNAMIC or instance.profile_id not in gs.profiles:
        return False
    end = instance.start + instance.size
    if any(i.start < end and instance.start < i.start + i.size for i in gs.instances.values()):
        return False
    return backend.restore_mig_instance(gs.gpu.uuid, instance)


def recover_returning(state: StoredState, fleet: FleetState, book: LeaseBook, journal: SchedulerJournal,
                      now: float) -> None:
    """Hold the slices of the stored leases that ended while their holders still held them; a
    slice the fleet no longer has is returned (so written at the next commit)."""
    for lease in sorted(state.returning, key=lambda l: l.seq):
        lease.heartbeat_at = now  # its holder gets a full TTL to be seen again, as active ones do
        if reattach(lease, fleet):
            book.returning[lease.id] = lease
        else:
            lease.returning = False
            journal.returning_changes[lease.id] = False


def reattach(lease: Lease, fleet: FleetState) -> bool:
    """Hold a recovered lease's slice again; False if the fleet no longer has it free."""
    sl = lease.slice
    if sl is None or sl.node not in fleet.node_index:
        return False
    gpus = [fleet.gpus.get(u) for u in sl.gpu_uuids]
    if any(g is None for g in gpus):
        return False
    node_index = fleet.node_index[sl.node]
    if sl.kind is SliceKind.MIG:
        gs = gpus[0]
        if sl.mig_uuid not in gs.instances or sl.mig_uuid in gs.owner:
            return False
        gs.owner[sl.mig_uuid] = lease.id
        fleet.changed(gs)
        fleet.views.allocate(node_index, (), host_demand(lease.spec))
        return True
    if any(g.is_mig or g.free_milli() < sl.milli for g in gpus):
        return False
    for gs in gpus:
        gs.holders[lease.id] = sl.milli
        fleet.changed(gs)
    fleet.views.allocate(node_index, tuple(g.slot for g in gpus), slice_demand(lease), check=False)  # drained or not
    return True


def recover_leases(state: StoredState, book: LeaseBook, plans_of: Callable[[SliceSpec], tuple[Plan, ...]],
                   fleet: FleetState, now: float, *, end: Callable[..., None], emit: Callable[..., None],
                   running: Callable[[Lease, float], None]) -> None:
    """Hold the stored active leases again, on their slices (ended, when the fleet no longer has them);
    `running(lease, now)` for each granted one that holds its slice again."""
    for lease in sorted(state.leases, key=lambda l: l.seq):
        lease.heartbeat_at = now
        book.add(lease)
        try:
            book.plans[lease.id] = plans_of(lease.spec)
        except SpecError as err:
            end(lease, LeaseState.EXPIRED, now, f"fleet changed: {err.message}", holds=False)
            continue
        if lease.state is LeaseState.QUEUED:
            book.queue.append(lease.id)
        elif not reattach(lease, fleet):
            emit("reconcile.slice_lost", now, lease, slice=lease.slice.to_json() if lease.slice else None)
            end(lease, LeaseState.EXPIRED, now, "its slice no longer exists on the device", holds=False)
        else:
            running(lease, now)
