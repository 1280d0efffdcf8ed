"""The core's vocabulary: GPUs, MIG profiles, slice specs, slices, leases, jobs and events.

Plain dataclasses and enums, shared by every other module. Sizes are MiB and milli-cores;
times are float seconds passed in by the caller (never read from the wall here).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, Mapping

from .holders import GRAMMAR, is_holder, job_holder

MIB_PER_GIB = 1024
MILLI_PER_GPU = 1000
NAME_MAX_LENGTH = 255  # user, holder, model and node names: the store's String(255) columns
PROFILE_PATTERN = r"[0-9]+g\.[0-9]+gb(\+me)?"
# The largest values a spec may ask for: far above any machine, far below float and int overflow.
SPEC_LIMITS = {"memory_gib": 2 ** 20, "memory_mib": 2 ** 30, "count": 1024,
               "cpu_milli": 10 ** 9, "host_memory_mib": 2 ** 40}
# The times a request may name, in epoch seconds: 1970-01-01 to 9999-12-31T23:59:59Z, the last a
# date can show. A typo (-1e11) or milliseconds (Date.now()) is refused, never stored.
MIN_EPOCH, MAX_EPOCH = 0, 253402300799
# Characters no name may hold: C0/C1 controls, invisible format marks (zero-width, bidi controls
# and isolates, BOM) and, in Python strings only, lone UTF-16 surrogates, which no store can encode.
UNPRINTABLE = r"\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff"
_UNSTORABLE = re.compile(f"[{UNPRINTABLE}\ud800-\udfff]")


class SliceKind(str, Enum):
    """What kind of slice a holder gets (or `any` in a request)."""

    MIG = "mig"
    SHARED = "shared"
    WHOLE = "whole"
    ANY = "any"


class MigMode(str, Enum):
    """How a GPU is partitioned: not at all, fixed MIG instances, or instances made on demand."""

    OFF = "off"
    STATIC = "static"
    DYNAMIC = "dynamic"


class PriorityClass(str, Enum):
    """Interactive requests are served before batch ones; batch leases may be preempted."""

    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        return 0 if self is PriorityClass.INTERACTIVE else 1


class LeaseState(str, Enum):
    QUEUED = "queued"
    GRANTED = "granted"
    RELEASED = "released"
    EXPIRED = "expired"
    PREEMPTED = "preempted"
    REJECTED = "rejected"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        return self in (LeaseState.QUEUED, LeaseState.GRANTED)


class SpecError(ValueError):
    """A request that cannot be understood; `field` names the offending part."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile of one GPU model, e.g. 3g.40gb on an A100-80GB."""

    profile_id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    max_instances: int
    starts: tuple[int, ...]
    sms: int = 0
    media_extensions: bool = False


@dataclass
class MigInstance:
    """An existing MIG GPU instance (with its compute instance) on a GPU."""

    uuid: str
    profile_id: int
    start: int
    size: int
    gi_id: int = -1
    ci_id: int = -1

    def slices(self) -> range:
        return range(self.start, self.start + self.size)


@dataclass
class Gpu:
    """One physical device as a backend reports it."""

    uuid: str
    index: int
    model: str
    memory_mib: int
    node: str
    mig_capable: bool = False
    mig_mode: MigMode = MigMode.OFF
    instances: list[MigInstance] = field(default_factory=list)
    # Which plain slices it may carry: "any"; "whole" (a Kubernetes GPU without sharing: the device
    # plugin gives it to one pod); "shared" (time-sliced or MPS replicas: pods get replicas, never all of it).
    sharing: str = "any"


