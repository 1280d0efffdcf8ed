"""The GPUs panel in a real JupyterLab, driven by Debian's chromium through Playwright.

JupyterLab runs in embedded mode on the simulated fleet of tests/server (an A100 with MIG made on
demand, an L4 shared by memory caps) with a short idle policy, time-boxed kernel slices and a weekly
usage quota. The test requests a slice for a notebook's kernel from the panel, sees it under My
slices, in the fleet drawing, in the status bar and in the kernel's next cell, sees its memory
used and a sparkline of its SM utilisation, sees its time limit and extends it from the deadline warning,
sees the usage quota and the chart of GPU-hours per day by offer beside it, gets the idle-warning notification,
runs the notebook as a GPU job from the file browser and sees it finish, is refused a second
extension while another request waits, releases the slice (its kernel shut down after a dialog),
sees the waiting slice released at its time limit, and saves
screenshots in the light and the dark theme: in a temporary folder, or in the folder
$GPUALLOC_SCREENSHOTS names (`.venv/bin/python docs/screenshots.py sidebar` retakes
docs/img/sidebar-*.png so); a plain run leaves the repository as it was.
"""

from __future__ import annotations

import json
import contextlib
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from jupyter_gpualloc.core.devices.simulated import report_process_memory
from tests.hubfixture import free_port
from tests.processes import start_logged, wait_until_ready
from tests.server.conftest import FLEET

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DOCS_IMG = REPO / "docs" / "img"
SCREENSHOTS_ENV = "GPUALLOC_SCREENSHOTS"
CHROMIUM = Path("/usr/bin/chromium")
TOKEN = "browser-test-token-123456"
OFFERS = [
    {"name": "mig-1g.5gb", "label": "MIG 1g.5gb", "spec": {"kind": "mig", "profile": "1g.5gb"}},
    {"name": "whole-a100", "label": "Whole A100", "spec": {"kind": "mig", "profile": "7g.40gb"},
     "max_duration": 20},
    {"name": "shared-8gb", "label": "Shared 8 GiB", "spec": {"kind": "shared", "memory_gib": 8, "model": "L4"}},
]
IDLE_TIMEOUT = 25.0  # long enough to see the idle countdown before the warning
IDLE_GRACE = 300.0
# kernels' slices last 15 minutes and are warned at once; each extension adds 10 minutes
DEADLINES = {"max_duration": {"kernel": 900}, "deadline_warning": 895, "max_extensions": 2, "extension": 600}
USAGE_QUOTAS = {"*": {"gpu_hours": 1, "window": "calendar_week"}}
QUOTAS = {"*": {"slices": 2}}
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium_or_skip() -> Path:
    """Debian's chromium; under CI=true its absence fails the test instead of skipping it."""
    if CHROMIUM.exists():
        return CHROMIUM
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium before make test")
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install -y chromium)")


