"""The README's demo as a person lives it: the demo hub, real JupyterLab servers, Debian's chromium.

One hub (hub_config/jupyterhub_config.py, the simulated demo fleet, short idle times) and one
story, asserting what a person sees:

- alice logs in, picks *MIG 1g.10gb* on the spawn form; the progress page says which slice the
  server is spawning on and its event log holds the request and the grant; JupyterLab's status
  bar names the slice;
- the GPUs panel is live (its badge says so, and a slice a notebook's kernel asks for with
  `%gpu request` appears in it without a reload; the status bar counts it as "+1");
- a `%%gpu job` cell shows in the panel's Jobs without a reload, and finishes;
- the kernel's slice, left alone, is warned (a notification), then released and the kernel shut
  down;
- dave, whose server holds *Whole H100*, releases the server's slice from the panel: the panel
  asks to confirm that this stops the server, the server stops, and bob, waiting for a whole H100,
  gets that GPU only once nothing of dave's server runs any more;
- alice stops her server as the README says: File -> Hub Control Panel -> Stop My Server.

Skipped with a reason without /usr/bin/chromium, except under CI=true, where that fails.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import psutil
import pytest
import requests

from jupyter_gpualloc.hub.local import still_running
from tests.browser.test_sidebar import chromium_or_skip, headless_chromium
from tests.hub.conftest import DemoHub, server_environ

pytestmark = pytest.mark.slow

H100 = "H100 80GB HBM3"
IDLE_TIMEOUT = 12
IDLE_GRACE = 8
# Short idle times; a quota that lets alice hold her server's, her kernel's and her job's slices at once.
SERVICE_CONFIG = f"""
c.SchedulerPolicy.idle_timeout = {IDLE_TIMEOUT}
c.SchedulerPolicy.idle_grace = {IDLE_GRACE}
c.SchedulerPolicy.quotas = {{"*": {{"slices": 3, "whole_gpus": 1}}, "carol": {{"slices": 1, "memory_gib": 20}}}}
"""
# The progress page is always shown (JupyterHub skips it for a spawn done within 10 s).
HUB_CONFIG = """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
"""
# Each user's ~/.jupyter: quick reports of the kernels' activity and of jobs; no news notification.
SERVER_CONFIG = {"GpuAllocExtension": {"report_interval": 2, "job_poll_interval": 1},
                 "LabApp": {"expose_app_in_browser": True}}
LAB_SETTINGS = {"@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"}}
KERNEL_REQUEST = "%gpu request --shared 8GB --model L4"
JOB_CELL = "%%gpu job --shared 4GB --model L4 --name hello\nprint('hello from the job')"
MIN = 60_000  # ms


def notebook(path: Path, source: str) -> None:
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {}, "outputs": [],
                   "source": source}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))


def prepare_home(hub: DemoHub, user: str) -> Path:
    """The user's home as the demo spawner makes it (<runtime>/users/<name>), with their Jupyter config."""
    home = hub.workdir / "users" / user
    (home / ".jupyter").mkdir(parents=True, exist_ok=True)
    (home / ".jupyter" / "jupyter_server_config.json").write_text(json.dumps(SERVER_CONFIG))
    for name, settings in LAB_SETTINGS.items():
        path = home / ".jupyter" / "lab" / "user-settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    return home


@pytest.fixture
def hub(tmp_path):
    chromium_or_skip()
    demo = DemoHub(tmp_path, start_timeout=120, service_config=SERVICE_CONFIG, extra_config=HUB_CONFIG)
    for user in ("alice", "bob", "dave"):
        prepare_home(demo, user)
    demo.start()
    try:
        yield demo
    finally:
        trees = []
        for pid in demo.server_pids:
            try:
                root = psutil.Process(pid)
                trees += [root, *root.children(recursive=True)]
            except psutil.Error:
                pass
        demo.stop()
        for process in trees:
            try:
                process.kill()
            except psutil.Error:
                pass


