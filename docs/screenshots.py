"""Retake the documentation's screenshots: `.venv/bin/python docs/screenshots.py [spawn-form] [sidebar] [admin-page]`.

spawn-form (docs/spawn-form.png): starts `jupyter-gpualloc demo` on a free port, in a temporary
directory, with the simulated demo fleet and the policy of docs/usage.md (time-boxed servers, a
weekly usage quota), logs in as carol in Debian's chromium (/usr/bin/chromium) through Playwright,
and saves her spawn form: where she stands, each offer's time limit, and the offer her quota
never allows greyed out.

sidebar (docs/img/sidebar-light.png and sidebar-dark.png): runs tests/browser/test_sidebar.py with
$GPUALLOC_SCREENSHOTS set to docs/img (a plain run of the test saves them in a temporary folder).
It needs the built labextension (`cd labextension && jlpm build:prod`).

admin-page (docs/img/admin-page.png): starts `jupyter-gpualloc serve` standalone on a free port over
the demo fleet, where alice, bob, carol and dave hold slices (a server, kernels, a job with GPU
utilisation samples) and two requests wait (one for bob's whole H100, one behind carol's quota),
signs in to the service's page with the admin's token and saves it whole.

With no argument, all three.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
OUTPUT = REPO / "docs" / "spawn-form.png"
SIDEBAR = [REPO / "docs" / "img" / f"sidebar-{theme}.png" for theme in ("light", "dark")]
ADMIN_PAGE = REPO / "docs" / "img" / "admin-page.png"
TOKENS = {f"{user}-screenshot-token": {"user": user, "admin": user == "admin"}
          for user in ("admin", "alice", "bob", "carol", "dave")}
ADMIN_POLICY = """
c.SchedulerPolicy.quotas = {"carol": {"slices": 1}}
c.SchedulerPolicy.heartbeat_ttl = 3600
c.SchedulerPolicy.wait_for_holders = False
"""
POLICY = """
c.SchedulerPolicy.max_duration = {"server": 14400, "kernel": 14400}
c.SchedulerPolicy.max_extensions = 2
c.SchedulerPolicy.usage_quotas = {"*": {"gpu_hours": 40, "window": "calendar_week"}}
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, demo: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            sys.exit(f"error: the demo exited with status {demo.returncode} (its log is above)")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    sys.exit(f"error: {url} did not answer within {timeout:.0f} s")


