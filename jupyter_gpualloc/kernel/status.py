"""Words for a lease as the kernel shows it: its slice, cap mechanism, memory, idle countdown and time limit.

Pure functions of the lease JSON of REST API v1 and of `now`, shared by the plain-text status and
the ipywidgets view.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from ..core.model import SliceSpec, SpecError
from .extend import deadline_text
from .sizes import MIB_PER_GIB, InputError, format_duration, format_mib


# The MIME types under which a lease's and a job's outputs carry their ids, beside the ipywidget:
# JupyterLab draws them live from the API (labextension/src/components/outputs.tsx).
LEASE_MIME = "application/vnd.jupyter-gpualloc.lease+json"
JOB_MIME = "application/vnd.jupyter-gpualloc.job+json"

def describe_slice(slice_: Mapping[str, Any]) -> str:
    """'MIG 1g.5gb on A100-SXM4-40GB (node0)', 'shared 8 GiB on L4 (node0)', '2 whole L4 (node0)'."""
    where = f" on {slice_['model']}" if slice_.get("model") else ""
    node = f" ({slice_['node']})" if slice_.get("node") else ""
    if slice_["kind"] == "mig":
        return f"MIG {slice_.get('profile')}{where}{node}"
    if slice_["kind"] == "shared":
        return f"shared {format_mib(slice_['memory_mib'])}{where}{node}"
    count = len(slice_.get("gpu_uuids") or ())
    return f"{count} whole GPUs{where}{node}" if count > 1 else f"whole GPU{where}{node}"


def end_text(state: str, reason: str | None) -> str:
    """How a lease ended, without saying it twice: 'released by alice' (not 'released: released by
    alice'), 'expired: idle for 30m', 'preempted'."""
    if not reason:
        return state
    return reason if reason.startswith(f"{state} ") else f"{state}: {reason}"


def describe_request(lease: Mapping[str, Any], article: bool = False) -> str:
    """What a lease asked for, e.g. '3g.40gb slice' or 'whole GPU on L4' ('a 3g.40gb slice', but
    '2 whole GPUs', with `article`)."""
    try:
        return SliceSpec.from_json(lease["spec"]).describe(article)
    except (SpecError, KeyError, TypeError):
        return "a GPU slice" if article else "GPU slice"


def describe_lease(lease: Mapping[str, Any]) -> str:
    """The slice of a granted lease, else what it waits for."""
    return describe_slice(lease["slice"]) if lease.get("slice") else describe_request(lease)


def mig_memory(lease: Mapping[str, Any]) -> str:
    """A granted MIG slice's memory, and, where it is less than the size asked, why: '4.75 GiB of GPU
    memory (a 1g.5gb answers a 5 GiB request: NVIDIA's profile names round up)'."""
    has = lease["slice"]["memory_mib"]
    words = f"{format_mib(has)} of GPU memory"
    asked = (lease.get("spec") or {}).get("memory_gib")
    if asked and asked * MIB_PER_GIB > has:
        words += (f" (a {lease['slice'].get('profile')} answers a {asked:g} GiB request: NVIDIA's profile "
                  f"names round up)")
    return words


def cap_mechanism(slice_: Mapping[str, Any], environ: Mapping[str, str], frameworks: str = "") -> str:
    """How the slice's memory limit is enforced in this kernel, strongest mechanism first."""
    if slice_["kind"] == "mig":
        return "MIG instance: memory and compute isolated by the GPU"
    if slice_["kind"] == "whole":
        return "whole GPU: no cap"
    limit = format_mib(slice_["memory_mib"])
    found = []
    if environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"):
        found.append("MPS pinned-memory limit")
    if "libvgpu" in environ.get("LD_PRELOAD", ""):
        found.append("HAMi-core")
    found.append(f"framework caps: {frameworks}" if frameworks else "framework caps on import")
    return f"shared {limit}: " + "; ".join(found)


def idle_seconds_left(lease: Mapping[str, Any], now: float) -> float | None:
    """Seconds until the idle warning (0 once due), or None when idle release does not apply now."""
    timeout = lease.get("idle_timeout")
    if lease.get("state") != "granted" or not timeout:
        return None
    if "idle_release" in lease:  # the service's own account of it
        release = lease["idle_release"]
        return None if release is None else max(0.0, release["warn_at"] - now)
    last = lease.get("last_activity") or lease.get("granted_at") or now
    return max(0.0, last + timeout - now)


def idle_text(lease: Mapping[str, Any], now: float) -> str | None:
    """The idle countdown of a granted lease: when the warning comes, how long the grace after it
    lasts, and when the slice goes; None when idle release does not apply to it."""
    if lease.get("state") != "granted" or not lease.get("idle_timeout"):
        return None
    release = lease.get("idle_release", False)
    if release is None:
        return "not idle now (a cell runs): the countdown starts when it ends"
    after = format_duration(lease["idle_timeout"])
    if release:
        grace = format_duration(release["grace"])
        if release["warned"]:
            return (f"warned: released in {format_duration(max(0.0, release['release_at'] - now))} unless this "
                    "kernel is used (or extended)")
        return (f"warning in {format_duration(max(0.0, release['warn_at'] - now))}, then released {grace} later "
                f"unless a cell runs (idle release after {after} idle)")
    left = idle_seconds_left(lease, now)
    if lease.get("idle_warned_at"):
        return "warned: the slice is released soon unless this kernel is used (or extended)"
    if left <= 0:
        return f"idle for over {after}: a warning is due"
    return f"warning in {format_duration(left)} (released when idle for {after} plus a grace period)"


def time_limit_text(lease: Mapping[str, Any], now: float) -> str | None:
    """'until 2026-12-03 14:00 UTC (in 3h 59m), 2 extensions left (%gpu extend)', or None without a deadline."""
    deadline = lease.get("deadline")
    if lease.get("state") != "granted" or not deadline:
        return None
    hint = " (%gpu extend)" if deadline["extensions_left"] else ""
    return deadline_text(deadline, now) + hint


def memory_text(used_mib: int | None, slice_: Mapping[str, Any]) -> str:
    """'1.5 GiB of 8 GiB' or 'not measured (no GPU context in this kernel); 8 GiB available'."""
    cap = format_mib(slice_["memory_mib"])
    if used_mib is None:
        return f"not measured (no GPU context in this kernel); {cap} available"
    return f"{format_mib(used_mib)} of {cap}"


def status_lines(lease: Mapping[str, Any] | None, *, now: float, in_effect: bool,
                 environ: Mapping[str, str], frameworks: str = "", used_mib: int | None = None,
                 ended: Mapping[str, Any] | None = None, server: Mapping[str, Any] | None = None,
                 quotas: Sequence[str] = ()) -> list[str]:
    """The plain-text status of this kernel's lease (or of its absence, and then of its server's
    slice), then where the user stands against each usage quota (`quotas`: one sentence each)."""
    return _lease_lines(lease, now=now, in_effect=in_effect, environ=environ, frameworks=frameworks,
                        used_mib=used_mib, ended=ended, server=server) + [f"  usage: {q}" for q in quotas]


def _lease_lines(lease: Mapping[str, Any] | None, *, now: float, in_effect: bool, environ: Mapping[str, str],
                 frameworks: str, used_mib: int | None, ended: Mapping[str, Any] | None,
                 server: Mapping[str, Any] | None) -> list[str]:
    if lease is None:
        lines = []
        if ended is not None:
            how = end_text(ended["state"], ended.get("reason"))
            lines.append(f"gpu: no GPU slice of this kernel's own; lease {ended['id']} {how}"
                         if server else f"gpu: no GPU slice; lease {ended['id']} {how}")
        if server is not None:
            lines.append(f"gpu: this kernel uses its server's {describe_slice(server['slice'])} (lease {server['id']}); "
                         f"%gpu request 10GB asks for a slice of its own")
            limit = time_limit_text(server, now)
            if limit:
                lines.append(f"  time limit: {limit}")
        return lines or ["gpu: this kernel holds no GPU slice (%gpu request 10GB asks for one)"]
    if lease["state"] == "queued":
        position = lease.get("position")
        where = f" at position {position}" if position else ""
        return [f"gpu: queued{where} for {describe_request(lease, article=True)} (lease {lease['id']})",
                "  %gpu release withdraws the request"]
    slice_ = lease["slice"]
    devices = slice_.get("visible_devices") or slice_.get("mig_uuid") or ",".join(slice_["gpu_uuids"])
    effect = "in effect in this kernel" if in_effect else "applies when the kernel restarts"
    lines = [f"gpu: {describe_slice(slice_)}, lease {lease['id']}",
             f"  devices: CUDA_VISIBLE_DEVICES={devices} ({effect})",
             f"  memory cap: {cap_mechanism(slice_, environ, frameworks)}",
             f"  memory used: {memory_text(used_mib, slice_)}"]
    idle = idle_text(lease, now)
    if idle:
        lines.append(f"  idle: {idle}")
    limit = time_limit_text(lease, now)
    if limit:
        lines.append(f"  time limit: {limit}")
    if lease.get("reservation"):
        lines.append(f"  from reservation {lease['reservation']}: it ends with the reservation's window")
    return lines


HOLDER_WIDTH = 48  # fits kernel:<uuid>; wider holders are cut with an ellipsis so the columns stay readable


def clip(text: str, width: int) -> str:
    """`text`, or its first width-1 characters and an ellipsis when it is longer than `width`."""
    return text if len(text) <= width else text[:width - 1] + "\u2026"


def lease_table(leases: list[Mapping[str, Any]], holder: str) -> list[str]:
    """One aligned row per lease: a '*' for `holder`'s, id, holder, state, then the slice."""
    holders = [clip(lease["holder"], HOLDER_WIDTH) for lease in leases]
    id_width = max(len(str(lease["id"])) for lease in leases)
    holder_width = max(len(h) for h in holders)
    state_width = max(len(lease["state"]) for lease in leases)
    rows = []
    for lease, shown in zip(leases, holders):
        mark = "*" if lease["holder"] == holder else " "
        where = f" (position {lease['position']})" if lease.get("position") else ""
        rows.append(f" {mark} {str(lease['id']):<{id_width}}  {shown:<{holder_width}}  "
                    f"{lease['state']:<{state_width}}  {describe_lease(lease)}{where}")
    return rows


def error_line(err: Exception, service_url: str = "") -> str:
    """One line for people about a failed call (InputError or a client error), starting 'gpu: '."""
    from ..client import BadRequest, HolderBusy, NoCapacity, ServiceUnavailable, Unauthorized

    if isinstance(err, NoCapacity):
        return f"gpu: {err.reason} (use --wait to queue)"
    if isinstance(err, HolderBusy):
        return f"gpu: this kernel already holds lease {err.lease_id}: %gpu release it first"
    if isinstance(err, Unauthorized):
        return f"gpu: the gpualloc service refused this kernel's token ({err}): check GPUALLOC_TOKEN"
    if isinstance(err, ServiceUnavailable):
        if not err.status:
            where = f" at {service_url}" if service_url else ""
            return f"gpu: cannot reach the gpualloc service{where}: check that it runs, or set GPUALLOC_URL"
        retry = f" (try again in {err.retry_after:g} s)" if err.retry_after else ""
        return f"gpu: {err}{retry}"
    message = str(err)
    if isinstance(err, BadRequest) and err.field:  # 'spec.profile: must ...' or 'spec.profile must ...'
        message = re.sub(rf"^{re.escape(err.field)}:? ", "", message)
    return f"gpu: {message}"


def is_reported(err: Exception) -> bool:
    """Errors a magic reports in one line: bad input and every answer of the service."""
    if isinstance(err, InputError):
        return True
    from ..client import GpuAllocError

    return isinstance(err, GpuAllocError)


def job_submitted_text(job: Mapping[str, Any]) -> str:
    """Where a job just submitted stands: 'has its slice and is starting' (position 0: its slice is
    granted), 'queued at position 2', or 'queued'."""
    position = job.get("position")
    if position == 0:
        return "has its slice and is starting"
    return f"queued at position {position}" if position else "queued"


def job_state_text(job: Mapping[str, Any], now: float) -> str:
    """'queued (position 2): user quota for alice: ...', 'starting (it has its slice)', 'running for 3m',
    'failed: ZeroDivisionError ...'."""
    state = job["state"]
    if state == "queued":
        position = job.get("position")
        again = f", attempt {job['attempts'] + 1}" if job.get("attempts") else ""
        if position == 0:  # its slice is granted: the job is being started
            return f"starting (it has its slice{again})"
        where = f"position {position}" if position else "waiting for a slice"
        why = f": {job['reason']}" if job.get("reason") else ""
        return f"queued ({where}{again}){why}"
    if state == "running":
        return f"running for {format_duration(now - job['started_at'])}"
    runtime = f" after {format_duration(job['runtime_s'])}" if job.get("runtime_s") is not None else ""
    return f"{state.replace('_', ' ')}{runtime}: {job.get('reason', '')}"
