"""The allocator's page (the service's root URL) in Debian's chromium through Playwright.

Standalone: a `jupyter-gpualloc serve` over the service tests' fleet, where bob's server, alice's
kernel (whose GPU use her watchdog reported) and her job "train-resnet" hold slices, carol's kernel
too, and carol's job "sweep" waits behind her quota. The admin signs in with a token, sees every
slice with its user, readable holder, local time and measured use, the queue with the core's
reason, usage by user, and drains a GPU from the page (accepting its confirmation);
the core then holds that GPU drained. alice sees her own slices and none of the others' names, and
no actions.

In hub mode (the demo hub, hub_config/): the admin opens the page from the hub's Services menu
(through JupyterHub's OAuth) and releases alice's slice from it, which takes JupyterHub's XSRF token.

Skipped with a reason without /usr/bin/chromium, except under CI=true, where that fails.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from tests.browser.test_sidebar import chromium_or_skip, headless_chromium
from tests.service.conftest import ALICE, BOB, CAROL, POLICY, ROOT, ServiceProcess

pytestmark = pytest.mark.slow

MIG = {"profile": "1g.5gb"}
MIN = 60_000  # ms
EPOCH = re.compile(r"\b1[0-9]{9}(\.[0-9]+)?\b")  # an epoch float a person would have to decode


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    chromium_or_skip()
    workdir = tmp_path_factory.mktemp("admin-page")
    svc = ServiceProcess(workdir, config=POLICY).start()
    held = {
        "bob": svc.call("POST", "leases", {"spec": MIG, "holder": "server"}, BOB).json(),
        "alice": svc.call("POST", "leases", {"spec": MIG, "holder": "kernel:5f2c9e01-aaaa"}, ALICE).json(),
        "carol": svc.call("POST", "leases", {"spec": MIG, "holder": "kernel:c1"}, CAROL).json(),
    }
    svc.job = submit_job(svc, ALICE, "train-resnet", {"kind": "shared", "memory_gib": 4, "model": "L4"}, workdir)
    held["carol_queued"] = submit_job(svc, CAROL, "sweep", MIG, workdir)["lease"]  # a batch job waits for her quota
    assert [held[k].get("state") for k in held] == ["granted", "granted", "granted", "queued"], held
    assert svc.job["lease"]["state"] == "granted", svc.job
    for sm_percent in (80, 80):  # two samples of alice's kernel's GPU use, as its watchdog sends them
        assert svc.call("POST", f"leases/{held['alice']['id']}/utilization", {"sm_percent": sm_percent}, ALICE).status == 200
        time.sleep(1)
    svc.held = held
    yield svc
    svc.kill(signal.SIGTERM)


def submit_job(svc, token: str, name: str, spec: dict, workdir) -> dict:
    job = svc.call("POST", "jobs", {"spec": spec, "workdir": str(workdir), "name": name,
                                    "source": {"kind": "cell", "code": "x = 1"}}, token)
    assert job.status == 201, job
    return svc.call("GET", f"jobs/{job.json()['id']}", token=token).json()


@pytest.fixture
def browser(service):  # one per test: pytest-jupyter's event loop is made and closed around each test
    with headless_chromium() as launched:
        yield launched


def signed_in(browser, service, token: str):
    """A browser profile of its own on the service's root, signed in with `token` through the page's form."""
    page = browser.new_context(viewport={"width": 1300, "height": 900}).new_page()
    page.goto(service.url.removesuffix("api/v1/"), timeout=MIN)
    page.locator("#token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#content").wait_for(timeout=MIN)
    return page


def row(page, where: str, lease: dict):
    return page.locator(f"{where} tr[data-lease='{lease['id']}']")


def test_an_admin_sees_every_slice_and_the_queue_and_drains_a_gpu(browser, service):
    page = signed_in(browser, service, ROOT)
    assert "admin" in page.locator("#who").inner_text()
    bob = row(page, "#gpu-list", service.held["bob"])
    bob.wait_for(timeout=MIN)
    cells = bob.locator("td").all_inner_texts()
    assert cells[1:3] == ["bob", "default server"], cells
    assert cells[0] == "1g.5gb (MIG)" and not EPOCH.search(bob.inner_text()), cells
    granted = bob.locator("time").get_attribute("datetime")
    assert abs(_iso_epoch(granted) - service.held["bob"]["granted_at"]) < 1, granted
    assert cells[6] == "not measured", cells
    job = row(page, "#gpu-list", service.job["lease"])
    assert job.locator("td").all_inner_texts()[1:3] == ["alice", 'job "train-resnet"']
    assert job.get_by_role("button").inner_text() == "Cancel job"
    kernel = row(page, "#gpu-list", service.held["alice"]).locator("td").all_inner_texts()
    assert kernel[2] == "kernel 5f2c9e01" and re.fullmatch(r"[1-9][0-9]?% busy", kernel[6]), kernel

    queued = row(page, "#queue-list", service.held["carol_queued"]).locator("td").all_inner_texts()
    assert queued[:3] == ["1", "carol", 'job "sweep"'], queued
    assert queued[5] == service.held["carol_queued"]["reason"] and "user quota for carol" in queued[5], queued
    assert {"alice", "bob", "carol"} <= set(page.locator("#usage-list tbody tr td:first-child").all_inner_texts())

    # drain the second L4, which holds nothing: the page asks first, then the core holds it drained
    gpus = [g for n in service.call("GET", "inventory", token=ROOT).json()["nodes"] for g in n["gpus"]]
    spare = next(g for g in gpus if g["model"] == "L4" and g["whole_free"])
    card = page.locator(f"article[data-gpu='{spare['uuid']}']")
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    card.get_by_role("button", name="Drain").click()
    card.locator(".badge.drained").wait_for(timeout=MIN)
    assert asked and asked[0].startswith(f"Drain GPU {spare['index']} (L4) on node0?"), asked
    assert drained_gpus(service) == {spare["uuid"]}
    assert "Drained GPU" in page.locator("#notice").inner_text()
    # a dismissed confirmation changes nothing
    page.once("dialog", lambda dialog: dialog.dismiss())
    card.get_by_role("button", name="Undrain").click()
    page.wait_for_timeout(500)
    assert drained_gpus(service) == {spare["uuid"]}
    service.call("DELETE", f"gpus/{spare['uuid']}/drain", token=ROOT)


def test_a_user_sees_only_their_own_slices_and_no_actions(browser, service):
    page = signed_in(browser, service, ALICE)
    row(page, "#gpu-list", service.held["alice"]).wait_for(timeout=MIN)
    assert "your slices only" in page.locator("#who").inner_text()
    job = row(page, "#gpu-list", service.job["lease"]).locator("td").all_inner_texts()
    assert job[1:3] == ["alice", 'job "train-resnet"'], job
    text = page.locator("body").inner_text()
    for other in ("bob", "carol", "root", "default server", "sweep", "kernel c1"):
        assert other not in text, (other, text)
    assert "held by other users" in text and "Nobody is waiting." in text
    assert page.locator("button.action").count() == 0
    assert set(page.locator("#usage-list tbody tr td:first-child").all_inner_texts()) == {"alice"}


def test_a_refused_token_is_asked_again_and_never_put_in_the_url(browser, service):
    page = browser.new_context().new_page()
    page.goto(service.url.removesuffix("api/v1/"), timeout=MIN)
    page.locator("#token").fill("not-a-token-at-all")
    page.get_by_role("button", name="Sign in").click()
    page.locator("#token-error", has_text="refused").wait_for(timeout=MIN)
    assert "token" not in page.url and page.locator("#content").is_hidden()
    assert page.context.cookies() == []


def drained_gpus(service) -> set[str]:
    """The GPUs the core holds drained."""
    nodes = service.call("GET", "inventory", token=ROOT).json()["nodes"]
    return {g["uuid"] for n in nodes for g in n["gpus"] if g["drained"]}


def _iso_epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
def demo_hub(tmp_path):
    from tests.hub.conftest import DemoHub

    chromium_or_skip()
    hub = DemoHub(tmp_path, service_config="c.SchedulerPolicy.heartbeat_ttl = 3600\n").start()
    try:
        yield hub
    finally:
        hub.stop()


def test_in_the_hub_an_admin_opens_the_page_from_the_services_menu_and_releases_a_slice(demo_hub):
    reply = demo_hub.service("POST", "leases", {"offer": "shared-8gb-l4", "holder": "kernel:0e1d2c3b4a"}, user="alice")
    assert reply.status_code == 201, reply.text
    lease = reply.json()
    with headless_chromium() as browser:
        page = browser.new_context(viewport={"width": 1300, "height": 900}).new_page()
        page.goto(demo_hub.url + "/hub/login", timeout=MIN)
        page.locator("#username_input").fill("admin")
        page.locator("#password_input").fill("any password")
        page.locator("#login_submit").click()
        page.wait_for_url(lambda url: "/hub/login" not in url, timeout=MIN)
        page.goto(demo_hub.url + "/hub/home", timeout=MIN)
        page.get_by_role("button", name="Services").click()
        page.get_by_role("link", name="gpualloc").click()  # through JupyterHub's OAuth, back to the page
        page.wait_for_url(demo_hub.url + "/services/gpualloc/", timeout=MIN)
        alice = row(page, "#gpu-list", lease)
        alice.wait_for(timeout=MIN)
        assert alice.locator("td").all_inner_texts()[:3] == ["shared 8 GiB", "alice", "kernel 0e1d2c3b"]
        assert "admin" in page.locator("#who").inner_text() and page.locator("#token-form").is_hidden()
        page.once("dialog", lambda dialog: dialog.accept())
        alice.get_by_role("button", name="Release").click()
        page.locator("#notice", has_text="Released alice's kernel 0e1d2c3b").wait_for(timeout=MIN)
    ended = demo_hub.service("GET", f"leases/{lease['id']}").json()
    assert (ended["state"], ended["reason"]) == ("released", "released by admin"), ended
