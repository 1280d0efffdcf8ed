"""The jobs benchmark's day simulation, on a tiny load: interactive first, a preempted job restarts."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_jobs", ROOT / "benchmarks" / "jobs.py")
bench = sys.modules["bench_jobs"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_a_tiny_mixed_day_preempts_the_job_and_a_baseline_day_makes_the_session_wait(tmp_path):
    arrivals = [bench.Arrival(0.0, "job", "j0", bench.WHOLE, 3600.0)]
    arrivals += [bench.Arrival(60.0 + i, "session", f"u{i}", bench.WHOLE, 600.0) for i in range(8)]
    mixed = bench.summarise(bench.Day(arrivals, 8, True, f"sqlite:///{tmp_path / 'm.sqlite'}").run(), 8)
    assert mixed["sessions_waited"] == 0 and mixed["wasted_gpu_h"] > 0
    assert mixed["job_turnaround_mean"] >= 600 + 3600  # waited for a GPU, then ran from scratch
    baseline = bench.summarise(bench.Day(arrivals, 8, False, f"sqlite:///{tmp_path / 'b.sqlite'}").run(), 8)
    assert baseline["sessions_waited"] == 1 and baseline["wasted_gpu_h"] == 0
    assert baseline["job_turnaround_mean"] == 3600