def screenshot_spawn_form(url: str, user: str, output: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.goto(f"{url}/hub/login")
            page.fill("#username_input", user)
            page.fill("#password_input", "any")
            page.click("#login_submit")
            page.wait_for_load_state()
            page.goto(f"{url}/hub/spawn")
            heading, form = page.locator("h1").first.bounding_box(), page.locator("#spawn_form").bounding_box()
            pad = 24  # the heading "Server Options" and the form, with a margin
            page.screenshot(path=str(output), clip={
                "x": form["x"] - pad, "y": heading["y"] - pad,
                "width": form["width"] + 2 * pad, "height": form["y"] + form["height"] - heading["y"] + 2 * pad})
        finally:
            browser.close()


def retake_sidebar() -> None:
    """The browser test's screenshots, saved in docs/img; exits with its output if it fails or skips."""
    started = time.time()
    env = dict(os.environ, GPUALLOC_SCREENSHOTS=str(SIDEBAR[0].parent))
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/browser/test_sidebar.py"], cwd=REPO, env=env)
    if test.returncode != 0 or any(path.stat().st_mtime < started for path in SIDEBAR):
        sys.exit("error: tests/browser/test_sidebar.py did not save the sidebar's screenshots (its output is above)")
    for path in SIDEBAR:
        print(f"wrote {path.relative_to(REPO)}")


def retake_spawn_form() -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpualloc-screenshots-") as runtime:
        (Path(runtime) / "policy.py").write_text(POLICY)
        env = dict(os.environ, GPUALLOC_DEMO_DIR=runtime, GPUALLOC_DEMO_PORT=str(port),
                   GPUALLOC_DEMO_FLEET=str(REPO / "hub_config" / "demo-fleet.yaml"),
                   GPUALLOC_DEMO_SERVICE_CONFIG=str(Path(runtime) / "policy.py"))
        demo = subprocess.Popen([str(Path(sys.executable).parent / "jupyter-gpualloc"), "demo"], env=env,
                                stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(f"{url}/services/gpualloc/api/v1/health", demo)
            screenshot_spawn_form(url, "carol", OUTPUT)
        finally:
            demo.send_signal(signal.SIGTERM)  # the demo stops its hub, proxy and service
            demo.wait(30)
    print(f"wrote {OUTPUT.relative_to(REPO)}")


def call(url: str, method: str, path: str, user: str, body: dict | None = None) -> dict:
    """One API call as `user`; exits with the answer if it fails."""
    request = urllib.request.Request(f"{url}/api/v1/{path}", method=method, headers={
        "Authorization": f"Bearer {user}-screenshot-token", "Content-Type": "application/json"},
        data=None if body is None else json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as err:
        sys.exit(f"error: {method} {path} as {user}: {err.code} {err.read().decode()}")


def hold_slices(url: str, workdir: Path) -> None:
    """Who holds what on the demo fleet, and who waits."""
    job = {"workdir": str(workdir), "source": {"kind": "cell", "code": "train()"}}
    call(url, "POST", "leases", "alice", {"spec": {"kind": "mig", "profile": "1g.10gb"}, "holder": "server"})
    bob = call(url, "POST", "leases", "bob", {"spec": {"kind": "whole", "model": "H100 80GB HBM3"}, "holder": "server"})
    call(url, "POST", "leases", "carol", {"spec": {"kind": "shared", "memory_gib": 8, "model": "L4"},
                                          "holder": "kernel:7c41d2e9-0b5a-4f3e-9d61-2a8f1e4c3b70"})
    call(url, "POST", "jobs", "alice", {**job, "name": "finetune-bert", "spec": {"kind": "mig", "profile": "3g.40gb"}})
    call(url, "POST", "jobs", "dave", {**job, "name": "render-frames", "spec": {"kind": "whole", "model": "H100 80GB HBM3"}})
    call(url, "POST", "jobs", "carol", {**job, "name": "sweep", "spec": {"kind": "shared", "memory_gib": 4, "model": "L4"}})
    for sm_percent in (70, 64):  # the GPU-busy share of bob's server, as its watchdog reports it
        call(url, "POST", f"leases/{bob['id']}/utilization", "admin", {"sm_percent": sm_percent})
        time.sleep(1)


def screenshot_admin_page(url: str, output: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url + "/")
            page.fill("#token", "admin-screenshot-token")
            page.click("#token-form button")
            page.locator("#queue-list tbody tr").first.wait_for()
            page.screenshot(path=str(output), full_page=True)
        finally:
            browser.close()


def retake_admin_page() -> None:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="gpualloc-screenshots-") as runtime:
        config = Path(runtime) / "gpualloc_config.py"
        config.write_text(f"c.GpuAllocService.api_tokens = {TOKENS!r}\n{ADMIN_POLICY}")
        service = subprocess.Popen(
            [str(Path(sys.executable).parent / "jupyter-gpualloc"), "serve", "--port", str(port),
             "--fleet", str(REPO / "hub_config" / "demo-fleet.yaml"), "--db", f"sqlite:///{runtime}/gpualloc.sqlite",
             "-f", str(config), "--audit-log", ""],
            cwd=runtime, env={k: v for k, v in os.environ.items() if k != "JUPYTERHUB_API_TOKEN"},
            stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_for(f"{url}/api/v1/health", service)
            hold_slices(url, Path(runtime))
            screenshot_admin_page(url, ADMIN_PAGE)
        finally:
            service.send_signal(signal.SIGTERM)
            service.wait(30)
    print(f"wrote {ADMIN_PAGE.relative_to(REPO)}")


def main() -> int:
    parser = argparse.ArgumentParser(description="Retake the documentation's screenshots.")
    parser.add_argument("which", nargs="*", metavar="spawn-form|sidebar|admin-page",
                        help="which screenshots (default: all)")
    which = parser.parse_args().which or ["spawn-form", "sidebar", "admin-page"]
    unknown = sorted(set(which) - {"spawn-form", "sidebar", "admin-page"})
    if unknown:
        parser.error(f"no screenshots named {', '.join(unknown)}: spawn-form, sidebar or admin-page")
    if "spawn-form" in which:
        retake_spawn_form()
    if "sidebar" in which:
        retake_sidebar()
    if "admin-page" in which:
        retake_admin_page()
    return 0


if __name__ == "__main__":
    sys.exit(main())
