"""The job view: state, position, Logs and Cancel through ipywidgets' own models, against a real service."""

from __future__ import annotations

import signal
import time

import pytest

from jupyter_gpualloc.client import SyncGpuAllocClient
from jupyter_gpualloc.kernel.job_widget import JobView
from tests.service.conftest import ALICE, ServiceProcess

WHOLE_L4 = {"kind": "whole", "model": "L4"}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    service = ServiceProcess(tmp_path_factory.mktemp("job-widget")).start()
    with SyncGpuAllocClient(service.url[:-len("api/v1/")], ALICE) as c:
        yield c
    service.kill(signal.SIGTERM)


def click(button) -> None:
    """What the frontend's click does: a custom message to the button's model."""
    button._handle_custom_msg({"event": "click"}, [])


def submit(client, workdir) -> dict:
    return client.submit_job({"spec": WHOLE_L4, "workdir": str(workdir), "name": "train",
                              "source": {"kind": "cell", "code": "x = 1"}})


def test_the_view_follows_the_job_and_cancels_it(client, tmp_path):
    first, second, third = (submit(client, tmp_path) for _ in range(3))  # two L4s: the third waits
    view = JobView(client, third, refresh_seconds=0.1)
    assert f"<b>GPU job</b> {third['id']} &middot; train" in view.title.value
    waiting = "queued (position 1): waiting for a whole GPU on L4"  # where it stands, and the core's reason
    assert view.state.value == waiting and not view.cancel_button.disabled
    assert view._repr_mimebundle_()["text/plain"] == f"gpu: job {third['id']} {waiting}"
    client.cancel_job(first["id"])
    deadline = time.monotonic() + 10
    while view.state.value != "starting (it has its slice)":
        assert time.monotonic() < deadline, view.state.value
        time.sleep(0.05)
    folder = tmp_path / ".gpualloc" / "jobs" / third["id"]
    folder.mkdir(parents=True)
    (folder / "job.log").write_text("loading data\n")
    click(view.logs_button)
    assert view.log.value == "loading data\n" and view.log.layout.display == ""
    click(view.cancel_button)
    assert view.message.value == "cancelled" and view.cancel_button.disabled
    assert view.state.value == "cancelled: cancelled by alice"
    click(view.cancel_button)  # a second click on a stale view: one line in the view, no exception
    assert view.message.value.startswith("gpu: job ") and "already ended" in view.message.value
    client.cancel_job(second["id"])
