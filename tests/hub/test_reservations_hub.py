"""A reservation for a group on the demo config's real JupyterHub: members' servers start on
reserved slices while a non-member waits (issue 27)."""

from __future__ import annotations

import time

import pytest

from .conftest import Browser, DemoHub
from .test_demo_hub import active_lease, spawn


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # dave waits in the queue while two servers start: the demo's own start timeout, not the tests'
    # 60 s, under which a loaded machine's two starts outlast his wait and his spawn gives up
    hub = DemoHub(tmp_path_factory.mktemp("reservations-hub"), start_timeout=600,
                  extra_config='c.JupyterHub.load_groups = {"students": ["bob", "carol"]}\n').start()
    try:
        yield hub
    finally:
        hub.stop()
        hub.kill_servers()


def test_members_start_on_reserved_slices_while_a_non_member_waits(hub):
    for user in ("bob", "carol", "dave"):
        hub.token(user)
    now = time.time()
    made = hub.service("POST", "reservations", {
        "name": "ml101", "groups": ["students"], "spec": {"kind": "mig", "profile": "1g.10gb"}, "count": 14,
        "start": now - 60, "end": now + 3600})
    assert made.status_code == 201, made.text
    bob = Browser(hub, "bob")
    bob.login()
    assert "ml101 reservation: 14 of 14 free until " in bob.spawn_form()
    assert spawn(hub, "dave", {"gpu": "mig-1g.10gb"}).status_code in (201, 202)
    hub.progress("dave", until="position 1 in queue")
    for user in ("bob", "carol"):
        assert spawn(hub, user, {"gpu": "mig-1g.10gb"}).status_code in (201, 202)
        hub.wait_ready(user)
        lease = hub.service("GET", f"leases/{active_lease(hub, user)['id']}").json()
        assert lease["state"] == "granted" and lease["reservation"] == "ml101"
        assert lease["deadline"]["at"] == made.json()["next_end"]
    assert active_lease(hub, "dave")["state"] == "queued"
    assert hub.service("GET", "reservations/ml101").json()["in_use"] == 2
