"""Instructions per request of `jupyter-gpualloc serve`, counted by callgrind: a figure the
machine's load does not move, where service_load.py's wall-clock and CPU figures do (by 20-30 %
between runs on a shared machine).

The service (or the tornado hello app of service_load.py) runs under `valgrind --tool=callgrind
--instr-atstart=no` on SQLite over a simulated fleet (`--gpus`, the kinds of service_load.py);
`--warm` requests of the allocate+release mix are sent uninstrumented, then counting is switched
on (`callgrind_control -i on`), `--requests` more are sent, and it is switched off and dumped.
The figure is the dump's total instructions divided by the requests counted. `--in-flight` workers
each allocate (a shape of service_load.SHAPES in turn, a holder of its own, `wait: 0`) and then
release, so about that many requests are in flight (1: one at a time, each group one request).

    python benchmarks/service_instructions.py [--gpus 100] [--in-flight 16] [--requests 800] [--hello] [--keep FILE]
    python benchmarks/service_instructions.py --pg-url postgresql+psycopg://...   # on a new PostgreSQL database

The counts repeat to within about 1 % (requests fall into groups differently from run to run).
Needs valgrind; without it the run is skipped with one line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import service_load  # noqa: E402  (the fleet, the tokens, the servers and the request shapes)


async def allocate_and_release(port: int, tokens: list[str], requests: int, in_flight: int, start: int) -> int:
    """About `requests` requests (half allocations, half releases) over `in_flight` workers, holders
    numbered from `start`; returns how many were sent."""
    per_worker = max(1, requests // (2 * in_flight))

    async def worker(n: int) -> None:
        conn = service_load.Connection(port)
        try:
            for k in range(per_worker):
                serial = start + n * per_worker + k
                token = tokens[serial % len(tokens)]
                status, body = await conn.request(
                    "POST", "/api/v1/leases", token,
                    {"spec": service_load.SHAPES[serial % len(service_load.SHAPES)],
                     "holder": f"kernel:i{serial}", "wait": 0})
                if status != 201:
                    raise RuntimeError(f"allocation {serial}: {status} {body[:200]!r}")
                lease_id = json.loads(body)["id"]
                status, body = await conn.request("DELETE", f"/api/v1/leases/{lease_id}", token)
                if status != 200:
                    raise RuntimeError(f"release {serial}: {status} {body[:200]!r}")
        finally:
            conn.close()
    await asyncio.gather(*(worker(n) for n in range(in_flight)))
    return 2 * per_worker * in_flight


async def hello_requests(port: int, requests: int, in_flight: int) -> int:
    """About `requests` POSTs to the hello app over `in_flight` workers; returns how many were sent."""
    per_worker = max(1, requests // in_flight)

    async def worker() -> None:
        conn = service_load.Connection(port)
        try:
            for _ in range(per_worker):
                await conn.request("POST", "/api/v1/leases", "none", {"spec": service_load.SHAPES[0]})
        finally:
            conn.close()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return per_worker * in_flight


def count(args) -> tuple[float, int]:
    """(instructions per request, requests counted) of one server under callgrind."""
    with tempfile.TemporaryDirectory(prefix="gpualloc-callgrind-") as tmp:
        work = Path(tmp)
        out = work / "callgrind.out"
        valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        drop = None
        if args.hello:
            argv, port, tokens = service_load.hello_command(work)
        else:
            db_url, drop = service_load.fresh_pg_database(args.pg_url) if args.pg_url else \
                (f"sqlite:///{work / 'service.sqlite'}", None)
            argv, port, tokens = service_load.service_command(work, db_url, args.gpus)
        # under valgrind the service's start-up (imports, the fleet) is slow, more so on a loaded machine
        server = service_load.Server("counted", valgrind + argv, port, args.core, work, tokens, start_timeout=600)
        try:
            def send(requests: int, start: int) -> int:
                if args.hello:
                    return asyncio.run(hello_requests(port, requests, args.in_flight))
                return asyncio.run(allocate_and_release(port, tokens, requests, args.in_flight, start))
            send(args.warm, 0)
            subprocess.run(["callgrind_control", "-i", "on", str(server.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            counted = send(args.requests, args.warm)
            subprocess.run(["callgrind_control", "-i", "off", str(server.proc.pid)], check=True,
                           stdout=subprocess.DEVNULL)
            subprocess.run(["callgrind_control", "-d", str(server.proc.pid)], check=True, stdout=subprocess.DEVNULL)
        finally:
            server.stop()
            if drop is not None:
                drop()
        total = 0
        for dump in work.glob("callgrind.out*"):
            for line in dump.read_text(errors="replace").splitlines():
                if line.startswith("totals:") and int(line.split()[1]):
                    total += int(line.split()[1])
                    if args.keep:
                        shutil.copy(dump, args.keep)
                    break
        return total / counted, counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=100, help="fleet size (service_load.py's kinds)")
    parser.add_argument("--in-flight", type=int, default=16, help="concurrent workers")
    parser.add_argument("--requests", type=int, default=800, help="requests counted")
    parser.add_argument("--warm", type=int, default=300, help="requests sent before counting")
    parser.add_argument("--core", type=int, default=1, help="the core the server is pinned to")
    parser.add_argument("--hello", action="store_true", help="count the tornado hello app instead")
    parser.add_argument("--pg-url", help="count the service on a new database of this PostgreSQL server "
                                         "(postgresql+psycopg://...) instead of a new SQLite file")
    parser.add_argument("--keep", help="copy the counted dump here (for callgrind_annotate --inclusive=yes)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("taskset") is None:
        print("skipped: valgrind and taskset are needed to count instructions")
        return
    per_request, counted = count(args)
    store = "postgresql" if args.pg_url else "sqlite"
    what = "tornado hello" if args.hello else f"service ({store}, {args.gpus} GPUs)"
    print(f"{what}, {args.in_flight} in flight: {per_request / 1e6:.3f} M instructions per request "
          f"over {counted} requests")


if __name__ == "__main__":
    main()