@contextlib.contextmanager
def headless_chromium():
    """Debian's chromium, headless, through Playwright; closed when the block ends."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium_or_skip()), headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class JupyterLabProcess:
    """`jupyter lab` with the shipped server config, embedded mode on the simulated fleet (`fleet`), or
    without a fleet on this machine without GPUs (GPU features off)."""

    def __init__(self, workdir: Path, fleet: bool = True):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        config_dir = workdir / "config"
        shutil.copytree(REPO / "jupyter-config", config_dir)
        (config_dir / "jupyter_server_config.json").write_text(json.dumps({
            "GpuAllocExtension": {"db_url": f"sqlite:///{workdir / 'gpualloc.sqlite'}",
                                  "process_dir": str(workdir / "gpu-processes"),
                                  "tick_interval": 0.5, "report_interval": 0.5, "job_poll_interval": 0.5,
                                  **({"fleet": str(FLEET)} if fleet else {"mode": "embedded"})},
            "SchedulerPolicy": {"offers": OFFERS, "idle_timeout": IDLE_TIMEOUT, "idle_grace": IDLE_GRACE,
                                "usage_quotas": USAGE_QUOTAS, "quotas": QUOTAS, **DEADLINES},
        }))
        # JUPYTER_PATH stays: a checkout's own build of the panel comes first there (see HELPERS: .jpath)
        clean = {k: v for k, v in os.environ.items()
                 if k == "JUPYTER_PATH" or not k.startswith(("GPUALLOC_", "JUPYTERHUB_", "JUPYTER"))}
        self.env = {**clean, "JUPYTER_CONFIG_DIR": str(config_dir), "JUPYTER_DATA_DIR": str(workdir / "data"),
                    "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
                    "JUPYTERLAB_SETTINGS_DIR": str(workdir / "lab-settings"),
                    "JUPYTERLAB_WORKSPACES_DIR": str(workdir / "lab-workspaces"),
                    "PYTHONPATH": os.pathsep.join(sys.path)}
        # no "official Jupyter news?" toast among the notifications under test
        news = workdir / "lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True)
        news.write_text(json.dumps({"fetchNews": "false"}))
        self.root = workdir / "notebooks"
        self.root.mkdir()
        self.proc = None

    def start(self, timeout: float = 120) -> "JupyterLabProcess":
        self.proc = start_logged(
            [sys.executable, "-m", "jupyterlab", "--allow-root", "--no-browser", f"--port={self.port}",
             "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={self.root}",
             "--LabApp.expose_app_in_browser=True"],
            self.workdir / "lab.log", env=self.env, cwd=self.root)
        wait_until_ready(self.proc, lambda: self.call("GET", "gpualloc/api/status")[0] == 200, "jupyter lab",
                         self.log_tail, timeout)
        return self

    def log_tail(self) -> str:
        return (self.workdir / "lab.log").read_text(errors="replace")[-4000:]

    def call(self, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"token {TOKEN}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        children = psutil.Process(self.proc.pid).children(recursive=True)
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:  # a loaded machine: what did not stop in time is killed
            os.killpg(self.proc.pid, 9)
            self.proc.wait(30)
        finally:
            for child in children:
                if child.is_running():
                    child.kill()


@pytest.fixture
def lab(tmp_path):
    server = JupyterLabProcess(tmp_path)
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def page(tmp_path, lab):
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(executable), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 860})
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()


@pytest.fixture
def screenshots(tmp_path) -> Path:
    """Where the screenshots go: the folder $GPUALLOC_SCREENSHOTS names, else a temporary one."""
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_notebook(path: Path, *sources: str) -> None:
    """A Python notebook of code cells (default: one that shows CUDA_VISIBLE_DEVICES)."""
    sources = sources or ("import os\nos.environ.get('CUDA_VISIBLE_DEVICES')",)
    path.write_text(json.dumps({
        "cells": [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
                   "source": source} for i, source in enumerate(sources)],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))


def open_panel(page) -> None:
    """Through the status-bar item, which shows the panel (a click on its sidebar tab would toggle it)."""
    page.locator(".jp-gpualloc-status-button").click()
    page.locator(".jp-gpualloc-panel h2", has_text="GPUs").wait_for()


def run_as_gpu_job(page, notebook: str, offer_label: str) -> None:
    """The file browser's context menu on `notebook`: Run as GPU job, on the offer labelled `offer_label`."""
    page.locator('.lm-TabBar-tab[data-id="filebrowser"]').click()
    page.locator(".jp-DirListing-item", has_text=notebook).click(button="right")
    page.locator(".lm-Menu-item", has_text="Run as GPU job").click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator("select").select_option(label=dialog.locator("option", has_text=offer_label).inner_text())
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    dialog.wait_for(state="detached")


