"""A simulated fleet with the real MIG rules, for laptops, demos, tests and the trace simulator.

The fleet comes from a fleet file (see core/fleet.py). MIG instances follow the driver's geometry
(mig.legal_starts), get new UUIDs each time they are created and driver-like GI ids. Like a real
GPU's, the MIG layout outlives the process that changed it when a `state_file` is given; without
one, created instances live in memory only. The state file is a JSON snapshot plus an append-only
journal beside it (`<state_file>.journal`, one JSON line per instance change, numbered): a change
costs one append, and the journal is folded into a new snapshot (written aside, then renamed)
every `COMPACT_AFTER` changes and at start. A process killed mid-append leaves a torn last line,
which is not a change (its caller never heard of it) and is dropped; one killed between a new
snapshot and the journal's truncation leaves records the snapshot already holds, skipped by number.

Per-process GPU memory is simulated with files, so the watchdog can be tested with real
processes: each process writes `<pid>.json` (`{"gpu_uuid": ..., "mig_uuid": ..., "used_mib": N}`)
into `process_dir` (see `report_process_memory`); files of processes that have exited are removed.
A simulation that runs its own notebooks (the trace replay) declares them with `run_process`
instead, without files or live PIDs.

SM utilisation is attributed per process, like the driver does on GPUs without MIG: a process's
file may say its own `sm_percent`, else the fleet file's `utilization` pattern of its GPU at the
time asked applies. A GPU or MIG instance is sampled when its GPU has a pattern (all its devices,
idle ones too) or when a process on it states its own figure; others are left out, as the driver
leaves out what it cannot sample.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

from .. import mig
from ..fleet import UtilizationPattern, load_fleet, mig_uuid, smallest_free_id
from ..model import Gpu, MigInstance, MigMode, MigProfile, Node
from .base import DeviceBackend, DeviceError, DevicePermissionError, GpuProcess, GpuUtilization


COMPACT_AFTER = 1000


class SimulatedBackend(DeviceBackend):
    """GPUs described by a fleet file, behaving like the real driver."""

    name = "simulated"

    def __init__(self, fleet: list[Node] | str | os.PathLike[str] | Mapping[str, Any], *,
                 allow_mig_changes: bool = True, process_dir: str | os.PathLike[str] | None = None,
                 state_file: str | os.PathLike[str] | None = None):
        self.patterns: dict[str, UtilizationPattern] = {}
        nodes = fleet if isinstance(fleet, list) else load_fleet(fleet, self.patterns)
        self._nodes = copy.deepcopy(nodes)
        self._gpus: dict[str, Gpu] = {g.uuid: g for n in self._nodes for g in n.gpus}
        self._created: dict[str, int] = {u: len(g.instances) for u, g in self._gpus.items()}
        self._allow_mig_changes = allow_mig_changes
        self.process_dir = Path(process_dir) if process_dir is not None else None
        self.state_file = Path(state_file) if state_file is not None else None
        self._lock = threading.Lock()
        self._seq = 0  # number of the last instance change recorded in the state file
        self._journaled = 0  # changes in the journal since the last snapshot
        self._journal_fd: int | None = None
        self._own: dict[int, tuple[GpuProcess, float | None]] = {}  # run_process: pid -> (process, SM %)
        if self.state_file is not None:
            self._load_state()

    @property
    def journal_file(self) -> Path | None:
        return None if self.state_file is None else self.state_file.with_name(self.state_file.name + ".journal")

    def _load_state(self) -> None:
        """Take the MIG layouts (and UUID counters) a previous process left: the snapshot, then the
        journal's newer changes up to its first incomplete line; then fold them into a new snapshot."""
        if self.state_file.exists():
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
            self._seq = state.pop("seq", 0)
            for gpu_uuid, entry in (state["gpus"] if "gpus" in state else state).items():  # or a pre-journal file
                gpu = self._gpus.get(gpu_uuid)
                if gpu is not None and gpu.mig_mode is not MigMode.OFF:
                    gpu.instances = [MigInstance(**i) for i in entry["instances"]]
                    self._created[gpu_uuid] = entry["created"]
        if self.journal_file.exists():
            for line in self.journal_file.read_bytes().split(b"\n")[:-1]:  # the last piece is torn or empty
                try:
                    change = json.loads(line)
                except ValueError:
                    break
                if change["seq"] > self._seq:
                    self._replay(change)
                    self._seq = change["seq"]
        self._snapshot()

    def _replay(self, change: dict) -> None:
        gpu = self._gpus.get(change["gpu"])
        if gpu is None or gpu.mig_mode is MigMode.OFF:
            return
        if change["op"] == "create":
            gpu.instances.append(MigInstance(**change["instance"]))
            self._created[gpu.uuid] = change["created"]
        else:
            gpu.instances = [i for i in gpu.instances if i.uuid != change["uuid"]]

    def _snapshot(self) -> None:
        """Write every MIG GPU's layout aside, rename it over the state file, empty the journal."""
        state = {"seq": self._seq, "gpus": {
            u: {"instances": [vars(i) for i in g.instances], "created": self._created[u]}
            for u, g in self._gpus.items() if g.mig_mode is not MigMode.OFF}}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state), encoding="utf-8")
        os.replace(tmp, self.state_file)
        os.ftruncate(self._journal(), 0)
        self._journaled = 0

    def _journal(self) -> int:
        if self._journal_fd is None:
            self._journal_fd = os.open(self.journal_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._journal_fd

    def _record(self, change: dict) -> None:
        """Append one instance change to the journal (a snapshot every COMPACT_AFTER of them)."""
        if self.state_file is None:
            return
        self._seq += 1
        data = (json.dumps({"seq": self._seq, **change}) + "\n").encode()
        while data:
            data = data[os.write(self._journal(), data):]
        self._journaled += 1
        if self._journaled >= COMPACT_AFTER:
            self._snapshot()

    def close(self) -> None:
        if self._journal_fd is not None:
            os.close(self._journal_fd)
            self._journal_fd = None

    @property
    def can_change_mig(self) -> bool:
        return self._allow_mig_changes

    def discover(self) -> list[Node]:
        with self._lock:
            nodes = copy.deepcopy(self._nodes)
        if not self._allow_mig_changes:
            for gpu in (g for n in nodes for g in n.gpus):
                if gpu.mig_mode is MigMode.DYNAMIC:
                    gpu.mig_mode = MigMode.STATIC
        return nodes

    def mig_profiles(self, gpu_uuid: str) -> dict[int, MigProfile]:
        return dict(self._profiles(self._gpu(gpu_uuid)))

    @staticmethod
    def _profiles(gpu: Gpu) -> dict[int, MigProfile]:
        """The catalogue's table of its model (shared: read it, never change it); empty with MIG off."""
        if gpu.mig_mode is MigMode.OFF:
            return {}
        return mig.resolve_model(gpu.model, gpu.memory_mib).profiles

    def create_mig_instance(self, gpu_uuid: str, profile_id: int, start: int) -> MigInstance:
        gpu = self._gpu(gpu_uuid)
        self._check_mig_changes(gpu, "create a MIG instance")
        profiles = self._profiles(gpu)
        profile = profiles.get(profile_id)
        if profile is None:
            raise DeviceError(f"GPU {gpu_uuid} ({gpu.model}) has no MIG profile id {profile_id}")
        with self._lock:
            starts = mig.legal_starts(mig.Layout.of(gpu.instances, profiles), profile)
            if start not in starts:
                raise DeviceError(
                    f"Insufficient Resources: cannot create {profile.name} at start {start} on GPU "
                    f"{gpu_uuid}; legal starts now: {', '.join(map(str, starts)) or 'none'}")
            counter = self._created[gpu_uuid]
            self._created[gpu_uuid] = counter + 1
            instance = MigInstance(
                uuid=mig_uuid(gpu_uuid, start, profile_id, counter), profile_id=profile_id,
                start=start, size=profile.memory_slices,
                gi_id=smallest_free_id({i.gi_id for i in gpu.instances}), ci_id=0)
            gpu.instances.append(instance)
            self._record({"op": "create", "gpu": gpu_uuid, "instance": vars(instance), "created": counter + 1})
            return copy.copy(instance)

    def destroy_mig_instance(self, gpu_uuid: str, mig_uuid: str) -> None:
        gpu = self._gpu(gpu_uuid)
        self._check_mig_changes(gpu, "destroy a MIG instance")
        users = sorted(p.pid for p in self.process_memory() if p.mig_uuid == mig_uuid)
        with self._lock:
            for n, instance in enumerate(gpu.instances):
                if instance.uuid == mig_uuid:
                    if users:
                        raise DeviceError(f"In use by another client: MIG instance {mig_uuid} is used "
                                          f"by process(es) {', '.join(map(str, users))}")
                    del gpu.instances[n]
                    self._record({"op": "destroy", "gpu": gpu_uuid, "uuid": mig_uuid})
                    return
        raise DeviceError(f"GPU {gpu_uuid} has no MIG instance {mig_uuid}")

    def process_memory(self) -> list[GpuProcess]:
        """Processes that reported their GPU memory in `process_dir` and are still alive."""
        return [process for process, _ in self._reports()]

    def utilization(self, now: float) -> list[GpuUtilization]:
        """Each process's SM utilisation (its own figure, else its GPU's pattern at `now`), per GPU
        or MIG device; see the module's docstring for which devices are sampled."""
        devices: dict[tuple[str, str | None], dict[int, float]] = {}
        with self._lock:
            for uuid in self.patterns:
                gpu = self._gpus[uuid]
                if gpu.mig_mode is MigMode.OFF:
                    devices[(uuid, None)] = {}
                for instance in gpu.instances:
                    devices[(uuid, instance.uuid)] = {}
        for process, own in self._reports():
            pattern = self.patterns.get(process.gpu_uuid)
            if own is None and pattern is None:
                continue
            device = (process.gpu_uuid, process.mig_uuid)
            devices.setdefault(device, {})[process.pid] = own if own is not None else pattern.at(now)
        return [GpuUtilization(gpu, mig, processes=pids) for (gpu, mig), pids in devices.items()]

    def run_process(self, pid: int, gpu_uuid: str, used_mib: int, *, mig_uuid: str | None = None,
                    sm_percent: float | None = None) -> None:
        """Declare (or change) a process the simulation itself runs on a GPU: it is reported like
        those of `process_dir` until `end_process(pid)`."""
        self._gpu(gpu_uuid)
        self._own[pid] = (GpuProcess(pid=pid, gpu_uuid=gpu_uuid, used_mib=used_mib, mig_uuid=mig_uuid), sm_percent)

    def end_process(self, pid: int) -> None:
        self._own.pop(pid, None)

    def _reports(self) -> list[tuple[GpuProcess, float | None]]:
        """(process, the SM utilisation it states or None) of each process the simulation runs and
        each live one that reported in `process_dir`."""
        processes = list(self._own.values())
        if self.process_dir is None or not self.process_dir.is_dir():
            return processes
        for path in sorted(self.process_dir.glob("*.json")):
            if not path.stem.isdigit():
                continue
            pid = int(path.stem)
            if not _alive(pid):
                path.unlink(missing_ok=True)
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
                process = GpuProcess(pid=pid, gpu_uuid=str(data["gpu_uuid"]), used_mib=int(data["used_mib"]),
                                     mig_uuid=data.get("mig_uuid"))
                own = None if data.get("sm_percent") is None else float(data["sm_percent"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if process.gpu_uuid in self._gpus:
                processes.append((process, own))
        return processes

    def _gpu(self, gpu_uuid: str) -> Gpu:
        gpu = self._gpus.get(gpu_uuid)
        if gpu is None:
            raise DeviceError(f"no GPU {gpu_uuid} in this fleet")
        return gpu

    def _check_mig_changes(self, gpu: Gpu, action: str) -> None:
        if gpu.mig_mode is MigMode.OFF:
            raise DeviceError(f"cannot {action} on GPU {gpu.uuid} ({gpu.model}): MIG mode is off")
        if gpu.mig_mode is MigMode.STATIC or not self._allow_mig_changes:
            raise DevicePermissionError(
                f"cannot {action} on GPU {gpu.uuid}: MIG is static here (its instances are fixed)")


def report_process_memory(process_dir: str | os.PathLike[str], pid: int, gpu_uuid: str, used_mib: int,
                          mig_uuid: str | None = None, sm_percent: float | None = None) -> Path:
    """Record, atomically, that process `pid` holds `used_mib` MiB on a simulated GPU (and, when
    given, keeps `sm_percent` of its SMs busy)."""
    directory = Path(process_dir)
    directory.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"gpu_uuid": gpu_uuid, "used_mib": int(used_mib)}
    if mig_uuid is not None:
        record["mig_uuid"] = mig_uuid
    if sm_percent is not None:
        record["sm_percent"] = float(sm_percent)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{pid}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(record, f)
    target = directory / f"{pid}.json"
    os.replace(tmp, target)
    return target


def _alive(pid: int) -> bool:
    """Whether `pid` is a running process (an exited, unreaped zombie holds no GPU memory)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return not Path("/proc/self").exists()  # no procfs: trust kill(); with one, it just exited
    return stat.rpartition(")")[2].split()[0] != "Z"
