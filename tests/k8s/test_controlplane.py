"""The control plane's own process handling: it ends every process it started, on a stop and when
it is killed, so a test session or `make k8s-down` leaves nothing running."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from .conftest import require_binary
from .controlplane import BINARY, ControlPlane, alive, children

ONE_NODE = """\
nodes:
  - name: gpu-l4-solo
    cpu_milli: 8000
    memory_mib: 32768
    labels:
      nvidia.com/gpu.product: NVIDIA-L4
      nvidia.com/gpu.count: "1"
      nvidia.com/gpu.memory: "23034"
    resources:
      nvidia.com/gpu: "1"
"""
COMPONENTS = ["kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]


@pytest.fixture
def control_plane(tmp_path):
    require_binary()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(ONE_NODE)
    plane = ControlPlane(tmp_path / "k8s", fleet=fleet).start()
    yield plane
    plane.stop()


def until_gone(pids, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def test_stop_ends_every_component(control_plane):
    run = control_plane.process.pid
    started = children(run)
    assert sorted(started.values()) == COMPONENTS
    assert (control_plane.directory / "ready").exists()
    control_plane.stop()
    assert not alive(run)
    assert until_gone(started) == []
    assert not (control_plane.directory / "ready").exists()


def test_its_components_die_with_it(control_plane):
    run = control_plane.process.pid
    started = children(run)
    assert sorted(started.values()) == COMPONENTS
    os.kill(run, signal.SIGKILL)  # no orderly stop: the parent-death signal ends them
    assert until_gone(started) == []


def test_up_returns_once_ready_and_down_stops_everything(tmp_path):
    """What `make k8s-up` and `make k8s-down` run."""
    require_binary()
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(ONE_NODE)
    directory = tmp_path / "k8s"
    up = subprocess.run([str(BINARY), "up", f"--dir={directory}", f"--fleet={fleet}"],
                        capture_output=True, text=True, timeout=300)
    run = int((directory / "controlplane.pid").read_text()) if (directory / "controlplane.pid").exists() else None
    started: dict[int, str] = {}
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"export KUBECONFIG={directory / 'kubeconfig'}" in up.stdout
        assert (directory / "ready").exists() and (directory / "kubeconfig").exists()
        started = children(run)
        assert sorted(started.values()) == COMPONENTS
        again = subprocess.run([str(BINARY), "up", f"--dir={directory}", f"--fleet={fleet}"],
                               capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "already up" in again.stdout
    finally:
        down = subprocess.run([str(BINARY), "down", f"--dir={directory}"], capture_output=True, text=True,
                              timeout=120)
    assert down.returncode == 0 and "control plane stopped" in down.stdout, down.stdout + down.stderr
    assert until_gone([pid for pid in (run, *started) if pid]) == []
    assert not (directory / "controlplane.pid").exists()
