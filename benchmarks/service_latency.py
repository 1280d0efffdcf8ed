"""Allocate/release latency of the scheduler service over HTTP, against the core called directly.

Starts a standalone `jupyter-gpualloc serve` subprocess on a temporary SQLite file over the demo
fleet (examples/fleets/demo.yaml: two A100-80GB with dynamic MIG, an H100, an L4), then runs
allocate/release cycles of a MIG 1g.10gb slice:

* sequential: one client, one keep-alive connection, N cycles;
* concurrent: C clients (threads, one connection each, one user each) doing N/C cycles each;
* core: the same cycles called directly on Scheduler.submit/release over a SQLite store of its own
  (no HTTP), as the baseline.

Latency is measured at the client from request sent to answer read (perf_counter). Run
``python benchmarks/service_latency.py`` (about 20 s on 2 cores); it writes docs/benchmarks/service_latency.md.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyter_gpualloc.core.devices.simulated import SimulatedBackend  # noqa: E402
from jupyter_gpualloc.core.model import PriorityClass, SliceSpec  # noqa: E402
from jupyter_gpualloc.core.policy import SchedulerPolicy  # noqa: E402
from jupyter_gpualloc.core.scheduler import Scheduler  # noqa: E402
from jupyter_gpualloc.core.store import Store, sqlite_url  # noqa: E402

FLEET = ROOT / "examples" / "fleets" / "demo.yaml"
SPEC = {"kind": "mig", "profile": "1g.10gb"}
OUT = ROOT / "docs" / "benchmarks" / "service_latency.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(workdir: Path, users: int) -> tuple[subprocess.Popen, int, list[str]]:
    tokens = {f"bench-token-{n:04d}": {"user": f"user{n}"} for n in range(users)}
    config = workdir / "gpualloc_config.py"
    config.write_text(f"c.GpuAllocService.api_tokens = {tokens!r}\nc.SchedulerPolicy.heartbeat_ttl = 0\nc.SchedulerPolicy.wait_for_holders = False\n")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--port", str(port), "--fleet", str(FLEET),
         "--db", sqlite_url(workdir / "service.sqlite"), "-f", str(config), "--audit-log",
         str(workdir / "audit.jsonl"), "--log-level", "WARN"],
        cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/api/v1/health")
            if conn.getresponse().status == 200:
                return proc, port, list(tokens)
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the service did not start")


def http_cycles(port: int, token: str, cycles: int, holder: str, post_ms: list, delete_ms: list) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = json.dumps({"spec": SPEC, "holder": holder, "wait": 10})
    for _ in range(cycles):
        start = time.perf_counter()
        conn.request("POST", "/api/v1/leases", body, headers)
        response = conn.getresponse()
        lease = json.loads(response.read())
        post_ms.append((time.perf_counter() - start) * 1000)
        if response.status != 201:
            raise RuntimeError(f"POST /leases answered {response.status}: {lease}")
        start = time.perf_counter()
        conn.request("DELETE", f"/api/v1/leases/{lease['id']}", headers=headers)
        response = conn.getresponse()
        response.read()
        delete_ms.append((time.perf_counter() - start) * 1000)
        if response.status != 200:
            raise RuntimeError(f"DELETE answered {response.status}")
    conn.close()


def core_cycles(workdir: Path, cycles: int) -> tuple[list, list]:
    store = Store(sqlite_url(workdir / "core.sqlite"))
    scheduler = Scheduler(SimulatedBackend(FLEET), store, SchedulerPolicy(heartbeat_ttl=0, wait_for_holders=False),
                          now=time.time())
    spec = SliceSpec.from_json(SPEC)
    submit_ms, release_ms = [], []
    for _ in range(cycles):
        start = time.perf_counter()
        lease = scheduler.submit("user0", "kernel:bench", spec, PriorityClass.INTERACTIVE, now=time.time())
        submit_ms.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        scheduler.release(lease.id, now=time.time())
        release_ms.append((time.perf_counter() - start) * 1000)
    store.close()
    return submit_ms, release_ms


def stats(samples: list[float]) -> tuple[float, float, float]:
    a = np.asarray(samples)
    return float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=400, help="allocate/release cycles per scenario")
    parser.add_argument("--concurrency", type=int, default=8, help="clients in the concurrent scenario")
    parser.add_argument("--out", type=Path, default=OUT, help="where to write the results table")
    args = parser.parse_args(argv)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc, port, tokens = start_service(workdir, args.concurrency)
        try:
            warm_post, warm_delete = [], []
            http_cycles(port, tokens[0], 20, "kernel:warmup", warm_post, warm_delete)
            post_ms, delete_ms = [], []
            started = time.perf_counter()
            http_cycles(port, tokens[0], args.cycles, "kernel:seq", post_ms, delete_ms)
            seq_rate = args.cycles / (time.perf_counter() - started)
            rows.append(("HTTP, 1 client", post_ms, delete_ms, seq_rate))

            c_post, c_delete = [], []
            per_client = max(1, args.cycles // args.concurrency)
            threads = [threading.Thread(target=http_cycles, args=(port, tokens[n], per_client, f"kernel:c{n}",
                                                                   c_post, c_delete))
                       for n in range(args.concurrency)]
            started = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            c_rate = per_client * args.concurrency / (time.perf_counter() - started)
            rows.append((f"HTTP, {args.concurrency} clients", c_post, c_delete, c_rate))
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        core_cycles(workdir, 20)
        started = time.perf_counter()
        submit_ms, release_ms = core_cycles(workdir, args.cycles)
        rows.append(("core, no HTTP", submit_ms, release_ms, args.cycles / (time.perf_counter() - started)))

    core_p50 = stats(rows[-1][1])[0], stats(rows[-1][2])[0]
    lines = [
        "# Service latency: allocate/release over HTTP",
        "",
        f"Measured by `python benchmarks/service_latency.py --cycles {args.cycles} --concurrency "
        f"{args.concurrency}` on {time.strftime('%Y-%m-%d')}, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores ({platform.machine()}), "
        "a standalone service subprocess over a temporary SQLite file (WAL) and the demo fleet "
        "(dynamic MIG: every grant creates a MIG instance in the simulator, every release destroys it).",
        "",
        "One cycle: `POST /leases` for a MIG 1g.10gb slice (granted at once, 201), then "
        "`DELETE /leases/{id}` (200). Times are per request, in milliseconds, measured at the client; "
        "each answer is written to SQLite before it is sent.",
        "",
        "| scenario | allocate p50 | allocate p99 | release p50 | release p99 | cycles/s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, alloc, release, rate in rows:
        a50, a99, _ = stats(alloc)
        r50, r99, _ = stats(release)
        lines.append(f"| {name} | {a50:.2f} | {a99:.2f} | {r50:.2f} | {r99:.2f} | {rate:.0f} |")
    seq, conc = rows[0], rows[1]
    lines += [
        "",
        f"For one client the HTTP p50 is {stats(seq[1])[0] / core_p50[0]:.1f}x the core's own (allocate) and "
        f"{stats(seq[2])[0] / core_p50[1]:.1f}x (release). With {args.concurrency} clients the requests queue "
        "on the service's single IOLoop thread (the core is single-threaded by design): per-request latency "
        f"grows with the number of clients, and throughput is {conc[3] / seq[3]:.1f}x the one-client rate. "
        "The machine was shared with other work while measuring; p99 is the noisiest column.",
    ]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
