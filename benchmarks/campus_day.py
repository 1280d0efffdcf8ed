"""A simulated campus day through `jupyter-gpualloc serve` over HTTP: U users on a fleet of N GPUs,
with the service's CPU per simulated hour, time-to-GPU, event delivery and memory.

The service runs standalone (SQLite, simulated fleet of service_load.py's kinds: 40 % A100-80GB
with dynamic MIG, 40 % H100 shared by memory, 20 % L4), with one bearer token per user in its
token map (32 hex characters, as JupyterHub's per-user API tokens). One asyncio process plays
every user over raw HTTP/1.1 keep-alive connections (service_load.Connection):

* the day: the share of the U users with a running server follows a modelled campus weekday
  (DAY_CURVE: 3 % at night, 100 % at 14:00); users start and stop servers to follow it;
* each active user's server heartbeats every 30 simulated seconds (`POST /heartbeat` naming
  its kernels, its GPU server's holder and its jobs) and reports each GPU kernel's activity
  (`POST /leases/{id}/touch`: last activity, busy), and its open sidebar holds an event stream
  (`GET /events`, SSE: one connection per active user);
* one GPU server in GPU_SERVER_SHARE of the spawns (a server lease held for the session);
* GPU bursts at `--bursts` per active user-hour (Poisson), their GPU counts and durations drawn
  from the NotebookOS sensei trace's (benchmarks/data/sensei_bursts.json, see DATA_NOTE):
  1 GPU asks for a MIG 1g.10gb or an 8 GiB H100 share, 4 GPUs for a MIG 3g.40gb or a 16 GiB
  share, 8 GPUs for a whole GPU; durations capped at 4 hours. JOB_SHARE of them are background
  jobs (`POST /jobs`, batch; this process is the runner: it heartbeats them, claims them when
  their lease is granted, `start`, and reports `finish`), the others `%gpu request`s
  (`POST /leases`, a kernel holder, interactive, `wait: 0`: the grant comes on the stream).
  After a burst the user releases the slice with its kernel (RELEASE_SHARE), or leaves it idle
  for the service's idle release, then reports the kernel gone when the stream says it expired.

Time is compressed by `--compression` C: a simulated hour takes 3600/C real seconds, and the
service's clocks are scaled with it (`--tick-interval`, heartbeat TTL, idle timeout and grace,
keep-alive and activity-write intervals all divided by C), so ticks and heartbeats per simulated
hour match a real day's. Per simulated hour it reports the service's CPU seconds (utime+stime
of /proc/<pid>/stat) per simulated second measured (3,600 in a whole hour), i.e. its share of one
core had that hour run in real time, and that share times C (how busy the service was in the run);
time-to-GPU p50/p99 in simulated seconds (request to the grant's event time, through the
queue; interactive and jobs apart); event delivery p99 over every stream (receive time minus
the event's `time`, real seconds, under C times the real load); and the service's peak RSS.
Hardware counters are not available on the machine this was written on (perf: instructions not
supported), so CPU seconds are the measure; each configuration runs `--runs` times. An hour
whose heartbeats were answered later than 30 simulated seconds (p99) is marked "(behind)": the
service or the machine could not keep up at that compression, so its CPU is a lower bound.

    python benchmarks/campus_day.py   # the full size: 3,000 users, 1,500 and 10,000 GPUs, 14:00-15:00 at 2x, twice
    python benchmarks/campus_day.py --quick --markdown docs/benchmarks/campus_day_quick.md   # make bench
    python benchmarks/campus_day.py ... --profile /tmp/service.prof   # one run under cProfile: top frames
    python benchmarks/campus_day.py --derive PATH/sensei_june_60sec.csv   # rewrite the trace summary
"""

from __future__ import annotations

import argparse
import array
import asyncio
import csv
import hashlib
import json
import math
import os
import random
import resource
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import service_load  # noqa: E402  (the fleet, the connections)

DATA = HERE / "data" / "sensei_bursts.json"
DATA_NOTE = ("GPU counts and durations of the NotebookOS sensei trace (June 2021, 30,909 GPU bursts), summarised "
             "in benchmarks/data/sensei_bursts.json by `--derive`; the trace itself is not needed to run")