def test_request_warn_run_a_job_and_release_from_the_panel(lab, page, screenshots):
    docs_img = {path: path.stat().st_mtime_ns for path in DOCS_IMG.iterdir()}
    write_notebook(lab.root / "train.ipynb")
    page.goto(f"{lab.url}lab/tree/train.ipynb?token={TOKEN}", timeout=120_000)
    status = page.locator(".jp-gpualloc-status-button")
    status.wait_for(timeout=120_000)
    page.wait_for_function(  # "…" until the server has answered, never a "no GPU" not yet known
        "() => document.querySelector('.jp-gpualloc-status-button').textContent === 'no GPU'", timeout=30_000)
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel", timeout=120_000)

    open_panel(page)
    panel = page.locator(".jp-gpualloc-panel")
    panel.locator('.jp-gpualloc-live.jp-mod-on').wait_for(timeout=30_000)  # the event stream is up
    assert panel.locator('.jp-gpualloc-block[data-owner="free"]').count() == 8  # the A100's memory slices

    panel.get_by_label("Slice to request").select_option("mig-1g.5gb")
    panel.get_by_role("button", name="Request MIG 1g.5gb for train.ipynb").click()

    mine = panel.locator('.jp-gpualloc-slice[data-state="granted"]')
    mine.wait_for(timeout=30_000)
    assert "1g.5gb" in mine.inner_text() and "train.ipynb" in mine.inner_text()
    assert "isolation: MIG" in mine.inner_text()
    block = panel.locator('.jp-gpualloc-block[data-owner="mine"]')
    block.wait_for()
    slices = lab.call("GET", "gpualloc/api/slices")[1]["slices"]
    assert [s["slice"]["profile"] for s in slices] == ["1g.5gb"]
    assert block.get_attribute("data-start") == str(slices[0]["slice"]["start"])
    assert block.inner_text() == "1g.5gb"
    inventory = lab.call("GET", "gpualloc/api/inventory")[1]
    [instance] = [i for node in inventory["nodes"] for gpu in node["gpus"] for i in gpu.get("instances", [])]
    assert inventory["admin"] and instance["user"] == inventory["user"]  # the owner administers this server
    page.wait_for_function(
        "() => document.querySelector('.jp-gpualloc-status-button').textContent.startsWith('GPU 1g.5gb')")

    # no CUDA runs in the kernel: the slice takes effect in it before its next cell, with no %gpu command
    # and no restart; the panel's note and its Restart kernel button go once the kernel has applied it
    panel.get_by_role("button", name="Restart the kernel of train.ipynb").wait_for(state="detached", timeout=30_000)
    assert "next cell" not in mine.inner_text()
    [kernel] = lab.call("GET", "gpualloc/api/kernels")[1]["kernels"]
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    page.locator(".jp-OutputArea-output", has_text=slices[0]["slice"]["mig_uuid"]).wait_for(timeout=30_000)
    assert [k["pid"] for k in lab.call("GET", "gpualloc/api/kernels")[1]["kernels"]] == [kernel["pid"]]
    assert [s["id"] for s in lab.call("GET", "gpualloc/api/slices")[1]["slices"]] == [slices[0]["id"]]

    # the kernel's process takes 3 GiB of its MIG slice and 60 % of its SMs (as the simulated backend reads
    # them): memory used of the cap, and a sparkline of the SM utilisation the watchdog samples
    assert mine.locator('.jp-gpualloc-util[data-measured="false"]').inner_text() == "SM utilisation not measured"
    report_process_memory(lab.workdir / "gpu-processes", kernel["pid"], slices[0]["slice"]["gpu_uuids"][0], 3072,
                          mig_uuid=slices[0]["slice"]["mig_uuid"], sm_percent=60)
    page.wait_for_function(
        "() => document.querySelector('.jp-gpualloc-status-button').textContent === 'GPU 1g.5gb · 3/4.75 GiB'",
        timeout=30_000)
    assert "3 / 4.75 GiB used" in mine.inner_text()
    sparkline = mine.locator('.jp-gpualloc-util[data-measured="true"][data-latest="60"]')
    sparkline.wait_for(timeout=30_000)
    assert sparkline.inner_text().strip() == "SM 60 %"
    assert re.fullmatch(r"SM utilisation over the last \d+ (s|min): now 60 %, peak 60 %",
                        sparkline.get_by_role("img").get_attribute("aria-label"))

    # idle since its cell ended: before any warning the card counts down to the idle release, and says
    # when the warning comes and how long the grace after it lasts
    idle = mine.locator(".jp-gpualloc-idle")
    idle.filter(has_text="idle release in").wait_for(timeout=(IDLE_TIMEOUT - 5) * 1000)
    assert re.fullmatch(r"idle release in \d+ (s|min) \(warned at \d\d:\d\d:\d\d( [AP]M)?, then a 5 min grace\)",
                        idle.inner_text()), idle.inner_text()

    # a time-boxed slice: its time limit in its row; the deadline warning is a notification with Extend
    limit = mine.locator(".jp-gpualloc-deadline")
    limit.wait_for()
    assert re.search(r"time limit: 1[45]:\d\d left · 2 extensions left", limit.inner_text()), limit.inner_text()
    deadline_toast = page.locator(".Toastify__toast", has_text="reaches its time limit")
    deadline_toast.wait_for(timeout=30_000)
    assert "train.ipynb" in deadline_toast.inner_text()
    mine.locator('.jp-gpualloc-deadline[data-warned="true"]').wait_for(timeout=30_000)
    before = lab.call("GET", "gpualloc/api/slices")[1]["slices"][0]["deadline"]
    assert before["warned_at"] is not None and before["extensions_left"] == 2
    deadline_toast.get_by_role("button", name="Extend").click()
    deadline_toast.wait_for(state="detached", timeout=30_000)
    page.locator(".Toastify__toast", has_text="train.ipynb was extended until").wait_for(timeout=30_000)
    mine.locator('.jp-gpualloc-deadline[data-warned="false"][data-extensions-left="1"]').wait_for(timeout=30_000)
    after = lab.call("GET", "gpualloc/api/slices")[1]["slices"][0]["deadline"]
    assert after["at"] == pytest.approx(before["at"] + DEADLINES["extension"]) and after["extensions_left"] == 1
    assert "1 extension left" in limit.inner_text()

    # my usage against the weekly quota: a bar, what is used of the limit and when it resets
    quota = panel.locator(".jp-gpualloc-quota")
    quota.wait_for(timeout=30_000)
    assert quota.get_attribute("data-state") == "ok"
    assert re.search(r"You have used \d+\.\d\d of 1 GPU-hours this week \(resets Mon \d{4}-\d\d-\d\d 00:00 UTC\)",
                     quota.inner_text()), quota.inner_text()
    assert quota.get_by_role("meter").get_attribute("aria-valuenow") is not None
    # beside it, my GPU-hours per day of the last two weeks by offer: today's bar is the MIG slice's
    chart = panel.locator(".jp-gpualloc-usage-chart")
    chart.locator('rect[data-offer="mig-1g.5gb"]').wait_for(state="attached", timeout=30_000)
    assert chart.locator("g[data-day]").count() == 14
    assert "MIG 1g.5gb" in chart.locator('.jp-gpualloc-legend[data-offer="mig-1g.5gb"]').inner_text()

    # idle past the policy's timeout: the warning arrives as a notification with Keep active, and a countdown
    toast = page.locator(".Toastify__toast", has_text="idle")
    toast.wait_for(timeout=(IDLE_TIMEOUT + 30) * 1000)
    assert "train.ipynb" in toast.inner_text()  # the notification names the notebook, not the kernel id
    assert re.search(r"train\.ipynb is idle: it goes at \d\d:\d\d:\d\d", toast.inner_text()), toast.inner_text()
    assert toast.get_by_role("button", name="Keep active").count() == 1
    countdown = panel.locator(".jp-gpualloc-countdown")
    countdown.wait_for()
    assert "released in" in countdown.inner_text()
    assert idle.count() == 0  # the warning's own countdown replaces the one before it

    # the notebook as a background job on a shared slice: it runs and finishes in the Jobs section
    run_as_gpu_job(page, "train.ipynb", "Shared 8 GiB")
    open_panel(page)
    job = panel.locator(".jp-gpualloc-job")
    job.wait_for(timeout=30_000)
    panel.locator('.jp-gpualloc-job[data-state="succeeded"]').wait_for(timeout=120_000)
    page.locator(".Toastify__toast", has_text="succeeded").first.wait_for(timeout=30_000)
    [record] = lab.call("GET", "gpualloc/api/jobs")[1]["jobs"]  # the sidebar API relays REST API v1's jobs
    assert lab.call("GET", "gpualloc/api/jobs/no-such-job/log?follow=1")[0] == 404
    assert record["state"] == "succeeded" and record["source"]["path"] == "train.ipynb"
    assert (lab.root / ".gpualloc" / "jobs" / record["id"] / "executed.ipynb").exists()
    panel.get_by_role("button", name="Show the log of train.ipynb").click()
    panel.locator(".jp-gpualloc-log", has_text="succeeded").wait_for(timeout=30_000)

    assert panel.bounding_box()["width"] <= 260 and panel.evaluate("el => el.scrollWidth <= el.clientWidth + 1"), \
        "the panel overflows sideways at its default 250 px"
    page.wait_for_timeout(1000)  # the notifications' slide-in
    page.screenshot(path=str(screenshots / "sidebar-light.png"))
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    page.wait_for_timeout(500)
    page.screenshot(path=str(screenshots / "sidebar-dark.png"))

    panel.get_by_role("button", name="Open the executed notebook of train.ipynb").click()
    page.locator(".lm-TabBar-tab", has_text=f"train.job-{record['id']}.ipynb").wait_for(timeout=30_000)
    assert (lab.root / f"train.job-{record['id']}.ipynb").exists()
    open_panel(page)
    panel.get_by_role("button", name="Rerun train.ipynb").click()
    page.wait_for_function("() => document.querySelectorAll('.jp-gpualloc-job[data-state=\"succeeded\"]').length === 2",
                           timeout=120_000)

    # a job that would run for minutes: Cancel stops it
    write_notebook(lab.root / "slow.ipynb", "import time\ntime.sleep(600)")
    run_as_gpu_job(page, "slow.ipynb", "Shared 8 GiB")
    open_panel(page)
    running = panel.locator('.jp-gpualloc-job[data-state="running"]')
    running.wait_for(timeout=120_000)
    assert "stopping the server stops them" in panel.inner_text()
    assert "on 8 GiB shared" in running.inner_text()  # the slice granted, not only the request

    # train.ipynb's slice and slow.ipynb's job fill the quota of 2 slices: a third waits, and says why
    write_notebook(lab.root / "third.ipynb")
    run_as_gpu_job(page, "third.ipynb", "Shared 8 GiB")
    open_panel(page)
    waiting = panel.locator('.jp-gpualloc-job[data-state="queued"]', has_text="third.ipynb")
    waiting.locator(".jp-gpualloc-reason", has_text="quota").wait_for(timeout=30_000)
    [third] = [j for j in lab.call("GET", "gpualloc/api/jobs")[1]["jobs"] if j["name"] == "third.ipynb"]
    assert third["reason"] and third["reason"] in waiting.inner_text(), (third, waiting.inner_text())
    assert "asks for 8 GiB shared" in waiting.inner_text()
    offer = panel.locator('.jp-gpualloc-offers li[data-offer="shared-8gb"]')
    offer.filter(has_text="your quota is full now: ").wait_for(timeout=30_000)
    assert "free now" not in offer.inner_text()
    panel.get_by_role("button", name="Cancel third.ipynb").click()  # a queued job: no question
    panel.locator('.jp-gpualloc-job[data-state="cancelled"]', has_text="third.ipynb").wait_for(timeout=60_000)

    # Cancel of a running job asks first
    panel.get_by_role("button", name="Cancel slow.ipynb").click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Cancel the GPU job slow.ipynb?").wait_for()
    dialog.get_by_role("button", name="Cancel the job").click()
    dialog.wait_for(state="detached")
    panel.locator('.jp-gpualloc-job[data-state="cancelled"]', has_text="slow.ipynb").wait_for(timeout=60_000)

    # Keep active clears the idle warning; Release ends the lease
    # one idle-warning notification per slice: a warning that was cleared closed its notification
    page.wait_for_function("() => [...document.querySelectorAll('.Toastify__toast')]"
                           ".filter(t => t.textContent.includes('idle')).length === 1", timeout=10_000)
    page.locator(".Toastify__toast", has_text="idle").get_by_role("button", name="Keep active").click()
    countdown.wait_for(state="detached", timeout=30_000)
    # every control of the panel is reachable from the keyboard and has a name; Release by keyboard
    unlabelled = panel.evaluate("""el => [...el.querySelectorAll('button, select, [tabindex]')]
        .filter(c => c.tabIndex < 0 || !(c.getAttribute('aria-label') || c.textContent.trim()))
        .map(c => c.outerHTML)""")
    assert unlabelled == []
    # a second notebook asks for the whole A100, which train.ipynb's slice takes in part: it waits
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:open', {path: 'slow.ipynb'}); }")
    page.wait_for_function(
        "() => window.jupyterapp.shell.currentWidget?.context?.path === 'slow.ipynb'"
        " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel", timeout=120_000)
    open_panel(page)
    panel.get_by_label("Slice to request").select_option("whole-a100")
    panel.get_by_role("button", name="Request Whole A100 for slow.ipynb").click()
    queued = panel.locator('.jp-gpualloc-slice[data-state="queued"]')
    queued.wait_for(timeout=30_000)
    assert "slow.ipynb" in queued.inner_text() and "position 1 in the queue" in queued.inner_text()
    assert queued.get_by_role("button", name="Cancel the request for slow.ipynb").count() == 1
    # while a request waits, a slice is not extended: the refusal is a notification in plain words
    panel.get_by_role("button", name="Extend the time limit of train.ipynb").click()
    page.locator(".Toastify__toast", has_text="Not extended: others are waiting for GPUs").wait_for(timeout=30_000)
    assert lab.call("GET", "gpualloc/api/slices")[1]["slices"][0]["deadline"]["extensions_left"] == 1

    # Release train.ipynb's slice from the keyboard (its kernel has let go of the GPU memory first:
    # a MIG instance with a process on it cannot be destroyed): the panel asks first, as the kernel is
    # shut down; once it has stopped, the waiting request gets the GPU
    (lab.workdir / "gpu-processes" / f"{kernel['pid']}.json").unlink()
    panel.get_by_role("button", name="Release the slice of train.ipynb").focus()
    page.keyboard.press("Enter")
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Release the GPU slice of train.ipynb?").wait_for()
    assert "shuts the kernel of train.ipynb down: its variables are lost" in dialog.inner_text()
    dialog.get_by_role("button", name="Release and shut down the kernel").click()
    dialog.wait_for(state="detached")
    mine.filter(has_text="train.ipynb").wait_for(state="detached", timeout=30_000)
    page.locator(".Toastify__toast", has_text="The GPU slice of train.ipynb was released").wait_for(timeout=30_000)
    page.locator(".Toastify__toast", has_text="slow.ipynb got its GPU slice").wait_for(timeout=30_000)
    mine.filter(has_text="slow.ipynb").wait_for(timeout=30_000)
    assert kernel["id"] not in [k["id"] for k in lab.call("GET", "api/kernels")[1]]  # train.ipynb's kernel
    page.wait_for_function(
        "() => document.querySelector('.jp-gpualloc-status-button').textContent.startsWith('GPU 7g.40gb')",
        timeout=30_000)
    panel.locator('.jp-gpualloc-block[data-owner="mine"][data-size="8"]').wait_for(timeout=30_000)  # next fetch
    [held] = lab.call("GET", "gpualloc/api/slices")[1]["slices"]
    assert held["state"] == "granted" and held["slice"]["profile"] == "7g.40gb"
    assert held["deadline"]["at"] == pytest.approx(held["granted_at"] + 20)  # the offer's own max_duration

    # the whole A100 is time-boxed to 20 s by its offer: released at its limit, told and listed
    page.locator(".Toastify__toast", has_text="slow.ipynb expired: reached its maximum duration of 20s")\
        .wait_for(timeout=60_000)
    mine.wait_for(state="detached", timeout=30_000)
    ended = panel.locator(".jp-gpualloc-ended li", has_text="slow.ipynb")
    assert "released at its time limit" in ended.inner_text()
    # each ended slice once: its slice, when it was held (local time) and for how long, and why it ended
    span = r"\d\d:\d\d:\d\d( [AP]M)?–\d\d:\d\d:\d\d( [AP]M)? \(\d+ (s|min)\)"
    assert re.fullmatch(rf"slow\.ipynb: 7g\.40gb · {span} · released at its time limit \(.*\)", ended.inner_text())
    [train_ended] = panel.locator(".jp-gpualloc-ended li", has_text="train.ipynb").all()
    assert re.fullmatch(rf"train\.ipynb: 1g\.5gb · {span} · released", train_ended.inner_text()), \
        train_ended.inner_text()
    assert lab.call("GET", "gpualloc/api/slices")[1]["slices"] == []
    # its kernel is shut down with it
    shutdown = page.locator(".Toastify__toast", has_text="was shut down: its GPU lease expired (reached its maximum")
    shutdown.wait_for(timeout=60_000)

    assert {path.name for path in screenshots.iterdir()} >= {"sidebar-light.png", "sidebar-dark.png"}
    if screenshots.resolve() != DOCS_IMG.resolve():  # a plain run leaves the repository's images as they were
        assert {path: path.stat().st_mtime_ns for path in DOCS_IMG.iterdir()} == docs_img

    # the server stops: its tab no longer shows a GPU or "live", says so, and asks the server again only now and then
    lab.stop()
    page.wait_for_function(
        "() => document.querySelector('.jp-gpualloc-status-button').textContent === 'server stopped'", timeout=60_000)
    panel.locator(".jp-gpualloc-banner", has_text="The server stopped").wait_for(timeout=30_000)
    assert panel.locator(".jp-gpualloc-live.jp-mod-on").count() == 0
    assert_asks_only_status(page, 15_000, at_most=2)


