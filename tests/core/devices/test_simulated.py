"""SimulatedBackend: real MIG geometry, driver-like ids and UUIDs, static mode, process files."""

from __future__ import annotations

import inspect
import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from jupyter_gpualloc.core.devices import make_backend
from jupyter_gpualloc.core.devices.base import DeviceError, DevicePermissionError
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend, report_process_memory
from jupyter_gpualloc.core.fleet import FleetError
from jupyter_gpualloc.core.model import MigMode

GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
FLEET = {"nodes": [{"name": "local", "cpu_milli": 32000, "memory_mib": 131072, "gpus": [
    {"model": "A100-SXM4-80GB", "mig": "dynamic"},
    {"model": "A100-SXM4-40GB", "mig": "static", "layout": ["3g.20gb", "2g.10gb"]},
    {"model": "L4"}]}]}


@pytest.fixture
def backend():
    return SimulatedBackend(FLEET)


def uuids(backend):
    return [g.uuid for g in backend.discover()[0].gpus]


def test_uuids_are_well_formed_and_deterministic(backend):
    first = uuids(backend)
    assert all(GPU_UUID.match(u) for u in first) and len(set(first)) == 3
    assert uuids(SimulatedBackend(FLEET)) == first
    static = backend.discover()[0].gpus[1]
    assert all(MIG_UUID.match(i.uuid) for i in static.instances)
    assert [i.uuid for i in SimulatedBackend(FLEET).discover()[0].gpus[1].instances] == [i.uuid for i in static.instances]


def test_invalid_fleet_is_a_fleet_error():
    with pytest.raises(FleetError, match=r"nodes\[0\]\.gpus\[0\]\.model: unknown GPU model 'Nope'"):
        SimulatedBackend({"nodes": [{"name": "a", "cpu_milli": 1, "memory_mib": 1, "gpus": [{"model": "Nope"}]}]})


def test_create_follows_the_geometry(backend):
    gpu = uuids(backend)[0]
    four = backend.create_mig_instance(gpu, 5, 0)   # 4g.40gb at 0
    three = backend.create_mig_instance(gpu, 9, 4)  # 3g.40gb at 4: the only order in which both fit
    assert (four.gi_id, four.ci_id, three.gi_id, three.size) == (1, 0, 2, 4)
    assert MIG_UUID.match(four.uuid) and four.uuid != three.uuid
    with pytest.raises(DeviceError, match=r"Insufficient Resources: cannot create 1g.10gb at start 6 .*legal starts now: none"):
        backend.create_mig_instance(gpu, 19, 6)
    backend.destroy_mig_instance(gpu, four.uuid)
    with pytest.raises(DeviceError, match="cannot create 3g.40gb at start 4 .*legal starts now: 0"):
        backend.create_mig_instance(gpu, 9, 4)
    one = backend.create_mig_instance(gpu, 19, 3)
    assert one.gi_id == 1  # the smallest free GPU-instance id, like the driver


def test_a_recreated_instance_gets_a_new_uuid(backend):
    gpu = uuids(backend)[0]
    first = backend.create_mig_instance(gpu, 19, 0)
    backend.destroy_mig_instance(gpu, first.uuid)
    second = backend.create_mig_instance(gpu, 19, 0)
    assert second.uuid != first.uuid and (second.start, second.profile_id) == (first.start, first.profile_id)


def test_destroy_and_create_errors(backend):
    a100, static, l4 = uuids(backend)
    with pytest.raises(DeviceError, match="has no MIG instance MIG-unknown"):
        backend.destroy_mig_instance(a100, "MIG-unknown")
    with pytest.raises(DeviceError, match="no GPU GPU-nope in this fleet"):
        backend.create_mig_instance("GPU-nope", 19, 0)
    with pytest.raises(DeviceError, match="MIG mode is off") as off:
        backend.create_mig_instance(l4, 19, 0)
    assert not isinstance(off.value, DevicePermissionError)
    with pytest.raises(DeviceError, match="no MIG profile id 77"):
        backend.create_mig_instance(a100, 77, 0)
    assert backend.mig_profiles(l4) == {}
    assert backend.mig_profiles(a100)[9].name == "3g.40gb"


