"""`make demo` (`jupyter-gpualloc demo`): listens where GPUALLOC_DEMO_PORT says, and stopping it
stops the servers it started, releasing their slices; ports it cannot use, or an allocator service that does not start,
stop it with one line instead of leaving a half-working hub; a demo killed outright takes its hub with it."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

from jupyter_gpualloc.core.store import Store
from jupyter_gpualloc.hub.demo import PORTS, demo_ports, port_in_use
from tests.hubfixture import FAKE_SERVER, find_proxy, free_port

from .conftest import DemoHub

DEMO = [str(Path(sys.executable).parent / "jupyter-gpualloc"), "demo"]


# a stand-in server that takes 4 s to stop after the hub's SIGINT, and notes when it got it
SLOW_TO_STOP = FAKE_SERVER.replace("except KeyboardInterrupt:\n    pass", """except KeyboardInterrupt:
    import time
    (Path(sys.argv[1]) / f"interrupted-{os.environ['JUPYTERHUB_USER']}").write_text(str(time.time()))
    time.sleep(4)""")


def test_the_demo_listens_on_its_port_and_stops_its_servers_at_once_saying_so(tmp_path):
    fake = tmp_path / "fake_server.py"  # a light stand-in for jupyterhub-singleuser
    assert SLOW_TO_STOP != FAKE_SERVER
    fake.write_text(SLOW_TO_STOP)
    hub = DemoHub(tmp_path, command=DEMO,
                  extra_config=f"c.Spawner.cmd = [{sys.executable!r}, {str(fake)!r}, {str(tmp_path)!r}]\n")
    hub.start()  # waits for http://127.0.0.1:<GPUALLOC_DEMO_PORT>/hub/api/
    states, servers = {}, []
    try:
        for user in ("alice", "bob"):
            reply = hub.api("POST", f"/users/{user}/server", {"user_options": {"gpu": "shared-8gb-l4"}},
                            token=hub.token(user))
            assert reply.status_code in (201, 202), reply.text
        for user in ("alice", "bob"):
            states[user] = hub.wait_ready(user)["state"]
            servers.append(psutil.Process(states[user]["pid"]))
    finally:
        hub.stop()
    # the demo stopped both servers while the allocator ran, so their slices were released, not left to expire
    store = Store(f"sqlite:///{tmp_path / 'gpualloc' / 'gpualloc.sqlite'}")
    for state in states.values():
        lease = store.load_lease(state["gpu_lease_id"])
        assert lease.state.value == "released", lease
    try:
        deadline = time.monotonic() + 10
        while any(running(server) for server in servers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(running(server) for server in servers), "the demo left a server running"
    finally:
        hub.kill_servers()
    # at once, not one after the other (each takes 4 s), and saying what it stops
    interrupted = [float((tmp_path / f"interrupted-{user}").read_text()) for user in ("alice", "bob")]
    assert abs(interrupted[0] - interrupted[1]) < 2, interrupted
    log = hub.log_tail(20000)
    assert re.search(r"demo: stopping 2 servers \((alice, bob|bob, alice)\) so that each gives its GPU slice "
                     r"back \(Ctrl-C again to skip\)", log), log
    assert re.search(r"demo: servers stopped in \d+ s\n", log), log
    assert "demo: stopping JupyterHub, its proxy and the allocator service" in log


def test_a_killed_demo_takes_its_hub_proxy_and_service_with_it(tmp_path):
    hub = DemoHub(tmp_path, command=DEMO)
    hub.start()
    launcher = psutil.Process(hub.proc.pid)
    started = launcher.children(recursive=True)
    started.append(psutil.Process(int((tmp_path / "jupyterhub-proxy.pid").read_text())))
    assert any("jupyterhub" in " ".join(p.cmdline()) for p in started), started
    launcher.kill()  # no Ctrl-C, no SIGTERM: the demo cannot pass anything on
    hub.proc.wait(5)
    hub.proc = None
    try:
        gone, alive = psutil.wait_procs(started, timeout=30)
        assert not [p for p in alive if running(p)], f"left running: {[p.cmdline() for p in alive if running(p)]}"
    finally:
        for process in started:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


def running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_demo(tmp_path: Path, **ports: int) -> subprocess.CompletedProcess:
    """The demo with these GPUALLOC_DEMO_* ports (the others unset) and a fleet file that is missing, so
    that its service cannot start, run until it exits by itself."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUALLOC_DEMO_")}
    env["PATH"] = os.pathsep.join([str(find_proxy().parent), env.get("PATH", "")])
    env.update({f"GPUALLOC_DEMO_{name.upper()}": str(port) for name, port in ports.items()})
    env["GPUALLOC_DEMO_DIR"] = str(tmp_path / "demo")
    env["GPUALLOC_DEMO_FLEET"] = str(tmp_path / "no-such-fleet.yaml")  # the service cannot start
    proc = subprocess.Popen(DEMO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        left = [p for p in psutil.process_iter() if started_by(p, proc.pid, tmp_path)]  # the demo too, if it hangs
        for process in left:
            process.kill()
    assert not left, f"the demo left {[p.cmdline() for p in left]} running"
    return subprocess.CompletedProcess(DEMO, proc.returncode, out, err)


def started_by(process: psutil.Process, demo_pid: int, runtime: Path) -> bool:
    """Whether the demo started `process`: in its session, or the proxy JupyterHub starts in a session of its own."""
    proxy_pid_file = runtime / "demo" / "jupyterhub-proxy.pid"
    try:
        if os.getsid(process.pid) == demo_pid:
            return True
        return proxy_pid_file.exists() and process.pid == int(proxy_pid_file.read_text()) \
            and "configurable-http-proxy" in " ".join(process.cmdline())
    except (OSError, ValueError, psutil.Error):
        return False


def test_a_port_named_twice_stops_the_demo_before_it_starts_naming_the_variable(tmp_path):
    port = free_port()
    result = run_demo(tmp_path, port=port, service_port=port)
    assert result.returncode == 1
    assert result.stderr == (f"error: GPUALLOC_DEMO_SERVICE_PORT and GPUALLOC_DEMO_PORT are both {port}: the "
                             "allocator service and the hub (the proxy's public port) need ports of their own\n")
    assert not port_in_use("127.0.0.1", port)


def test_a_port_in_use_stops_the_demo_naming_the_variable(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_demo(tmp_path, port=port)
        assert result.returncode == 1
        assert result.stderr == (f"error: port {port} for the hub (the proxy's public port) is in use; "
                                 "set GPUALLOC_DEMO_PORT (or --port) to a free port\n")
        result = run_demo(tmp_path, port=free_port(), proxy_api_port=port)
        assert result.stderr == (f"error: port {port} for the proxy's API is in use; "
                                 "set GPUALLOC_DEMO_PROXY_API_PORT to a free port\n")


def test_internal_ports_left_unset_move_off_the_hubs_port_and_ports_in_use():
    public = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        defaults = {"GPUALLOC_DEMO_PORT": 8000, "GPUALLOC_DEMO_HUB_PORT": taken.getsockname()[1],
                    "GPUALLOC_DEMO_PROXY_API_PORT": free_port(), "GPUALLOC_DEMO_SERVICE_PORT": public}
        ports = demo_ports({"GPUALLOC_DEMO_PORT": str(public)}, "127.0.0.1", defaults)
    assert list(ports) == list(PORTS) and ports["GPUALLOC_DEMO_PORT"] == public
    assert ports["GPUALLOC_DEMO_PROXY_API_PORT"] == defaults["GPUALLOC_DEMO_PROXY_API_PORT"]  # free: kept
    assert len(set(ports.values())) == 4 and defaults["GPUALLOC_DEMO_HUB_PORT"] not in ports.values()


def test_a_service_that_cannot_start_stops_the_demo_with_one_line(tmp_path):
    ports = {"port": free_port(), "hub_port": free_port(), "proxy_api_port": free_port()}
    result = run_demo(tmp_path, **ports)
    assert result.returncode != 0
    last = result.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("error: the demo stopped before the allocator service was up: JupyterHub exited"), \
        result.stderr[-3000:]
    assert not any(port_in_use("127.0.0.1", port) for port in ports.values())  # no proxy left on the hub's URL


def test_the_banner_shows_no_command_that_prints_the_service_token():
    """The banner's env pattern finds the slice's variables and never GPUALLOC_TOKEN (the README says
    never to print it); it names the menu path JupyterLab has for stopping the server."""
    import re

    from jupyter_gpualloc.hub.demo import GUIDE

    patterns = re.findall(r'env \| grep -E "([^"]+)"', GUIDE)
    assert patterns, GUIDE
    names = ["CUDA_VISIBLE_DEVICES", "GPUALLOC_LEASE_ID", "GPUALLOC_SLICE_KIND", "GPUALLOC_MEMORY_LIMIT_MIB"]
    for pattern in patterns:
        assert all(re.search(pattern, f"{name}=x") for name in names), pattern
        assert not re.search(pattern, "GPUALLOC_TOKEN=secret"), pattern
    assert "File -> Hub Control Panel -> Stop My Server" in " ".join(GUIDE.split())
