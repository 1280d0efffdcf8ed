"""`jupyter server` subprocesses: embedded mode over HTTP, and a SIGKILLed server's slices ending within the TTL."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from jupyter_gpualloc.server.kernelspecs import kernelspecs_for_offers
from tests.hubfixture import free_port
from tests.server.conftest import BIG_KERNEL, FLEET, MIG_KERNEL, OFFERS
from tests.service.conftest import ALICE, TOKENS, ServiceProcess
from tests.processes import start_logged, wait_until_ready

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SERVER_TOKEN = "server-token-123456"


HEARTBEAT_GRACE = 10.0  # s without a heartbeat before a test's kernel client calls its kernel dead


def ready_kernel_client(connection_file: Path, server: "JupyterServerProcess", timeout: float):
    """A client of a kernel the server started, from its connection file, once the kernel answers
    kernel_info; else the test fails with the server's log.

    Such a client judges the kernel alive by heartbeats alone, and by default calls it dead after
    one unanswered 1 s ping. A kernel still importing on a loaded machine (CI's three test workers
    on two cores) may not answer one yet, and wait_for_ready() then raised "Kernel died before
    replying to kernel_info"."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(connection_file))
    client.load_connection_file()
    client.hb_channel.time_to_dead = HEARTBEAT_GRACE
    client.start_channels()
    try:
        client.wait_for_ready(timeout=timeout)
    except RuntimeError as err:
        client.stop_channels()
        pytest.fail(f"{connection_file.name}: {err}\n{server.log_tail()}")
    return client