def assert_asks_only_status(page, window_ms: int, at_most: int) -> None:
    """Within `window_ms` the tab asks the sidebar API only for the server's status, at most `at_most` times."""
    asked: list[str] = []
    listener = lambda request: asked.append(request.url) if "/gpualloc/api/" in request.url else None  # noqa: E731
    page.on("request", listener)
    page.wait_for_timeout(window_ms)
    page.remove_listener("request", listener)
    paths = [re.sub(r".*/gpualloc/api/([^?]*).*", r"\1", url) for url in asked]
    assert set(paths) <= {"status"} and len(paths) <= at_most, paths


def test_gpu_off_says_why_and_polls_nothing(tmp_path):
    """Embedded mode without a fleet on a machine without GPUs: the panel shows why GPU features are off,
    offers no "Run as GPU job", and asks the server nothing else (no 503 logged every 10 s)."""
    lab = JupyterLabProcess(tmp_path, fleet=False)
    write_notebook(lab.root / "plain.ipynb")
    try:
        lab.start()
        status = lab.call("GET", "gpualloc/api/status")[1]
        if status["mode"] != "off":
            pytest.skip(f"GPU features are on here without a fleet: {status}")
        with headless_chromium() as browser:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            page.goto(f"{lab.url}lab/tree/plain.ipynb?token={TOKEN}", timeout=120_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-gpualloc-status-button')?.textContent === 'GPU off'",
                timeout=120_000)
            open_panel(page)
            panel = page.locator(".jp-gpualloc-panel")
            banner = panel.locator(".jp-gpualloc-banner")
            banner.wait_for()
            assert banner.inner_text() == status["reason"] and "c.GpuAllocExtension.fleet" in banner.inner_text()
            assert "Run as GPU job" not in panel.inner_text()
            page.locator('.lm-TabBar-tab[data-id="filebrowser"]').click()
            page.locator(".jp-DirListing-item", has_text="plain.ipynb").click(button="right")
            page.locator(".lm-Menu-item", has_text="Rename").first.wait_for()
            assert page.locator(".lm-Menu-item:visible", has_text="Run as GPU job").count() == 0
            page.keyboard.press("Escape")
            assert_asks_only_status(page, 12_000, at_most=0)  # checked again once a minute
            assert " 503 " not in (tmp_path / "lab.log").read_text(errors="replace")
            # Check again asks at once
            with page.expect_request(re.compile(r"/gpualloc/api/status\?")):
                open_panel(page)
                panel.get_by_role("button", name="Check the server again now").click()
            assert banner.inner_text() == status["reason"]
    finally:
        lab.stop()


