"""The ipywidgets view of one background job: state, queue position, runtime, Cancel and Logs.

It refreshes itself from the service every few seconds (a daemon thread) until the job ends; in
a terminal frontend its plain-text form is the job's state line. JupyterLab renders the job's id
instead (JOB_MIME), live from the API, so a reopened notebook shows the job as it is now.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

import ipywidgets as widgets

from .status import JOB_MIME, describe_slice, error_line, job_state_text

REFRESH_SECONDS = 2.0
LOG_TAIL_CHARS = 20000


class JobView:
    """One job, kept up to date, with Cancel and Logs buttons that call the service through `client`."""

    def __init__(self, client: Any, job: Mapping[str, Any], *, refresh_seconds: float = REFRESH_SECONDS,
                 clock: Callable[[], float] = time.time):
        self.client = client
        self.clock = clock
        self.title = widgets.HTML()
        self.state = widgets.Label()
        self.message = widgets.Label()
        self.log = widgets.Textarea(layout=widgets.Layout(width="100%", height="12em", display="none"))
        self.cancel_button = widgets.Button(description="Cancel", button_style="danger", icon="times",
                                            tooltip="Withdraw the job, or stop it if it runs")
        self.logs_button = widgets.Button(description="Logs", icon="file-text",
                                          tooltip="Show (and refresh) the job's log")
        self.cancel_button.on_click(self._cancel)
        self.logs_button.on_click(self._logs)
        self.widget = widgets.VBox([self.title, self.state, widgets.HBox([self.cancel_button, self.logs_button]),
                                    self.message, self.log])
        self.job: dict = {}
        self.show(job)
        if job["state"] in ("queued", "running"):
            threading.Thread(target=self._follow, args=(refresh_seconds,), name="gpualloc-job-view",
                             daemon=True).start()

    def show(self, job: Mapping[str, Any]) -> None:
        self.job = dict(job)
        where = f" on a {describe_slice(job['slice'])}" if job.get("slice") else ""
        self.title.value = f"<b>GPU job</b> {job['id']} &middot; {job['name']}{where}"
        self.state.value = job_state_text(self.job, self.clock())
        self.cancel_button.disabled = job["state"] not in ("queued", "running")

    def text(self) -> str:
        return f"gpu: job {self.job['id']} {job_state_text(self.job, self.clock())}"

    def _repr_mimebundle_(self, **kwargs: Any) -> dict:
        """The widget, the job's state line, and the job's id for JupyterLab, whose renderer (the
        labextension's JobOutput) shows the job live from the API, so the output outlives this
        kernel's widget models (a reopened notebook never says "model not found")."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        bundle["text/plain"] = self.text()
        bundle[JOB_MIME] = {"job_id": self.job["id"]}
        return bundle

    def _follow(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            try:
                self.show(self.client.job(self.job["id"]))
                if self.log.layout.display != "none":
                    self._load_log()
            except Exception as err:  # the service may be restarting: shown, and tried again
                self.message.value = error_line(err)
                continue
            if self.job["state"] not in ("queued", "running"):
                return

    def _load_log(self) -> None:
        self.log.value = self.client.job_log(self.job["id"])[-LOG_TAIL_CHARS:]

    def _cancel(self, _button: widgets.Button) -> None:
        try:
            self.show(self.client.cancel_job(self.job["id"]))
        except Exception as err:  # shown in the view: a button must not raise into the comm
            self.message.value = error_line(err)
            return
        self.message.value = "cancelled"

    def _logs(self, _button: widgets.Button) -> None:
        try:
            self._load_log()
        except Exception as err:  # shown in the view: a button must not raise into the comm
            self.message.value = error_line(err)
            return
        self.log.layout.display = ""
