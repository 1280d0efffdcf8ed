"""The ipywidgets view of this kernel's lease: slice, memory against the cap, idle countdown, time
limit, usage quotas, buttons.

`display(LeaseView(...))` shows the widget in a notebook and its plain-text status in a terminal
frontend (the view's mime bundle carries both); JupyterLab draws the lease's id it also carries
live from the API, as the GPUs panel does. Release gives the slice back; Keep active reports
activity now, which restarts the idle countdown; Extend moves a time-boxed lease's deadline later
(POST /leases/<id>/extend), and a refusal is one line in the view. With `follow`, the view
re-reads its lease every `follow` seconds while it is active, so a slice released elsewhere (the
panel, `%gpu release`, idleness, a time limit) never shows as granted with a frozen countdown.
"""

from __future__ import annotations

import os
import threading
import time
from html import escape
from typing import Any, Callable, Mapping, Sequence

import ipywidgets as widgets

from .cuda_state import memory_used_mib
from .sizes import format_duration
from .extend import deadline_text, extend_lease
from .status import LEASE_MIME, cap_mechanism, describe_lease, error_line, idle_seconds_left, idle_text, memory_text, \
    status_lines, time_limit_text

FOLLOW_SECONDS = 5.0
ACTIVE = ("granted", "queued")