class JupyterServerProcess:
    """`jupyter server` with the shipped jupyter-config enabling the extension, plus `config`."""

    def __init__(self, workdir: Path, config: dict, env: dict[str, str] | None = None):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        config_dir = workdir / "config"
        shutil.copytree(REPO / "jupyter-config", config_dir)  # where `pip install` puts it, as a user dir
        (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
        kernels = workdir / "data" / "kernels"
        for name, spec in kernelspecs_for_offers(OFFERS).items():
            (kernels / name).mkdir(parents=True)
            (kernels / name / "kernel.json").write_text(json.dumps(spec))
        clean = {k: v for k, v in os.environ.items()
                 if not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "JUPYTER_"))}
        self.env = {**clean, "JUPYTER_CONFIG_DIR": str(config_dir),
                    "JUPYTER_DATA_DIR": str(workdir / "data"), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
                    "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60, sigint_ignored: bool = False) -> "JupyterServerProcess":
        """Start it, stdin from /dev/null (as under systemd, nohup or a hub started so: the same in a
        terminal and in CI); `sigint_ignored`: with SIGINT ignored from the start, as a shell leaves a job
        it starts in the background, else as Python's default (whatever this test process inherited)."""
        self.proc = start_logged(
            [sys.executable, "-m", "jupyter_server", "--allow-root", "--no-browser", f"--port={self.port}",
             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={SERVER_TOKEN}",
             f"--ServerApp.root_dir={self.workdir}"],
            self.workdir / "server.log", env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
            preexec_fn=functools.partial(signal.signal, signal.SIGINT,
                                         signal.SIG_IGN if sigint_ignored else signal.SIG_DFL))
        wait_until_ready(self.proc, lambda: self.call("GET", "api/status")[0] == 200, "jupyter server",
                         self.log_tail, timeout)
        return self

    def log_tail(self) -> str:
        return (self.workdir / "server.log").read_text(errors="replace")[-4000:]

    def call(self, method: str, path: str, body=None, token: str | None = SERVER_TOKEN, timeout: float = 60):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if token:
            request.add_header("Authorization", f"token {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                text = response.read().decode()
                return response.status, json.loads(text) if text else None
        except urllib.error.HTTPError as err:
            text = err.read().decode()
            return err.code, json.loads(text) if text.startswith("{") else text

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)
        self.proc = None


@pytest.fixture
def servers():
    made: list[JupyterServerProcess] = []
    yield made
    for server in made:
        running = server.proc is not None and server.proc.poll() is None
        kernels = psutil.Process(server.proc.pid).children(recursive=True) if running else []
        server.stop()
        for kernel in kernels:
            if kernel.is_running():
                kernel.kill()


def test_embedded_mode_serves_rest_api_v1_and_is_listed(tmp_path, servers):
    config = {"GpuAllocExtension": {"fleet": str(FLEET), "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
              "SchedulerPolicy": {"offers": OFFERS}}
    server = JupyterServerProcess(tmp_path, config)
    listed = subprocess.run([sys.executable, "-m", "jupyter_server", "extension", "list"], env=server.env,
                            capture_output=True, text=True, timeout=60)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)  # without the colours
    assert "jupyter_gpualloc.server enabled" in text
    assert re.search(r"jupyter_gpualloc\.server\s+OK", text)
    servers.append(server.start())
    assert server.call("GET", "gpualloc/api/v1/health", token=None)[1]["backend"] == "simulated"
    assert server.call("GET", "gpualloc/api/v1/offers", token=None)[0] == 401
    assert server.call("GET", "gpualloc/api/v1/offers", token="wrong-token")[0] == 401
    status, offers = server.call("GET", "gpualloc/api/v1/offers")
    assert status == 200 and [o["name"] for o in offers["offers"]] == [o["name"] for o in OFFERS]
    assert offers["refused_holders"] == {}  # every kind of holder can get a slice on one machine
    assert server.call("GET", "gpualloc/api/offers")[1] == offers  # the sidebar's, as the service says it
    status, lease = server.call("POST", "gpualloc/api/v1/leases", {"spec": {"profile": "1g.5gb"}, "holder": "server"})
    assert status == 201 and lease["state"] == "granted" and lease["slice"]["mig_uuid"]
    assert [l["id"] for l in server.call("GET", "gpualloc/api/v1/leases")[1]["leases"]] == [lease["id"]]
    status, ended = server.call("DELETE", f"gpualloc/api/v1/leases/{lease['id']}")
    assert status == 200 and ended["state"] == "released"
    status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
    assert status == 201
    held = [l for l in server.call("GET", "gpualloc/api/slices")[1]["slices"] if l["holder"] == f"kernel:{kernel['id']}"]
    assert held and held[0]["state"] == "granted" and held[0]["kernel"]["name"] == MIG_KERNEL
    assert server.call("DELETE", f"api/kernels/{kernel['id']}")[0] == 204
    assert server.call("GET", "gpualloc/api/v1/leases")[1]["leases"] == []


def test_killed_server_loses_its_kernels_slices_within_the_heartbeat_ttl(tmp_path, servers):
    ttl = 3.0
    service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config=(
        f"c.SchedulerPolicy.heartbeat_ttl = {ttl}\nc.GpuAllocService.tick_interval = 0.5\n"
        f"c.SchedulerPolicy.offers = {OFFERS!r}\n")).start()
    try:
        server = JupyterServerProcess(tmp_path / "server", {"GpuAllocExtension": {"report_interval": 0.5}},
                                      env={"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE})
        servers.append(server.start())
        status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
        assert status == 201, kernel
        holder = f"kernel:{kernel['id']}"
        leases = service.call("GET", "leases", token=ALICE).json()["leases"]
        assert [(l["holder"], l["state"]) for l in leases] == [(holder, "granted")]
        time.sleep(2 * ttl)  # the server's heartbeats keep it
        assert service.call("GET", f"leases/{leases[0]['id']}", token=ALICE).json()["state"] == "granted"
        kernels = psutil.Process(server.proc.pid).children(recursive=True)
        server.stop(signal.SIGKILL)
        killed_at = time.monotonic()
        while service.call("GET", f"leases/{leases[0]['id']}", token=ALICE).json()["state"] == "granted":
            assert time.monotonic() - killed_at < ttl + 3, "the slice outlived the heartbeat TTL"
            time.sleep(0.2)
        ended = service.call("GET", f"leases/{leases[0]['id']}", token=ALICE).json()
        assert ended["state"] == "expired" and "no heartbeat" in ended["reason"]
        for process in kernels:
            if process.is_running():
                process.kill()
    finally:
        service.kill()


# a cell that keeps its kernel alive through the shutdown request and the interrupt before it, until killed
STUBBORN_CELL = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    try:
        time.sleep(0.1)
    except BaseException:
        pass
"""


@pytest.mark.parametrize("mode", ["embedded", "remote"])
def test_sigterm_while_an_expired_kernel_is_being_shut_down_stops_the_server_promptly(tmp_path, servers, mode):
    # the lease's time limit: the kernel must be up and in its stubborn cell first, on a loaded machine too
    # (CI's three test workers on two cores once took more than 10 s to bring a kernel to kernel_info)
    policy = {"offers": OFFERS, "max_duration": {"kernel": 20}}
    config = {"GpuAllocExtension": {"tick_interval": 0.2, "report_interval": 0.3},
              "KernelManager": {"shutdown_wait_time": 5.0}}
    service, env = None, None
    if mode == "embedded":
        config["GpuAllocExtension"].update(fleet=str(FLEET), db_url=f"sqlite:///{tmp_path / 'db.sqlite'}")
        config["SchedulerPolicy"] = policy
    else:  # the lease's end comes over the service's event stream, which the server's stop cancels
        service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config="c.GpuAllocService.tick_interval = 0.2\n"
                                 + "".join(f"c.SchedulerPolicy.{k} = {v!r}\n" for k, v in policy.items())).start()
        env = {"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE}
    try:
        server = JupyterServerProcess(tmp_path / "server", config, env=env)
        servers.append(server.start())
        status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
        assert status == 201, kernel
        client = ready_kernel_client(tmp_path / "server" / "runtime" / f"kernel-{kernel['id']}.json", server, 30)
        try:
            client.execute(STUBBORN_CELL)
            deadline = time.monotonic() + 40
            while f"shutting down kernel {kernel['id']}" not in server.log_tail():
                assert time.monotonic() < deadline, server.log_tail()
                time.sleep(0.05)
        finally:
            client.stop_channels()
        time.sleep(0.5)  # well inside the kernel's shutdown: it ignores the request, the interrupt and SIGTERM
        os.killpg(server.proc.pid, signal.SIGTERM)
        try:
            server.proc.wait(20)
        except subprocess.TimeoutExpired:
            server.stop(signal.SIGKILL)
            pytest.fail(f"the server did not exit within 20 s of SIGTERM:\n{server.log_tail()}")
        log = (tmp_path / "server" / "server.log").read_text(errors="replace")
        assert "Traceback" not in log and "InvalidStateError" not in log, log[-4000:]
        assert f"cannot shut down kernel {kernel['id']}" not in log
    finally:
        if service is not None:
            service.kill()


def run_cell(client, code: str, timeout: float = 60) -> tuple[str, str]:
    """Run a cell through a blocking kernel client: its (stdout, stderr)."""
    return cell_output(client, client.execute(code), timeout)


def cell_output(client, msg_id: str, timeout: float = 60) -> tuple[str, str]:
    """What a cell sent to the kernel showed, once it has run: (stdout and displays as text, stderr)."""
    out = {"stdout": "", "stderr": ""}
    while True:
        msg = client.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            out[msg["content"]["name"]] += msg["content"]["text"]
        elif msg["msg_type"] in ("display_data", "execute_result"):
            out["stdout"] += msg["content"]["data"].get("text/plain", "")
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return out["stdout"], out["stderr"]


def established_ports(pid: int) -> list[int]:
    """The remote ports of a process's established TCP connections."""
    return [c.raddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr]


def test_kernels_follow_their_leases_events_through_the_servers_one_stream(tmp_path, servers):
    service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config=(
        "c.GpuAllocService.tick_interval = 0.5\nc.SchedulerPolicy.max_duration = {'kernel': 60}\n"
        f"c.SchedulerPolicy.deadline_warning = 35\nc.SchedulerPolicy.offers = {OFFERS!r}\n")).start()
    clients = []
    try:
        server = JupyterServerProcess(tmp_path / "server", {"GpuAllocExtension": {"report_interval": 0.5}},
                                      env={"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE})
        servers.append(server.start())
        relay = "gpualloc/relay/api/v1/events"
        assert server.call("GET", relay, token=None)[0] == 401
        assert server.call("GET", relay, token="wrong-token")[0] == 401
        kernel_ids = []
        for _ in range(2):
            status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
            assert status == 201, kernel
            kernel_ids.append(kernel["id"])
            client = ready_kernel_client(tmp_path / "server" / "runtime" / f"kernel-{kernel['id']}.json", server, 60)
            clients.append(client)
            stdout, stderr = run_cell(client, "%gpu status")  # the kernel holds its lease: notices follow it
            assert "1g.5gb" in stdout and not stderr, (stdout, stderr)
        # each kernel prints its own lease's deadline warning (25 s after its grant, while its cell sleeps
        # even where the kernels were slow to start), read from the relay
        sleeping = [client.execute("import time; time.sleep(30)") for client in clients]
        for client, msg_id in zip(clients, sleeping):
            _, stderr = cell_output(client, msg_id)
            assert re.search(r"^gpu: lease \w+ reaches its time limit at .*; it cannot be extended: save your work$",
                             stderr, re.M), stderr
            assert stderr.count("reaches its time limit") == 1, stderr
        # the service sees this server's stream only: the kernels' streams go to the server
        pids = {k: p.pid for p in psutil.Process(server.proc.pid).children(recursive=True)
                for k in kernel_ids if any(k in part for part in p.cmdline())}
        assert len(pids) == 2
        for pid in pids.values():
            ports = established_ports(pid)
            assert service.port not in ports and server.port in ports, ports
    finally:
        for client in clients:
            client.stop_channels()
        service.kill()


@pytest.mark.parametrize("when", ["waiting", "failed"])
def test_sigterm_stops_the_server_promptly_after_a_kernel_start_waiting_for_a_slice(tmp_path, servers, when):
    """A kernel start queued for a slice, still waiting (or failed at its wait timeout) when the server stops."""
    import threading

    wait = 300.0 if when == "waiting" else 1.0
    config = {"GpuAllocExtension": {"fleet": str(FLEET), "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}",
                                    "tick_interval": 0.2, "kernel_wait_timeout": wait},
              "SchedulerPolicy": {"offers": OFFERS}}
    server = JupyterServerProcess(tmp_path, config)
    servers.append(server.start())
    status, first = server.call("POST", "api/kernels", {"name": BIG_KERNEL})  # the whole A100
    assert status == 201, first
    # (a kernel interrupted while it imports prints a traceback of its own)
    client = ready_kernel_client(tmp_path / "runtime" / f"kernel-{first['id']}.json", server, 60)
    client.stop_channels()
    answers: list = []

    def start_second() -> None:
        try:
            answers.append(server.call("POST", "api/kernels", {"name": BIG_KERNEL}))
        except OSError as err:  # the server stopped before it answered
            answers.append(err)

    start = threading.Thread(target=start_second)
    start.start()
    deadline = time.monotonic() + 20
    while not [l for l in server.call("GET", "gpualloc/api/v1/leases")[1]["leases"] if l["state"] == "queued"]:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.1)
    if when == "failed":
        start.join(30)
        assert answers and answers[0][0] == 500, answers
        assert "No GPU slice (whole-a100) became free within 1 s" in server.log_tail()
    os.kill(server.proc.pid, signal.SIGTERM)  # as JupyterHub stops a server: the kernels are the server's to stop
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.stop(signal.SIGKILL)
        pytest.fail(f"the server did not exit within 20 s of SIGTERM:\n{server.log_tail()}")
    start.join(30)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "Traceback" not in log.split("received signal 15")[-1], log[-4000:]


@pytest.mark.parametrize("sig, sigint_ignored", [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["SIGINT", "SIGINT-ignored-at-start", "SIGTERM"])
def test_remote_server_stop_reports_its_kernels_gone_at_once(tmp_path, servers, sig, sigint_ignored):
    """JupyterHub stops a server with SIGINT (then SIGTERM): each stops it through its shutdown sequence,
    its stdin a terminal or not (under systemd or nohup it is not, and jupyter_server then leaves SIGINT
    to Python's KeyboardInterrupt, which skipped it), SIGINT ignored from its start or not (a hub started
    in a script's background passes that on). Its kernels' leases end and their slices return at once,
    not after the heartbeat TTL."""
    service = ServiceProcess(tmp_path / "service", tokens=TOKENS, config=(
        "c.SchedulerPolicy.heartbeat_ttl = 600.0\nc.GpuAllocService.tick_interval = 0.5\n"
        f"c.SchedulerPolicy.offers = {OFFERS!r}\n")).start()
    try:
        server = JupyterServerProcess(tmp_path / "server", {},
                                      env={"GPUALLOC_URL": service.url[:-len("api/v1/")], "GPUALLOC_TOKEN": ALICE})
        servers.append(server.start(sigint_ignored=sigint_ignored))
        status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
        assert status == 201, kernel
        ready_kernel_client(server.workdir / "runtime" / f"kernel-{kernel['id']}.json", server, 60).stop_channels()
        leases = service.call("GET", "leases", token=ALICE).json()["leases"]
        assert [(l["holder"], l["state"]) for l in leases] == [(f"kernel:{kernel['id']}", "granted")]
        os.kill(server.proc.pid, sig)  # the server's process alone, as a spawner signals it
        stopped_at = time.monotonic()
        while (lease := service.call("GET", f"leases/{leases[0]['id']}", token=ALICE).json())["state"] == "granted" \
                or lease["returning"]:
            assert time.monotonic() - stopped_at < 20, f"the kernel's slice is still held:\n{server.log_tail()}"
            time.sleep(0.2)
        assert lease["state"] == "released", lease
        server.proc.wait(20)
    finally:
        service.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_embedded_server_stop_releases_its_kernels_leases(tmp_path, servers, sig):
    """The provisioners cannot call the API of a server that stopped listening: the extension releases in-process."""
    config = {"GpuAllocExtension": {"fleet": str(FLEET), "db_url": f"sqlite:///{tmp_path / 'db.sqlite'}"},
              "SchedulerPolicy": {"offers": OFFERS}}
    server = JupyterServerProcess(tmp_path / "first", config)
    servers.append(server.start())
    status, kernel = server.call("POST", "api/kernels", {"name": MIG_KERNEL})
    assert status == 201, kernel
    assert [l["holder"] for l in server.call("GET", "gpualloc/api/v1/leases")[1]["leases"]] == [f"kernel:{kernel['id']}"]
    os.kill(server.proc.pid, sig)
    server.proc.wait(30)
    assert "cannot release its GPU lease" not in server.log_tail(), server.log_tail()
    again = JupyterServerProcess(tmp_path / "second", config)  # the same state database
    servers.append(again.start())
    assert again.call("GET", "gpualloc/api/v1/leases")[1]["leases"] == []  # not held until the heartbeat TTL
