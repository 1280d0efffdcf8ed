"""End to end: the demo config's real JupyterHub, the scheduler service and real single-user servers.

One hub for the module; the tests run in order and build on each other (who holds what).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import psutil
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from .conftest import Browser, server_environ

H100 = "H100 80GB HBM3"


def active_lease(hub, user: str) -> dict | None:
    return next((l for l in hub.leases() if l["user"] == user and l["holder"] == "server"), None)


def gpu_uuid(hub, model: str) -> str:
    inventory = hub.service("GET", "inventory").json()
    return next(g["uuid"] for n in inventory["nodes"] for g in n["gpus"] if g["model"] == model)


def spawn(hub, user: str, user_options: dict, *, legacy_body: bool = False):
    body = user_options if legacy_body else {"user_options": user_options}
    return hub.api("POST", f"/users/{user}/server", body, token=hub.token(user))


def check_env(hub, user: str) -> tuple[dict, dict]:
    """The running server's environment and its lease; they must agree."""
    server = hub.wait_ready(user)
    env = server_environ(server["state"]["pid"])
    lease = active_lease(hub, user)
    assert lease is not None and lease["state"] == "granted"
    assert server["state"]["gpu_lease_id"] == lease["id"] == env["GPUALLOC_LEASE_ID"]
    assert env["CUDA_VISIBLE_DEVICES"] == lease["slice"]["visible_devices"]
    assert env["GPUALLOC_URL"].endswith("/services/gpualloc/")
    return env, lease


def test_form_lists_the_offers_and_starts_a_mig_server(demo_hub):
    browser = Browser(demo_hub, "alice")
    browser.login()
    html = browser.spawn_form()
    for label in ("No GPU", "MIG 1g.10gb on A100 80GB", "Shared 8 GiB on L4", "Whole H100"):
        assert label in html
    assert "MIG 1g.10gb on A100 80GB <small class=\"text-muted\">(14 free now)</small>" in html
    reply = browser.submit("mig-1g.10gb")
    assert reply.status_code == 302, reply.text[:2000]
    env, lease = check_env(demo_hub, "alice")
    assert lease["slice"]["kind"] == "mig" and lease["slice"]["profile"] == "1g.10gb"
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert "GPUALLOC_MEMORY_LIMIT_MIB" not in env
    erin = Browser(demo_hub, "erin")
    erin.login()
    assert "MIG 1g.10gb on A100 80GB <small class=\"text-muted\">(13 free now)</small>" in erin.spawn_form()


def run_cell(hub, user: str, kernel_id: str, code: str) -> str:
    """Execute `code` in a kernel of the user's server over its websocket; the cell's stdout and stderr."""
    async def run() -> str:
        url = hub.url.replace("http", "ws", 1) + f"/user/{user}/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {hub.token(user)}"}))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": user, "session": msg_id,
                       "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False}}))
        out = []
        try:
            while True:
                msg = json.loads(await asyncio.wait_for(ws.read_message(), 60))
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    out.append(msg["content"]["text"])
                if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    return "".join(out)
        finally:
            ws.close()

    return asyncio.run(run())


def test_a_kernel_in_a_server_asks_for_its_own_slice_with_the_magic(demo_hub):
    reply = requests.post(demo_hub.url + "/user/alice/api/kernels", json={"name": "python3"}, timeout=60,
                          headers={"Authorization": f"token {demo_hub.token('alice')}"})
    assert reply.status_code == 201, reply.text
    kernel_id = reply.json()["id"]
    out = run_cell(demo_hub, "alice", kernel_id, "%gpu request --shared 4GB --model L4")  # no %load_ext needed
    assert out.startswith("gpu: granted shared 4 GiB on L4"), out
    lease = next(l for l in demo_hub.leases() if l["holder"] == f"kernel:{kernel_id}")
    assert lease["user"] == "alice" and lease["state"] == "granted"
    assert run_cell(demo_hub, "alice", kernel_id, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() \
        == lease["slice"]["visible_devices"]
    released = run_cell(demo_hub, "alice", kernel_id, "%gpu release")
    server = active_lease(demo_hub, "alice")  # the MIG slice alice's server took at spawn
    assert released.startswith("gpu: released") and "this kernel uses its server's MIG 1g.10gb" in released, released
    assert run_cell(demo_hub, "alice", kernel_id, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])").strip() \
        == server["slice"]["visible_devices"]
    requests.delete(demo_hub.url + f"/user/alice/api/kernels/{kernel_id}", timeout=60,
                    headers={"Authorization": f"token {demo_hub.token('alice')}"})
    assert not any(l["holder"] == f"kernel:{kernel_id}" for l in demo_hub.leases())