@pytest.fixture
def browser(hub, tmp_path):
    with headless_chromium() as launched:
        yield launched


def person(browser, hub: DemoHub, user: str):
    """A browser profile of its own, logged in to the hub as `user` through the login form."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.goto(hub.url + "/hub/login", timeout=MIN)
    page.locator("#username_input").fill(user)
    page.locator("#password_input").fill("any password")
    page.locator("#login_submit").click()
    page.wait_for_url(lambda url: "/hub/login" not in url, timeout=MIN)  # home, spawn form, or the server
    return page


def open_panel(page) -> None:
    page.locator(".jp-gpualloc-status-button").click()
    page.locator(".jp-gpualloc-panel h2", has_text="GPUs").wait_for(timeout=MIN)


def open_notebook(page, name: str) -> str:
    """Open the notebook in the running JupyterLab and wait for its kernel; the id of its panel."""
    page.evaluate("async path => { await window.jupyterapp.commands.execute('docmanager:open', {path}); }", name)
    page.wait_for_function(
        "path => window.jupyterapp.shell.currentWidget?.context?.path === path"
        " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel?.status === 'idle'",
        arg=name, timeout=2 * MIN)
    return page.evaluate("() => window.jupyterapp.shell.currentWidget.id")


def run_first_cell(page, panel_id: str) -> None:
    """Click into the notebook's first cell and press Shift+Enter, as a person does."""
    page.locator(f"[id='{panel_id}'] .jp-Cell").first.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")


def kernels(hub: DemoHub, user: str) -> list[dict]:
    reply = requests.get(hub.url + f"/user/{user}/api/kernels", timeout=30,
                         headers={"Authorization": f"token {hub.token(user)}"})
    assert reply.status_code == 200, reply.text
    return reply.json()


def lease_of(hub: DemoHub, user: str, holder: str) -> dict | None:
    """The user's newest active lease of `holder`."""
    leases = [l for l in hub.leases() if l["user"] == user and l["holder"] == holder]
    return max(leases, key=lambda l: l["created_at"]) if leases else None


def state_of(hub: DemoHub, lease: dict) -> str:
    return hub.service("GET", f"leases/{lease['id']}").json()["state"]


class GrantWatch(threading.Thread):
    """Watches a queued lease until it is granted: every time it is found granted, none of
    `processes` may still run (they are of the server whose slice it waits for)."""

    def __init__(self, hub: DemoHub, user: str, lease_id: str, processes: list[psutil.Process]):
        super().__init__(daemon=True)
        self.hub, self.user, self.lease_id, self.processes = hub, user, lease_id, processes
        self.granted_while_running: list[int] = []
        self.granted_at: float | None = None
        self.stop_at = time.monotonic() + 90

    def run(self) -> None:
        while time.monotonic() < self.stop_at:
            state = self.hub.service("GET", f"leases/{self.lease_id}", user=self.user).json()["state"]
            if state == "granted":  # the grant came before this look at the processes
                self.granted_while_running = [p.pid for p in self.processes if still_running(p)]
                self.granted_at = time.monotonic()
                return
            time.sleep(0.1)


@pytest.fixture
def pages(tmp_path):
    """The people's pages; on a failure each one's screenshot and GPUs panel are kept in tmp_path."""
    opened: dict[str, object] = {}
    yield opened
    for user, page in opened.items():
        try:
            page.screenshot(path=str(tmp_path / f"{user}.png"))
            panel = page.locator(".jp-gpualloc-panel")
            text = panel.inner_text(timeout=1000) if panel.count() else "(no GPUs panel)"
            toasts = page.locator(".Toastify__toast").all_inner_texts()
            print(f"--- {user} at {page.url} (screenshot {tmp_path / f'{user}.png'}):\n{text}\ntoasts: {toasts}")
        except Exception as err:  # the page may be gone
            print(f"--- {user}: {err}")


