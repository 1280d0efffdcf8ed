"""The README's demo as a person lives it: the demo hub, real JupyterLab servers, Debian's chromium.

One hub (hub_config/jupyterhub_config.py, the simulated demo fleet, short idle times) and one
story, asserting what a person sees:

- alice logs in, picks *MIG 1g.10gb* on the spawn form; the progress page says which slice the
  server is spawning on and its event log holds the request and the grant; JupyterLab's status
  bar names the slice;
- erin asks for a whole H100, which dave's server holds: her spawn page says where she stands,
  why, and when the start gives up; at that time it gives up, says why, and nothing was spawned;
- the GPUs panel is live (its badge says so, and a slice a notebook's kernel asks for with
  `%gpu request` appears in it without a reload; the status bar counts it as "+1"); before any
  idle warning the slice's card counts down to its idle release;
- alice's quota (2 slices) is then full: a `%%gpu job` cell waits, and its cell and the panel
  say why (her quota), as do the panel's offers;
- the kernel's slice, left alone, is warned (a notification), then released and the kernel shut
  down; the job then runs, shows in the panel's Jobs without a reload, and finishes;
- alice releases a slice the panel asked for her job notebook's kernel: the panel asks to confirm
  that this shuts the kernel down, the kernel is shut down, and a request waiting for the whole L4
  that slice shares gets it only once the kernel's processes are gone;
- bob waits for a whole H100, which dave's server holds; his spawn page says where he stands, why
  and when the start gives up; the admin opens the allocator's page (the service's root, through
  JupyterHub's OAuth), sees who holds the GPUs and who waits, and drains a GPU from it;
- dave releases the server's slice from the panel: the panel asks to confirm that this stops the
  server, the server stops, and bob gets that GPU only once nothing of dave's server runs any more;
- alice stops her server as the README says: File -> Hub Control Panel -> Stop My Server.

Skipped with a reason without /usr/bin/chromium, except under CI=true, where that fails.
"""

from __future__ import annotations

import json
import re
import threading
import time
from datetime import datetime, timezone
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
ALICE_SLICES = 2  # her server's and one kernel's: a job then waits for her quota
# Short idle times; alice's quota as in the README's demo.
SERVICE_CONFIG = f"""
c.SchedulerPolicy.idle_timeout = {IDLE_TIMEOUT}
c.SchedulerPolicy.idle_grace = {IDLE_GRACE}
c.SchedulerPolicy.quotas = {{"*": {{"slices": 3, "whole_gpus": 1}}, "alice": {{"slices": {ALICE_SLICES}}},
                            "carol": {{"slices": 1, "memory_gib": 20}}}}
"""
ERIN_START_TIMEOUT = 30  # erin's start gives up in the queue at 30 - gpu_start_reserve (10) = 20 s
# The progress page is always shown (JupyterHub skips it for a spawn done within 10 s); erin's start
# has less time than the others' (a pre-spawn hook, run before start(), sets it).
HUB_CONFIG = f"""
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 0}}

def erin_waits_less(spawner):
    if spawner.user.name == "erin":
        spawner.start_timeout = {ERIN_START_TIMEOUT}

c.Spawner.pre_spawn_hook = erin_waits_less
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
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            "path => window.jupyterapp.shell.currentWidget?.context?.path === path"
            " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel?.status === 'idle'",
            arg=name, timeout=2 * MIN)
    except PlaywrightTimeout:  # say what the page shows instead
        shown = page.evaluate("""() => { const w = window.jupyterapp.shell.currentWidget;
            return {path: w?.context?.path, kernel: w?.sessionContext?.session?.kernel?.status ?? null,
                    dialog: document.querySelector('.jp-Dialog')?.innerText ?? null}; }""")
        raise AssertionError(f"{name} did not open with an idle kernel within 2 min: {shown}") from None
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
    `processes` may still run (they are of the holder whose slice it waits for). `holder`: the
    lease's holder, heartbeated meanwhile where nothing else keeps it alive."""

    def __init__(self, hub: DemoHub, user: str, lease_id: str, processes: list[psutil.Process],
                 holder: str | None = None):
        super().__init__(daemon=True)
        self.hub, self.user, self.lease_id, self.processes = hub, user, lease_id, processes
        self.holder = holder
        self.granted_while_running: list[int] = []
        self.granted_at: float | None = None
        self.stop_at = time.monotonic() + 90

    def run(self) -> None:
        beaten = 0.0
        while time.monotonic() < self.stop_at:
            if self.holder and time.monotonic() - beaten > 1:
                self.hub.service("POST", "heartbeat", {"holders": [self.holder]}, user=self.user)
                beaten = time.monotonic()
            state = self.hub.service("GET", f"leases/{self.lease_id}", user=self.user).json()["state"]
            if state == "granted":  # the grant came before this look at the processes
                self.granted_while_running = [p.pid for p in self.processes if still_running(p)]
                self.granted_at = time.monotonic()
                return
            time.sleep(0.1)


