"""Prometheus metrics: the fleet and queue read from the scheduler at scrape time, plus
histograms and counters fed by the scheduler's events and the service's own timings.

Those fed on every request (gpualloc_decision_seconds, gpualloc_queue_wait_seconds,
gpualloc_events_total) are counted in plain Python (HistogramByLabel, CounterByLabel) and turned
into samples at scrape time: prometheus_client's Histogram walks its bounds and takes a lock per
observation. They are fed and read on the IOLoop thread only (events are announced there, also
those of a group written on the group commit's thread), so they take no lock.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from itertools import accumulate

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from ..core.model import Event, LeaseState, PriorityClass

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
WAIT_BUCKETS = (0.1, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600)
DECISION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class FleetCollector:
    """Gauges computed from the scheduler's inventory and leases whenever /metrics is read."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        inventory = self.scheduler.inventory()
        gpus = GaugeMetricFamily("gpualloc_gpus", "GPUs in the fleet.", labels=["node", "model", "mig_mode", "drained"])
        slices = GaugeMetricFamily(
            "gpualloc_slices",
            "Slices per kind, MIG profile and GPU model: granted now, or free (how many more could be granted now).",
            labels=["kind", "profile", "model", "state"])
        shared_free = GaugeMetricFamily("gpualloc_shared_free_memory_mib",
                                        "GPU memory (MiB) not yet shared out on non-MIG GPUs.", labels=["model"])
        gpu_count: dict[tuple, int] = {}
        counts: dict[tuple, int] = {}
        free_mib: dict[str, int] = {}

        def add(key: tuple, n: int) -> None:
            counts[key] = counts.get(key, 0) + n

        for node in inventory["nodes"]:
            for gpu in node["gpus"]:
                key = (node["name"], gpu["model"], gpu["mig_mode"], str(gpu["drained"]).lower())
                gpu_count[key] = gpu_count.get(key, 0) + 1
                model = gpu["model"]
                if gpu["mig_mode"] != "off":
                    for inst in gpu["instances"]:
                        if inst["lease_id"] is not None:
                            add(("mig", inst["profile"], model, "granted"), 1)
                    for profile, n in gpu["free_profiles"].items():
                        add(("mig", profile, model, "free"), n)
                    continue
                kinds = {share["kind"] for share in gpu["shares"]}
                add(("shared", "", model, "granted"), sum(1 for s in gpu["shares"] if s["kind"] == "shared"))
                add(("whole", "", model, "granted"), 1 if "whole" in kinds else 0)
                add(("whole", "", model, "free"), 1 if gpu["whole_free"] and not gpu["drained"] else 0)
                free_mib[model] = free_mib.get(model, 0) + (0 if gpu["drained"] else gpu["free_memory_mib"])
        for key, n in sorted(gpu_count.items()):
            gpus.add_metric(list(key), n)
        for key, n in sorted(counts.items()):
            slices.add_metric(list(key), n)
        for model, mib in sorted(free_mib.items()):
            shared_free.add_metric([model], mib)

        leases = GaugeMetricFamily("gpualloc_leases", "Active leases by state.", labels=["state"])
        active = self.scheduler.leases()
        for state in (LeaseState.QUEUED, LeaseState.GRANTED):
            leases.add_metric([state.value], sum(1 for l in active if l.state is state))
        queue = GaugeMetricFamily("gpualloc_queue_length", "Waiting requests per priority class.", labels=["priority"])
        for priority in PriorityClass:
            queue.add_metric([priority.value], inventory["queue"][priority.value])
        yield from (gpus, slices, shared_free, leases, queue)


class UsageCollector:
    """gpualloc_gpu_hours_total: GPU-hours accrued by leases (running ones up to the scrape), from
    the core's usage ledger. A lease counts in each of its groups (group "" without one); the user
    label is left out unless `per_user` (the policy's usage_metrics_per_user)."""

    def __init__(self, usage, per_user: bool, clock=time.time):
        self.usage = usage
        self.per_user = per_user
        self.clock = clock

    def collect(self):
        per_user = self.per_user
        labels = ["user", "group", "model", "kind"] if per_user else ["group", "model", "kind"]
        hours = CounterMetricFamily("gpualloc_gpu_hours", "GPU-hours held by leases, weighted by each slice's "
                                    "share of its GPU.", labels=labels)
        totals: dict[tuple, float] = {}
        for (user, group, model, kind), value in self.usage.totals(self.clock()).items():
            key = (user, group, model, kind) if per_user else (group, model, kind)
            totals[key] = totals.get(key, 0.0) + value
        for key, value in sorted(totals.items()):
            hours.add_metric(list(key), value)
        yield hours


class TickCollector:
    """gpualloc_tick_errors_total: the failures of each rule of the scheduler's tick (each undone
    alone, the other rules going on); gpualloc_tick_rules_broken: how many fail now."""

    def __init__(self, scheduler):
        self.scheduler = scheduler

    def collect(self):
        errors = CounterMetricFamily("gpualloc_tick_errors", "Failures of each rule of the scheduler's tick "
                                     "(its part undone, the other rules going on).", labels=["rule"])
        for rule, count in sorted(self.scheduler.tick_failures().items()):
            errors.add_metric([rule], count)
        yield errors
        yield GaugeMetricFamily("gpualloc_tick_rules_broken", "Rules of the scheduler's tick failing now "
                                "(the service log says why; GET /health lists them).",
                                value=len(self.scheduler.broken_rules()))


