"""One line in the notebook when the service warns about, or ends, the lease this kernel holds.

While the kernel holds a lease, `LeaseNotices` follows the service's event stream (GET /events,
the caller's own events only; in a server with the extension in remote mode, the server's relay of
its own stream, $GPUALLOC_EVENTS_URL) on the client's thread and prints one line to stderr for the
events of that lease that its user must act on: a deadline or idle warning, a usage quota nearly
or wholly used up, and the lease ending without being released by its holder. In a kernel the
line shows under the cell that ran last. A stream that ends (the service restarted) is opened
again after `retry` seconds.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
from typing import Any, Callable, Mapping

from .extend import extensions_text, moment_text
from .sizes import format_duration

RETRY_SECONDS = 5.0


def notice_line(event: Mapping[str, Any]) -> str | None:
    """The line for one event of a lease, or None for events that need no word to the user."""
    kind, data, lease_id = event.get("type"), event.get("data") or {}, event.get("lease_id")
    if kind == "lease.deadline_warning":
        left = data.get("extensions_left", 0)
        advice = f"{extensions_text(left)}: %gpu extend moves it later" if left else \
            "it cannot be extended: save your work"
        when = moment_text(data["deadline"], event["time"])
        return f"gpu: lease {lease_id} reaches its time limit at {when}; {advice}"
    if kind == "lease.idle_warning":
        when = f"in {format_duration(data['release_at'] - event['time'])}" if data.get("release_at") else "soon"
        return f"gpu: lease {lease_id} is idle: it is released {when} unless this kernel is used"
    if kind == "usage.warning":
        return f"gpu: usage quota nearly used up: {data.get('message', '')}"
    if kind == "usage.exceeded":
        return f"gpu: usage quota used up: {data.get('message', '')}"
    if kind in ("lease.expired", "lease.preempted"):
        reason = f": {data['reason']}" if data.get("reason") else ""
        return f"gpu: lease {lease_id} {kind.split('.', 1)[1]}{reason}"
    return None


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class LeaseNotices:
    """Prints `notice_line` for the events of the lease `lease_id()` names, while started."""

    def __init__(self, client: Callable[[], Any], lease_id: Callable[[], str | None], *,
                 show: Callable[[str], None] = say, retry: float = RETRY_SECONDS):
        self.client = client
        self.lease_id = lease_id
        self.show = show
        self.retry = retry
        self._stop: threading.Event | None = None
        self._stream: concurrent.futures.Future | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        return self._stop is not None

    def start(self) -> None:
        with self._lock:
            if self._stop is not None:
                return
            stop = self._stop = threading.Event()
        threading.Thread(target=self._run, args=(stop,), name="gpualloc-notices", daemon=True).start()

    def stop(self) -> None:
        with self._lock:
            stop, stream = self._stop, self._stream
            self._stop = self._stream = None
            if stop is not None:
                stop.set()
        if stream is not None:
            stream.cancel()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                stream = self.client().watch_events(self._on_event)
                with self._lock:
                    if stop.is_set():
                        stream.cancel()
                    else:
                        self._stream = stream
                stream.result()
            except (Exception, concurrent.futures.CancelledError):  # down, restarting, or stopped
                pass
            stop.wait(self.retry)

    def _on_event(self, event: Mapping[str, Any]) -> None:
        if event.get("lease_id") is None or event.get("lease_id") != self.lease_id():
            return
        line = notice_line(event)
        if line is not None:
            self.show(line)
