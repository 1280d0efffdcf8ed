"""The JupyterHub demo: `python -m jupyter_gpualloc.hub.demo` starts hub_config/jupyterhub_config.py.

The hub listens on http://127.0.0.1:8000 (or $GPUALLOC_DEMO_IP / $GPUALLOC_DEMO_PORT, or --ip /
--port) and keeps its databases, logs and the users' homes in the runtime directory (`.demo/` in
the checkout, or $GPUALLOC_DEMO_DIR). Its internal ports (hub API, proxy API, allocator service)
are their defaults when free, else ones the system picks, unless their variables name them; a
port that is in use or named twice stops the demo before it starts, with one line naming the
variable. configurable-http-proxy is taken from the project's set-up (.venv/node) or PATH. The
demo stops, saying so, when the allocator service does not come up; stopping the demo stops the
servers it started (the config itself keeps servers across hub restarts, as production wants).
On Linux the hub gets SIGTERM when the demo process dies without a word (SIGKILL, a closed
terminal), so that no hub outlives the command that started it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import psutil

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "hub_config" / "jupyterhub_config.py"
PROXY_IN_VENV = REPO / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
# The demo's ports: the variable that sets each, its default, and what listens there.
PUBLIC_PORT = "GPUALLOC_DEMO_PORT"
PORTS = {
    PUBLIC_PORT: (8000, "the hub (the proxy's public port)"),
    "GPUALLOC_DEMO_HUB_PORT": (8081, "the hub's internal API"),
    "GPUALLOC_DEMO_PROXY_API_PORT": (8001, "the proxy's API"),
    "GPUALLOC_DEMO_SERVICE_PORT": (8765, "the allocator service"),
}
SERVICE_PREFIX = "/services/gpualloc/"
SERVICE_START_TIMEOUT = 90  # seconds the allocator service has to answer its health check
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies
STOP_TOKEN = "GPUALLOC_DEMO_STOP_TOKEN"  # the hub API token with which the demo stops the servers

GUIDE = """\
JupyterHub on GPU slices: {url}

  Log in as alice, bob or carol (any password; any other name works too), or as `admin`.
  1. The spawn form lists the GPU offers with how many are free now: pick "MIG 1g.10gb" and
     start; the progress page says "Spawning server... (on your 1g.10gb slice)" (its Event log
     lists the request and the grant). The server's CUDA_VISIBLE_DEVICES is its MIG device: in
     a JupyterLab terminal, `env | grep -E "^CUDA_|^GPUALLOC_(LEASE|SLICE|MEMORY)"` shows it
     (and not GPUALLOC_TOKEN, the service token: never print that); in a notebook, `%gpu status`.
  2. In a second browser profile, log in as bob and pick "Whole H100"; then as carol: her form
     greys "Whole H100" out, "(over your quota: at most 20 GiB)". Pick it as
     another user (e.g. dave) while bob holds it: the spawn page shows "waiting for a whole GPU
     on H100 80GB HBM3: position 1 in queue" until bob stops his server (in JupyterLab: File ->
     Hub Control Panel -> Stop My Server); then dave's server starts.
  3. As admin, the Hub Control Panel shows every server, and Services -> gpualloc opens the
     allocator's page ({url}/services/gpualloc/): every GPU and slice with who holds it, the queue
     with its reasons, usage by user, and Release, Cancel job, Drain and Undrain.
  Runtime files: {runtime}. Ctrl-C stops the hub and the servers it started.
