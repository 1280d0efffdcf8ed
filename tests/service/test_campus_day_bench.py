"""The campus-day benchmark on a tiny day: it drives the real service (grants through the queue,
jobs claimed and finished, events on every stream) and leaves no service process behind."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_campus_day", ROOT / "benchmarks" / "campus_day.py")
bench = sys.modules["bench_campus_day"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def children() -> str:
    return Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().strip()


def test_a_tiny_campus_day_runs_through_the_service_and_stops_it():
    before = children()
    args = argparse.Namespace(users=24, start=14.0, hours=0.1, compression=30.0, bursts=6.0, warmup=120.0,
                              connections=4)
    run = bench.one_run(args, 16, 1, bench.Bursts.load(bench.DATA))
    [hour] = run["hours"]
    assert hour["hour"] == 14 and abs(hour["simulated_s"] - 360) < 1e-6
    assert hour["active"] == 24 and run["lost_streams"] == 0
    assert hour["requests"] > 24 * 360 / bench.HEARTBEAT_S * 0.8  # every server heartbeats
    assert hour["errors"] == 0
    assert hour["grants"] > 0 and hour["wait_p50"] >= 0
    assert hour["events"] > hour["grants"]  # each grant's event, and releases and jobs' events, on their users' streams
    assert 0 < hour["cpu_s"] and 0 < hour["rss_mib"]
    assert children() == before  # the service was stopped and reaped