@dataclass
class Node:
    """A machine: its CPU (milli-cores), host memory (MiB) and GPUs. `unschedulable` says why
    nothing new may be placed on it (a cordoned or not-Ready Kubernetes node), else None."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu] = field(default_factory=list)
    unschedulable: str | None = None


@dataclass(frozen=True)
class OutsideUse:
    """What one outside holder (a workload the allocator did not place, named by a key that is never
    a lease id) takes on a node: whole GPUs, shares (milli of one GPU each, as time-sliced
    replicas are) and MIG devices by profile name; `devices`, the GPU and MIG UUIDs it holds where
    they are known (a DRA claim names its devices), which it takes before any other."""

    key: str
    node: str
    whole: int = 0
    shares: tuple[int, ...] = ()
    mig: Mapping[str, int] = field(default_factory=dict)
    devices: tuple[str, ...] = ()

    def is_empty(self) -> bool:
        return not (self.whole or self.shares or any(self.mig.values()))


_PARSED_SPECS: dict[tuple, "SliceSpec"] = {}  # SliceSpec.from_json's answers, by the spec object's items


@dataclass(frozen=True)
class SliceSpec:
    """What was asked for. `memory_mib` is the minimum GPU memory per GPU."""

    kind: SliceKind = SliceKind.ANY
    memory_mib: int = 0
    profile: str | None = None
    model: str | None = None
    count: int = 1
    node: str | None = None
    cpu_milli: int = 0
    host_memory_mib: int = 0

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        """The fields' hash, worked out once: specs are dict keys on every request's path."""
        return hash((self.kind, self.memory_mib, self.profile, self.model, self.count, self.node,
                     self.cpu_milli, self.host_memory_mib))

    @classmethod
    def from_json(cls, data: Any) -> "SliceSpec":
        """Parse the REST API's spec object strictly; raise SpecError naming the field. The same
        object (each value of the same type) gives the same spec object: a dict lookup finds it
        at once, and the many requests of one shape parse once."""
        if not isinstance(data, dict):
            raise SpecError("spec", "must be an object")
        key = tuple((name, value.__class__, value) for name, value in data.items())
        try:
            spec = _PARSED_SPECS.get(key)
        except TypeError:  # a value no dict can key (a list, an object): never a valid spec
            return cls._parse(data)
        if spec is None:
            spec = cls._parse(data)
            if len(_PARSED_SPECS) >= 4096:  # requests of many odd shapes: start over
                _PARSED_SPECS.clear()
            _PARSED_SPECS[key] = spec
        return spec

    @classmethod
    def _parse(cls, data: dict) -> "SliceSpec":
        known = {"kind", "memory_gib", "memory_mib", "profile", "model", "count", "node",
                 "cpu_milli", "host_memory_mib"}
        for key in data:
            if key not in known:
                raise SpecError(f"spec.{key}", "unknown field")
        kind_raw = data.get("kind", "any" if "profile" not in data else "mig")
        try:
            kind = SliceKind(kind_raw)
        except ValueError:
            raise SpecError("spec.kind", "must be one of mig, shared, whole, any") from None
        memory_mib = 0
        if "memory_gib" in data and "memory_mib" in data:
            raise SpecError("spec.memory_gib", "give memory_gib or memory_mib, not both")
        if "memory_gib" in data:
            gib = data["memory_gib"]
            if isinstance(gib, bool) or not isinstance(gib, (int, float)) or not math.isfinite(gib) \
                    or not 0 < gib <= SPEC_LIMITS["memory_gib"]:
                raise SpecError("spec.memory_gib", f"must be a number above 0, at most {SPEC_LIMITS['memory_gib']}")
            memory_mib = math.ceil(gib * MIB_PER_GIB)
        if "memory_mib" in data:
            memory_mib = _bounded_int(data["memory_mib"], "spec.memory_mib", 1)
        profile = _optional_name(data.get("profile"), "spec.profile")
        if profile is not None and not re.fullmatch(PROFILE_PATTERN, profile):
            raise SpecError("spec.profile", "must look like 1g.10gb or 3g.40gb")
        if profile is not None and kind not in (SliceKind.MIG, SliceKind.ANY):
            raise SpecError("spec.profile", "only a mig slice has a profile")
        count = _bounded_int(data.get("count", 1), "spec.count", 1)
        if count > 1 and kind not in (SliceKind.WHOLE, SliceKind.ANY):
            raise SpecError("spec.count", "only whole GPUs come in counts above 1")
        if kind is SliceKind.SHARED and memory_mib == 0:
            raise SpecError("spec.memory_gib", "a shared slice needs its memory size")
        if count > 1:
            kind = SliceKind.WHOLE
        return cls(
            kind=kind,
            memory_mib=memory_mib,
            profile=profile,
            model=_optional_name(data.get("model"), "spec.model"),
            count=count,
            node=_optional_name(data.get("node"), "spec.node"),
            cpu_milli=_bounded_int(data.get("cpu_milli", 0), "spec.cpu_milli", 0),
            host_memory_mib=_bounded_int(data.get("host_memory_mib", 0), "spec.host_memory_mib", 0),
        )

    def to_json(self) -> dict[str, Any]:
        """The spec as the API gives it (a new dict: worked out once per spec, copied each time)."""
        return dict(self._json)

    @cached_property
    def _json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind.value, "count": self.count}
        if self.memory_mib:
            out["memory_gib"] = self.memory_mib / MIB_PER_GIB  # exact: n / 2**10
        for name in ("profile", "model", "node"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.cpu_milli:
            out["cpu_milli"] = self.cpu_milli
        if self.host_memory_mib:
            out["host_memory_mib"] = self.host_memory_mib
        return out

    def describe(self, article: bool = False) -> str:
        """A few words for people: '3g.40gb slice', 'shared 8 GiB slice', '2 whole GPUs'; with
        `article`, 'a 3g.40gb slice' but still '2 whole GPUs'."""
        words = self._words()
        return f"a {words}" if article and not (self.kind is SliceKind.WHOLE and self.count > 1) else words

    def _words(self) -> str:
        model = f" on {self.model}" if self.model else ""
        if self.profile:
            return f"{self.profile} slice{model}"
        gib = f"{self.memory_mib / MIB_PER_GIB:g} GiB"
        if self.kind is SliceKind.WHOLE:
            n = f"{self.count} whole GPUs" if self.count > 1 else "whole GPU"
            return n + model
        if self.kind is SliceKind.SHARED:
            return f"shared {gib} slice{model}"
        return f"{gib} GPU slice{model}" if self.memory_mib else f"GPU slice{model}"


@dataclass
class Slice:
    """What a holder got: a MIG instance, a memory-capped share, or whole GPUs."""

    kind: SliceKind
    node: str
    gpu_uuids: tuple[str, ...]
    memory_mib: int
    profile: str | None = None
    start: int | None = None
    mig_uuid: str | None = None
    milli: int = MILLI_PER_GPU
    model: str = ""
    gpu_memory_mib: int = 0  # the memory of each GPU it is on (a share's cap is memory_mib of it)

    @property
    def visible_devices(self) -> str:
        """The value for CUDA_VISIBLE_DEVICES."""
        return self.mig_uuid if self.mig_uuid else ",".join(self.gpu_uuids)

    def to_json(self) -> dict[str, Any]:
        """The fields that are set, in declaration order, and visible_devices (no dataclasses.asdict:
        it deep-copies every field, and this runs for every lease in every answer)."""
        out: dict[str, Any] = {"kind": self.kind.value, "node": self.node, "gpu_uuids": list(self.gpu_uuids),
                               "memory_mib": self.memory_mib}
        if self.profile is not None:
            out["profile"] = self.profile
        if self.start is not None:
            out["start"] = self.start
        if self.mig_uuid is not None:
            out["mig_uuid"] = self.mig_uuid
        out["milli"] = self.milli
        out["model"] = self.model
        out["gpu_memory_mib"] = self.gpu_memory_mib
        out["visible_devices"] = self.visible_devices
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Slice":
        fields = {k: v for k, v in data.items() if k != "visible_devices"}
        fields["kind"] = SliceKind(fields["kind"])
        fields["gpu_uuids"] = tuple(fields["gpu_uuids"])
        return cls(**fields)


@dataclass
class Lease:
    """A holder's claim on a slice, from request to its end."""

    id: str
    user: str
    holder: str
    spec: SliceSpec
    priority: PriorityClass
    state: LeaseState
    created_at: float
    seq: int
    groups: tuple[str, ...] = ()
    preemptible: bool = False
    slice: Slice | None = None
    granted_at: float | None = None
    ended_at: float | None = None
    last_activity: float | None = None
    heartbeat_at: float | None = None
    busy: bool = False
    idle_warned_at: float | None = None
    idle_timeout: float | None = None
    reason: str = ""
    returning: bool = False  # ended, its slice still held until its holder is gone

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "user": self.user,
            "holder": self.holder,
            "groups": list(self.groups),
            "spec": self.spec.to_json(),
            "priority": self.priority.value,
            "preemptible": self.preemptible,
            "state": self.state.value,
            "slice": self.slice.to_json() if self.slice else None,
            "created_at": self.created_at,
            "granted_at": self.granted_at,
            "ended_at": self.ended_at,
            "last_activity": self.last_activity,
            "heartbeat_at": self.heartbeat_at,
            "busy": self.busy,
            "idle_warned_at": self.idle_warned_at,
            "idle_timeout": self.idle_timeout,
            "reason": self.reason,
            "returning": self.returning,
        }