def test_static_gpu_and_static_backend(backend):
    a100, static, _ = uuids(backend)
    existing = backend.discover()[0].gpus[1].instances[0]
    with pytest.raises(DevicePermissionError, match="MIG is static"):
        backend.create_mig_instance(static, 19, 6)
    with pytest.raises(DevicePermissionError):
        backend.destroy_mig_instance(static, existing.uuid)
    locked = SimulatedBackend(FLEET, allow_mig_changes=False)
    assert not locked.can_change_mig and backend.can_change_mig
    assert [g.mig_mode for g in locked.discover()[0].gpus] == [MigMode.STATIC, MigMode.STATIC, MigMode.OFF]
    with pytest.raises(DevicePermissionError):
        locked.create_mig_instance(a100, 19, 0)


def test_discover_returns_copies(backend):
    node = backend.discover()[0]
    node.gpus[1].instances.clear()
    node.gpus.pop()
    again = backend.discover()[0]
    assert len(again.gpus) == 3 and len(again.gpus[1].instances) == 2


CHILD = """
import os
import sys
from jupyter_gpualloc.core.devices.simulated import report_process_memory
report_process_memory(sys.argv[1], os.getpid(), sys.argv[2], 2048, mig_uuid=sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
"""


def test_process_memory_from_a_real_child_process(tmp_path):
    backend = SimulatedBackend(FLEET, process_dir=tmp_path)
    a100 = uuids(backend)[0]
    instance = backend.create_mig_instance(a100, 19, 0)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path), a100, instance.uuid],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        [process] = backend.process_memory()
        assert (process.pid, process.gpu_uuid, process.used_mib, process.mig_uuid) == (
            child.pid, a100, 2048, instance.uuid)
        with pytest.raises(DeviceError, match=f"In use by another client.*{child.pid}"):
            backend.destroy_mig_instance(a100, instance.uuid)
    finally:
        child.communicate("done\n", timeout=20)
    assert backend.process_memory() == []
    assert not (tmp_path / f"{child.pid}.json").exists()  # the exited process's file is removed
    backend.destroy_mig_instance(a100, instance.uuid)


def test_report_is_atomic_json_and_foreign_files_are_ignored(tmp_path):
    backend = SimulatedBackend(FLEET, process_dir=tmp_path)
    l4 = uuids(backend)[2]
    path = report_process_memory(tmp_path, os.getpid(), l4, 512)
    assert json.loads(path.read_text()) == {"gpu_uuid": l4, "used_mib": 512}
    (tmp_path / "notes.json").write_text("{}")
    report_process_memory(tmp_path, os.getpid(), "GPU-of-another-fleet", 1)  # replaces ours
    assert backend.process_memory() == []
    report_process_memory(tmp_path, os.getpid(), l4, 768)
    assert [(p.pid, p.used_mib, p.mig_uuid) for p in backend.process_memory()] == [(os.getpid(), 768, None)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["notes.json", f"{os.getpid()}.json"])
    assert SimulatedBackend(FLEET).process_memory() == []


def test_make_backend():
    backend = make_backend("simulated", fleet=FLEET, allow_mig_changes=False)
    assert isinstance(backend, SimulatedBackend) and not backend.can_change_mig
    with pytest.raises(ValueError, match="needs a fleet file"):
        make_backend("simulated")
    with pytest.raises(ValueError, match="unknown device backend 'cuda'"):
        make_backend("cuda")


A30_FLEET = {"nodes": [{"name": "a30-box", "cpu_milli": 32000, "memory_mib": 131072, "gpus": [
    {"model": "NVIDIA A30", "mig": "dynamic"}, {"model": "A100-SXM4-40GB", "mig": "dynamic"}]}]}


def test_a30_has_four_memory_slices_and_its_own_profile_ids():
    backend = SimulatedBackend(A30_FLEET)
    a30, a100 = backend.discover()[0].gpus
    profiles = backend.mig_profiles(a30.uuid)
    assert profiles[5].name == "2g.12gb" and backend.mig_profiles(a100.uuid)[5].name == "4g.20gb"
    backend.create_mig_instance(a30.uuid, 5, 2)
    backend.create_mig_instance(a30.uuid, 14, 0)
    with pytest.raises(DeviceError, match="legal starts now: 1$"):
        backend.create_mig_instance(a30.uuid, 14, 4)
    with pytest.raises(DeviceError, match="legal starts now: none"):
        backend.create_mig_instance(a30.uuid, 0, 0)


