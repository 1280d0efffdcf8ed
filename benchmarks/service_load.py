"""Open-loop load against `jupyter-gpualloc serve`, beside a trivial tornado app, both on one core.

Requests are sent at scheduled times (a fixed rate), whatever the answers do; each latency is
measured from the request's *scheduled* send time to its answer, so a server that falls behind
is charged for the requests waiting behind it (no coordinated omission). The generator runs in
this process on one core (asyncio, raw HTTP/1.1 over 64 keep-alive connections); the server
runs in a subprocess pinned (taskset) to another.

Servers, measured one after the other in the same run:

* `hello`: a tornado app answering every request with a small JSON body (the floor);
* `service (sqlite, N GPUs)`: `jupyter-gpualloc serve` on a temporary SQLite file over a
  simulated fleet of N GPUs (`--fleets`, default 16, 100 and 1,000): 40 % A100-80GB with dynamic
  MIG in nodes of 8, 40 % H100 shared by memory in nodes of 8, 20 % L4 in nodes of 4 (the last
  node of a kind takes the rest); bearer tokens of 64 users; half as many leases as GPUs granted
  before the sweeps, each to a holder of its own, and held throughout;
* `service (postgresql, N GPUs)`: the same on a fresh database of the server named by `--pg-url`
  or `GPUALLOC_TEST_PG_URL`, when one is named.

Mixes:

* `alloc`: allocate+release: `POST /leases` (`wait: 0`, a new `kernel:<n>` holder each, shapes in
  turn: MIG 1g.10gb, shared 4 GiB on H100, MIG 2g.20gb, shared 8 GiB, MIG 1g.20gb, shared 16 GiB,
  a whole GPU of any kind) while fewer than 16 leases are held, asked for or being released, else
  `DELETE /leases/{id}` of the oldest;
* `touch`: over the leases granted before the sweeps, in turn `POST /leases/{id}/touch`,
  `POST /heartbeat` and `GET /leases`.

Each rate runs `--seconds` seconds; the knee is the highest offered rate whose requests all
completed with p99 under 50 ms. A mix's sweep stops after two rates past the knee.

    python benchmarks/service_load.py [--seconds 4] [--pg-url URL] [--json results.json] [--before old.json]

prints a markdown table (the issue's figures beside this run's, ratios against hello) and, with
`--json`, writes the raw figures (pass them as `--before` to a later run to show both).
The summary table gives, per fleet, the allocate+release knee and p99 at 500 req/s beside hello's.
`--rates touch=1000,2000` measures only those rates of a mix; `--quick` (what run_all.py runs)
takes 2 s per rate at a few rates of each mix on the 100-GPU fleet, on PostgreSQL only when a URL is given, and with
`--markdown FILE` writes its table there. Without `taskset` (util-linux) the run is skipped with
one line, as the servers could not be pinned to a core.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONNECTIONS = 64
USERS = 64
HELD = 16  # the alloc mix releases once this many leases are held
OUTSTANDING = 32  # ... and allocates only while fewer are held, asked for or being released
HOLDERS = itertools.count()  # the alloc mix's holder names
KNEE_P99_MS = 50.0
RATES = {"alloc": [250, 500, 750, 1000, 1500, 2000, 3000, 4000],
         "touch": [500, 1000, 1500, 2000, 3000, 4000, 5000, 6000]}
QUICK_RATES = {"alloc": [250, 500], "touch": [1000, 2000, 3000]}
QUICK_SECONDS = 2.0
QUICK_TITLE = "# Service under load: a quick open-loop run"
FLEETS = [16, 100, 1000]  # GPUs; 40 % A100-80GB (dynamic MIG), 40 % H100 (shared), 20 % L4
KINDS = [("A100-SXM4-80GB", "dynamic", 0.4, 8), ("H100 80GB HBM3", "off", 0.4, 8), ("L4", "off", 0.2, 4)]
# The alloc mix's request shapes, in turn: MIG profiles, shared sizes, whole GPUs.
SHAPES = [{"kind": "mig", "profile": "1g.10gb"},
          {"kind": "shared", "memory_gib": 4, "model": "H100-80GB"},
          {"kind": "mig", "profile": "2g.20gb"},
          {"kind": "shared", "memory_gib": 8, "model": "H100-80GB"},
          {"kind": "mig", "profile": "1g.20gb"},
          {"kind": "shared", "memory_gib": 16, "model": "H100-80GB"},
          {"kind": "whole"}]


def fleet_yaml(gpus: int) -> str:
    """`gpus` GPUs of the three kinds (40/40/20 %), in nodes of 8, 8 and 4 (the last of a kind smaller)."""
    lines = ["nodes:"]
    for n, (model, mig, share, per_node) in enumerate(KINDS):
        count = round(gpus * share) if n < len(KINDS) - 1 else gpus - sum(round(gpus * k[2]) for k in KINDS[:-1])
        for node, first in enumerate(range(0, count, per_node)):
            lines += [f"  - name: {model.split()[0].split('-')[0].lower()}-{node}", "    cpu_milli: 256000",
                      "    memory_mib: 2097152", "    gpus:",
                      f"      - {{model: {model}, count: {min(per_node, count - first)}, mig: \"{mig}\"}}"]
    return "\n".join(lines) + "\n"


HELLO = textwrap.dedent("""
    import asyncio, sys
    from tornado import web
    class Hello(web.RequestHandler):
        def get(self, *_):
            self.set_header("Content-Type", "application/json")
            self.finish('{"status": "ok"}')
        post = delete = get
    async def main():
        web.Application([(r"/.*", Hello)]).listen(int(sys.argv[1]), "127.0.0.1")
        await asyncio.Event().wait()
    asyncio.run(main())