"""


def find_proxy() -> str | None:
    if PROXY_IN_VENV.exists():
        return str(PROXY_IN_VENV)
    return shutil.which("configurable-http-proxy")


class PortError(ValueError):
    """A demo port that cannot be used; the message names its variable."""


def parse_port(var: str, raw: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise PortError(f"{var} must be a port number (1-65535), not {raw!r}")
    return int(raw)


def configured_ports(environ: dict[str, str]) -> dict[str, int]:
    """The ports the variables in `environ` name, else the defaults; refuses one used twice."""
    ports = {var: parse_port(var, environ.get(var) or str(default)) for var, (default, _) in PORTS.items()}
    check_distinct(ports)
    return ports


def check_distinct(ports: dict[str, int]) -> None:
    seen: dict[int, str] = {}
    for var, port in ports.items():
        if port in seen:
            raise PortError(f"{var} and {seen[port]} are both {port}: {PORTS[var][1]} and "
                            f"{PORTS[seen[port]][1]} need ports of their own")
        seen[port] = var


def port_in_use(ip: str, port: int) -> bool:
    """Whether something listens on ip:port (a bind as the hub, proxy and service do fails)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((ip, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def demo_ports(environ: dict[str, str], ip: str, defaults: dict[str, int] | None = None) -> dict[str, int]:
    """The demo's four ports, by variable. A port a variable names must be free and unique; an
    internal port left unset is its default when that is free and unique, else a free one."""
    defaults = defaults or {var: default for var, (default, _) in PORTS.items()}
    ports = {var: parse_port(var, environ[var]) for var in PORTS if environ.get(var)}
    ports.setdefault(PUBLIC_PORT, defaults[PUBLIC_PORT])  # the URL the guide gives: never moved silently
    check_distinct(ports)
    for var, port in ports.items():
        if port_in_use(ip if var == PUBLIC_PORT else "127.0.0.1", port):
            hint = " (or --port)" if var == PUBLIC_PORT else ""
            raise PortError(f"port {port} for {PORTS[var][1]} is in use; set {var}{hint} to a free port")
    for var in PORTS:
        if var not in ports:
            port = defaults[var]
            while port in ports.values() or port_in_use("127.0.0.1", port):
                port = free_port()
            ports[var] = port
    return {var: ports[var] for var in PORTS}


def demo_env(runtime: Path, ip: str, ports: dict[str, int], proxy: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("JUPYTERHUB_API_TOKEN", None)
    env["PATH"] = os.pathsep.join([str(Path(proxy).parent), str(Path(sys.executable).parent), env.get("PATH", "")])
    env["GPUALLOC_DEMO_DIR"] = str(runtime)
    env["GPUALLOC_DEMO_IP"] = ip
    env.update({var: str(port) for var, port in ports.items()})
    return env


def service_answers(url: str) -> bool:
    """Whether the allocator service itself (not whatever else listens there) answers its health check."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.load(reply).get("status") == "ok"
    except (OSError, ValueError, AttributeError):
        return False


def stop_leftover_proxy(runtime: Path) -> None:
    """Stop the proxy a hub that failed to start left behind (it runs in a session of its own)."""
    pid_file = runtime / "jupyterhub-proxy.pid"
    try:
        proxy = psutil.Process(int(pid_file.read_text()))
        if "configurable-http-proxy" in " ".join(proxy.cmdline()):
            proxy.terminate()
            proxy.wait(10)
    except (OSError, ValueError, psutil.Error):
        pass


def stop_servers(hub_api: str, token: str, give_up: Callable[[], bool], timeout: float = 30,
                 say: Callable[[str], None] = lambda line: print(f"demo: {line}", flush=True)) -> None:
    """Stop every user's servers through the hub's API, all at once, and wait (at most `timeout` s)
    until they have, so that each releases its GPU lease while the allocator still runs: JupyterHub's
    own shutdown stops its services before the servers. Says what it stops and how it went."""
    def call(method: str, path: str) -> Any:
        request = urllib.request.Request(hub_api + path, method=method, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            body = reply.read()
            return json.loads(body) if body else None

    def running() -> list[tuple[str, str]]:
        return [(user["name"], name) for user in call("GET", "/users?state=active") for name in user["servers"]]

    def stop(user: str, name: str) -> None:
        try:  # the hub answers once the server has stopped, or after 10 s (its slow_stop_timeout)
            call("DELETE", f"/users/{quote(user)}" + (f"/servers/{quote(name)}" if name else "/server"))
        except OSError:  # e.g. still starting: the hub's own shutdown stops it
            pass

    try:
        servers = running()
        if servers:
            started = time.monotonic()
            names = ", ".join(f"{user}/{name}" if name else user for user, name in servers)
            say(f"stopping {len(servers)} server{'s' if len(servers) > 1 else ''} ({names}) so that each gives "
                "its GPU slice back (Ctrl-C again to skip)")
            pool = ThreadPoolExecutor(max_workers=min(len(servers), 16))
            for user, name in servers:
                pool.submit(stop, user, name)
            pool.shutdown(wait=False)  # the loop below waits, and a second Ctrl-C cuts it short
            deadline = started + timeout
            while (left := running()) and time.monotonic() < deadline and not give_up():
                time.sleep(0.5)
            took = f"{time.monotonic() - started:.0f} s"
            say(f"{len(left)} still running after {took}: JupyterHub's shutdown stops them" if left
                else f"servers stopped in {took}")
        say("stopping JupyterHub, its proxy and the allocator service")
    except (OSError, ValueError, KeyError):
        pass


def term_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A function for the child to run before exec (Linux): SIGTERM it when `parent_pid` dies,
    at once if it already has. None where the kernel has no parent-death signal."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


def run_hub(command: list[str], env: dict[str, str], cwd: Path, health_url: str, timeout: float,
            before_stop: Callable[[Callable[[], bool]], None]) -> int:
    """Run JupyterHub until it exits. Ctrl-C or SIGTERM first calls `before_stop` (while the
    service runs; a second one cuts that short), then passes the signal on. When the allocator
    service does not answer within `timeout` seconds, stop the hub, saying so in one line."""
    hub = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=True, preexec_fn=term_with_parent(os.getpid()))
    received: list[int] = []
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, frame: received.append(signum))
    deadline, service_up, passed_on = time.monotonic() + timeout, False, 0
    while hub.poll() is None:
        if len(received) > passed_on:
            if service_up and not passed_on:
                before_stop(lambda: len(received) > 1)
            hub.send_signal(received[-1])
            passed_on = len(received)
        elif not service_up and not received:
            service_up = service_answers(health_url)
            if not service_up and time.monotonic() > deadline:
                print(f"error: the allocator service did not answer at {health_url} within {timeout:.0f} s "
                      "(its log is above); stopping the demo", file=sys.stderr, flush=True)
                hub.terminate()
                hub.wait()
                stop_leftover_proxy(cwd)
                return 1
        try:
            hub.wait(0.5)
        except subprocess.TimeoutExpired:
            pass
    stop_leftover_proxy(cwd)
    if not service_up and not received:
        print(f"error: the demo stopped before the allocator service was up: JupyterHub exited with status "
              f"{hub.returncode} (its log above says why)", file=sys.stderr, flush=True)
        return hub.returncode or 1
    return hub.returncode if hub.returncode >= 0 else 128 - hub.returncode  # as a shell reports a signal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter-gpualloc demo", description=__doc__.splitlines()[0])
    parser.add_argument("--ip", default=os.environ.get("GPUALLOC_DEMO_IP") or "127.0.0.1",
                        help="address the hub listens on (default $GPUALLOC_DEMO_IP, else 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port of the hub (default $GPUALLOC_DEMO_PORT, else 8000)")
    parser.add_argument("--runtime-dir", type=Path,
                        default=Path(os.environ.get("GPUALLOC_DEMO_DIR") or REPO / ".demo"),
                        help="where the hub keeps its state (default: .demo/ in the checkout)")
    parser.add_argument("--config", type=Path, default=CONFIG, help="the JupyterHub config file")
    args = parser.parse_args(argv)
    proxy = find_proxy()
    if proxy is None:
        print(f"error: configurable-http-proxy not found (looked at {PROXY_IN_VENV} and on PATH); install it "
              "with `npm install --prefix .venv/node configurable-http-proxy@4`", file=sys.stderr)
        return 1
    environ = dict(os.environ)
    if args.port is not None:
        environ[PUBLIC_PORT] = str(args.port)
    try:
        ports = demo_ports(environ, args.ip)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    runtime = args.runtime_dir.resolve()
    runtime.mkdir(parents=True, exist_ok=True)
    print(GUIDE.format(url=f"http://{args.ip}:{ports[PUBLIC_PORT]}", runtime=runtime), flush=True)
    # The config keeps servers across hub restarts (production); the demo stops what it started.
    hub = [str(Path(sys.executable).parent / "jupyterhub"), "-f", str(args.config.resolve()),
           "--JupyterHub.cleanup_servers=True"]
    health = f"http://127.0.0.1:{ports['GPUALLOC_DEMO_SERVICE_PORT']}{SERVICE_PREFIX}api/v1/health"
    hub_api = f"http://127.0.0.1:{ports['GPUALLOC_DEMO_HUB_PORT']}/hub/api"
    token = secrets.token_hex(16)  # the config grants it to a `demo-launcher` service that may stop servers
    env = demo_env(runtime, args.ip, ports, proxy) | {STOP_TOKEN: token}
    return run_hub(hub, env, runtime, health, SERVICE_START_TIMEOUT,
                   lambda give_up: stop_servers(hub_api, token, give_up))


if __name__ == "__main__":
    sys.exit(main())