def test_the_scheduler_and_the_inventory_drawing_use_each_gpus_geometry(harness):
    from jupyter_gpualloc.cli import render_inventory
    from jupyter_gpualloc.core.model import SliceKind, SliceSpec

    h = harness(A30_FLEET)
    spec = SliceSpec(kind=SliceKind.MIG, profile="2g.12gb")
    granted = [h.scheduler.submit("u", f"kernel:{n}", spec, now=0, wait=False) for n in range(3)]
    assert [lease.state.value for lease in granted] == ["granted", "granted", "rejected"]
    assert {lease.slice.start for lease in granted[:2]} == {0, 2}
    a30, a100 = h.scheduler.inventory()["nodes"][0]["gpus"]
    assert (a30["memory_slices"], a30["compute_slices"], a30["free_memory_slices"]) == (4, 4, 0)
    assert (a100["memory_slices"], a100["compute_slices"], a100["free_memory_slices"]) == (8, 7, 8)
    assert sorted((i["start"], i["size"]) for i in a30["instances"]) == [(0, 2), (2, 2)]
    lines = list(render_inventory(h.backend))
    assert lines[1].endswith("|a|a|b|b|  a=2g.12gb@0 b=2g.12gb@2")
    assert "|.|.|.|.|.|.|.|.|  no instances" in lines[2]


BUSY_CHILD = """
import os, sys
from jupyter_gpualloc.core.devices.simulated import report_process_memory
sm = None if sys.argv[4] == "-" else float(sys.argv[4])
report_process_memory(sys.argv[1], os.getpid(), sys.argv[2], 1024, mig_uuid=sys.argv[3] or None, sm_percent=sm)
print("ready", flush=True)
sys.stdin.readline()
"""


def test_utilization_per_process_from_its_report_or_its_gpus_pattern(tmp_path):
    fleet = {"nodes": [{"name": "n", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [
        {"model": "A100-SXM4-40GB", "mig": "dynamic", "utilization": [[60, 80], [60, 0]]},
        {"model": "L4"}, {"model": "T4"}]}]}
    backend = SimulatedBackend(fleet, process_dir=tmp_path)
    a100, l4, t4 = uuids(backend)
    one, idle = backend.create_mig_instance(a100, 19, 0), backend.create_mig_instance(a100, 19, 1)
    assert {(u.gpu_uuid, u.mig_uuid, u.sm_percent): u.processes for u in backend.utilization(now=0)} == {
        (a100, one.uuid, None): {}, (a100, idle.uuid, None): {}}  # the pattern's GPU: sampled though idle
    children = [subprocess.Popen([sys.executable, "-c", BUSY_CHILD, str(tmp_path), gpu, mig, sm],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                for gpu, mig, sm in ((a100, one.uuid, "-"), (l4, "", "0"), (l4, "", "65"), (t4, "", "-"))]
    try:
        assert all(c.stdout.readline().strip() == "ready" for c in children)
        on_pattern, l4_idle, l4_busy, _ = (c.pid for c in children)
        at = {t: {(u.gpu_uuid, u.mig_uuid): u.processes for u in backend.utilization(now=t)} for t in (30, 90)}
        assert at[30] == {(a100, one.uuid): {on_pattern: 80.0}, (a100, idle.uuid): {},
                          (l4, None): {l4_idle: 0.0, l4_busy: 65.0}}  # the T4 has neither: not sampled
        assert at[90][(a100, one.uuid)] == {on_pattern: 0.0}
    finally:
        for child in children:
            child.communicate("done\n", timeout=20)
    assert (l4, None) not in {(u.gpu_uuid, u.mig_uuid) for u in backend.utilization(now=0)}


# A loop of MIG changes on one GPU with a state file, printing each layout once its change returned.
CHURN = """
import json, sys
from jupyter_gpualloc.core.devices import simulated
simulated.COMPACT_AFTER = int(sys.argv[3])
backend = simulated.SimulatedBackend(json.loads(sys.argv[1]), state_file=sys.argv[2])
for layout in churn(backend):
    print(json.dumps(layout), flush=True)
"""
ONE_A100 = {"nodes": [{"name": "n", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [
    {"model": "A100-SXM4-40GB", "mig": "dynamic"}]}]}


def churn(backend, steps=None):
    """Create and destroy 1g.5gb instances in a fixed order; yields the layout after each change."""
    gpu = backend.discover()[0].gpus[0].uuid
    held, k = {}, 0
    while steps is None or k < steps:
        start = (k * 3) % 7
        if start in held:
            backend.destroy_mig_instance(gpu, held.pop(start))
        else:
            held[start] = backend.create_mig_instance(gpu, 19, start).uuid
        k += 1
        yield sorted(held.items())


def layout(backend):
    return [[i.start, i.uuid] for i in sorted(backend.discover()[0].gpus[0].instances, key=lambda i: i.start)]


@pytest.mark.parametrize("compact_after", [1000, 3])
def test_sigkill_at_any_moment_loses_no_acknowledged_mig_change(tmp_path, compact_after):
    source = textwrap.dedent(inspect.getsource(churn))
    rng = random.Random(compact_after)
    for attempt in range(6):
        state = tmp_path / f"mig{attempt}.json"
        child = subprocess.Popen([sys.executable, "-c", source + CHURN, json.dumps(ONE_A100), str(state),
                                  str(compact_after)], stdout=subprocess.PIPE, text=True)
        lines: list[str] = []

        def read(child=child, lines=lines) -> None:  # all the time, so the child never waits on its pipe
            for line in child.stdout:
                lines.append(line)

        reader = threading.Thread(target=read)
        reader.start()
        while not lines and child.poll() is None:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=20)
        reader.join(timeout=20)
        acknowledged = sum(line.endswith("\n") for line in lines)  # a line cut by the kill: not heard
        expected = [[]] + [[list(x) for x in step] for step in churn(SimulatedBackend(ONE_A100), acknowledged + 1)]
        assert json.loads(lines[acknowledged - 1]) == expected[acknowledged]
        found = layout(SimulatedBackend(ONE_A100, state_file=state))
        assert found in (expected[acknowledged], expected[acknowledged + 1]), (attempt, acknowledged)
        # and the state goes on from there: one more change, then a restart, shows it
        again = SimulatedBackend(ONE_A100, state_file=state)
        gpu = again.discover()[0].gpus[0].uuid
        if found:
            again.destroy_mig_instance(gpu, found[0][1])
            after = found[1:]
        else:
            after = [[0, again.create_mig_instance(gpu, 19, 0).uuid]]
        assert layout(SimulatedBackend(ONE_A100, state_file=state)) == after


