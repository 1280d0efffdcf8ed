"""The lease view: its buttons driven through ipywidgets' own model, in-process and in a real kernel."""

from __future__ import annotations

import re
import time

import pytest

from jupyter_gpualloc.client import SyncGpuAllocClient
from jupyter_gpualloc.kernel.widget import LeaseView
from tests.kernel.conftest import ALICE


@pytest.fixture(scope="module")
def client(service):
    with SyncGpuAllocClient(service.url, ALICE) as c:
        yield c


@pytest.fixture
def lease(service, client):
    lease = client.request_lease({"kind": "shared", "memory_gib": 8, "model": "L4"}, "kernel:widget-test", wait=0)
    yield lease
    service.release_all()


def click(button) -> None:
    """What the frontend's click does: a custom message to the button's model."""
    button._handle_custom_msg({"event": "click"}, [])


def test_the_view_shows_slice_memory_and_countdown(client, lease):
    now = lease["last_activity"] + 600
    view = LeaseView(client, lease, environ={}, memory_used=lambda: 6144, clock=lambda: now,
                     frameworks="PyTorch (fraction 0.3556)")
    assert f"shared 8 GiB on L4 (node0) &middot; lease {lease['id']} (granted)" in view.title.value
    assert view.cap.value == "cap: shared 8 GiB: framework caps: PyTorch (fraction 0.3556)"
    assert view.memory.value == pytest.approx(0.75)
    assert view.memory_label.value == "6 GiB of 8 GiB"
    assert view.idle.value.startswith("idle: warning in 20m, then released 5m later unless a cell runs")
    assert view.idle_seconds_left == pytest.approx(1200)
    bundle = view._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == view.widget.model_id
    assert "memory used: 6 GiB of 8 GiB" in bundle["text/plain"]


def test_over_the_cap_turns_the_bar_red(client, lease):
    view = LeaseView(client, lease, environ={}, memory_used=lambda: 9000)
    assert view.memory.value == 1.0 and view.memory.bar_style == "danger"


def test_keep_active_restarts_the_idle_countdown(service, client, lease):
    view = LeaseView(client, lease, environ={}, memory_used=lambda: None)
    assert view.extend_button.disabled and view.deadline.value == ""  # no time limit in this policy
    time.sleep(1.1)  # let the countdown run down a little
    before = view.idle_seconds_left
    click(view.keep_button)
    assert re.fullmatch(r"kept active: idle warning in (29m \d+s|30m)", view.message.value)
    assert view.idle_seconds_left > before
    assert service.call("GET", f"leases/{lease['id']}")["last_activity"] > lease["last_activity"]


def test_release_gives_the_slice_back_and_disables_the_buttons(service, client, lease):
    forgotten = []
    view = LeaseView(client, lease, environ={}, memory_used=lambda: None, on_release=forgotten.append)
    click(view.release_button)
    assert service.call("GET", f"leases/{lease['id']}")["state"] == "released"
    assert view.release_button.disabled and view.keep_button.disabled and view.extend_button.disabled
    assert view.message.value == "released shared 8 GiB on L4 (node0)"
    assert [ended["id"] for ended in forgotten] == [lease["id"]]
    assert view.text().startswith(f"gpu: lease {lease['id']} released")


def test_a_button_that_fails_says_so_in_the_view(service, client, lease):
    view = LeaseView(client, lease, environ={}, memory_used=lambda: None)
    service.release_all()
    click(view.release_button)
    assert view.message.value == f"gpu: lease {lease['id']} has already ended"
    click(view.keep_button)
    assert view.message.value == f"gpu: lease {lease['id']} has already ended"


def widget_ids(cell, model: str, **state) -> list[str]:
    return [o["comm_id"] for o in cell.comm_opens if o["data"]["state"].get("_model_name") == model
            and all(o["data"]["state"].get(k) == v for k, v in state.items())]


def test_buttons_clicked_from_the_frontend_of_a_real_kernel(service, start_kernel):
    kernel = start_kernel()
    kernel.run("%gpu request 4GB")
    [lease] = [held for held in service.leases() if held["holder"] == f"kernel:{kernel.kernel_id}"]
    status = kernel.run("%gpu status")
    [keep] = widget_ids(status, "ButtonModel", description="Keep active")
    [release] = widget_ids(status, "ButtonModel", description="Release")
    [view_id] = [d["application/vnd.jupyter.widget-view+json"]["model_id"] for d in status.displays]
    assert view_id in widget_ids(status, "VBoxModel")

    time.sleep(0.3)
    kernel.collect(kernel.send_comm_msg(keep, {"method": "custom", "content": {"event": "click"}}))
    assert service.call("GET", f"leases/{lease['id']}")["last_activity"] > lease["last_activity"]

    clicked = kernel.collect(kernel.send_comm_msg(release, {"method": "custom", "content": {"event": "click"}}))
    assert service.call("GET", f"leases/{lease['id']}")["state"] == "released"
    updates = [m["data"]["state"] for m in clicked.comm_msgs if m["comm_id"] == release
               and m["data"].get("method") == "update"]
    assert {"disabled": True} in updates
    assert env_after(kernel) == ""
    assert kernel.run("%gpu status").stdout.startswith(f"gpu: no GPU slice; lease {lease['id']} released")


def env_after(kernel) -> str:
    return kernel.run("import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").stdout.strip()


def test_a_followed_view_shows_a_release_made_elsewhere(service, client, lease):
    view = LeaseView(client, lease, environ={}, memory_used=lambda: None, follow=0.1)
    assert not view.release_button.disabled
    client.release(lease["id"], holder_gone=True)  # e.g. from the panel, or %gpu release
    deadline = time.monotonic() + 10
    while "(released)" not in view.title.value:
        assert time.monotonic() < deadline, view.title.value
        time.sleep(0.05)
    assert view.release_button.disabled and view.keep_button.disabled
    assert view.cap.value.startswith("ended: ")