# Share of the users with a running server, per hour of a modelled campus weekday (the trace's own
# hour-of-day curve is nearly flat, 3.7-4.8 % of bursts an hour: a platform across time zones).
DAY_CURVE = [0.08, 0.05, 0.03, 0.03, 0.03, 0.03, 0.05, 0.12, 0.30, 0.60, 0.85, 0.95,
             0.90, 0.95, 1.00, 0.95, 0.85, 0.65, 0.45, 0.40, 0.38, 0.32, 0.25, 0.15]
HEARTBEAT_S = 30.0  # the server extension's report_interval
GPU_SERVER_SHARE = 0.2  # spawns that ask for a GPU slice for the server itself
JOB_SHARE = 0.15  # bursts run as background jobs
RELEASE_SHARE = 0.7  # bursts whose slice the user gives back at once; the rest wait for idle release
MAX_BURST_S = 4 * 3600.0
SHAPES = {1: [{"kind": "mig", "profile": "1g.10gb"}, {"kind": "shared", "memory_gib": 8, "model": "H100-80GB"}],
          4: [{"kind": "mig", "profile": "3g.40gb"}, {"kind": "shared", "memory_gib": 16, "model": "H100-80GB"}],
          8: [{"kind": "whole"}]}
SERVER_SHAPES = SHAPES[1]
TARGETS = ("the issue's, for 3,000 users on 10,000 GPUs: peak hour under 25 % of one core, event delivery p99 "
           "under 1 s, RSS under 1 GiB")
QUICK = {"users": 300, "gpus": "150", "start": 14.0, "hours": 0.25, "compression": 15.0, "runs": 2, "warmup": 300.0}
TITLE = "# A campus day through the service: CPU per simulated hour, time-to-GPU, events, memory"
QUICK_TITLE = "# A campus day through the service: a quick run"


# ------------------------------------------------------------------ the trace's summary


