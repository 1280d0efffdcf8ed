"""Retake the documentation's screenshots: `.venv/bin/python docs/screenshots.py [spawn-form] [sidebar]`.

spawn-form (docs/spawn-form.png): starts `jupyter-gpualloc demo` on a free port, in a temporary
directory, with the simulated demo fleet and the policy of docs/usage.md (time-boxed servers, a
weekly usage quota), logs in as carol in Debian's chromium (/usr/bin/chromium) through Playwright,
and saves her spawn form: where she stands, each offer's time limit, and the offer her quota
never allows greyed out.

sidebar (docs/img/sidebar-light.png and sidebar-dark.png): runs tests/browser/test_sidebar.py with
$GPUALLOC_SCREENSHOTS set to docs/img (a plain run of the test saves them in a temporary folder).
It needs the built labextension (`cd labextension && jlpm build:prod`).

With no argument, both.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
OUTPUT = REPO / "docs" / "spawn-form.png"
SIDEBAR = [REPO / "docs" / "img" / f"sidebar-{theme}.png" for theme in ("light", "dark")]
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


def main() -> int:
    parser = argparse.ArgumentParser(description="Retake the documentation's screenshots.")
    parser.add_argument("which", nargs="*", metavar="spawn-form|sidebar", help="which screenshots (default: all)")
    which = parser.parse_args().which or ["spawn-form", "sidebar"]
    unknown = sorted(set(which) - {"spawn-form", "sidebar"})
    if unknown:
        parser.error(f"no screenshots named {', '.join(unknown)}: spawn-form or sidebar")
    if "spawn-form" in which:
        retake_spawn_form()
    if "sidebar" in which:
        retake_sidebar()
    return 0


if __name__ == "__main__":
    sys.exit(main())
