"""The spawn form's usage standing and time limits, and the progress page's deadline, on the demo
config's real JupyterHub with a policy of time-boxed servers and usage quotas."""

from __future__ import annotations

import re

import pytest
import requests

from .conftest import Browser, DemoHub
from .test_demo_hub import run_cell

POLICY = """
c.SchedulerPolicy.max_duration = {"server": 14400}
c.SchedulerPolicy.max_extensions = 2
c.SchedulerPolicy.usage_quotas = {"*": {"gpu_hours": 40, "window": "calendar_week"},
                                  "erin": {"gpu_hours": 0, "window": "calendar_week"}}
"""
# the spawn request answers at once, so the progress page is read while the server starts
HUB = """
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
"""
RESETS = r"\(resets Mon \d{4}-\d\d-\d\d 00:00 UTC\)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    hub = DemoHub(tmp_path_factory.mktemp("time-and-usage-hub"), service_config=POLICY, extra_config=HUB).start()
    try:
        yield hub
    finally:
        hub.stop()
        hub.kill_servers()


def test_the_form_shows_where_the_user_stands_and_how_long_each_offer_lasts(hub):
    alice = Browser(hub, "alice")
    alice.login()
    html = alice.spawn_form()
    assert re.search(rf'<p class="gpualloc-usage small">GPU usage: you have used 0\.00 of 40 GPU-hours this week '
                     rf'{RESETS}</p>', html), html
    assert ('MIG 1g.10gb on A100 80GB <small class="text-muted">(14 free now; up to 4 h, extendable 2x)</small>'
            in html)
    assert 'value="mig-1g.10gb" checked' not in html and 'value="none" checked' in html


def test_offers_a_used_up_usage_quota_refuses_are_greyed_out_with_the_sentence(hub):
    erin = Browser(hub, "erin")
    erin.login()
    html = erin.spawn_form()
    sentence = rf"you have used 0\.00 of 0 GPU-hours this week {RESETS}"
    assert re.search(rf"GPU usage: {sentence}</p>", html), html
    greyed = re.findall(r'value="([^"]+)" disabled>', html)
    assert "none" not in greyed and {"mig-1g.10gb", "whole-h100", "shared-8gb-l4"} <= set(greyed)
    assert re.search(rf'Whole H100 <small class="text-muted">\(usage quota used up: {sentence}\)</small>', html)
    reply = hub.api("POST", "/users/erin/server", {"user_options": {"gpu": "whole-h100"}}, token=hub.token("erin"))
    assert reply.status_code == 202, reply.text  # refused while starting: the progress page says why
    failed = hub.progress("erin", until="Spawn failed")[-1]
    assert failed["failed"] and re.fullmatch(
        rf"Spawn failed: You cannot have Whole H100 now: {sentence}\. Until then, choose No GPU\.", failed["message"])


def test_the_progress_page_shows_the_slices_deadline(hub):
    reply = hub.api("POST", "/users/alice/server", {"user_options": {"gpu": "mig-1g.10gb"}}, token=hub.token("alice"))
    assert reply.status_code == 202, reply.text
    events = hub.progress("alice", until="GPU slice held until")
    assert re.fullmatch(r"GPU slice held until (\w{3} )?\d\d:\d\d UTC \(4 h\); extend with %gpu extend or the sidebar",
                        events[-1]["message"]), events
    server = hub.wait_ready("alice")
    lease = next(l for l in hub.leases() if l["id"] == server["state"]["gpu_lease_id"])
    assert lease["deadline"]["at"] - lease["granted_at"] == 14400 and lease["deadline"]["extensions_left"] == 2


def test_a_kernel_on_the_servers_slice_sees_its_time_limit_and_extends_it(hub):
    """What the progress page promises: %gpu extend in a notebook extends the server's slice."""
    headers = {"Authorization": f"token {hub.token('alice')}"}
    reply = requests.post(hub.url + "/user/alice/api/kernels", json={"name": "python3"}, timeout=60, headers=headers)
    assert reply.status_code == 201, reply.text
    kernel_id = reply.json()["id"]
    try:
        status = run_cell(hub, "alice", kernel_id, "%gpu status")
        uses = r"^gpu: this kernel uses its server's MIG 1g\.10gb on A100-SXM4-80GB \(local\) \(lease \w+\)"
        assert re.search(uses, status, re.M), status
        assert re.search(r"^  time limit: until \S+ \d\d:\d\d UTC \(in (3h 59m|4h)\), 2 extensions left "
                         r"\(%gpu extend\)$", status, re.M), status
        usage = rf"^  usage: you have used \d+\.\d\d of 40 GPU-hours this week {RESETS}$"
        assert re.search(usage, status, re.M), status
        server = next(l for l in hub.leases() if l["user"] == "alice" and l["holder"] == "server")
        extended = run_cell(hub, "alice", kernel_id, "%gpu extend")
        assert re.fullmatch(rf"gpu: your server's lease {server['id']} extended until .* UTC \(in .*\), "
                            r"1 extension left\n", extended), extended
        assert next(l for l in hub.leases() if l["id"] == server["id"])["deadline"]["extensions"] == 1
    finally:
        requests.delete(hub.url + f"/user/alice/api/kernels/{kernel_id}", timeout=60, headers=headers)
    assert hub.api("DELETE", "/users/alice/server").status_code in (202, 204)
    hub.wait_stopped("alice")