def process_tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def sidebar_kernels(hub: DemoHub, user: str) -> list[dict]:
    """The user's kernels as the sidebar's API lists them (with their process ids)."""
    reply = requests.get(hub.url + f"/user/{user}/gpualloc/api/kernels", timeout=30,
                         headers={"Authorization": f"token {hub.token(user)}"})
    assert reply.status_code == 200, reply.text
    return reply.json()["kernels"]


def current_kernel(page) -> str:
    return page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.id")


def gives_up_at(message: str, patience: int) -> None:
    """The spawn page's deadline: "this start gives up at HH:MM:SS UTC (<patience> s after asking)", about now."""
    match = re.search(r"this start gives up at (\d\d:\d\d:\d\d) UTC \((\d+) s after asking\) if none frees", message)
    assert match and int(match.group(2)) == patience, message
    at = datetime.strptime(match.group(1), "%H:%M:%S").time()
    now = datetime.now(timezone.utc)
    seconds = (datetime.combine(now.date(), at, timezone.utc) - now).total_seconds() % 86400
    assert seconds <= patience, (message, now)


def eventually(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.3)


def admin_row(page, where: str, lease: dict):
    return page.locator(f"{where} tr[data-lease='{lease['id']}']")


def drained_gpus(hub: DemoHub) -> set[str]:
    return {g["uuid"] for n in hub.service("GET", "inventory").json()["nodes"] for g in n["gpus"] if g["drained"]}


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

    # --- erin asks for a whole H100, which dave's server holds: her spawn page says where she stands,
    # why, and when her start gives up (her hub gives starts less time than the others')
    assert lease_of(hub, "dave", "server")["state"] == "granted"
    erin = pages["erin"] = person(browser, hub, "erin")
    erin.goto(hub.url + "/hub/spawn", timeout=MIN)
    erin.locator('input[name="gpu"][value="whole-h100"]').check()
    erin.get_by_role("button", name="Start").click()
    erin_waits = erin.locator("#progress-message", has_text="this start gives up at")
    erin_waits.wait_for(timeout=MIN)
    patience = ERIN_START_TIMEOUT - 10  # less the hub's gpu_start_reserve (tests/hub/conftest.py)
    assert erin_waits.inner_text().startswith(f"waiting for a whole GPU on {H100}: position 1 in queue; ")
    gives_up_at(erin_waits.inner_text(), patience)
    erin_gives_up = time.monotonic() + patience

    open_panel(alice)
    panel = alice.locator(".jp-gpualloc-panel")
    panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="this server").wait_for(timeout=MIN)

    # --- the panel is live: its badge, and a slice a kernel asks for appears in it without a reload
    panel.locator(".jp-gpualloc-live.jp-mod-on", has_text="live").wait_for(timeout=MIN)
    run_first_cell(alice, open_notebook(alice, "idle.ipynb"))
    alice.locator(".jp-OutputArea-output", has_text="gpu: granted shared 8 GiB on L4").wait_for(timeout=MIN)
    kernel = current_kernel(alice)
    kernel_lease = lease_of(hub, "alice", f"kernel:{kernel}")
    assert kernel_lease["state"] == "granted"
    open_panel(alice)
    # the event stream brings it (the panel polls only every 10 s while the stream is down)
    idle_card = panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="idle.ipynb")
    idle_card.wait_for(timeout=8_000)
    alice.wait_for_function("() => document.querySelector('.jp-gpualloc-status-button')"
                            ".textContent.endsWith('+1')", timeout=8_000)  # the server's slice, and one more
    # idle since its cell ended: before any warning, its card counts down to the idle release
    countdown = idle_card.locator(".jp-gpualloc-idle", has_text="idle release in")
    countdown.wait_for(timeout=IDLE_TIMEOUT * 1000)
    assert re.fullmatch(rf"idle release in \d+ s \(warned at \d\d:\d\d:\d\d( [AP]M)?, then a {IDLE_GRACE} s grace\)",
                        countdown.inner_text()), countdown.inner_text()

    # --- her quota is full now (her server's slice and her kernel's): a %%gpu job waits, and says why
    job_panel = open_notebook(alice, "job.ipynb")
    run_first_cell(alice, job_panel)
    in_cell = alice.locator(f"[id='{job_panel}'] .jp-OutputArea-output .jp-gpualloc-job[data-state='queued']")
    in_cell.locator(".jp-gpualloc-reason", has_text="quota").wait_for(timeout=MIN)
    [job] = hub.service("GET", "jobs", user="alice").json()["jobs"]
    assert f"user quota for alice: at most {ALICE_SLICES} slices" in job["reason"], job
    assert job["reason"] in in_cell.inner_text(), (job, in_cell.inner_text())
    open_panel(alice)
    queued = panel.locator('.jp-gpualloc-job[data-state="queued"]', has_text="hello")
    queued.locator(".jp-gpualloc-reason", has_text=job["reason"]).wait_for(timeout=8_000)
    full = panel.locator('.jp-gpualloc-offers li[data-offer="shared-8gb-l4"]', has_text="your quota is full now: ")
    full.wait_for(timeout=30_000)
    assert "free now" not in full.inner_text()

    # dave opens his JupyterLab meanwhile (it loads while alice's kernel idles)
    dave = pages["dave"] = person(browser, hub, "dave")
    hub.wait_ready("dave", timeout=2 * MIN)
    if "/user/dave/lab" not in dave.url:  # the login goes to his running server, else to the hub's home
        dave.goto(hub.url + "/user/dave/lab", wait_until="commit", timeout=MIN)

    # --- left alone, the kernel's slice is warned, then released and the kernel shut down
    warned = alice.locator(".Toastify__toast", has_text="idle")
    warned.wait_for(timeout=(IDLE_TIMEOUT + 30) * 1000)
    assert re.search(r"idle\.ipynb is idle: it goes at \d\d:\d\d:\d\d", warned.inner_text()), warned.inner_text()
    alice.locator(".Toastify__toast", has_text="was shut down").wait_for(timeout=(IDLE_GRACE + 30) * 1000)
    assert state_of(hub, kernel_lease) != "granted"
    assert kernel not in [k["id"] for k in kernels(hub, "alice")]
    idle_card.wait_for(state="detached", timeout=MIN)

    # --- the job, within her quota again, runs and finishes, in the panel without a reload
    open_panel(alice)
    panel.locator('.jp-gpualloc-job[data-state="succeeded"]', has_text="hello").wait_for(timeout=2 * MIN)

    # --- erin's start gave up at its deadline: her page says so and why; nothing was spawned
    erin_failed = erin.locator("#progress-message", has_text="became free within")
    erin_failed.wait_for(timeout=max(erin_gives_up - time.monotonic(), 0) * 1000 + 30_000)
    assert f"No whole GPU on {H100} became free within {patience} seconds" in erin_failed.inner_text()
    assert "Spawning server" not in erin.locator("#progress-log").text_content()
    assert hub.server("erin") is None and lease_of(hub, "erin", "server") is None

    # --- a slice the panel asks for the job notebook's kernel, released from the panel: it asks first,
    # as the kernel is shut down; a request for the whole L4 the slice shares waits until the kernel is gone
    open_notebook(alice, "job.ipynb")
    kernel = current_kernel(alice)
    open_panel(alice)
    panel.get_by_label("Slice to request").select_option("shared-8gb-l4")
    panel.get_by_role("button", name="Request Shared 8 GiB on L4 for job.ipynb").click()
    panel.locator('.jp-gpualloc-slice[data-state="granted"]', has_text="job.ipynb").wait_for(timeout=30_000)
    [pid] = [k["pid"] for k in sidebar_kernels(hub, "alice") if k["id"] == kernel]
    kernel_processes = process_tree(pid)
    reply = hub.service("POST", "leases", {"offer": "whole-l4", "holder": "kernel:waits-for-l4"}, user="admin")
    assert reply.status_code == 202, reply.text
    whole_l4 = reply.json()
    l4_watch = GrantWatch(hub, "admin", whole_l4["id"], kernel_processes, holder="kernel:waits-for-l4")
    l4_watch.start()
    panel.get_by_role("button", name="Release the slice of job.ipynb").click()
    dialog = alice.locator(".jp-Dialog")
    dialog.get_by_text("Release the GPU slice of job.ipynb?").wait_for(timeout=30_000)
    assert "shuts the kernel of job.ipynb down" in dialog.inner_text(), dialog.inner_text()
    dialog.get_by_role("button", name="Release and shut down the kernel").click()
    alice.locator(".Toastify__toast", has_text="The GPU slice of job.ipynb was released").wait_for(timeout=30_000)
    l4_watch.join(60)
    assert l4_watch.granted_at is not None, f"the whole L4 was never granted\n{hub.log_tail()}"
    assert l4_watch.granted_while_running == [], \
        f"the whole L4 was granted while the kernel's processes {l4_watch.granted_while_running} still ran"
    # its process is gone; the server then forgets it (after the provisioner's cleanup, which reported it gone)
    eventually(lambda: kernel not in [k["id"] for k in kernels(hub, "alice")], 30, "job.ipynb's kernel still listed")
    assert hub.service("DELETE", f"leases/{whole_l4['id']}?holder_gone=true", user="admin").status_code == 200

    # --- bob waits for a whole H100, which dave's server holds
    dave_server = hub.wait_ready("dave")
    dave_lease = lease_of(hub, "dave", "server")
    assert dave_lease["state"] == "granted" and dave_lease["slice"]["kind"] == "whole"
    dave_processes = process_tree(dave_server["state"]["pid"])
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
    assert waiting.inner_text().startswith(f"waiting for a whole GPU on {H100}: position 1 in queue; ")
    gives_up_at(waiting.inner_text(), 120 - 10)  # the hub's start_timeout, less its gpu_start_reserve

    # --- the admin's page (the service's root, through JupyterHub's OAuth): who holds what, who waits
    admin = pages["admin"] = person(browser, hub, "admin")
    admin.goto(hub.url + "/services/gpualloc/", timeout=MIN)
    admin.wait_for_url(hub.url + "/services/gpualloc/", timeout=MIN)
    admin_row(admin, "#gpu-list", dave_lease).wait_for(timeout=MIN)
    assert "admin" in admin.locator("#who").inner_text()
    cells = admin_row(admin, "#gpu-list", dave_lease).locator("td").all_inner_texts()
    assert cells[:3] == ["whole GPU", "dave", "default server"], cells
    alice_lease = lease_of(hub, "alice", "server")
    assert admin_row(admin, "#gpu-list", alice_lease).locator("td").all_inner_texts()[:3] == \
        ["1g.10gb (MIG)", "alice", "default server"]
    cells = admin_row(admin, "#queue-list", bob_lease).locator("td").all_inner_texts()
    assert cells[:3] == ["1", "bob", "default server"] and f"waiting for a whole GPU on {H100}" in cells[5], cells
    # a drain from the page, after its question: the core holds the GPU drained (and undrained after)
    gpus = [g for n in hub.service("GET", "inventory").json()["nodes"] for g in n["gpus"]]
    spare = next(g for g in gpus if g["model"] == "L4" and g["whole_free"])
    card = admin.locator(f"article[data-gpu='{spare['uuid']}']")
    asked: list[str] = []
    admin.once("dialog", lambda question: (asked.append(question.message), question.accept()))
    card.get_by_role("button", name="Drain").click()
    card.locator(".badge.drained").wait_for(timeout=MIN)
    assert asked and asked[0].startswith(f"Drain GPU {spare['index']} (L4)"), asked
    assert drained_gpus(hub) == {spare["uuid"]}
    admin.once("dialog", lambda question: question.accept())
    card.get_by_role("button", name="Undrain").click()
    card.locator(".badge.drained").wait_for(state="detached", timeout=MIN)
    assert drained_gpus(hub) == set()

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
    alice.locator(".lm-MenuBar-itemLabel", has_text="File").click()
    with alice.context.expect_page() as opened:
        alice.locator(".lm-Menu-itemLabel", has_text="Hub Control Panel").click()
    home = opened.value
    home.wait_for_load_state("networkidle", timeout=MIN)  # the button works once the page's script has run
    home.locator("#stop", has_text="Stop My Server").click()
    hub.wait_stopped("alice", timeout=60)
    assert state_of(hub, alice_lease) == "released"
    assert time.monotonic() - started < 300, f"the story took {time.monotonic() - started:.0f} s"
