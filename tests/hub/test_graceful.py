"""A hub is never worse off for the allocator: No GPU servers start whether the allocator is
down, not configured, or not granted to the user, and the form and errors say why plainly."""

from __future__ import annotations

import time

import pytest

from tests.hubfixture import Hub, free_port

from .conftest import Browser

ACCESS = "access:services!service=gpualloc"
SPAWNER = """
c.JupyterHub.spawner_class = "jupyter_gpualloc.hub.GPUSameUserSpawner"
c.GPUSameUserSpawner.home_dir_template = {homes!r} + "/{{username}}"
c.GPUSpawnerMixin.gpu_request_timeout = 2
"""


def hub_with(workdir, *, services=(), roles=()) -> Hub:
    return Hub(workdir, services=services, roles=roles, extra_config=SPAWNER.format(homes=str(workdir / "homes")))


@pytest.fixture(scope="module")
def down_hub(tmp_path_factory):
    """A hub whose gpualloc service is configured but not running; bob lacks its scope."""
    workdir = tmp_path_factory.mktemp("hub-allocator-down")
    hub = hub_with(workdir, services=[{"name": "gpualloc", "url": f"http://127.0.0.1:{free_port()}", "timeout": 1}],
                   roles=[{"name": "gpu-users", "scopes": [ACCESS], "users": ["alice", "carol"]}])
    hub.start()
    try:
        hub.add_users("alice", "bob", "carol")
        yield hub
    finally:
        hub.stop()


def spawn(hub: Hub, user: str, options: dict) -> tuple[int, dict]:
    return hub.api("POST", f"/users/{user}/server", {"user_options": options})


def test_without_the_scope_the_form_says_who_must_grant_it_and_no_gpu_starts(down_hub):
    bob = Browser(down_hub, "bob")
    bob.login()
    form = bob.spawn_form()
    assert f"To use GPUs, an administrator must grant {ACCESS} to you." in form
    assert form.count('name="gpu"') == 1 and 'value="none" checked' in form
    status, body = spawn(down_hub, "bob", {"gpu": "mig-1g.10gb"})
    assert status == 403 and body["message"] == f"To use GPUs, an administrator must grant {ACCESS} to you."
    started = time.monotonic()
    assert bob.submit("none").status_code == 302
    env = down_hub.server_env("bob")
    assert time.monotonic() - started < 15
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["GPUALLOC_URL"].endswith("/services/gpualloc/")


def test_with_the_allocator_down_no_gpu_starts_without_contacting_it(down_hub):
    alice = Browser(down_hub, "alice")
    alice.login()
    form = alice.spawn_form()
    assert "The GPU allocator is not answering right now: only servers without a GPU can start." in form
    env = down_hub.spawn("alice")  # empty options: gpu_default_offer, No GPU
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    status, body = spawn(down_hub, "carol", {"gpu": "mig-1g.10gb"})
    assert status == 503 and body["message"].startswith("The GPU allocator is not answering (")
    assert "choose No GPU to start without a GPU" in body["message"]


def test_a_hub_without_an_allocator_spawns_as_before_and_says_so_once(tmp_path):
    with hub_with(tmp_path) as hub:
        hub.add_users("alice", "bob")
        for user in ("alice", "bob"):
            env = hub.spawn(user)
            assert env["CUDA_VISIBLE_DEVICES"] == "" and not any(k.startswith("GPUALLOC_") for k in env)
        hub.add_users("carol")
        status, body = spawn(hub, "carol", {"gpu": "whole-h100"})
        assert status == 503 and "This hub has no GPU allocator" in body["message"]
        assert hub.log_tail(100_000).count("GPU allocator not configured") == 1
