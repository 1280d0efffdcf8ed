"""The command line: simulators and the inventory view, run as a user would run them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jupyter_gpualloc.cli import parse_seeds
from tests.core.test_openb import trace_or_skip

ROOT = Path(__file__).resolve().parent.parent
DEMO_FLEET = ROOT / "examples" / "fleets" / "demo.yaml"


def run_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "jupyter_gpualloc.cli", *args], capture_output=True,
                          text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc

def test_help_lists_every_command_and_serve_and_demo_keep_their_own_help():
    out = run_cli("--help").stdout
    flat = " ".join(out.split())
    for command in ("serve", "demo", "simulate", "inventory", "usage", "job", "reservation"):
        assert f" {command} " in flat, out
    assert "serve run the allocator's REST service (`serve --help-all` lists every option)" in flat
    assert "demo start the local JupyterHub demo on http://127.0.0.1:8000 (`demo --help`)" in flat
    demo = " ".join(run_cli("demo", "--help").stdout.split())
    assert demo.startswith("usage: jupyter-gpualloc demo [-h] [--ip IP] [--port PORT]"), demo


def test_seed_ranges():
    assert parse_seeds("42-51") == list(range(42, 52))
    assert parse_seeds("42,44-45") == [42, 44, 45]

def test_simulate_requests_prints_one_line_per_outcome(tmp_path):
    stream = tmp_path / "req.jsonl"
    ops = [
        {"op": "submit", "id": "a", "user": "alice", "spec": {"kind": "mig", "profile": "4g.40gb"}},
        {"op": "submit", "id": "b", "user": "bob", "spec": {"kind": "mig", "profile": "3g.40gb"}},
        {"op": "submit", "id": "c", "user": "carol", "spec": {"kind": "whole", "model": "L4"}},
        {"op": "submit", "id": "d", "user": "dave", "spec": {"kind": "whole", "model": "L4"}},
        {"op": "submit", "id": "e", "user": "erin", "spec": {"kind": "shared", "memory_gib": 8, "model": "L4"}, "wait": 0},
        {"op": "submit", "id": "f", "user": "fay", "spec": {"kind": "mig", "profile": "9g.99gb"}},
        {"op": "release", "id": "c", "now": 5},
        {"op": "tick", "now": 10},
    ]
    stream.write_text("\n".join(json.dumps(o) for o in ops) + "\n")
    out = run_cli("simulate", "requests", "--fleet", str(DEMO_FLEET), "--requests", str(stream), "--json").stdout
    lines = [json.loads(line) for line in out.splitlines()]
    by_id = {}
    for line in lines:
        by_id.setdefault(line["id"], []).append(line)
    a, b = by_id["a"][0], by_id["b"][0]
    assert a["state"] == b["state"] == "granted"
    assert a["gpu"] == b["gpu"]  # 4g + 3g share one A100-80GB: 4g@0 and 3g@4
    assert (a["slice"]["start"], b["slice"]["start"]) == (0, 4)
    assert a["slice"]["kind"] == "mig" and a["slice"]["memory_mib"] > 0
    assert by_id["c"][0]["state"] == "granted" and by_id["c"][0]["slice"]["kind"] == "whole"
    assert by_id["d"][0] == {"id": "d", "state": "queued", "position": 1}
    assert by_id["e"][0]["state"] == "rejected" and "no capacity" in by_id["e"][0]["reason"]
    assert by_id["f"][0]["state"] == "rejected" and "9g.99gb" in by_id["f"][0]["reason"]
    assert [l["state"] for l in by_id["c"]] == ["granted", "released"]
    assert [l["state"] for l in by_id["d"]] == ["queued", "granted"]

def test_inventory_draws_mig_layouts(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - name: box\n    cpu_milli: 8000\n    memory_mib: 65536\n    gpus:\n"
                     "      - {model: A100-SXM4-40GB, mig: static, layout: [4g.20gb, 2g.10gb, 1g.5gb]}\n"
                     "      - {model: T4}\n")
    out = run_cli("inventory", "--fleet", str(fleet)).stdout
    assert "|a|a|a|a|b|b|c|.|" in out
    assert "a=4g.20gb@0 b=2g.10gb@4 c=1g.5gb@6" in out
    assert "T4" in out and "[whole / shared]" in out

def test_inventory_without_a_driver_says_how_to_simulate():
    proc = run_cli("inventory", "--backend", "nvml", check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "--fleet" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

def test_bad_fleet_is_one_line_naming_the_place(tmp_path):
    fleet = tmp_path / "bad.yaml"
    fleet.write_text("nodes:\n  - name: box\n    cpu_milli: 8000\n    memory_mib: 1024\n    gpus: [{model: Z9000}]\n")
    proc = run_cli("inventory", "--fleet", str(fleet), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "nodes[0].gpus[0].model" in proc.stderr

def test_simulate_openb_bestfit_one_seed_is_near_the_paper():
    trace_or_skip()
    proc = run_cli("simulate", "openb", "--policy", "bestfit", "--seeds", "42", "--json")
    result = json.loads(proc.stdout)
    assert result["policy"] == "bestfit" and result["seeds"] == [42]
    assert abs(result["alloc_pct"]["100"]["mean"] - 92.86) < 1.0
    assert result["alloc_pct"]["130"]["mean"] >= result["alloc_pct"]["100"]["mean"]
    assert result["decisions"] > 10_000

def test_simulate_openb_rejects_unknown_policy():
    proc = run_cli("simulate", "openb", "--policy", "nonsense", "--seeds", "42", check=False)
    assert proc.returncode == 2 and "unknown policy 'nonsense'" in proc.stderr
