"""What must hold between the store, the core and the devices after any crash and recovery.

`check_consistent` looks at one recovered scheduler, its store and its device backend;
`check_transition` compares the leases after a crash with the committed state before the
operation that was interrupted and the state that operation would have reached.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from jupyter_gpualloc.core.devices.base import DeviceBackend
from jupyter_gpualloc.core.model import LeaseState, SliceKind
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store


def device_instances(backend: DeviceBackend) -> dict[str, tuple[str, int, int]]:
    """Every MIG instance on the devices: uuid -> (GPU uuid, profile id, start)."""
    return {i.uuid: (g.uuid, i.profile_id, i.start)
            for n in backend.discover() for g in n.gpus for i in g.instances}


def check_consistent(s: Scheduler, store: Store, backend: DeviceBackend, admin_instances: set[str]) -> list[str]:
    """Each broken invariant, in words (empty when all hold):

    - the store and the core list the same active leases, with the same states and slices;
    - the store records exactly the instances on the devices, and no MIG intent is left over;
    - every instance but the administrator's is held by exactly one granted lease (no orphan:
      instances are made only for leases), and no two leases share an instance, a whole GPU, or
      more than a GPU's capacity;
    - every instance an administrator made is still there and still recorded as theirs.
    """
    problems = []
    state = store.load()
    stored = {l.id: (l.state, l.slice) for l in state.leases}
    held = {l.id: (l.state, l.slice) for l in s.leases()}
    if stored != held:
        problems.append(f"store and core disagree on active leases: {sorted(set(stored) ^ set(held))} "
                        f"or their states/slices")
    on_device = device_instances(backend)
    recorded = {r.instance.uuid: r for r in state.instances}
    if set(recorded) != set(on_device):
        problems.append(f"instances on devices but not recorded: {sorted(set(on_device) - set(recorded))}; "
                        f"recorded but gone: {sorted(set(recorded) - set(on_device))}")
    if state.intents:
        problems.append(f"MIG intents left after recovery: {state.intents}")
    granted = [l for l in s.leases() if l.state is LeaseState.GRANTED]
    owners = Counter(l.slice.mig_uuid for l in granted if l.slice.kind is SliceKind.MIG)
    problems += [f"instance {u} is held by {n} leases" for u, n in owners.items() if n > 1]
    problems += [f"lease holds instance {u}, which is not on the device" for u in owners if u not in on_device]
    for uuid in on_device:
        if uuid not in admin_instances and uuid not in owners:
            problems.append(f"orphan: instance {uuid}, made by the core, is held by no lease")
    for uuid, record in recorded.items():
        if uuid in admin_instances and record.created_by_core:
            problems.append(f"the administrator's instance {uuid} is recorded as the core's")
    problems += [f"the administrator's instance {u} was destroyed" for u in admin_instances if u not in on_device]
    milli: dict[str, int] = defaultdict(int)
    whole: Counter = Counter()
    for lease in granted:
        if lease.slice.kind is SliceKind.MIG:
            continue
        for gpu in lease.slice.gpu_uuids:
            milli[gpu] += lease.slice.milli
            whole[gpu] += lease.slice.kind is SliceKind.WHOLE
    problems += [f"GPU {g} is booked {m}/1000" for g, m in milli.items() if m > 1000]
    problems += [f"whole GPU {g} is booked {n} times" for g, n in whole.items() if n > 1]
    return problems


def lease_states(s: Scheduler) -> dict[str, tuple]:
    """Each active lease: (state, slice kind, MIG profile or comma-joined GPU uuids)."""
    return {l.id: _essentials(l) for l in s.leases()}


def _essentials(lease) -> tuple:
    sl = lease.slice
    if sl is None:
        return (lease.state.value,)
    where = sl.profile if sl.kind is SliceKind.MIG else ",".join(sl.gpu_uuids)
    return (lease.state.value, sl.kind.value, where)


def check_transition(after: Scheduler, before: dict[str, tuple], done: dict[str, tuple],
                     queue_before: list[str]) -> list[str]:
    """Leases after a crash against the committed state `before` the operation and the state it
    reaches when `done`: no lease lost or made up, each one as before or as done (a queued one
    may also have been granted by recovery), and the waiting ones still in their order."""
    problems = []
    now = lease_states(after)
    for lease_id, essentials in now.items():
        allowed = {before.get(lease_id), done.get(lease_id)} - {None}
        if not allowed:
            problems.append(f"lease {lease_id} appeared from nowhere: {essentials}")
        elif essentials not in allowed and not (before.get(lease_id, ("",))[0] == "queued"
                                                and essentials[0] == "granted"):
            problems.append(f"lease {lease_id} is {essentials}, expected one of {sorted(allowed)}")
    for lease_id in set(before) & set(done):
        if lease_id not in now:
            problems.append(f"lease {lease_id}, active before and after the operation, was lost")
    waiting = [l.id for l in after.queue()]
    kept = [i for i in queue_before if i in waiting]
    if kept != [i for i in waiting if i in queue_before]:
        problems.append(f"queue order changed: {kept} became {waiting}")
    return problems