def test_a_torn_journal_line_is_no_change_and_a_replayed_snapshot_record_is_skipped(tmp_path):
    state = tmp_path / "mig.json"
    backend = SimulatedBackend(ONE_A100, state_file=state)
    gpu = uuids(backend)[0]
    first = backend.create_mig_instance(gpu, 19, 0)
    journal = backend.journal_file.read_bytes()
    assert journal.count(b"\n") == 1 and json.loads(state.read_text())["seq"] == 0
    with backend.journal_file.open("ab") as f:
        f.write(b'{"seq": 2, "op": "create", "gpu": "' + gpu.encode() + b'", "inst')  # killed mid-append
    restarted = SimulatedBackend(ONE_A100, state_file=state)
    assert layout(restarted) == [[0, first.uuid]]
    assert restarted.journal_file.read_bytes() == b"" and json.loads(state.read_text())["seq"] == 1
    second = restarted.create_mig_instance(gpu, 19, 1)  # appended after the dropped tail, not onto it
    # killed after a new snapshot but before the journal was emptied: its records are in the snapshot
    restarted._snapshot()
    restarted.journal_file.write_bytes(journal)
    assert layout(SimulatedBackend(ONE_A100, state_file=state)) == [[0, first.uuid], [1, second.uuid]]


def test_a_state_file_written_before_the_journal_is_read(tmp_path):
    backend = SimulatedBackend(ONE_A100)
    gpu = uuids(backend)[0]
    made = backend.create_mig_instance(gpu, 19, 2)
    state = tmp_path / "mig.json"
    state.write_text(json.dumps({gpu: {"instances": [vars(made)], "created": 1}}))
    loaded = SimulatedBackend(ONE_A100, state_file=state)
    assert layout(loaded) == [[2, made.uuid]]
    assert loaded.create_mig_instance(gpu, 19, 3).uuid != made.uuid  # the UUID counter carried over
