"""A real JupyterHub for tests: subprocess, free loopback ports, its own temporary directory.

    hub = Hub(tmp_path, services=[gpualloc_service(tmp_path, fleet)], roles=gpualloc_roles(["ada"]),
              custom_scopes=GPUALLOC_CUSTOM_SCOPES)
    hub.start()
    hub.wait_for_service("gpualloc")
    hub.add_users("alice", "bob")
    token = hub.token("alice")
    env = hub.spawn("alice")          # a minimal single-user server; returns its environment
    hub.stop()                        # kills the hub, the proxy, managed services and servers

The hub uses DummyAuthenticator, the `simple` local-process spawner and the configurable-http-proxy
the project's set-up installs (`npm install --prefix .venv/node configurable-http-proxy@4`). The
single-user "server" it spawns is a tiny HTTP server that answers every request and records the
environment JupyterHub gave it (so tests get a real server token), unless `spawner_cmd` says otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterable

import psutil

REPO_ROOT = Path(__file__).resolve().parent.parent
CHP_IN_VENV = REPO_ROOT / ".venv" / "node" / "node_modules" / ".bin" / "configurable-http-proxy"
ADMIN_SERVICE = "hub-test-admin"

FAKE_SERVER = r'''
"""A stand-in single-user server: answers 200 everywhere and records its environment."""
import json, os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

out = Path(sys.argv[1]) / f"server-env-{os.environ['JUPYTERHUB_USER']}.json"
out.write_text(json.dumps({k: v for k, v in os.environ.items()
                          if k.startswith(("JUPYTERHUB_", "GPUALLOC_", "CUDA_", "NVIDIA_"))}))

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"user": os.environ["JUPYTERHUB_USER"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
try:
    ThreadingHTTPServer((url.hostname, url.port), Handler).serve_forever()
except KeyboardInterrupt:
    pass
'''


GPUALLOC_ADMIN_SCOPE = "custom:gpualloc:admin"
GPUALLOC_CUSTOM_SCOPES = {
    GPUALLOC_ADMIN_SCOPE: {"description": "Administer the GPU allocator: every lease, drain GPUs, metrics."},
}


def gpualloc_service(workdir: Path, fleet: Path, *args: str, port: int | None = None) -> dict:
    """The JupyterHub service entry running `jupyter-gpualloc serve` over a simulated fleet."""
    return {
        "name": "gpualloc", "url": f"http://127.0.0.1:{port or free_port()}", "oauth_no_confirm": True,
        "cwd": str(workdir),
        "command": [sys.executable, "-m", "jupyter_gpualloc.cli", "serve", "--fleet", str(fleet),
                    "--db", f"sqlite:///{Path(workdir) / 'gpualloc.sqlite'}", *args],
    }


def gpualloc_roles(admins: Iterable[str] = ()) -> list[dict]:
    """Roles letting users and their servers' tokens use the service, and `admins` administer it."""
    return [
        {"name": "user", "scopes": ["self", "access:services!service=gpualloc"]},
        {"name": "server", "scopes": ["users:activity!user", "access:servers!server",
                                      "access:services!service=gpualloc"]},
        {"name": "gpualloc-admin", "scopes": [GPUALLOC_ADMIN_SCOPE], "users": list(admins)},
    ]


def _ports_below_the_ephemeral_range() -> range:
    """15000 up to the kernel's first ephemeral port (32768 on Linux by default)."""
    try:
        first = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(15000, first) if first - 15000 >= 1000 else range(0)


def free_port() -> int:
    """A loopback port free now, for a server a test starts. Drawn at random from below the
    kernel's ephemeral range where it can: a port of that range (the kernel's pick for port 0,
    for every outgoing connection, for each kernel's ZMQ sockets) can be taken by another process
    between this check and the server's bind, which on a busy machine fails the test's start."""
    candidates = _ports_below_the_ephemeral_range()
    for _ in range(100 if candidates else 0):
        port = secrets.choice(candidates)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_proxy() -> Path:
    """configurable-http-proxy from the project's set-up, else from PATH; a clear error if neither."""
    if CHP_IN_VENV.exists():
        return CHP_IN_VENV
    found = shutil.which("configurable-http-proxy")
    if found:
        return Path(found)
    raise RuntimeError(f"configurable-http-proxy not found (looked at {CHP_IN_VENV} and on PATH): "
                       "run `make test`, whose set-up installs it from the npm registry")