class JobState(str, Enum):
    """A job's life: queued -> running -> succeeded | failed | cancelled | timed_out (preempted: back to queued)."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"

    @property
    def active(self) -> bool:
        return self in (JobState.QUEUED, JobState.RUNNING)


@dataclass
class Job:
    """A cell or notebook run in the background; it holds one `job:<id>` lease per attempt.

    `source` is {"kind": "cell", "code", "inputs", "outputs", "inputs_file"} or
    {"kind": "notebook", "path", "parameters"}; paths are relative to `workdir`. `runner` is the
    owner's server that submitted it and alone runs it ('server', or 'server:<name>' for a named one),
    or 'pod': each attempt is a Kubernetes Job the service makes from `pod` (the submitting server's
    pod as it was at submit, so the job runs while that server is stopped), whose runner calls with
    the token whose SHA-256 is `token_sha256`. `waiting_for_runner`: its server stopped (or stopped
    heartbeating it), so nothing could run it: it holds no lease until that server's runner is back.
    """

    id: str
    user: str
    name: str
    spec: SliceSpec
    priority: PriorityClass
    preemptible: bool
    source: dict[str, Any]
    workdir: str
    kernel_name: str
    state: JobState
    created_at: float
    groups: tuple[str, ...] = ()
    timeout: float | None = None
    retries: int = 0
    attempts: int = 0
    preemptions: int = 0
    lease_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    reason: str = ""
    rerun_of: str | None = None
    runner: str = "server"
    pod: dict[str, Any] | None = None
    token_sha256: str = ""
    waiting_for_runner: bool = False

    @property
    def holder(self) -> str:
        return job_holder(self.id)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "user": self.user, "name": self.name, "spec": self.spec.to_json(),
            "priority": self.priority.value, "preemptible": self.preemptible, "source": dict(self.source),
            "workdir": self.workdir, "kernel_name": self.kernel_name, "state": self.state.value,
            "created_at": self.created_at, "groups": list(self.groups), "timeout": self.timeout,
            "retries": self.retries, "attempts": self.attempts, "preemptions": self.preemptions,
            "lease_id": self.lease_id, "started_at": self.started_at, "ended_at": self.ended_at,
            "reason": self.reason, "rerun_of": self.rerun_of, "runner": self.runner, "pod": self.pod,
            "token_sha256": self.token_sha256, "waiting_for_runner": self.waiting_for_runner,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Job":
        fields = dict(data)
        fields["spec"] = SliceSpec.from_json(fields["spec"])
        fields["priority"] = PriorityClass(fields["priority"])
        fields["state"] = JobState(fields["state"])
        fields["groups"] = tuple(fields["groups"])
        return cls(**fields)


@dataclass(frozen=True)
class Event:
    """A state change, announced after it is stored."""

    type: str
    time: float
    lease_id: str | None = None
    user: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "time": self.time, "lease_id": self.lease_id,
                "user": self.user, "data": self.data}


def check_name(value: Any, field_name: str, max_length: int = NAME_MAX_LENGTH) -> str:
    """A user, holder, model or node name the store can keep and people can read; else SpecError."""
    if not isinstance(value, str) or not value:
        raise SpecError(field_name, "must be a non-empty string")
    if len(value) > max_length:
        raise SpecError(field_name, f"must be at most {max_length} characters")
    if _UNSTORABLE.search(value):
        raise SpecError(field_name, "must not hold control, invisible formatting or lone surrogate characters")
    if value != value.strip():
        raise SpecError(field_name, "must not start or end with whitespace")
    return value


def check_holder(holder: str) -> None:
    """SpecError unless `holder` is a name that follows the holder grammar (holders.py)."""
    check_name(holder, "holder")
    if not is_holder(holder):
        raise SpecError("holder", f"must be {GRAMMAR}")


def _bounded_int(value: Any, name: str, minimum: int) -> int:
    """An integer (2.0 counts as 2) from `minimum` to the field's limit in SPEC_LIMITS."""
    limit = SPEC_LIMITS[name.removeprefix("spec.")]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= limit:
        raise SpecError(name, f"must be an integer from {minimum} to {limit}")
    return value


def _optional_name(value: Any, name: str) -> str | None:
    return None if value is None else check_name(value, name)
