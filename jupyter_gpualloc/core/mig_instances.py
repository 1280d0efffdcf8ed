"""The MIG instances the core makes and unmakes, under two rules.

Write-ahead: an intent naming the instance's place is durable before the device is asked to
create it (`create`), so a crash in between leaves an intent that recovery resolves. Destroy
after commit: an instance is destroyed only once the store says nobody holds it (`destroy`); a
crash in between leaves an unowned instance the core made, which recovery destroys.
"""

from __future__ import annotations

import secrets

from .devices.base import DeviceBackend, DeviceError
from .errors import StoreFailed
from .fleet_state import FleetState, GpuState
from .journal import SchedulerJournal, refused
from .model import Event, MigInstance, MigProfile
from .store import MigIntent, Store, StoreError


class MigInstances:
    """Creates and destroys MIG instances on the devices, recording each in the scheduler's journal."""

    def __init__(self, store: Store, backend: DeviceBackend, fleet: FleetState, journal: SchedulerJournal):
        self.store = store
        self.backend = backend
        self.fleet = fleet
        self.journal = journal

    def create(self, gs: GpuState, profile: MigProfile, start: int, now: float) -> MigInstance:
        """Write the intent, then ask the device: a crash in between leaves an intent, which
        recovery resolves, and never an instance nobody knows the core made."""
        intent = MigIntent(secrets.token_hex(8), gs.gpu.uuid, profile.profile_id, start)
        try:
            self.store.record_intent(intent)
        except StoreError as err:
            raise refused(err, "a MIG intent") from err
        self.journal.intents.append(intent.id)
        inst = self.backend.create_mig_instance(gs.gpu.uuid, profile.profile_id, start)
        self.journal.record_gpu(gs)
        gs.instances[inst.uuid] = inst
        gs.created.add(inst.uuid)
        self.fleet.changed(gs)
        self.journal.undo.made.append((gs, inst, intent.id))
        self.journal.instance_changes.append((gs.gpu.uuid, inst.uuid, inst, True))
        self.journal.events.append(Event("mig.created", now, None, None, {
            "gpu": gs.gpu.uuid, "instance": inst.uuid, "profile": profile.name, "start": inst.start}))
        return inst

    def destroy(self, gs: GpuState, mig_uuid: str, now: float) -> None:
        """Destroy an instance the core made once the store says nobody holds it: commit first,
        so a crash or a refusal leaves an unowned instance of the core's, which recovery destroys.
        While the store holds a group, the group is written first (a release leaves its instance
        to the group's commit instead)."""
        self.journal.commit(now)
        if self.store.holding:  # durable before the device changes, with the group it waits in
            self.journal.write_group(settle=False)
        destroyed = self.unmake(gs, mig_uuid, now)
        if destroyed is None:
            return
        self.journal.instance_changes.append((gs.gpu.uuid, mig_uuid, None, False))
        self.journal.events.append(destroyed)
        try:
            self.journal.commit()
        except StoreFailed:
            pass  # the record's removal stays pending for the next commit; a restart finds it gone anyway

    def unmake(self, gs: GpuState, mig_uuid: str, now: float) -> Event | None:
        """Have the device destroy an instance and drop it from the GPU's state and indexes: its
        `mig.destroyed` event, to announce once the record's removal is written; None (and a
        `device.error`) if the device refused, the instance then staying as it was."""
        try:
            self.backend.destroy_mig_instance(gs.gpu.uuid, mig_uuid)
        except DeviceError as err:
            self.journal.events.append(Event("device.error", now, None, None, {
                "gpu": gs.gpu.uuid, "instance": mig_uuid, "error": str(err)}))
            return None
        inst = gs.instances.pop(mig_uuid)
        gs.created.discard(mig_uuid)
        self.fleet.changed(gs)
        return Event("mig.destroyed", now, None, None, {"gpu": gs.gpu.uuid, "instance": mig_uuid,
                                                         "profile": gs.profiles[inst.profile_id].name,
                                                         "start": inst.start})

    def destroy_released(self, to_destroy: dict[str, GpuState], now: float) -> None:
        """Destroy the instances a settled group released and nobody took since: O(those instances);
        their records' removal waits for the next commit, which then announces them. One taken again
        by a change still staged is carried to that change's group (undone, it frees the instance)."""
        for mig_uuid, gs in to_destroy.items():
            if mig_uuid in gs.owner:
                if self.journal.gathering:
                    self.journal.carried[mig_uuid] = gs
                continue  # granted again, by a durable change or by one whose group decides
            if mig_uuid not in gs.created:
                continue  # destroyed meanwhile
            destroyed = self.unmake(gs, mig_uuid, now)
            if destroyed is not None:
                self.journal.destroyed.append(((gs.gpu.uuid, mig_uuid, None, False), destroyed))