def test_the_readme_story_in_a_browser(hub, browser, pages):
    started = time.monotonic()
    # dave's server on the whole H100 starts meanwhile (through the REST API: his part comes later)
    reply = hub.api("POST", "/users/dave/server", {"user_options": {"gpu": "whole-h100"}}, token=hub.token("dave"))
    assert reply.status_code in (201, 202), reply.text
    alice_home = hub.workdir / "users" / "alice"
    notebook(alice_home / "idle.ipynb", KERNEL_REQUEST)
    notebook(alice_home / "job.ipynb", JOB_CELL)

    # --- alice spawns on a MIG 1g.10gb slice
    alice = pages["alice"] = person(browser, hub, "alice")
    alice.goto(hub.url + "/hub/spawn", timeout=MIN)
    assert "MIG 1g.10gb on A100 80GB" in alice.locator("#spawn_form").inner_text()
    alice.locator('input[name="gpu"][value="mig-1g.10gb"]').check()
    alice.get_by_role("button", name="Start").click()
    alice.locator("#progress-message", has_text="(on your 1g.10gb slice)").wait_for(timeout=MIN)
    assert alice.locator("#progress-message").inner_text().startswith("Spawning server")
    log = alice.locator("#progress-log").text_content()
    assert "asking for a 1g.10gb slice" in log and "granted a 1g.10gb slice after" in log, log
    alice.wait_for_url("**/user/alice/lab**", timeout=2 * MIN)
    status = alice.locator(".jp-gpualloc-status-button")
    status.wait_for(timeout=2 * MIN)
    alice.wait_for_function("() => document.querySelector('.jp-gpualloc-status-button')"
                            ".textContent.startsWith('GPU 1g.10gb')", timeout=MIN)
    server = hub.wait_ready("alice")
    assert server_environ(server["state"]["pid"])["CUDA_VISIBLE_DEVICES"].startswith("MIG-")

    open_panel(alice)
    panel = alice.locator(".jp-gpualloc-panel")
    panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="this server").wait_for(timeout=MIN)

    # --- a %%gpu job shows in the panel without a reload, and finishes
    run_first_cell(alice, open_notebook(alice, "job.ipynb"))
    alice.locator(".jp-OutputArea-output", has_text="gpu: job").first.wait_for(timeout=MIN)
    open_panel(alice)
    panel.locator(".jp-gpualloc-job", has_text="hello").wait_for(timeout=8_000)
    panel.locator('.jp-gpualloc-job[data-state="succeeded"]', has_text="hello").wait_for(timeout=2 * MIN)

    # --- the panel is live: its badge, and a slice a kernel asks for appears in it without a reload
    panel.locator(".jp-gpualloc-live.jp-mod-on", has_text="live").wait_for(timeout=MIN)
    known = {k["id"] for k in kernels(hub, "alice")}
    run_first_cell(alice, open_notebook(alice, "idle.ipynb"))
    alice.locator(".jp-OutputArea-output", has_text="gpu: granted shared 8 GiB on L4").wait_for(timeout=MIN)
    [kernel] = [k for k in kernels(hub, "alice") if k["id"] not in known]
    kernel_lease = lease_of(hub, "alice", f"kernel:{kernel['id']}")
    assert kernel_lease["state"] == "granted"
    open_panel(alice)
    # the event stream brings it (the panel polls only every 10 s while the stream is down)
    panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="idle.ipynb").wait_for(timeout=8_000)
    alice.wait_for_function("() => document.querySelector('.jp-gpualloc-status-button')"
                            ".textContent.endsWith('+1')", timeout=8_000)  # the server's slice, and one more

    # dave opens his JupyterLab meanwhile (it loads while alice's kernel idles)
    dave = pages["dave"] = person(browser, hub, "dave")
    hub.wait_ready("dave", timeout=2 * MIN)
    if "/user/dave/lab" not in dave.url:  # the login goes to his running server, else to the hub's home
        dave.goto(hub.url + "/user/dave/lab", wait_until="commit", timeout=MIN)

    # --- left alone, the kernel's slice is warned, then released and the kernel shut down
    warned = alice.locator(".Toastify__toast", has_text="idle")
    warned.wait_for(timeout=(IDLE_TIMEOUT + 30) * 1000)
    assert "idle.ipynb" in warned.inner_text()
    alice.locator(".Toastify__toast", has_text="was shut down").wait_for(timeout=(IDLE_GRACE + 30) * 1000)
    assert state_of(hub, kernel_lease) != "granted"
    assert kernel["id"] not in [k["id"] for k in kernels(hub, "alice")]
    panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="idle.ipynb").wait_for(
        state="detached", timeout=MIN)

    # --- bob waits for a whole H100, which dave's server holds
    dave_server = hub.wait_ready("dave")
    dave_lease = lease_of(hub, "dave", "server")
    assert dave_lease["state"] == "granted" and dave_lease["slice"]["kind"] == "whole"
    root = psutil.Process(dave_server["state"]["pid"])
    dave_processes = [root, *root.children(recursive=True)]
    reply = hub.api("POST", "/users/bob/server", {"user_options": {"gpu": "whole-h100"}}, token=hub.token("bob"))
    assert reply.status_code in (201, 202), reply.text
    hub.progress("bob", until="position 1 in queue", timeout=60)
    bob_lease = lease_of(hub, "bob", "server")
    assert bob_lease["state"] == "queued"
    # his spawn page says where he stands, why, and when the start gives up
    bob = pages["bob"] = person(browser, hub, "bob")
    bob.goto(hub.url + "/hub/spawn-pending/bob", timeout=MIN)
    waiting = bob.locator("#progress-message", has_text="this start gives up at")
    waiting.wait_for(timeout=MIN)
    assert "position 1 in queue" in waiting.inner_text(), waiting.inner_text()
    watch = GrantWatch(hub, "bob", bob_lease["id"], dave_processes)
    watch.start()

    # --- dave releases his server's slice from the panel: asked to confirm, the server stops first
    dave.locator(".jp-gpualloc-status-button").wait_for(timeout=2 * MIN)
    open_panel(dave)
    dave_panel = dave.locator(".jp-gpualloc-panel")
    dave_panel.get_by_role("button", name="Release the slice of this server").click()
    dialog = dave.locator(".jp-Dialog")
    dialog.wait_for(timeout=30_000)
    assert "stop" in dialog.inner_text().lower(), dialog.inner_text()
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    hub.wait_stopped("dave", timeout=60)
    watch.join(90)
    assert watch.granted_at is not None, f"bob was never granted the H100\n{hub.log_tail()}"
    assert watch.granted_while_running == [], \
        f"bob got the H100 while dave's processes {watch.granted_while_running} still ran"
    bob_server = hub.wait_ready("bob", timeout=60)
    assert server_environ(bob_server["state"]["pid"])["CUDA_VISIBLE_DEVICES"] == dave_lease["slice"]["visible_devices"]
    assert "RecursionError" not in hub.log_tail(1_000_000)

    # --- alice stops her server as the README says: File -> Hub Control Panel -> Stop My Server
    alice_lease = lease_of(hub, "alice", "server")
    alice.locator(".lm-MenuBar-itemLabel", has_text="File").click()
    with alice.context.expect_page() as opened:
        alice.locator(".lm-Menu-itemLabel", has_text="Hub Control Panel").click()
    home = opened.value
    home.wait_for_load_state("networkidle", timeout=MIN)  # the button works once the page's script has run
    home.locator("#stop", has_text="Stop My Server").click()
    hub.wait_stopped("alice", timeout=60)
    assert state_of(hub, alice_lease) == "released"
    assert time.monotonic() - started < 240, f"the story took {time.monotonic() - started:.0f} s"
