"""The local Kubernetes control plane (k8s/, built by `make k8s-build`) as a test's process: started
with its own directory and free loopback ports, stopped with every process it started."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BINARY = REPO / ".k8s" / "bin" / "controlplane"
DEMO_FLEET = REPO / "examples" / "fleets" / "k8s-demo.yaml"


class ControlPlaneError(RuntimeError):
    pass


class ControlPlane:
    """`controlplane run --dir DIR --fleet FLEET` in its own process group: etcd (in that process),
    kube-apiserver, kube-scheduler, kube-controller-manager and kwok (its children, which get
    SIGKILL if it dies)."""

    def __init__(self, directory: Path, fleet: Path = DEMO_FLEET, binary: Path = BINARY):
        self.directory = Path(directory)
        self.fleet = Path(fleet)
        self.binary = Path(binary)
        self.kubeconfig = self.directory / "kubeconfig"
        self.process: subprocess.Popen | None = None
        self._output: list[str] = []
        self._said = threading.Condition()  # notified at each line of its output

    def start(self, timeout: float = 240.0, attempts: int = 2) -> "ControlPlane":
        """Start it and return once its nodes are Ready ("ready" on its output). A start that fails
        is tried again (fresh ports, etcd and certificates), its reason given as a warning: a
        Kubernetes test module depends on it whole, and one start lost to a loaded machine
        should not fail all of its tests."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start_once(timeout)
            except ControlPlaneError as failure:
                if attempt == attempts:
                    raise
                warnings.warn(f"the control plane's start {attempt} of {attempts} failed: {failure}")
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> "ControlPlane":
        self.directory.mkdir(parents=True, exist_ok=True)
        self._output = []
        self.process = subprocess.Popen(
            [str(self.binary), "run", f"--dir={self.directory}", f"--fleet={self.fleet}",
             f"--timeout={int(timeout)}s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True)
        ready = threading.Event()
        process = self.process
        output = self._output

        def read() -> None:
            for line in process.stdout:
                with self._said:
                    output.append(line)
                    self._said.notify_all()
                if line.startswith("ready "):
                    ready.set()
            ready.set()  # ended
            with self._said:
                self._said.notify_all()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout + 30) or self.process.poll() is not None:
            failure = ControlPlaneError(
                f"the control plane did not start:\n{self.logs()}\n--- its output\n{self.output()}")
            self.stop()
            raise failure
        return self

    def stop_apiserver(self, timeout: float = 90.0) -> None:
        """Stop kube-apiserver alone (SIGUSR1); etcd, the other components and kwok keep running."""
        self._signal_and_wait(signal.SIGUSR1, "kube-apiserver stopped", timeout)

    def start_apiserver(self, timeout: float = 240.0) -> None:
        """Start kube-apiserver again (SIGUSR2) on the same port, certificates and etcd; returns once
        it is ready."""
        self._signal_and_wait(signal.SIGUSR2, "kube-apiserver ready", timeout)

    def _signal_and_wait(self, signum: int, line: str, timeout: float) -> None:
        if self.process is None or self.process.poll() is not None:
            raise ControlPlaneError("the control plane is not running")
        with self._said:
            seen = len(self._output)
            self.process.send_signal(signum)
            ended = lambda: self.process.poll() is not None  # noqa: E731
            if not self._said.wait_for(lambda: line + "\n" in self._output[seen:] or ended(), timeout) or ended():
                raise ControlPlaneError(f"no {line!r} after {timeout} s:\n{self.logs()}\n--- its output\n{self.output()}")

    def output(self) -> str:
        return "".join(self._output)

    def logs(self, tail: int = 30) -> str:
        """The last lines of each component's log, for a failure's message (which ends with the
        control plane's own output, where its reason is: a CI log's tail shows it)."""
        parts = []
        for log in sorted((self.directory / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM (it stops its components, etcd last), then SIGKILL to whatever of its process
        group is left after the grace period."""
        process, self.process = self.process, None
        if process is None:
            return
        pgid = process.pid  # its own session: process group id = its pid
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        deadline = time.monotonic() + 10
        while _group_alive(pgid):
            if time.monotonic() > deadline:
                os.killpg(pgid, signal.SIGKILL)
                break
            time.sleep(0.1)

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is `pid`: pid -> the first word after the binary (the component)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
                found[int(stat.parent.name)] = argv[1].decode() if len(argv) > 1 else ""
        except (OSError, IndexError, ValueError):
            continue  # ended while being read
    return found


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