def test_slice_and_job_outputs_outlive_their_kernel(lab, page):
    """What `%gpu status` and a `%%gpu job` cell leave in a notebook is the lease and the job
    themselves, live from the API: after the notebook is saved, its kernel shut down and the page
    reloaded, the job is still shown as it is and the slice as ended, never "model not found"; the job's
    Rerun in the cell says it was resubmitted and shows the new job there."""
    write_notebook(lab.root / "outputs.ipynb", "%gpu request --shared 4GB --model L4\n%gpu status",
                   "%%gpu job --shared 4GB --model L4 --name answer\nx = 6 * 7")
    page.goto(f"{lab.url}lab/tree/outputs.ipynb?token={TOKEN}", timeout=120_000)
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.context?.path === 'outputs.ipynb'"
        " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel", timeout=120_000)
    page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
    slice_output = page.locator(".jp-OutputArea .jp-gpualloc-lease-output .jp-gpualloc-slice[data-state=granted]")
    slice_output.wait_for(timeout=60_000)
    assert slice_output.get_by_role("button", name=re.compile("^Release the slice of")).count() == 1
    job_output = page.locator(".jp-OutputArea .jp-gpualloc-job-output")
    job_output.locator('.jp-gpualloc-job[data-state="succeeded"]').wait_for(timeout=120_000)
    assert "answer" in job_output.inner_text()
    page.evaluate("async () => { await window.jupyterapp.commands.execute('docmanager:save'); }")
    saved = json.loads((lab.root / "outputs.ipynb").read_text())
    bundles = [o["data"] for cell in saved["cells"] for o in cell["outputs"] if "data" in o]
    [lease_id] = [b["application/vnd.jupyter-gpualloc.lease+json"]["lease_id"] for b in bundles
                  if "application/vnd.jupyter-gpualloc.lease+json" in b]
    [job_id] = [b["application/vnd.jupyter-gpualloc.job+json"]["job_id"] for b in bundles
                if "application/vnd.jupyter-gpualloc.job+json" in b]
    assert all("application/vnd.jupyter.widget-view+json" in b for b in bundles if "text/plain" in b)

    # the kernel, and with it every widget model, is gone; the page comes back to the notebook
    for kernel in lab.call("GET", "api/kernels")[1]:
        assert lab.call("DELETE", f"api/kernels/{kernel['id']}")[0] == 204
    page.goto(f"{lab.url}lab/tree/outputs.ipynb?token={TOKEN}", timeout=120_000)
    job = page.locator(f'.jp-gpualloc-job-output .jp-gpualloc-job[data-job="{job_id}"][data-state="succeeded"]')
    job.wait_for(timeout=60_000)
    assert job.get_by_role("button", name="Rerun answer").count() == 1
    ended = page.locator(f'.jp-gpualloc-lease-output [data-lease="{lease_id}"][data-state="ended"]')
    ended.wait_for(timeout=60_000)
    assert "ended" in ended.inner_text()
    assert "model not found" not in page.locator(".jp-Notebook").inner_text()

    # Rerun from the cell: the cell says the job was resubmitted and shows the new job until it finishes
    job.get_by_role("button", name="Rerun answer").click()
    note = page.locator(".jp-gpualloc-job-output .jp-gpualloc-rerun")
    note.wait_for(timeout=30_000)
    [rerun] = [j for j in lab.call("GET", "gpualloc/api/jobs")[1]["jobs"] if j.get("rerun_of") == job_id]
    assert note.inner_text().startswith(f"Rerun: resubmitted as job {rerun['id']} ("), note.inner_text()
    page.locator(f'.jp-gpualloc-job-output .jp-gpualloc-job[data-job="{rerun["id"]}"][data-state="succeeded"]') \
        .wait_for(timeout=120_000)
    note.filter(has_text="(succeeded)").wait_for(timeout=30_000)


