"""The administrator's policy: what is offered, quotas, timeouts, queueing and placement rules."""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Dict, Float, Int, List, Unicode, validate
from traitlets.config import Configurable

QUOTA_KEYS = ("slices", "memory_gib", "whole_gpus")


class SchedulerPolicy(Configurable):
    """Rules the scheduler core applies; set as `c.SchedulerPolicy.<name>` in gpualloc_config.py."""

    placement = Unicode(
        "default",
        help="""Placement policy for shared slices and whole GPUs: default (fragmentation-aware),
        fgd, bestfit, binpack, spread, packing, clustering, dotprod or random.""",
    ).tag(config=True)

    mig_placement = Unicode(
        "default",
        help="How a MIG instance's GPU and start are chosen: default (where its GPU loses the least "
             "expected future compute) or firstfit (first GPU, lowest legal start).",
    ).tag(config=True)

    mig_changes = Unicode(
        "dynamic",
        help="""dynamic: the scheduler creates and destroys MIG instances as leases come and go
        (needs the privilege to change MIG layouts); static: only instances that already exist
        are handed out, whatever the fleet says.""",
    ).tag(config=True)

    idle_timeout = Float(
        1800.0,
        help="Seconds a kernel's lease may stay idle before it is warned (0 disables idle release).",
    ).tag(config=True)

    idle_grace = Float(
        300.0,
        help="Seconds between the idle warning and the release of the slice.",
    ).tag(config=True)

    server_idle_timeout = Float(
        0.0,
        help="""Seconds a server's lease may stay idle before it is warned; 0 leaves idle servers
        to JupyterHub's own idle culler.""",
    ).tag(config=True)

    release_busy = Bool(
        False,
        help="Whether a lease whose holder reports it is busy (a cell running) may still be released as idle.",
    ).tag(config=True)

    heartbeat_ttl = Float(
        120.0,
        help="Seconds without a heartbeat after which a holder is presumed dead and its lease ends.",
    ).tag(config=True)

    wait_for_holders = Bool(
        True,
        help="""Whether an ended lease's slice waits for its holder to be gone before anyone else
        gets it: a lease that is released (unless the caller says its holder is gone), idle,
        preempted, over its usage quota or past its deadline keeps its slice out of the pool
        ("returning") until the holder is reported gone (the server stopped, the kernel's or
        job's process ended) or its heartbeats stop for `heartbeat_ttl`: a slice is never handed
        on while its holder may still use it. False frees it at once, as a simulation of the
        queue does (docs/architecture.md).""",
    ).tag(config=True)

    reserve_after = Float(
        600.0,
        help="""Seconds a queued request may wait before capacity is reserved for it: later,
        smaller requests are then no longer backfilled onto the GPUs it is waiting for.""",
    ).tag(config=True)

    fair_share = Bool(
        True,
        help="Order waiting requests of one priority class by their user's current GPU memory use (then by age), instead of pure FIFO.",
    ).tag(config=True)

    preemption = Bool(
        True,
        help="Whether a waiting interactive request may preempt preemptible batch leases.",
    ).tag(config=True)

    batch_preemptible = Bool(
        True,
        help="Whether batch leases (jobs, batch requests) are preemptible.",
    ).tag(config=True)

    allow_non_preemptible = Bool(
        False,
        help="""Whether a batch request may ask not to be preempted ("preemptible": false,
        `%%gpu job --no-preemptible`). Off, such a request is refused: the policy decides, and a
        request may only make itself preemptible.""",
    ).tag(config=True)

    preempt_grace = Float(
        60.0,
        help="""Seconds a preempted job gets between SIGINT and SIGTERM (time to checkpoint), and again
        between SIGTERM and SIGKILL.""",
    ).tag(config=True)

    requeue_interrupted = Bool(
        True,
        help="""What happens to a running job whose runner died (server restart, crash, lost
        heartbeat): requeued to run again (True) or failed (False).""",
    ).tag(config=True)

    max_job_retries = Int(
        10,
        help="The most retries a job may ask for (`%%gpu job --retries N`); a request for more is refused.",
    ).tag(config=True)

    interactive_jobs = Bool(
        False,
        help="Whether a job may ask for the interactive priority class (by default jobs are batch).",
    ).tag(config=True)

    quotas = Dict(
        help="""Per-user limits, e.g. {"alice": {"slices": 2, "memory_gib": 40, "whole_gpus": 1},
        "*": {"slices": 4}}; "*" applies to users without an entry. Missing keys are unlimited.""",
    ).tag(config=True)

    group_quotas = Dict(
        help="""Per-group limits over all the group's members together, same keys as quotas,
        e.g. {"students": {"memory_gib": 80}}.""",
    ).tag(config=True)

    offers = List(
        help="""Slice choices offered to users (spawner form, %gpu offers, sidebar). Each is
        {"name": "mig-1g.10gb", "label": "MIG 1g.10gb", "spec": {...REST spec...},
        "idle_timeout": seconds (optional; 0: never idle-released), "max_duration": seconds
        (optional; 0: no time limit), "groups": [...] (optional: only these groups)}. A lease on
        an offer (one that names it, or whose spec is its spec) gets the offer's idle timeout and
        time limit, else the policy's for its holder kind; a request may only ask for a shorter
        idle timeout. Empty: offers are derived from the fleet (each MIG profile, shares and whole
        GPUs per model).""",
    ).tag(config=True)

    shared_offer_gib = List(
        [8, 16],
        help="Sizes (GiB) of the shared slices offered on each non-MIG GPU model when offers are derived from the fleet.",
    ).tag(config=True)

    usage_quotas = Dict(
        help="""GPU-hours over a time window, e.g. {"*": {"gpu_hours": 40, "window": "7d"},
        "students": {"gpu_hours": 200, "window": "calendar_week", "per": "group"}}. Windows are
        rolling ("24h", "7d", "2w") or calendar periods in UTC ("calendar_day", "calendar_week"
        from Monday 00:00, "calendar_month"). An entry per "user" (the default) is keyed by user
        name, "*" covering users without one; an entry per "group" limits the group's members
        together. A request is refused once a quota is used up.""",
    ).tag(config=True)

    usage_enforcement = Unicode(
        "warn",
        help="""What happens to a running lease when a usage quota it counts against is used up:
        warn (an event, the lease keeps its slice) or release (released like an idle lease).""",
    ).tag(config=True)

    usage_warn_fraction = Float(
        0.9,
        help="Fraction of a usage quota at which running leases are warned (usage.warning event).",
    ).tag(config=True)

    usage_release_jobs = Bool(
        False,
        help="""Whether usage_enforcement = "release" also releases jobs' leases; by default a job
        finishes its current attempt.""",
    ).tag(config=True)

    usage_metrics_per_user = Bool(
        True,
        help="""Whether the gpualloc_gpu_hours_total metric has a user label (turn off on large
        hubs to keep the number of series small).""",
    ).tag(config=True)

    idle_signal = Unicode(
        "activity",
        help="""What makes a lease idle: activity (its holder's reported activity), gpu (its GPU's
        utilisation stayed under gpu_idle_threshold for the idle timeout, even while a kernel is
        busy on CPU work) or both (idle only when both say so). Leases without GPU utilisation
        samples are judged by activity.""",
    ).tag(config=True)

    gpu_idle_threshold = Float(
        5.0,
        help="SM utilisation (percent) under which a lease's GPU counts as idle.",
    ).tag(config=True)

    max_duration = Dict(
        help="""Seconds a granted lease may last, per holder kind, e.g. {"server": 14400,
        "kernel": 14400}; kinds left out (and 0) are unlimited. An offer's own "max_duration"
        wins. Past its deadline a lease is released like an idle one.""",
    ).tag(config=True)

    deadline_warning = Float(
        900.0,
        help="Seconds before a lease's deadline at which its holder is warned (lease.deadline_warning event).",
    ).tag(config=True)

    max_extensions = Int(
        0,
        help="How many times a time-boxed lease may be extended (%gpu extend, POST /leases/<id>/extend).",
    ).tag(config=True)

    extension = Float(
        3600.0,
        help="Seconds one extension adds, counted from the deadline (or from now, if that is later).",
    ).tag(config=True)

    extend_while_others_wait = Bool(
        False,
        help="Whether a lease may be extended while other requests wait in the queue.",
    ).tag(config=True)

    @validate("mig_changes")
    def _check_mig_changes(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in ("dynamic", "static"):
            raise ValueError("mig_changes must be 'dynamic' or 'static'")
        return proposal["value"]

    @validate("offers")
    def _check_offers(self, proposal: dict[str, Any]) -> list:
        from .offers import Offer
        names = [Offer.from_config(entry, f"offers[{i}]").name for i, entry in enumerate(proposal["value"])]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"offers: the name {repeated[0]!r} is used more than once")
        return proposal["value"]

    @validate("usage_quotas")
    def _check_usage_quotas(self, proposal: dict[str, Any]) -> dict:
        from .usage import parse_quota
        for who, entry in proposal["value"].items():
            parse_quota(who, entry)
        return proposal["value"]

    @validate("max_duration")
    def _check_max_duration(self, proposal: dict[str, Any]) -> dict:
        for kind, seconds in proposal["value"].items():
            if kind not in ("server", "kernel", "job"):
                raise ValueError(f"max_duration: unknown holder kind {kind!r} (use server, kernel, job)")
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0:
                raise ValueError(f"max_duration for {kind}: must be a non-negative number of seconds")
        return proposal["value"]

    @validate("idle_signal")
    def _check_idle_signal(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in ("activity", "gpu", "both"):
            raise ValueError("idle_signal must be 'activity', 'gpu' or 'both'")
        return proposal["value"]

    @validate("usage_enforcement")
    def _check_usage_enforcement(self, proposal: dict[str, Any]) -> str:
        if proposal["value"] not in ("warn", "release"):
            raise ValueError("usage_enforcement must be 'warn' or 'release'")
        return proposal["value"]

    @validate("quotas", "group_quotas")
    def _check_quotas(self, proposal: dict[str, Any]) -> dict:
        for who, limits in proposal["value"].items():
            if not isinstance(limits, dict):
                raise ValueError(f"quota for {who!r} must be a dict")
            for key, value in limits.items():
                if key not in QUOTA_KEYS:
                    raise ValueError(f"quota for {who!r}: unknown key {key!r} (use {', '.join(QUOTA_KEYS)})")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ValueError(f"quota for {who!r}: {key} must be a non-negative number")
        return proposal["value"]

    def user_quota(self, user: str) -> dict[str, float]:
        quotas = self.quotas
        return dict(quotas.get(user, quotas.get("*", {})))