def test_what_the_quota_never_allows_is_greyed_out_and_refused_plainly(demo_hub):
    carol = Browser(demo_hub, "carol")
    carol.login()
    html = carol.spawn_form()
    assert 'value="whole-h100" disabled' in html and "Whole H100 <small class=\"text-muted\">(over your quota: " \
        "at most 20 GiB)</small>" in html
    assert 'value="shared-8gb-l4" disabled' not in html
    reply = spawn(demo_hub, "carol", {"gpu": "whole-h100"})
    assert reply.status_code == 403, reply.text
    assert reply.json()["message"] == ("Your quota never allows Whole H100: at most 20 GiB. "
                                       "Choose a smaller one, or ask an administrator for a larger quota.")
    assert active_lease(demo_hub, "carol") is None
    assert demo_hub.server("carol") is None


def test_rest_api_spawns_with_strictly_checked_user_options(demo_hub):
    for options in ({"gpu": "mig-9g.99gb"}, {"gpu": ""}, {"gpu": 7}):
        reply = spawn(demo_hub, "dave", options)
        assert reply.status_code == 400, (options, reply.text)
        assert "offer" in reply.json()["message"] or "option" in reply.json()["message"]
    assert active_lease(demo_hub, "dave") is None

    assert spawn(demo_hub, "bob", {"gpu": "whole-h100"}).status_code in (201, 202)
    assert spawn(demo_hub, "carol", {"gpu": "shared-8gb-l4"}, legacy_body=True).status_code in (201, 202)
    bob_env, bob_lease = check_env(demo_hub, "bob")
    assert bob_lease["slice"]["kind"] == "whole" and bob_env["CUDA_VISIBLE_DEVICES"] == gpu_uuid(demo_hub, H100)
    carol_env, carol_lease = check_env(demo_hub, "carol")
    assert carol_env["CUDA_VISIBLE_DEVICES"] == gpu_uuid(demo_hub, "L4")
    assert carol_env["GPUALLOC_MEMORY_LIMIT_MIB"] == "8192"
    assert carol_env["CUDA_DEVICE_MEMORY_LIMIT"] == "8192m"
    assert abs(float(carol_env["GPUALLOC_MEMORY_FRACTION"]) - 8192 / 23034) < 1e-3
    assert carol_env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    alice_env = server_environ(demo_hub.server("alice")["state"]["pid"])
    assert len({alice_env["CUDA_VISIBLE_DEVICES"], bob_env["CUDA_VISIBLE_DEVICES"],
                carol_env["CUDA_VISIBLE_DEVICES"]}) == 3


def held_slices(inventory: dict) -> list[dict]:
    return [held for node in inventory["nodes"] for gpu in node["gpus"]
            for held in gpu.get("instances", []) + gpu.get("shares", []) if held.get("lease_id")]


def test_an_admin_in_a_browser_sees_every_lease_and_holder(demo_hub):
    page = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # what a browser asks for
    admin = Browser(demo_hub, "admin")
    admin.login()
    api = demo_hub.url + "/services/gpualloc/api/v1/"
    reply = admin.session.get(api + "leases?all=1", headers=page, timeout=30)  # through the OAuth login
    assert reply.status_code == 200 and reply.url == api + "leases?all=1", (reply.status_code, reply.url)
    assert {l["user"] for l in reply.json()["leases"]} == {"alice", "bob", "carol"}
    held = held_slices(admin.session.get(api + "inventory", headers=page, timeout=30).json())
    assert {(h["user"], h["holder"]) for h in held} == {("alice", "server"), ("bob", "server"), ("carol", "server")}

    erin = Browser(demo_hub, "erin")
    erin.login()
    assert erin.session.get(api + "leases?all=1", headers=page, timeout=30).status_code == 403
    assert {h["lease_id"] for h in held_slices(erin.session.get(api + "inventory", headers=page, timeout=30).json())} \
        == {"other"}
    assert requests.get(api + "leases", timeout=30).status_code == 401  # a script without a token