def http_json(method: str, url: str, body: Any = None, token: str | None = None,
              timeout: float = 30) -> tuple[int, Any]:
    """One HTTP request with a JSON body; returns (status, decoded JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, text


class Hub:
    """One JupyterHub process (with its proxy, managed services and spawned servers)."""

    def __init__(self, workdir: Path, *, services: Iterable[dict] = (), roles: Iterable[dict] = (),
                 custom_scopes: dict | None = None, extra_config: str = "", spawner_cmd: list[str] | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port, self.hub_port, self.proxy_api_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_url = f"http://127.0.0.1:{self.hub_port}/hub/api"
        self.admin_token = secrets.token_hex(16)
        self.services = list(services)
        self.roles = list(roles)
        self.custom_scopes = dict(custom_scopes or {})
        self.extra_config = extra_config
        self.spawner_cmd = spawner_cmd
        self.log_path = self.workdir / "jupyterhub.log"
        self.proc: subprocess.Popen | None = None
        self._log = None

    # ------------------------------------------------------------ lifecycle
    def config_text(self) -> str:
        fake = self.workdir / "fake_server.py"
        fake.write_text(FAKE_SERVER)
        services = [{"name": ADMIN_SERVICE, "api_token": self.admin_token}, *self.services]
        roles = [{"name": "hub-test-admin", "scopes": ["admin:users", "admin:servers", "tokens", "read:services"],
                  "services": [ADMIN_SERVICE]}, *self.roles]
        settings = {
            "JupyterHub.ip": "127.0.0.1", "JupyterHub.port": self.port,
            "JupyterHub.hub_ip": "127.0.0.1", "JupyterHub.hub_port": self.hub_port,
            "JupyterHub.public_url": self.url,
            "ConfigurableHTTPProxy.api_url": f"http://127.0.0.1:{self.proxy_api_port}",
            "ConfigurableHTTPProxy.pid_file": str(self.workdir / "proxy.pid"),
            "JupyterHub.db_url": f"sqlite:///{self.workdir / 'jupyterhub.sqlite'}",
            "JupyterHub.cookie_secret_file": str(self.workdir / "jupyterhub_cookie_secret"),
            "JupyterHub.pid_file": str(self.workdir / "jupyterhub.pid"),
            "JupyterHub.authenticator_class": "dummy", "Authenticator.allow_all": True,
            "JupyterHub.spawner_class": "simple",
            "Spawner.cmd": self.spawner_cmd or [sys.executable, str(fake), str(self.workdir)],
            "Spawner.start_timeout": 30, "Spawner.http_timeout": 30,
            "JupyterHub.services": services, "JupyterHub.load_roles": roles,
            "JupyterHub.custom_scopes": self.custom_scopes,
            "JupyterHub.cleanup_servers": True, "JupyterHub.cleanup_proxy": True,
        }
        lines = ["c = get_config()  # noqa"]
        lines += [f"c.{name} = {value!r}" for name, value in settings.items()]
        return "\n".join(lines) + "\n" + self.extra_config + "\n"

    def start(self, timeout: float = 60) -> "Hub":
        proxy = find_proxy()
        config = self.workdir / "jupyterhub_config.py"
        config.write_text(self.config_text())
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join([str(proxy.parent), str(Path(sys.executable).parent), env.get("PATH", "")])
        env.pop("JUPYTERHUB_API_TOKEN", None)
        self._log = open(self.log_path, "ab")
        # stdin from /dev/null, as under systemd or nohup (`make demo < /dev/null`): its servers' too, in a
        # terminal as in CI (jupyter_server handles SIGINT, JupyterHub's stop signal, by whether it is a tty)
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "jupyterhub"), "-f", str(config)],
                                     cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"jupyterhub exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = http_json("GET", self.url + "/hub/api/", timeout=2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"jupyterhub did not answer within {timeout} s:\n{self.log_tail()}")

    def descendants(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Stop the hub and everything it started (services and servers run in sessions of their own)."""
        if self.proc is None:
            return
        children = self.descendants()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for child in children:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(children, timeout=5)
        self.proc = None
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> "Hub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # ------------------------------------------------------------------ API
    def api(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """A request to the Hub's REST API (as the test admin service unless `token` is given)."""
        return http_json(method, self.api_url + path, body, token or self.admin_token)

    def add_users(self, *names: str) -> None:
        status, body = self.api("POST", "/users", {"usernames": list(names)})
        if status not in (201, 409):
            raise RuntimeError(f"cannot create users {names}: {status} {body}")

    def token(self, user: str, **request: Any) -> str:
        """A new API token of `user` (its own permissions unless `scopes`/`roles` are given)."""
        status, body = self.api("POST", f"/users/{user}/tokens", {"note": "test", **request})
        if status != 201:
            raise RuntimeError(f"cannot create a token for {user}: {status} {body}")
        return body["token"]

    def wait_for_service(self, name: str, path: str = "api/v1/health", timeout: float = 30) -> None:
        """Wait until a service answers 200 through the proxy at /services/<name>/<path>."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if http_json("GET", f"{self.url}/services/{name}/{path}", timeout=5)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"service {name} did not come up:\n{self.log_tail()}")
            time.sleep(0.2)

    def spawn(self, user: str, timeout: float = 60) -> dict[str, str]:
        """Start `user`'s default server; returns the environment JupyterHub gave it."""
        env_file = self.workdir / f"server-env-{user}.json"
        env_file.unlink(missing_ok=True)
        status, body = self.api("POST", f"/users/{user}/server")
        if status not in (201, 202, 400):
            raise RuntimeError(f"cannot start the server of {user}: {status} {body}")
        return self.server_env(user, timeout)

    def server_env(self, user: str, timeout: float = 60) -> dict[str, str]:
        """The environment of `user`'s default server, once it is ready (started any way)."""
        env_file = self.workdir / f"server-env-{user}.json"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status, model = self.api("GET", f"/users/{user}")
            server = (model or {}).get("servers", {}).get("")
            if server and server.get("ready") and env_file.exists():
                return json.loads(env_file.read_text())
            time.sleep(0.2)
        raise RuntimeError(f"the server of {user} did not become ready:\n{self.log_tail()}")
