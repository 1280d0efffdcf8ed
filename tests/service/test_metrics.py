"""The service's own timings in gpualloc_decision_seconds."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.service.metrics import ServiceMetrics


def count_and_sum(metrics: ServiceMetrics, operation: str) -> tuple[float, float]:
    samples = {(s.name, s.labels.get("operation")): s.value for m in metrics.decision_latency.collect()
               for s in m.samples}
    return (samples.get(("gpualloc_decision_seconds_count", operation), 0.0),
            samples.get(("gpualloc_decision_seconds_sum", operation), 0.0))


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
