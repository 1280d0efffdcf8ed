"""The usage benchmark's session replay, on one hand-made session: GPU-aware idleness frees the
GPU in a long gap, and the next burst asks again."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_usage", ROOT / "benchmarks" / "usage_sessions.py")
bench = sys.modules["bench_usage"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def session() -> list:
    """Two 10-minute bursts of one GPU, 3 hours apart, then a one-minute linger."""
    return [bench.Session(0, 0.0, 1, [600.0, 600.0], [3 * 3600.0, 60.0])]


def test_activity_holds_through_the_gap_and_gpu_idleness_releases_in_it():
    held = bench.Replay(session(), 1, bench.POLICIES["activity idle release"], 6 * 3600.0).run()
    assert held["held"] == pytest.approx(12060 / 3600) and held["busy"] == pytest.approx(1200 / 3600)
    assert held["requests"] == 1 and list(held["waits"]) == [0.0]
    freed = bench.Replay(session(), 1, bench.POLICIES["GPU-aware idle release"], 6 * 3600.0).run()
    # last active at the 600 s sample; warned 30 min later (tick at 2400 s), released 5 min after
    assert freed["held"] == pytest.approx((2700 + 660) / 3600)
    assert freed["busy"] == pytest.approx(1200 / 3600) and freed["requests"] == 2


def test_a_burst_that_starts_after_the_idle_warning_keeps_its_gpu():
    # idle on the GPU from 600 s: warned at 2400 s (tick), released at 2700 s unless the GPU is busy again;
    # the second burst starts at 600 + 1860 = 2460 s, and its start is sampled from the backend at 90%
    sessions = [bench.Session(0, 0.0, 1, [600.0, 600.0], [1860.0, 60.0])]
    replay = bench.Replay(sessions, 1, bench.POLICIES["GPU-aware idle release"], 6 * 3600.0)
    result = replay.run()
    assert result["requests"] == 1 and result["held"] == pytest.approx((2460 + 600 + 60) / 3600)
    assert replay.backend.process_memory() == []  # the closed notebook's process ended with it


def test_a_missing_trace_skips_with_a_message(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["usage_sessions.py", "--trace", str(tmp_path / "none.csv"),
                                      "--out", str(tmp_path / "out.md")])
    assert bench.main() == 0
    assert capsys.readouterr().out.startswith("skipped: the NotebookOS sensei trace is not at ")
    assert not (tmp_path / "out.md").exists()