""")
# The figures issue 16 reported for main, per (mix, offered rate).
ISSUE = {("alloc", 500): "p99 47-70 ms, 0.73 cores",
         ("alloc", 750): "516-563 req/s done, p99 2.8-3.1 s (at 600-650)",
         ("alloc", 1000): "526 req/s done, p99 17 s",
         ("touch", 1500): "1,324 req/s done, p99 6.1 s"}


@dataclass
class Step:
    server: str
    mix: str
    offered: float
    done: float  # answers per second of the step
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: int  # answers other than 2xx, and requests never answered
    cores: float  # the server's CPU seconds per second
    queued_p99_ms: float  # waiting for a free connection (all 64 busy)

    @property
    def meets_knee(self) -> bool:
        return self.p99_ms < KNEE_P99_MS and self.errors == 0 and self.done >= 0.99 * self.offered


# ------------------------------------------------------------------ servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server subprocess pinned to `core`, listening on 127.0.0.1:port."""

    def __init__(self, name: str, argv: list[str], port: int, core: int, cwd: Path, tokens: list[str],
                 start_timeout: float = 60.0):
        self.name, self.port, self.tokens = name, port, tokens
        self.proc = subprocess.Popen(["taskset", "-c", str(core), *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                                     stderr=open(cwd / "server.log", "ab"), start_new_session=True)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.proc.returncode}; see {cwd}")
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{name} did not start")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def hello_command(workdir: Path) -> tuple[list[str], int, list[str]]:
    """The hello app's command line, port and (unused) tokens; its script written into `workdir`."""
    script = workdir / "hello.py"
    script.write_text(HELLO)
    port = free_port()
    return [sys.executable, str(script), str(port)], port, ["none"] * USERS


def start_hello(workdir: Path, core: int) -> Server:
    argv, port, tokens = hello_command(workdir)
    return Server("hello", argv, port, core, workdir, tokens)


def service_command(workdir: Path, db_url: str, gpus: int) -> tuple[list[str], int, list[str]]:
    """`jupyter-gpualloc serve`'s command line, port and users' tokens; its fleet and configuration
    written into `workdir`."""
    tokens = {secrets.token_hex(16): {"user": f"user{n}"} for n in range(USERS)}
    (workdir / "fleet.yaml").write_text(fleet_yaml(gpus))
    (workdir / "gpualloc_config.py").write_text(
        f"c.GpuAllocService.api_tokens = {tokens!r}\nc.SchedulerPolicy.heartbeat_ttl = 0\nc.SchedulerPolicy.wait_for_holders = False\n")
    port = free_port()
    argv = [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--port", str(port),
            "--fleet", str(workdir / "fleet.yaml"), "--db", db_url, "-f", str(workdir / "gpualloc_config.py"),
            "--audit-log", str(workdir / "audit.jsonl"), "--log-level", "WARN"]
    return argv, port, list(tokens)


