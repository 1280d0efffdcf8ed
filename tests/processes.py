"""Starting the servers a test needs (each in its own process group, output to a log file)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable


def start_logged(command: list[str], log_path: Path, **options) -> subprocess.Popen:
    """Start `command` in a new session (so its whole group can be killed), appending to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **options)


def wait_until_ready(proc: subprocess.Popen, ready: Callable[[], bool], what: str,
                     log_tail: Callable[[], str], timeout: float) -> None:
    """Poll `ready()` until it is true; fail with the log if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited {proc.returncode}:\n{log_tail()}")
        try:
            if ready():
                return
        except OSError:  # not listening yet (requests' errors are OSErrors too)
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout} s:\n{log_tail()}")
