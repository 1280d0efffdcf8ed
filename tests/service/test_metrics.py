"""The hot path's metrics: the service's own timings in gpualloc_decision_seconds, the grants' waits
in gpualloc_queue_wait_seconds and gpualloc_events_total, as /metrics renders them."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.model import Event, SliceSpec
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.core.wiring import open_core
from jupyter_gpualloc.service.metrics import ServiceMetrics

L4_NODE = {"nodes": [{"name": "n0", "cpu_milli": 8000, "memory_mib": 32768, "gpus": [{"model": "L4", "count": 1}]}]}


def count_and_sum(metrics: ServiceMetrics, operation: str) -> tuple[float, float]:
    samples = {(s.name, s.labels.get("operation")): s.value for m in metrics.decision_latency.collect()
               for s in m.samples}
    return (samples.get(("gpualloc_decision_seconds_count", operation), 0.0),
            samples.get(("gpualloc_decision_seconds_sum", operation), 0.0))


@pytest.fixture
def core(tmp_path):
    core = open_core(SimulatedBackend(L4_NODE), Store(sqlite_url(tmp_path / "db.sqlite")), SchedulerPolicy(), now=0.0)
    yield core
    core.close()


def rendered(metrics: ServiceMetrics, prefix: str) -> dict[str, str]:
    """The sample lines of /metrics whose name starts with `prefix`: series (name and labels) -> value."""
    lines = metrics.render().decode().splitlines()
    return dict(line.rsplit(" ", 1) for line in lines if line.startswith(prefix))


def test_each_timed_block_is_observed_once_under_its_operation_even_when_it_raises():
    metrics = ServiceMetrics(scheduler=None)  # the scheduler is read only at scrape time
    with metrics.timed("touch"):
        pass
    with pytest.raises(KeyError), metrics.timed("touch"):
        raise KeyError("no lease")
    with metrics.timed("heartbeat"):
        sum(range(10_000))
    assert count_and_sum(metrics, "touch")[0] == 2
    count, seconds = count_and_sum(metrics, "heartbeat")
    assert count == 1 and 0 < seconds < 1
    assert count_and_sum(metrics, "release") == (0.0, 0.0)


def test_an_observation_counts_in_the_first_bucket_whose_bound_it_does_not_exceed_and_in_every_one_after(core):
    metrics = ServiceMetrics(core.scheduler)
    for seconds in (0.001, 0.0002, 2.5, 0.3):  # on a bound, under the first, past the last finite one
        metrics.decision_latency.labels("submit").observe(seconds)
    metrics.decision_latency.labels("release").observe(0.01)
    decisions = rendered(metrics, "gpualloc_decision_seconds")
    submit = {le: decisions[f'gpualloc_decision_seconds_bucket{{le="{le}",operation="submit"}}']
              for le in ("0.0005", "0.001", "0.0025", "0.25", "0.5", "1.0", "+Inf")}
    assert submit == {"0.0005": "1.0", "0.001": "2.0", "0.0025": "2.0", "0.25": "2.0", "0.5": "3.0",
                      "1.0": "3.0", "+Inf": "4.0"}
    assert decisions['gpualloc_decision_seconds_count{operation="submit"}'] == "4.0"
    assert float(decisions['gpualloc_decision_seconds_sum{operation="submit"}']) == pytest.approx(2.8012)
    assert decisions['gpualloc_decision_seconds_bucket{le="0.005",operation="release"}'] == "0.0"
    assert decisions['gpualloc_decision_seconds_bucket{le="0.01",operation="release"}'] == "1.0"
    assert len([series for series in decisions if series.startswith("gpualloc_decision_seconds_bucket")]) == 2 * 12
    assert not [series for series in decisions if "touch" in series]  # nothing timed: no series

    lease = core.scheduler.submit("alice", "kernel:k1", SliceSpec.from_json({"kind": "shared", "memory_gib": 4}),
                                  now=0.0)
    for waited in (60, 50_000, -1):  # on a bound, past the last finite one, and none (clock skew)
        metrics.observe(Event("lease.granted", 0.0, lease.id, "alice", {"waited_s": waited}))
    waits = rendered(metrics, "gpualloc_queue_wait_seconds")
    bucket = 'gpualloc_queue_wait_seconds_bucket{{le="{}",priority="interactive"}}'.format
    assert [waits[bucket(le)] for le in ("0.1", "30.0", "60.0", "43200.0", "+Inf")] == [
        "1.0", "1.0", "2.0", "2.0", "3.0"]
    assert waits['gpualloc_queue_wait_seconds_count{priority="interactive"}'] == "3.0"
    assert waits['gpualloc_queue_wait_seconds_sum{priority="interactive"}'] == "50060.0"


def test_events_are_counted_by_type_across_scrapes(core):
    metrics = ServiceMetrics(core.scheduler)
    assert rendered(metrics, "gpualloc_events") == {}
    for event_type in ("lease.queued", "lease.released", "lease.queued", "gpu.drained"):
        metrics.observe(Event(event_type, 0.0, None, "alice"))
    text = metrics.render().decode()
    assert "# TYPE gpualloc_events_total counter" in text
    assert rendered(metrics, "gpualloc_events") == {'gpualloc_events_total{type="lease.queued"}': "2.0",
                                                    'gpualloc_events_total{type="lease.released"}': "1.0",
                                                    'gpualloc_events_total{type="gpu.drained"}': "1.0"}
    metrics.observe(Event("lease.released", 0.0, None, "alice"))
    assert rendered(metrics, "gpualloc_events")['gpualloc_events_total{type="lease.released"}'] == "2.0"