class LeaseView:
    """One lease with Release, Keep active and Extend buttons that call the service through `client`."""

    def __init__(self, client: Any, lease: Mapping[str, Any], *, environ: Mapping[str, str] | None = None,
                 in_effect: bool = True, frameworks: str = "",
                 memory_used: Callable[[], int | None] = memory_used_mib,
                 clock: Callable[[], float] = time.time,
                 release: Callable[[dict], dict] | None = None,
                 on_release: Callable[[dict], None] | None = None, quotas: Sequence[str] = (),
                 follow: float | None = None):
        self.client = client
        self.release = release or (lambda lease: client.release(lease["id"]))
        self.environ = os.environ if environ is None else environ
        self.in_effect = in_effect
        self.frameworks = frameworks
        self.memory_used = memory_used
        self.clock = clock
        self.on_release = on_release
        self.quotas = list(quotas)
        self.title = widgets.HTML()
        self.cap = widgets.Label()
        self.memory = widgets.FloatProgress(min=0.0, max=1.0, description="memory")
        self.memory_label = widgets.Label()
        self.idle = widgets.Label()
        self.deadline = widgets.Label()
        self.usage = widgets.HTML("<br>".join(f"usage: {escape(q)}" for q in self.quotas))
        self.message = widgets.Label()
        self.release_button = widgets.Button(description="Release", button_style="danger", icon="times",
                                             tooltip="Give the GPU slice back")
        self.keep_button = widgets.Button(description="Keep active", icon="check",
                                          tooltip="Count this kernel as active now: restarts the idle countdown")
        self.extend_button = widgets.Button(description="Extend", icon="clock",
                                            tooltip="Move the time limit of this slice later")
        self.release_button.on_click(self._release)
        self.keep_button.on_click(self._keep)
        self.extend_button.on_click(self._extend)
        self.widget = widgets.VBox([
            self.title, self.cap, widgets.HBox([self.memory, self.memory_label]), self.idle, self.deadline,
            self.usage, widgets.HBox([self.release_button, self.keep_button, self.extend_button]), self.message])
        self.lease: dict = {}
        self.used_mib: int | None = None
        self.refresh(lease)
        if follow:
            threading.Thread(target=self._follow, args=(follow,), daemon=True, name="gpualloc-lease-view").start()

    def _follow(self, interval: float) -> None:
        """Re-read the lease until it ends (a widget update is not the kernel's activity)."""
        while self.lease["state"] in ACTIVE:
            time.sleep(interval)
            try:
                lease = self.client.lease(self.lease["id"])
            except Exception:  # the service is away for now: the next round tries again
                continue
            if lease["state"] != self.lease["state"] or lease["state"] == "granted":
                self.refresh(lease)

    def refresh(self, lease: Mapping[str, Any] | None = None) -> None:
        """Show `lease` (or the current one again, with memory and countdown re-read)."""
        if lease is not None:
            self.lease = dict(lease)
        lease, now = self.lease, self.clock()
        state = lease["state"]
        self.title.value = f"<b>GPU</b>: {describe_lease(lease)} &middot; lease {lease['id']} ({state})"
        slice_ = lease.get("slice")
        active = state in ACTIVE
        self.release_button.disabled = not active
        self.keep_button.disabled = state != "granted"
        limit = time_limit_text(lease, now)
        self.extend_button.disabled = not limit or not lease["deadline"]["extensions_left"]
        self.deadline.value = f"time limit: {limit}" if limit else ""
        if state == "granted" and slice_:
            self.used_mib = self.memory_used() if self.in_effect else None
            self.cap.value = f"cap: {cap_mechanism(slice_, self.environ, self.frameworks)}"
            self.memory.value = min(1.0, (self.used_mib or 0) / slice_["memory_mib"])
            self.memory.bar_style = "danger" if self.memory.value >= 1.0 else (
                "warning" if self.memory.value > 0.9 else "")
            self.memory_label.value = memory_text(self.used_mib, slice_)
            self.idle.value = f"idle: {idle_text(lease, now) or 'never released for idleness'}"
        elif state == "queued":
            position = lease.get("position")
            self.cap.value = f"queued at position {position}" if position else "queued"
            self.memory.value = 0.0
            self.memory_label.value = ""
            self.idle.value = ""
        else:
            self.cap.value = f"ended: {lease.get('reason') or state}"
            self.memory.value = 0.0
            self.memory_label.value = ""
            self.idle.value = ""

    @property
    def idle_seconds_left(self) -> float | None:
        return idle_seconds_left(self.lease, self.clock())

    def text(self) -> str:
        """The same status as plain text."""
        if self.lease["state"] not in ACTIVE:
            return f"gpu: lease {self.lease['id']} {self.lease['state']}: {self.lease.get('reason', '')}"
        return "\n".join(status_lines(self.lease, now=self.clock(), in_effect=self.in_effect,
                                      environ=self.environ, frameworks=self.frameworks, used_mib=self.used_mib,
                                      quotas=self.quotas))

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The widget, the text, and the lease's id for JupyterLab, whose renderer (the labextension's
        lease output) shows the slice live from the API as the GPUs panel does, so the output
        outlives this kernel's widget models (a reopened notebook never says "model not found")."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        bundle[LEASE_MIME] = {"lease_id": self.lease["id"]}
        return bundle

    def _release(self, _button: widgets.Button) -> None:
        try:
            lease = self.release(self.lease)
        except Exception as err:  # shown in the view: a button must not raise into the comm
            self.message.value = error_line(err)
            try:
                self.refresh(self.client.lease(self.lease["id"]))  # e.g. it ended meanwhile: show how
            except Exception:
                pass
            return
        self.refresh(lease)
        self.message.value = f"released {describe_lease(lease)}"
        if self.on_release is not None:
            self.on_release(lease)

    def _keep(self, _button: widgets.Button) -> None:
        try:
            lease = self.client.touch(self.lease["id"], last_activity=self.clock())
        except Exception as err:  # shown in the view: a button must not raise into the comm
            self.message.value = error_line(err)
            return
        self.refresh(lease)
        left = self.idle_seconds_left
        self.message.value = "kept active" + (f": idle warning in {format_duration(left)}" if left else "")

    def _extend(self, _button: widgets.Button) -> None:
        try:
            lease = extend_lease(self.client, self.lease["id"])
        except Exception as err:  # shown in the view: a button must not raise into the comm
            self.message.value = error_line(err)
            return
        self.refresh(lease)
        self.message.value = f"extended {deadline_text(lease['deadline'], self.clock())}"