def start_service(name: str, workdir: Path, core: int, db_url: str, gpus: int) -> Server:
    argv, port, tokens = service_command(workdir, db_url, gpus)
    return Server(name, argv, port, core, workdir, tokens)


# ------------------------------------------------------------------ client


class Connection:
    """One keep-alive HTTP/1.1 connection with a blocking request (setup and clean-up only)."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(encode(method, path, token, body))
        header = await self.reader.readuntil(b"\r\n\r\n")
        length = content_length(header)
        return int(header[9:12]), await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def encode(method: str, path: str, token: str, body: dict | None) -> bytes:
    data = json.dumps(body).encode() if body is not None else b""
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def content_length(header: bytes) -> int:
    at = header.lower().find(b"content-length:")
    return int(header[at + 15:header.index(b"\r\n", at)]) if at >= 0 else 0


class LoadProtocol(asyncio.Protocol):
    """One connection of the open-loop generator: sends the next due request when the last is answered."""

    def __init__(self, run: "OpenLoop"):
        self.run = run
        self.buffer = b""
        self.intended = 0.0
        self.note: object = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.run.idle.append(self)

    def send(self, intended: float, request: tuple) -> None:
        method, path, token, body, self.note = request
        self.intended = intended
        self.run.queued.append(self.run.loop.time() - intended)
        self.transport.write(encode(method, path, token, body))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        total = end + 4 + content_length(self.buffer[:end + 2])
        if len(self.buffer) < total:
            return
        answer, self.buffer = self.buffer[:total], self.buffer[total:]
        self.run.answered(self, int(answer[9:12]), answer[end + 4:])

    def connection_lost(self, exc) -> None:
        self.run.lost += 1


class OpenLoop:
    """`total` requests at `rate`/s from `start`, over CONNECTIONS connections; a request due while
    every connection is busy waits in line, and its latency counts from when it was due."""

    def __init__(self, loop, mix, rate: float, total: int):
        self.loop, self.mix, self.rate, self.total = loop, mix, rate, total
        self.idle: list[LoadProtocol] = []
        self.waiting: collections.deque[float] = collections.deque()
        self.latencies: list[float] = []
        self.queued: list[float] = []
        self.statuses: collections.Counter = collections.Counter()
        self.lost = 0
        self.sent = 0
        self.finished = loop.create_future()

    def answered(self, conn: LoadProtocol, status: int, body: bytes) -> None:
        self.latencies.append(self.loop.time() - conn.intended)
        self.statuses[status] += 1
        self.mix.answered(status, body, conn.note)
        if self.waiting:
            self.dispatch(conn, self.waiting.popleft())
        else:
            self.idle.append(conn)
        if len(self.latencies) == self.total and not self.finished.done():
            self.finished.set_result(None)

    def dispatch(self, conn: LoadProtocol, intended: float) -> None:
        """Send the mix's next request on `conn`; if the mix has none to send yet, the request due
        at `intended` waits first in line (its latency still counting) for the next answer."""
        request = self.mix.next()
        if request is None:
            self.waiting.appendleft(intended)
            self.idle.append(conn)
        else:
            conn.send(intended, request)

    def release_due(self) -> None:
        due = min(self.total, int((self.loop.time() - self.start) * self.rate) + 1)
        while self.sent < due:
            intended = self.start + self.sent / self.rate
            self.sent += 1
            if self.idle and not self.waiting:
                self.dispatch(self.idle.pop(), intended)
            else:
                self.waiting.append(intended)
        if self.sent < self.total:
            self.loop.call_at(self.start + self.sent / self.rate, self.release_due)

    async def run(self, port: int, deadline: float) -> None:
        conns = [await self.loop.create_connection(lambda: LoadProtocol(self), "127.0.0.1", port)
                 for _ in range(CONNECTIONS)]
        self.start = self.loop.time() + 0.05
        self.loop.call_at(self.start, self.release_due)
        try:
            await asyncio.wait_for(asyncio.shield(self.finished), deadline)
        except asyncio.TimeoutError:
            pass
        for transport, _ in conns:
            transport.close()
        self.wall = self.loop.time() - self.start


class AllocMix:
    """Allocate while fewer than HELD leases are held or asked for, else release the oldest held.

    A server that falls behind is not sent more allocations than it can hold: while OUTSTANDING
    leases are held, asked for or being released, the next allocation waits in line (its latency
    counting from when it was due) for an answer; more would run a small fleet out of room and be
    answered "no capacity"."""

    def __init__(self, tokens: list[str]):
        self.tokens = tokens
        self.held: collections.deque[tuple[str, str]] = collections.deque()
        self.asked = 0  # allocations sent and not yet answered
        self.releasing = 0  # releases sent and not yet answered
        self.count = 0

    def next(self) -> tuple[str, str, str, dict | None, object] | None:
        if self.held and len(self.held) + self.asked >= HELD:
            token, lease_id = self.held.popleft()
            self.releasing += 1
            return "DELETE", f"/api/v1/leases/{lease_id}", token, None, None
        if len(self.held) + self.asked + self.releasing >= OUTSTANDING:
            return None
        self.count += 1
        token = self.tokens[self.count % len(self.tokens)]
        self.asked += 1
        n = next(HOLDERS)  # never a holder a lease left over from an earlier rate still has
        spec = SHAPES[n % len(SHAPES)]
        return "POST", "/api/v1/leases", token, {"spec": spec, "holder": f"kernel:b{n}", "wait": 0}, token

    def answered(self, status: int, body: bytes, token: object) -> None:
        if token is None:
            self.releasing -= 1
        else:
            self.asked -= 1
            if status == 201:
                self.held.append((token, json.loads(body)["id"]))


class TouchMix:
    """Touch a lease, heartbeat its user, list its user's leases, in turn."""

    def __init__(self, leases: list[tuple[str, str]]):
        self.leases = leases
        self.count = 0

    def next(self) -> tuple[str, str, str, dict | None, object]:
        self.count += 1
        token, lease_id = self.leases[(self.count // 3) % len(self.leases)]
        kind = self.count % 3
        if kind == 0:
            return "POST", f"/api/v1/leases/{lease_id}/touch", token, {"last_activity": time.time()}, None
        if kind == 1:
            return "POST", "/api/v1/heartbeat", token, {}, None
        return "GET", "/api/v1/leases", token, None, None

    def answered(self, status: int, body: bytes, token: object) -> None:
        pass


async def grant_leases(port: int, tokens: list[str], count: int) -> list[tuple[str, str]]:
    conn = Connection(port)
    leases = []
    for n in range(count):
        token = tokens[n % len(tokens)]
        status, body = await conn.request("POST", "/api/v1/leases", token,
                                          {"spec": SHAPES[n % len(SHAPES)], "holder": f"kernel:touched{n}",
                                           "wait": 0})
        if status != 201:
            raise RuntimeError(f"setup lease {n}: {status} {body[:200]!r}")
        leases.append((token, json.loads(body)["id"]))
    conn.close()
    return leases


async def run_rate(server: Server, mix, rate: float, seconds: float, drain: float = 10.0) -> OpenLoop:
    """Offer `rate` requests/s for `seconds`, waiting at most `drain` s more for the last answers."""
    run = OpenLoop(asyncio.get_running_loop(), mix, rate, int(rate * seconds))
    await run.run(server.port, seconds + drain)
    return run


def measure(server: Server, mix_name: str, rate: float, seconds: float, setup: dict) -> Step:
    mix = AllocMix(server.tokens) if mix_name == "alloc" else TouchMix(setup["leases"])
    before = cpu_seconds(server.proc.pid)
    run = asyncio.run(run_rate(server, mix, rate, seconds))
    cores = (cpu_seconds(server.proc.pid) - before) / run.wall
    latencies, lags = run.latencies, run.queued
    errors = run.total - sum(n for status, n in run.statuses.items() if 200 <= status < 300)
    if errors:
        print(f"    answers: {dict(run.statuses)}, never answered: {run.total - len(latencies)}")
    if mix_name == "alloc":  # give back what the mix still holds, outside the measured window
        asyncio.run(release_all(server.port, mix.held))
    ms = np.array(latencies) * 1000 if latencies else np.array([float("inf")])
    return Step(server.name, mix_name, rate, len(latencies) / run.wall,
                float(np.percentile(ms, 50)), float(np.percentile(ms, 99)), float(ms.max()), errors,
                cores, float(np.percentile(np.array(lags) * 1000, 99)) if lags else 0.0)


async def release_all(port: int, held) -> None:
    conn = Connection(port)
    while held:
        token, lease_id = held.popleft()
        await conn.request("DELETE", f"/api/v1/leases/{lease_id}", token)
    conn.close()


def sweep(server: Server, mix: str, seconds: float, setup: dict, rates: list[int]) -> list[Step]:
    steps = []
    past_knee = 0
    for rate in rates:
        step = measure(server, mix, rate, seconds, setup)
        steps.append(step)
        print(f"  {server.name:22s} {mix:5s} {rate:5d}/s: done {step.done:7.0f}/s p50 {step.p50_ms:8.2f} "
              f"p99 {step.p99_ms:9.2f} ms errors {step.errors:5d} cores {step.cores:.2f} "
              f"queued p99 {step.queued_p99_ms:.1f} ms", flush=True)
        past_knee += not step.meets_knee
        if past_knee >= 2:
            break
        time.sleep(1.0)
    return steps


# ------------------------------------------------------------------ report


def knee(steps: list[Step], server: str, mix: str) -> float:
    met = [s.offered for s in steps if s.server == server and s.mix == mix and s.meets_knee]
    return max(met) if met else 0.0


def step_at(steps: list[Step], server: str, mix: str, rate: float) -> Step | None:
    return next((s for s in steps if s.server == server and s.mix == mix and s.offered == rate), None)


def cell(step: Step | None) -> str:
    if step is None:
        return "—"
    done = "" if step.meets_knee else f"{step.done:,.0f} req/s done, "
    p99 = f"{step.p99_ms / 1000:.1f} s" if step.p99_ms >= 1000 else f"{step.p99_ms:.1f} ms"
    errors = f", {step.errors} errors" if step.errors else ""
    return f"{done}p99 {p99}, {step.cores:.2f} cores ({cpu_per_request(step):.2f} ms CPU/req){errors}"


def cpu_per_request(step: Step) -> float:
    """The server's CPU milliseconds per answered request: what it costs, however busy the machine."""
    return step.cores / step.done * 1000 if step.done else float("inf")


def table(steps: list[Step], before: list[Step]) -> str:
    servers = sorted({s.server for s in steps if s.server != "hello"})
    lines = []
    for server in servers:
        lines += [f"### {server}", "", "| load | tornado hello | issue 16 (main) | before | after | p99 after / hello |",
                  "|---|---|---|---|---|---:|"]
        for mix in ("alloc", "touch"):
            label = "allocate+release" if mix == "alloc" else "touch/heartbeat/list"
            for rate in sorted({int(s.offered) for s in steps + before if s.mix == mix}):
                find = lambda pool, name: next((s for s in pool if s.server == name and s.mix == mix
                                                and s.offered == rate), None)  # noqa: E731
                hello, now, old = find(steps, "hello"), find(steps, server), find(before, server)
                if now is None and old is None:
                    continue
                ratio = f"{now.p99_ms / hello.p99_ms:.1f}x" if now and hello else "—"
                lines.append(f"| {label}, {rate:,} req/s offered | {cell(hello)} | {ISSUE.get((mix, rate), '—')} "
                             f"| {cell(old)} | {cell(now)} | {ratio} |")
        lines.append("")
        for mix in ("alloc", "touch"):
            lines.append(f"CPU per request ({mix}) at the knee: {cost_at_knee(steps, before, server, mix)}.  ")
            was = f"before {knee(before, server, mix):,.0f} req/s, " if before else ""
            lines.append(f"Knee ({mix}): hello {knee(steps, 'hello', mix):,.0f} req/s, {was}"
                         f"after {knee(steps, server, mix):,.0f} req/s.  ")
        lines.append("")
    return "\n".join(lines)


def fleet_table(steps: list[Step], before: list[Step]) -> str:
    """Allocate+release per fleet: the knee and the p99 at 500 req/s, beside hello's and before's."""
    lines = ["| server | knee | p99 at 500 req/s | CPU/req at 500 req/s | before: knee, p99 at 500 |",
             "|---|---:|---:|---:|---|"]
    hello, old = step_at(steps, "hello", "alloc", 500), step_at(before, "hello", "alloc", 500)
    if hello:
        was = f"{knee(before, 'hello', 'alloc'):,.0f} req/s, {brief(old)}" if old else ""
        lines.append(f"| tornado hello | {knee(steps, 'hello', 'alloc'):,.0f} req/s | {hello.p99_ms:.1f} ms "
                     f"| {cpu_per_request(hello):.2f} ms | {was} |")
    servers = sorted({s.server for s in steps + before if s.server.startswith("service")},
                     key=lambda name: (name.split()[1], int(name.split(", ")[-1].split()[0])) if "GPUs" in name
                     else (name, 0))
    for server in servers:
        now, old = step_at(steps, server, "alloc", 500), step_at(before, server, "alloc", 500)
        was = f"{knee(before, server, 'alloc'):,.0f} req/s, {brief(old)}" if old else "—"
        lines.append(f"| {server} | {knee(steps, server, 'alloc'):,.0f} req/s | {brief(now)} "
                     f"| {cpu_per_request(now):.2f} ms | {was} |" if now else f"| {server} | — | — | — | {was} |")
    return "\n".join(lines) + "\n"


def brief(step: Step) -> str:
    p99 = f"{step.p99_ms / 1000:.1f} s" if step.p99_ms >= 1000 else f"{step.p99_ms:.1f} ms"
    return p99 if step.meets_knee else f"{p99} ({step.done:,.0f} req/s done)"


def cost_at_knee(steps: list[Step], before: list[Step], server: str, mix: str) -> str:
    """The CPU per request at the highest rate met, beside hello's at the same rate. Not the lowest
    of the sweep: past the knee a saturated server batches more per turn, and its cost per request
    falls with how far the sweep went."""
    rate = knee(steps, server, mix)
    now, hello = step_at(steps, server, mix, rate), step_at(steps, "hello", mix, rate)
    if now is None:
        text = "after, no rate met"
    else:
        text = f"after {cpu_per_request(now):.2f} ms at {rate:,.0f} req/s"
        if hello is not None:
            ratio = cpu_per_request(now) / cpu_per_request(hello)
            text += f" (hello {cpu_per_request(hello):.2f} ms there: {ratio:.1f}x)"
    if before:
        rate = knee(before, server, mix)
        old = step_at(before, server, mix, rate)
        text += f"; before {cpu_per_request(old):.2f} ms at {rate:,.0f} req/s" if old else "; before, no rate met"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per offered rate")
    parser.add_argument("--pg-url", default=os.environ.get("GPUALLOC_TEST_PG_URL", ""),
                        help="PostgreSQL server (postgresql+psycopg://...) to measure the service on as well")
    parser.add_argument("--mixes", default="alloc,touch")
    parser.add_argument("--fleets", help=f"fleet sizes in GPUs (default {FLEETS}; --quick: 100)")
    parser.add_argument("--servers", default="hello,sqlite,postgresql")
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--before", help="raw figures of an earlier run (--json), shown as 'before'")
    parser.add_argument("--render", action="store_true", help="only print the table of --json (and --before)")
    parser.add_argument("--profile", help="py-spy: record each service asked for (--servers) under the alloc mix at this rate")
    parser.add_argument("--rates", action="append", default=[], metavar="MIX=RATE,...",
                        help="offered rates of one mix (e.g. touch=1000,2000), instead of its sweep")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_SECONDS:g} s at a few rates of each mix ({QUICK_RATES}), as run_all.py runs it")
    parser.add_argument("--markdown", help="also write the table to this markdown file")
    args = parser.parse_args()
    if args.render:
        load = lambda path: [Step(**s) for s in json.loads(Path(path).read_text())] if path else []  # noqa: E731
        print(fleet_table(load(args.json), load(args.before)) + "\n" + table(load(args.json), load(args.before)))
        return
    if shutil.which("taskset") is None:
        skipped = "service_load.py: skipped: `taskset` (util-linux) is not installed, so the servers cannot be pinned"
        print(skipped)
        if args.markdown:
            Path(args.markdown).write_text(f"{QUICK_TITLE}\n\n{skipped}.\n")
        return
    rates = {mix: list(QUICK_RATES[mix] if args.quick else RATES[mix]) for mix in RATES}
    try:
        for given in args.rates:
            mix, numbers = given.split("=")
            rates[mix] = [int(r) for r in numbers.split(",")]
    except (ValueError, KeyError):
        parser.error(f"--rates: give MIX=RATE,... with MIX one of {', '.join(RATES)}")
    if args.quick and "--seconds" not in sys.argv:
        args.seconds = QUICK_SECONDS
    args.fleets = args.fleets or ("100" if args.quick else ",".join(map(str, FLEETS)))
    os.sched_setaffinity(0, {args.client_core})
    steps = run_servers(args, rates)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(s) for s in steps], indent=1))
    before = [Step(**s) for s in json.loads(Path(args.before).read_text())] if args.before else []
    print()
    print(fleet_table(steps, before))
    print(table(steps, before))
    if args.markdown:
        write_markdown(args.markdown, table(steps, before), args)