def derive(trace: Path) -> dict:
    """The summary of the sensei CSV this benchmark draws from (GPU counts, duration percentiles)."""
    raw = trace.read_bytes()
    rows = list(csv.DictReader(raw.decode().splitlines()))
    gpus = np.array([int(r["num_gpu"]) for r in rows])
    minutes = np.array([float(r["duration"]) for r in rows])
    hours = (np.array([int(r["submit_time"]) for r in rows]) // 60) % 24
    counts = {str(n): int((gpus == n).sum()) for n in sorted(set(gpus.tolist()))}
    return {
        "source": "GitHub ds2-lab/NotebookOS-Dashboard, driver-backend/scripts/tiresias_generator/sensei_june_60sec.csv "
                  "(MIT); shared/data/notebookos-sensei-june2021/PROVENANCE.md",
        "sha256": hashlib.sha256(raw).hexdigest(), "rows": len(rows),
        "num_gpu": counts,
        "duration_minutes_percentiles": [float(v) for v in np.percentile(minutes, np.arange(101))],
        "hour_of_day_share": [round(float(c) / len(rows), 4) for c in np.bincount(hours, minlength=24)],
    }


@dataclass
class Bursts:
    """Draws a burst's GPU count and duration (simulated seconds) from the summary."""

    counts: list[int]
    weights: list[float]
    percentiles: list[float]

    @classmethod
    def load(cls, path: Path) -> "Bursts":
        data = json.loads(path.read_text())
        counts = sorted(int(n) for n in data["num_gpu"])
        return cls(counts, [data["num_gpu"][str(n)] for n in counts], data["duration_minutes_percentiles"])

    def draw(self, rng: random.Random) -> tuple[int, float]:
        gpus = rng.choices(self.counts, self.weights)[0]
        at = rng.random() * 100
        low = int(at)
        minutes = self.percentiles[low] + (self.percentiles[min(low + 1, 100)] - self.percentiles[low]) * (at - low)
        return gpus, min(minutes * 60.0, MAX_BURST_S)


# ------------------------------------------------------------------ the service


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Service:
    """`jupyter-gpualloc serve` on SQLite over `gpus` GPUs, its clocks divided by `compression`."""

    def __init__(self, work: Path, gpus: int, tokens: dict[str, str], compression: float, profile: str | None):
        self.port = free_port()
        (work / "fleet.yaml").write_text(service_load.fleet_yaml(gpus))
        c = compression
        config = {"c.GpuAllocService.api_tokens": {t: {"user": u} for u, t in tokens.items()},
                  "c.GpuAllocService.activity_interval": 1.0 / c, "c.GpuAllocService.keepalive_interval": 15.0 / c,
                  "c.SchedulerPolicy.heartbeat_ttl": 120.0 / c, "c.SchedulerPolicy.idle_timeout": 1800.0 / c,
                  "c.SchedulerPolicy.idle_grace": 300.0 / c, "c.SchedulerPolicy.reserve_after": 600.0 / c}
        (work / "gpualloc_config.py").write_text("".join(f"{k} = {v!r}\n" for k, v in config.items()))
        run = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
        argv = run + ["-m", "jupyter_gpualloc.cli", "serve", "--port", str(self.port),
                      "--fleet", str(work / "fleet.yaml"), "--db", f"sqlite:///{work / 'service.sqlite'}",
                      "-f", str(work / "gpualloc_config.py"), "--audit-log", str(work / "audit.jsonl"),
                      "--tick-interval", str(5.0 / c), "--log-level", "WARN"]
        self.proc = subprocess.Popen(argv, cwd=work, stdout=subprocess.DEVNULL,
                                     stderr=open(work / "service.log", "ab"), start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the service exited with {self.proc.returncode}; see {work}/service.log")
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("the service did not start")

    def cpu_seconds(self) -> float:
        return service_load.cpu_seconds(self.proc.pid)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


# ------------------------------------------------------------------ the users


@dataclass
class Hour:
    """What one simulated hour measured."""

    cpu_start: float = 0.0
    cpu_s: float = 0.0
    rss_mib: float = 0.0
    active: int = 0
    requests: int = 0
    errors: int = 0
    waits: list = field(default_factory=list)  # interactive time-to-GPU, simulated s
    job_waits: list = field(default_factory=list)
    delivery: array.array = field(default_factory=lambda: array.array("d"))  # real s
    refused: int = 0
    beat_lags: list = field(default_factory=list)  # simulated s from a heartbeat's due time to its answer


@dataclass
class Kernel:
    holder: str
    lease_id: str | None = None
    busy: bool = True
    last_activity: float = 0.0


@dataclass
class User:
    name: str
    token: str
    active: bool = False
    task: asyncio.Task | None = None
    stream: asyncio.Transport | None = None
    server_lease: str | None = None
    kernels: dict = field(default_factory=dict)  # holder -> Kernel
    jobs: dict = field(default_factory=dict)  # job id -> its holder's events (asyncio.Queue)
    bursts: set = field(default_factory=set)
    serial: int = 0


class Sidebar(asyncio.Protocol):
    """One user's event stream: delivery time of every event; the user's lease events handed on."""

    def __init__(self, day: "Day", user: User):
        self.day, self.user, self.buffer = day, user, b""

    def connection_made(self, transport) -> None:
        transport.write(f"GET /api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {self.user.token}"
                        f"\r\nAccept: text/event-stream\r\n\r\n".encode())

    def data_received(self, data: bytes) -> None:
        now = time.time()
        buffer = self.buffer + data
        delivery = self.day.hour().delivery
        at = 0
        while True:  # each event is one `data: {json}` line, whole in one chunk of the chunked answer
            start = buffer.find(b"data: ", at)
            end = buffer.find(b"\n", start) if start >= 0 else -1
            if end < 0:
                break
            line = buffer[start + 6:end]
            at = end
            stamp = line.find(b'"time":')  # the service writes compact JSON, its type first
            if stamp < 0:
                continue
            delivery.append(now - float(line[stamp + 7:line.index(b",", stamp)]))
            kind = line[9:line.find(b'"', 9)]
            self.day.kinds[kind] = self.day.kinds.get(kind, 0) + 1
            if line.startswith((b'{"type":"lease.', b'{"type":"job.')):
                self.day.on_event(self.user, json.loads(line))
        self.buffer = buffer[at:] if at else buffer[-65536:]

    def connection_lost(self, exc) -> None:
        if self.user.active and self.user.stream is not None:
            self.day.lost_streams += 1


class Day:
    """The users of one run and their day against one service."""

    def __init__(self, args, service: Service, tokens: dict[str, str], bursts: Bursts, seed: int):
        self.args, self.service, self.bursts = args, service, bursts
        self.c = args.compression
        self.rng = random.Random(seed)
        self.users = [User(name, token) for name, token in tokens.items()]
        self.hours: dict[int, Hour] = {}
        self.grants: dict[str, asyncio.Future] = {}  # lease id or holder -> its grant's event time
        self.early: dict[str, float] = {}  # grants seen on a stream before the answer named the lease
        self.pool: asyncio.Queue = asyncio.Queue()
        self.lost_streams = 0
        self.kinds: dict[bytes, int] = {}  # events delivered, by type, over every stream
        self.tasks: set[asyncio.Task] = set()

    # clocks: the simulated time of day, in seconds
    def sim(self) -> float:
        return self.sim0 + (time.time() - self.t0) * self.c

    def real_at(self, sim: float) -> float:
        return self.t0 + (sim - self.sim0) / self.c

    def hour(self) -> Hour:
        return self.hours.setdefault(int(self.sim() // 3600), Hour())

    async def sleep_sim(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds / self.c))

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            print(f"  load task failed: {task.exception()!r}", flush=True)

    async def call(self, method: str, path: str, user: User, body: dict | None = None) -> tuple[int, bytes]:
        conn = await self.pool.get()
        try:
            status, answer = await conn.request(method, "/api/v1" + path, user.token, body)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            conn.close()
            status, answer = 599, b""
        except BaseException:  # cancelled mid-request: its answer must not be read as the next one's
            conn.close()
            raise
        finally:
            self.pool.put_nowait(conn)
        hour = self.hour()
        hour.requests += 1
        hour.errors += status >= 500 or status in (400, 401)
        return status, answer

    # ---------------------------------------------------------- the run
    async def run(self) -> None:
        for _ in range(self.args.connections):
            self.pool.put_nowait(service_load.Connection(self.service.port))
        self.sim0 = self.args.start * 3600 - self.args.warmup
        self.t0 = time.time()
        self.end = self.args.start * 3600 + self.args.hours * 3600
        monitor = self.spawn(self.monitor())
        try:
            while self.sim() < self.end:
                self.follow_curve()
                await self.sleep_sim(min(60.0, self.end - self.sim()))
            last = self.hours.get(int((self.end - 1) // 3600))
            if last is not None and not last.cpu_s:
                last.cpu_s = self.service.cpu_seconds() - last.cpu_start
        finally:
            monitor.cancel()
            for user in self.users:
                if user.task is not None:
                    user.task.cancel()
                if user.stream is not None:
                    user.stream.close()
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            while not self.pool.empty():
                self.pool.get_nowait().close()

    def target(self, sim: float) -> int:
        """Users with a running server at `sim` (the curve, linear between the hours' middles)."""
        h = sim / 3600 - 0.5
        low = math.floor(h)
        share = DAY_CURVE[low % 24] + (DAY_CURVE[(low + 1) % 24] - DAY_CURVE[low % 24]) * (h - low)
        return round(share * len(self.users))

    def follow_curve(self) -> None:
        """Start or stop servers, spread over the next simulated minute, to follow the day's curve."""
        now = self.sim()
        active = [u for u in self.users if u.active]
        want = self.target(now + 60.0) if now >= self.args.start * 3600 else self.target(self.args.start * 3600)
        if now < self.args.start * 3600:  # warm-up: the window's first users arrive over WARMUP_S
            want = round(want * min(1.0, (now + 60.0 - self.sim0) / self.args.warmup))
        if want > len(active):
            idle = [u for u in self.users if not u.active and u.task is None]
            for user in self.rng.sample(idle, min(len(idle), want - len(active))):
                user.active = True
                user.task = self.spawn(self.session(user, self.rng.uniform(0, 60)))
        elif want < len(active):
            for user in self.rng.sample(active, len(active) - want):
                user.active = False

    async def monitor(self) -> None:
        """The service's CPU seconds at each simulated hour's start, its RSS, the active users."""
        current = None
        while True:
            number = int(self.sim() // 3600)
            hour = self.hour()
            if number != current:
                hour.cpu_start = self.service.cpu_seconds()
                if current is not None:
                    self.hours[current].cpu_s = hour.cpu_start - self.hours[current].cpu_start
                current = number
            hour.rss_mib = max(hour.rss_mib, self.service.rss_mib())
            stale = time.time() - 60
            for key in [k for k, at in self.early.items() if at < stale]:  # grants answered 201 (or never asked)
                del self.early[key]
            hour.active = max(hour.active, sum(u.active for u in self.users))
            await asyncio.sleep(min(1.0, max(0.05, (number + 1) * 3600 / self.c - self.sim() / self.c)))

    # ---------------------------------------------------------- one user's session
    async def session(self, user: User, delay: float) -> None:
        try:
            await self.sleep_sim(delay)
            loop = asyncio.get_running_loop()
            user.stream, _ = await loop.create_connection(lambda: Sidebar(self, user), "127.0.0.1", self.service.port)
            user.kernels = {f"kernel:{user.name}-cpu": Kernel(f"kernel:{user.name}-cpu", busy=False)}
            if self.rng.random() < GPU_SERVER_SHARE:
                user.server_lease = await self.request(user, "server", self.rng.choice(SERVER_SHAPES))
            next_beat = self.sim() + self.rng.uniform(0, HEARTBEAT_S)
            next_burst = self.sim() + self.rng.expovariate(self.args.bursts / 3600)
            while user.active:
                due = min(next_beat, next_burst)
                await self.sleep_sim(min(due - self.sim(), HEARTBEAT_S))
                if self.sim() >= next_beat:
                    next_beat += HEARTBEAT_S
                    self.spawn(self.heartbeat(user))
                if self.sim() >= next_burst:
                    next_burst += self.rng.expovariate(self.args.bursts / 3600)
                    burst = self.spawn(self.job(user) if self.rng.random() < JOB_SHARE else self.kernel(user))
                    user.bursts.add(burst)
                    burst.add_done_callback(user.bursts.discard)
            await self.stop_server(user)
        finally:
            if user.stream is not None:
                user.stream.close()
            user.stream, user.task, user.active = None, None, False

    async def stop_server(self, user: User) -> None:
        """The user stops the server: its kernels end, its jobs are cancelled, its GPU slice returns."""
        for burst in list(user.bursts):
            burst.cancel()
        await asyncio.gather(*user.bursts, return_exceptions=True)
        for job_id in list(user.jobs):
            await self.call("DELETE", f"/jobs/{job_id}", user)
        user.jobs.clear()
        holders = list(user.kernels)
        if holders:
            await self.call("POST", "/holders/gone", user, {"holders": holders})
        user.kernels.clear()
        if user.server_lease:
            await self.call("DELETE", f"/leases/{user.server_lease}?holder_gone=true", user)
            user.server_lease = None

    async def heartbeat(self, user: User) -> None:
        due = self.sim()
        holders = list(user.kernels) + (["server"] if user.server_lease else []) + [f"job:{j}" for j in user.jobs]
        await self.call("POST", "/heartbeat", user, {"holders": holders})
        self.hour().beat_lags.append(self.sim() - due)
        for kernel in list(user.kernels.values()):
            if kernel.lease_id is not None:
                await self.call("POST", f"/leases/{kernel.lease_id}/touch", user,
                                {"last_activity": kernel.last_activity, "busy": kernel.busy, "connections": 1})

    def spec(self, gpus: int) -> dict:
        return self.rng.choice(SHAPES[gpus] if gpus in SHAPES else SHAPES[8])

    async def request(self, user: User, holder: str, spec: dict) -> str | None:
        """POST /leases (interactive, wait 0) and wait for the grant; the lease id, or None if refused."""
        asked, hour = time.time(), self.hour()
        status, body = await self.call("POST", "/leases", user, {"spec": spec, "holder": holder, "wait": 0})
        if status not in (201, 202):
            hour.refused += 1
            return None
        lease = json.loads(body)
        if status == 201:
            granted = lease["granted_at"]
        else:
            granted = await self.grant(lease["id"])
        hour.waits.append((granted - asked) * self.c)
        return lease["id"]

    async def grant(self, key: str) -> float:
        if key in self.early:
            return self.early.pop(key)
        future = self.grants[key] = asyncio.get_running_loop().create_future()
        try:
            return await future
        finally:
            self.grants.pop(key, None)

    def on_event(self, user: User, event: dict) -> None:
        kind, lease_id, data = event["type"], event["lease_id"], event.get("data") or {}
        holder = data.get("holder", "")
        if kind == "lease.granted":
            key = holder if holder.startswith("job:") else lease_id
            future = self.grants.get(key)
            if future is not None and not future.done():
                future.set_result(event["time"])
            elif future is None:
                self.early[key] = event["time"]
        elif kind in ("lease.expired", "lease.preempted"):
            if holder.startswith("job:") and holder[4:] in user.jobs:
                user.jobs[holder[4:]].put_nowait(kind)
            elif holder in user.kernels and kind == "lease.expired" and user.active:
                del user.kernels[holder]  # the server's monitor shuts the kernel down and says it is gone
                self.spawn(self.call("POST", "/holders/gone", user, {"holders": [holder]}))

    async def kernel(self, user: User) -> None:
        """A `%gpu request` in a new kernel, a burst on the slice, then release or idle."""
        gpus, seconds = self.bursts.draw(self.rng)
        user.serial += 1
        kernel = Kernel(f"kernel:{user.name}-{user.serial}", last_activity=time.time())
        user.kernels[kernel.holder] = kernel
        lease_id = await self.request(user, kernel.holder, self.spec(gpus))
        if lease_id is None:
            user.kernels.pop(kernel.holder, None)
            return
        kernel.lease_id = lease_id
        await self.sleep_sim(seconds)
        kernel.busy, kernel.last_activity = False, time.time()
        if self.rng.random() < RELEASE_SHARE and user.kernels.pop(kernel.holder, None) is not None:
            await self.call("DELETE", f"/leases/{lease_id}?holder_gone=true", user)

    async def job(self, user: User) -> None:
        """A background job: submitted, claimed when granted, run (again if preempted), finished."""
        gpus, seconds = self.bursts.draw(self.rng)
        asked, hour = time.time(), self.hour()
        status, body = await self.call("POST", "/jobs", user, {
            "name": "train", "spec": self.spec(gpus), "workdir": f"/home/{user.name}",
            "source": {"kind": "notebook", "path": "train.ipynb"}})
        if status != 201:
            hour.refused += 1
            return
        job_id = json.loads(body)["id"]
        ends = user.jobs[job_id] = asyncio.Queue()
        first = True
        try:
            while seconds > 0:
                granted = await self.grant(f"job:{job_id}")
                if first:
                    hour.job_waits.append((granted - asked) * self.c)
                    first = False
                status, body = await self.call("POST", f"/jobs/{job_id}/start", user, {"runner": "server"})
                if status != 200:
                    continue
                attempt = json.loads(body)["attempts"]
                started = self.sim()
                ended = asyncio.ensure_future(ends.get())
                done, _ = await asyncio.wait([ended], timeout=seconds / self.c)
                if not done:
                    ended.cancel()
                    await self.call("POST", f"/jobs/{job_id}/finish", user,
                                    {"attempt": attempt, "outcome": "succeeded"})
                    break
                seconds -= self.sim() - started  # preempted or expired: the job is queued again
        finally:
            user.jobs.pop(job_id, None)


# ------------------------------------------------------------------ runs and report


def tokens_for(users: int) -> dict[str, str]:
    return {f"u{n:05d}": secrets.token_hex(16) for n in range(users)}


def one_run(args, gpus: int, run: int, bursts: Bursts, profile: str | None = None) -> dict:
    tokens = tokens_for(args.users)
    with tempfile.TemporaryDirectory(prefix="gpualloc-campus-") as tmp:
        service = Service(Path(tmp), gpus, tokens, args.compression, profile)
        try:
            started_cpu = service.cpu_seconds()
            day = Day(args, service, tokens, bursts, seed=1000 * run + gpus)
            wall = time.monotonic()
            asyncio.run(day.run())
            wall = time.monotonic() - wall
            rss_end = service.rss_mib()
        finally:
            service.stop()
    first = int(args.start)
    hours = []
    for number in sorted(h for h in day.hours if first <= h < args.start + args.hours):
        hour = day.hours[number]
        covered = min(day.end, (number + 1) * 3600) - max(args.start * 3600, number * 3600)  # a part-hour's share
        delivery = np.frombuffer(hour.delivery, dtype=float) if len(hour.delivery) else np.array([math.nan])
        pct = lambda values, q: float(np.percentile(values, q)) if values else math.nan  # noqa: E731
        hours.append({"hour": number, "active": hour.active, "requests": hour.requests, "errors": hour.errors,
                      "refused": hour.refused, "cpu_s": hour.cpu_s, "simulated_s": covered,
                      "core_share": hour.cpu_s / covered,
                      "wait_p50": pct(hour.waits, 50), "wait_p99": pct(hour.waits, 99), "grants": len(hour.waits),
                      "job_wait_p50": pct(hour.job_waits, 50), "job_wait_p99": pct(hour.job_waits, 99),
                      "events": len(hour.delivery), "delivery_p99": float(np.percentile(delivery, 99)),
                      "rss_mib": hour.rss_mib, "busy_in_run": hour.cpu_s / covered * args.compression,
                      "heartbeat_lag_p99": pct(hour.beat_lags, 99)})
    return {"gpus": gpus, "users": args.users, "run": run, "compression": args.compression, "wall_s": wall,
            "startup_cpu_s": started_cpu, "rss_end_mib": rss_end, "lost_streams": day.lost_streams, "hours": hours,
            "events_by_type": {k.decode(): n for k, n in sorted(day.kinds.items(), key=lambda kn: -kn[1])}}


def table(runs: list[dict]) -> str:
    lines = ["| fleet | users | run | hour | active | requests | CPU s | share of a core | time-to-GPU p50 / p99 "
             "(interactive, grants) | jobs p50 / p99 | events delivered | delivery p99 | RSS | busy in the run "
             "| heartbeat answered p99 |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        for h in r["hours"]:
            lines.append(
                f"| {r['gpus']:,} | {r['users']:,} | {r['run']} | {h['hour']:02d}:00{part(h)} | {h['active']:,} "
                f"| {h['requests']:,} | {h['cpu_s']:.0f} | {h['core_share'] * 100:.1f} % "
                f"| {seconds(h['wait_p50'])} / {seconds(h['wait_p99'])} ({h['grants']:,}) "
                f"| {seconds(h['job_wait_p50'])} / {seconds(h['job_wait_p99'])} "
                f"| {h['events']:,} | {h['delivery_p99'] * 1000:.0f} ms | {h['rss_mib']:.0f} MiB "
                f"| {h['busy_in_run'] * 100:.0f} % | {seconds(h['heartbeat_lag_p99'])}{behind(h)} |")
    return "\n".join(lines) + "\n"


def part(hour: dict) -> str:
    return "" if hour["simulated_s"] >= 3600 else f" ({hour['simulated_s'] / 60:.0f} min)"


def behind(hour: dict) -> str:
    """A mark on an hour whose heartbeats went out late: the load fell behind (the machine or the
    service could not keep up at this compression), so its CPU figure is a lower bound."""
    return " (behind)" if not hour["heartbeat_lag_p99"] <= HEARTBEAT_S else ""


def seconds(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def verdict(runs: list[dict]) -> str:
    lines = []
    for r in runs:
        peak = max(r["hours"], key=lambda h: h["core_share"])
        delivery = max(h["delivery_p99"] for h in r["hours"])
        rss = max(h["rss_mib"] for h in r["hours"])
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        lines.append(f"- {r['gpus']:,} GPUs, {r['users']:,} users, run {r['run']} ({r['wall_s']:.0f} s wall): "
                     f"peak hour {peak['hour']:02d}:00 at {peak['core_share'] * 100:.1f} % of a core "
                     f"({met(peak['core_share'] < 0.25)}); delivery p99 at most {delivery * 1000:.0f} ms "
                     f"({met(delivery < 1.0)}); RSS at most {rss:.0f} MiB ({met(rss < 1024)}); start-up "
                     f"{r['startup_cpu_s']:.1f} CPU s; streams lost {r['lost_streams']}; events delivered by type "
                     f"(warm-up included): {', '.join(f'{k} {n:,}' for k, n in list(r['events_by_type'].items())[:5])}.")
    return "\n".join(lines) + "\n"


def top_frames(profile: str, count: int = 15) -> str:
    import pstats
    stats = pstats.Stats(profile)
    total = stats.total_tt
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:count]
    lines = ["| own time | share | cumulative | calls | function |", "|---:|---:|---:|---:|---|"]
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        where = path.split("site-packages/")[-1].split("jupyter_gpualloc/")[-1] if path != "~" else ""
        lines.append(f"| {own:.1f} s | {own / total * 100:.1f} % | {cumulative:.1f} s | {calls:,} "
                     f"| `{name}` {where}:{line} |")
    return (f"Profiled: {total:.0f} s of the service's wall time (cProfile's timer: start-up, idle waits and its own "
            "overhead included; compare proportions only).\n\n" + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--gpus", default="1500,10000", help="fleet sizes, comma separated")
    parser.add_argument("--start", type=float, default=14.0, help="the window's first simulated hour of the day")
    parser.add_argument("--hours", type=float, default=1.0, help="simulated hours measured")
    parser.add_argument("--warmup", type=float, default=900.0,
                        help="simulated seconds before the window, not reported, over which its first users arrive")
    parser.add_argument("--compression", type=float, default=2.0, help="simulated seconds per real second")
    parser.add_argument("--bursts", type=float, default=1.0, help="GPU bursts per active user-hour")
    parser.add_argument("--runs", type=int, default=2, help="runs of each fleet size")
    parser.add_argument("--connections", type=int, default=32, help="keep-alive connections for requests")
    parser.add_argument("--quick", action="store_true", help=f"what run_all.py runs: {QUICK}")
    parser.add_argument("--profile", help="one more run of the first fleet under cProfile, its stats here")
    parser.add_argument("--json", help="write the raw figures here")
    parser.add_argument("--markdown", help="write the tables to this markdown file")
    parser.add_argument("--derive", type=Path, help="rewrite the trace summary from the sensei CSV, then stop")
    args = parser.parse_args()
    if args.derive:
        DATA.parent.mkdir(exist_ok=True)
        DATA.write_text(json.dumps(derive(args.derive), indent=1) + "\n")
        print(f"wrote {DATA}")
        return
    if args.quick:
        for name, value in QUICK.items():
            if f"--{name}" not in sys.argv:
                setattr(args, name, value)
    if not DATA.is_file():
        print(f"campus_day.py: skipped: the trace summary {DATA} is missing (rewrite it with --derive)")
        return
    bursts = Bursts.load(DATA)
    signal.signal(signal.SIGTERM, interrupted)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a stream per active user, here and in the service
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    runs = []
    for gpus in (int(n) for n in str(args.gpus).split(",")):
        for run in range(1, args.runs + 1):
            print(f"== {gpus} GPUs, {args.users} users, run {run}: simulated {args.start:g}:00 + {args.hours:g} h "
                  f"at {args.compression:g}x", flush=True)
            runs.append(one_run(args, gpus, run, bursts))
            print(table([runs[-1]]) + verdict([runs[-1]]), flush=True)
    profiled = ""
    if args.profile:
        gpus = int(str(args.gpus).split(",")[0])
        print(f"== {gpus} GPUs under cProfile", flush=True)
        one_run(args, gpus, 0, bursts, profile=args.profile)
        profiled = top_frames(args.profile)
        print(profiled)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    if args.markdown:
        write_markdown(args, runs, profiled)


def interrupted(*_) -> None:
    raise KeyboardInterrupt  # the runs' `finally` stop the service


def write_markdown(args, runs: list[dict], profiled: str) -> None:
    command = " ".join(["python benchmarks/campus_day.py", *sys.argv[1:]]).replace(f"{HERE.parent}/", "")
    title = QUICK_TITLE if args.quick else TITLE
    text = (f"{title}\n\nMeasured by `{command}` on {time.strftime('%Y-%m-%d')}, CPython {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPU cores (shared), {args.users:,} users, simulated {args.start:g}:00 + {args.hours:g} h "
            f"at {args.compression:g}x, {args.bursts:g} GPU bursts per active user-hour; {DATA_NOTE}. What is "
            "modelled, the full-size figures and how to read them: [campus_day.md](campus_day.md). Targets: "
            f"{TARGETS}.\n\n" + table(runs) + "\n" + verdict(runs) + (f"\n{profiled}" if profiled else ""))
    Path(args.markdown).write_text(text)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