def test_restart_as_a_gpu_kernel_where_kernels_run_in_pods(lab, page):
    """Where GPU kernels run in pods of their own (Kubernetes kernel pods, faked here: the browser's
    offers sheet, request and slices are answered by the test), the Request button restarts the
    notebook's kernel as a GPU kernel after a dialog, shows the server's note, and the status bar
    shows the restarted kernel's place in the queue."""
    write_notebook(lab.root / "pod.ipynb")
    posted = []
    note = "the kernel of pod.ipynb restarts in a pod of its own with a MIG 1g.5gb slice"
    sheet = {"offers": [{**OFFERS[0], "available": 0}], "kernel_pods": True,
             "refused_holders": {"kernel": "on Kubernetes a running kernel cannot get a GPU slice"}}

    def fulfill(route, status: int, body) -> None:
        route.fulfill(status=status, content_type="application/json", body=json.dumps(body))

    def request(route) -> None:
        posted.append(json.loads(route.request.post_data))
        fulfill(route, 202, {"kernel_id": posted[-1]["kernel_id"], "restarting": True,
                             "offer": posted[-1]["offer"], "note": note})

    def slices(route) -> None:
        if not posted:
            fulfill(route, 200, {"slices": []})
            return
        kernel_id = posted[-1]["kernel_id"]
        fulfill(route, 200, {"slices": [{
            "id": "pod-lease", "user": "me", "holder": f"kernel:{kernel_id}", "spec": OFFERS[0]["spec"],
            "priority": "interactive", "state": "queued", "slice": None, "created_at": 0, "reason": "",
            "position": 2, "kernel": None}]})

    page.route(re.compile(r"/gpualloc/api/offers\?"), lambda route: fulfill(route, 200, sheet))
    page.route(re.compile(r"/gpualloc/api/request\?"), request)
    page.route(re.compile(r"/gpualloc/api/slices\?"), slices)
    page.goto(f"{lab.url}lab/tree/pod.ipynb?token={TOKEN}", timeout=120_000)
    page.wait_for_function(
        "() => window.jupyterapp?.shell.currentWidget?.context?.path === 'pod.ipynb'"
        " && window.jupyterapp.shell.currentWidget.sessionContext?.session?.kernel", timeout=120_000)
    [kernel] = lab.call("GET", "api/kernels")[1]
    open_panel(page)
    panel = page.locator(".jp-gpualloc-panel")
    restart = panel.get_by_role("button", name="Restart pod.ipynb as a GPU kernel with MIG 1g.5gb")
    assert restart.inner_text() == "Restart as a GPU kernel…" and restart.is_enabled()

    # the dialog says what a restart costs; Cancel asks the server nothing
    restart.click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Restart pod.ipynb as a GPU kernel?").wait_for()
    assert "runs in a pod of its own" in dialog.inner_text() and "variables are lost" in dialog.inner_text()
    dialog.get_by_role("button", name="Cancel").click()
    dialog.wait_for(state="detached")
    assert posted == []

    restart.click()
    dialog.get_by_role("button", name="Restart with MIG 1g.5gb").click()
    dialog.wait_for(state="detached")
    queued = panel.locator('.jp-gpualloc-slice[data-state="queued"]')
    queued.wait_for(timeout=30_000)
    assert posted == [{"offer": "mig-1g.5gb", "kernel_id": kernel["id"], "restart": True}]
    assert "pod.ipynb" in queued.inner_text() and note in queued.inner_text()
    page.wait_for_function(
        "() => document.querySelector('.jp-gpualloc-status-button').textContent"
        " === 'waiting for a GPU slice: position 2'", timeout=30_000)
    assert panel.get_by_text("The kernel of pod.ipynb already has a slice or a request.").count() == 1