def test_a_user_waits_in_the_queue_until_another_server_stops(demo_hub):
    assert spawn(demo_hub, "dave", {"gpu": "whole-h100"}).status_code in (201, 202)  # "slow to start"
    assert demo_hub.server("dave")["pending"] == "spawn" and not demo_hub.server("dave")["ready"]
    events = demo_hub.progress("dave", until="position 1 in queue")
    assert any(e["message"].startswith(f"waiting for a whole GPU on {H100}: position 1 in queue; this start gives up at ")
               for e in events)
    assert active_lease(demo_hub, "dave")["state"] == "queued"
    bob_lease = active_lease(demo_hub, "bob")
    reply = requests.post(demo_hub.url + "/user/bob/api/kernels", json={"name": "python3"}, timeout=60,
                          headers={"Authorization": f"token {demo_hub.token('bob')}"})
    assert reply.status_code == 201, reply.text
    kernel_holder = f"kernel:{reply.json()['id']}"
    granted = run_cell(demo_hub, "bob", reply.json()["id"], "%gpu request --shared 4GB --model L4")
    assert granted.startswith("gpu: granted"), granted
    kernel_lease = next(l for l in demo_hub.leases() if l["holder"] == kernel_holder)
    with ThreadPoolExecutor(1) as pool:  # the progress page, while bob's server stops
        later = pool.submit(demo_hub.progress, "dave", f"(on your whole GPU on {H100})", 60)
        assert demo_hub.api("DELETE", "/users/bob/server").status_code in (202, 204)
        demo_hub.wait_stopped("bob")
        # Stop My Server sent SIGINT to a server whose stdin is not a terminal: it went through its shutdown,
        # so its kernel's slice is back at once, not after the heartbeat TTL
        ended = demo_hub.service("GET", f"leases/{kernel_lease['id']}").json()
        assert (ended["state"], ended["returning"]) == ("released", False), ended
        messages = [e["message"] for e in later.result()]
    assert messages[-1] == f"Spawning server... (on your whole GPU on {H100})"
    assert any(m.startswith(f"granted a whole GPU on {H100} after") for m in messages)
    assert demo_hub.service("GET", f"leases/{bob_lease['id']}").json()["state"] == "released"
    env, lease = check_env(demo_hub, "dave")
    assert env["CUDA_VISIBLE_DEVICES"] == gpu_uuid(demo_hub, H100)
    assert lease["granted_at"] >= bob_lease["created_at"]


def test_a_hub_restart_keeps_the_leases(demo_hub):
    before = {l["id"]: l for l in demo_hub.leases()}
    assert {l["user"] for l in before.values()} == {"alice", "carol", "dave"}
    pids = {u: demo_hub.server(u)["state"]["pid"] for u in ("alice", "carol", "dave")}
    demo_hub.stop()
    assert all(psutil.pid_exists(pid) for pid in pids.values())
    demo_hub.start()
    time.sleep(12)  # longer than the heartbeat TTL (10 s): only resumed heartbeats keep the leases
    after = {l["id"]: l for l in demo_hub.leases()}
    assert set(after) == set(before)
    assert all(l["state"] == "granted" and l["slice"] == before[i]["slice"] for i, l in after.items())
    assert all(time.time() - l["heartbeat_at"] < 5 for l in after.values())
    for user, pid in pids.items():
        server = demo_hub.server(user)
        assert server["ready"] and server["state"]["pid"] == pid


def test_a_killed_server_loses_its_slice_within_the_heartbeat_ttl(demo_hub):
    lease = active_lease(demo_hub, "alice")
    os.kill(demo_hub.server("alice")["state"]["pid"], signal.SIGKILL)
    killed = time.monotonic()
    while demo_hub.service("GET", f"leases/{lease['id']}").json()["state"] == "granted":
        assert time.monotonic() - killed < 10, "the slice outlived the heartbeat TTL"
        time.sleep(0.2)
    assert demo_hub.service("GET", f"leases/{lease['id']}").json()["state"] == "released"
    demo_hub.wait_stopped("alice")