class EventStreamCollector:
    """The event streams' fan-out, read from the broker (service/events.py) at scrape time: open
    streams, messages serialised (once per event and view) and messages sent (once per stream)."""

    def __init__(self, broker):
        self.broker = broker

    def collect(self):
        yield GaugeMetricFamily("gpualloc_event_streams", "Event streams (GET /events) open.",
                                value=len(self.broker.streams))
        yield CounterMetricFamily("gpualloc_event_messages_serialised", "Event stream messages serialised: once "
                                  "per event and view (whole, or a fleet event without lease ids).",
                                  value=self.broker.serialised)
        yield CounterMetricFamily("gpualloc_event_messages_sent", "Event stream messages queued to streams: "
                                  "once per event and stream that may see it.", value=self.broker.sent)


class HistogramCounts:
    """One label value's observations: how many fell in each bucket (the first whose bound is >=
    the value; the last bucket is past every bound, +Inf) and their sum."""

    __slots__ = ("bounds", "in_bucket", "sum")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.in_bucket = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.in_bucket[bisect_left(self.bounds, value)] += 1
        self.sum += value


class HistogramByLabel:
    """A histogram over one label, a collector that renders it as prometheus_client's Histogram does
    (cumulative buckets up to +Inf, _count and _sum; no _created)."""

    def __init__(self, name: str, documentation: str, label: str, bounds: tuple[float, ...]):
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = tuple(float(bound) for bound in bounds)
        self._le = [floatToGoString(bound) for bound in self.bounds] + ["+Inf"]
        self.by_value: dict[str, HistogramCounts] = {}

    def labels(self, value: str) -> HistogramCounts:
        counts = self.by_value.get(value)
        if counts is None:
            counts = self.by_value[value] = HistogramCounts(self.bounds)
        return counts

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, counts in self.by_value.items():
            family.add_metric([value], list(zip(self._le, accumulate(counts.in_bucket))), counts.sum)
        yield family


class CounterByLabel:
    """A counter over one label, `counts` (label value -> count), a collector that renders it as
    prometheus_client's Counter does (<name>_total; no _created)."""

    def __init__(self, name: str, documentation: str, label: str):
        self.name, self.documentation, self.label = name, documentation, label
        self.counts: dict[str, int] = {}

    def collect(self):
        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, count in self.counts.items():
            family.add_metric([value], count)
        yield family


class ServiceMetrics:
    """The service's metrics, in a registry of its own (several services may share a process in tests)."""

    def __init__(self, scheduler, usage=None, usage_per_user: bool = True, broker=None):
        """Over the scheduler, (for gpualloc_gpu_hours) its usage ledger, per user if `usage_per_user`,
        and (for the event streams' figures) the event broker."""
        self.scheduler = scheduler
        self.registry = CollectorRegistry()
        self.registry.register(FleetCollector(scheduler))
        self.registry.register(TickCollector(scheduler))
        if broker is not None:
            self.registry.register(EventStreamCollector(broker))
        if usage is not None:
            self.registry.register(UsageCollector(usage, usage_per_user))
        self.queue_wait = HistogramByLabel("gpualloc_queue_wait_seconds", "Seconds from request to grant.",
                                           "priority", WAIT_BUCKETS)
        self.registry.register(self.queue_wait)
        self.decision_latency = HistogramByLabel("gpualloc_decision_seconds",
                                                 "Seconds the scheduler core took per call, by operation.",
                                                 "operation", DECISION_BUCKETS)
        self.registry.register(self.decision_latency)
        self.expirations = Counter("gpualloc_lease_expirations",
                                   "Leases ended by the scheduler (idle or no heartbeat).",
                                   registry=self.registry)
        self.preemptions = Counter("gpualloc_lease_preemptions", "Batch leases preempted for interactive requests.",
                                   registry=self.registry)
        self.events = CounterByLabel("gpualloc_events", "Scheduler events by type.", "type")
        self.registry.register(self.events)
        self.jobs = Counter("gpualloc_jobs", "Job state changes (queued, started, succeeded, failed, preempted, ...) "
                            "by priority class.", ["event", "priority"], registry=self.registry)
        self.cluster_stale = Gauge("gpualloc_cluster_stale_seconds",
                                   "Seconds the Kubernetes view has been stale (the API server unreachable); 0 when current.",
                                   registry=self.registry)
        self.job_wait = Histogram("gpualloc_job_queue_wait_seconds",
                                  "Seconds from a job's submission to the start of each of its attempts.",
                                  ["priority"], buckets=WAIT_BUCKETS, registry=self.registry)

    def observe(self, event: Event) -> None:
        """Feed one scheduler event into the histograms and counters."""
        event_counts = self.events.counts
        event_counts[event.type] = event_counts.get(event.type, 0) + 1
        if event.type == "lease.granted":
            priority = self.scheduler.lease(event.lease_id).priority.value
            self.queue_wait.labels(priority).observe(max(0.0, float(event.data.get("waited_s", 0.0))))
        elif event.type == "lease.expired":
            self.expirations.inc()
        elif event.type == "lease.preempted":
            self.preemptions.inc()
        elif event.type.startswith("job."):
            priority = event.data.get("priority", "batch")
            self.jobs.labels(event.type[len("job."):], priority).inc()
            if event.type == "job.started":
                self.job_wait.labels(priority).observe(max(0.0, float(event.data.get("waited_s", 0.0))))

    def timed(self, operation: str) -> "_Timed":
        """`with metrics.timed("touch"): ...` observes the block's duration in gpualloc_decision_seconds."""
        return _Timed(self.decision_latency.labels(operation))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Timed:
    """The timing of one block, observed when it ends (also when it raises): a plain class, as a
    generator-based context manager costs several times more on every touch and heartbeat."""

    __slots__ = ("histogram", "start")

    def __init__(self, histogram: HistogramCounts):
        self.histogram = histogram

    def __enter__(self) -> None:
        self.start = time.perf_counter()

    def __exit__(self, *exc_info) -> None:
        self.histogram.observe(time.perf_counter() - self.start)