def run_servers(args, rates: dict[str, list[int]]) -> list[Step]:
    """Sweep hello, then the service on each database and fleet size, one after the other."""
    mixes, wanted = args.mixes.split(","), args.servers.split(",")
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="gpualloc-load-") as tmp:
        work = Path(tmp)
        if "hello" in wanted:
            server = start_hello(work, args.server_core)
            try:
                for mix in mixes:
                    steps += sweep(server, mix, args.seconds, {"leases": [("none", "x")]}, rates[mix])
            finally:
                server.stop()
        for gpus in (int(n) for n in args.fleets.split(",")):
            databases = []
            if "sqlite" in wanted:
                databases.append(("sqlite", lambda folder: (f"sqlite:///{folder / 'service.sqlite'}", None)))
            if "postgresql" in wanted and args.pg_url:
                databases.append(("postgresql", lambda folder: fresh_pg_database(args.pg_url)))
            for database, make in databases:
                folder = work / f"{database}-{gpus}"
                folder.mkdir()
                steps += run_service(f"service ({database}, {gpus} GPUs)", folder, gpus, make(folder), args,
                                     mixes, rates)
    return steps


def run_service(name: str, folder: Path, gpus: int, db, args, mixes: list[str], rates) -> list[Step]:
    """One service's sweeps, over `gpus` GPUs of which half hold a lease throughout (many holders)."""
    url, drop = db
    server = start_service(name, folder, args.server_core, url, gpus)
    steps: list[Step] = []
    try:
        setup = {"leases": asyncio.run(grant_leases(server.port, server.tokens, gpus // 2))}
        for mix in mixes:
            if args.profile:
                profile(server, mix, int(args.profile), args.seconds, setup)
            else:
                steps += sweep(server, mix, args.seconds, setup, rates[mix])
    finally:
        server.stop()
        if drop:
            drop()
    return steps


def write_markdown(path: str, body: str, args) -> None:
    """The table as a section of docs/benchmarks.md, saying how it was made."""
    command = " ".join(["python benchmarks/service_load.py", *sys.argv[1:]]).replace(f"{ROOT}/", "")
    Path(path).write_text(
        f"{QUICK_TITLE}\n\n"
        f"Measured by `{command}` on {time.strftime('%Y-%m-%d')}, CPython {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPU cores, {args.seconds:g} s per offered rate, each server pinned to core "
        f"{args.server_core} and the load generator to core {args.client_core}. A short form of the full run "
        "in [service.md](service.md), which says how to read it: compare the CPU per request and the "
        "ratios against the tornado hello app, not the knees, across runs on a shared machine.\n\n"
        + body.strip() + "\n")


def profile(server: Server, mix: str, rate: int, seconds: float, setup: dict) -> None:
    """py-spy's top frames (own time) of the service while it takes `rate` requests/s of `mix`."""
    out = Path(f"/tmp/gpualloc-pyspy-{mix}-{rate}.txt")
    spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(server.proc.pid),
                            "--format", "raw", "--output", str(out), "--duration", str(int(seconds)), "--rate", "200",
                            "--idle"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    step = measure(server, mix, rate, seconds, setup)
    spy.wait()
    print(f"{server.name} {mix} {rate}/s under py-spy: {cell(step)}; folded stacks in {out}")


def fresh_pg_database(server_url: str):
    """A new database on the server, and a function that drops it."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"gpualloc_load_{secrets.token_hex(4)}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()
    return make_url(server_url).set(database=name).render_as_string(hide_password=False), drop


if __name__ == "__main__":
    main()
