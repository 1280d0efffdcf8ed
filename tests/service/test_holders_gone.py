"""Over HTTP: an ended lease's slice stays out of the pool until its holder is said to be gone
(policy wait_for_holders): DELETE ?holder_gone=true, POST /holders/gone, each caller's own only."""

from __future__ import annotations

from tests.service.conftest import ALICE, BOB, POLICY

WHOLE_L4 = {"kind": "whole", "model": "L4"}
WAITING = POLICY + "c.SchedulerPolicy.wait_for_holders = True\n"


def shares(service, token: str) -> list[dict]:
    return [share for node in service.call("GET", "inventory", token=token).json()["nodes"]
            for gpu in node["gpus"] for share in gpu.get("shares", [])]


def test_a_released_slice_waits_for_its_holder_then_goes_to_the_next_user(fresh_service):
    service = fresh_service(config=WAITING).start()
    held = [service.call("POST", "leases", {"spec": WHOLE_L4, "holder": f"server:{i}"}, ALICE).json()
            for i in (1, 2)]  # both L4s
    bob = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "server"}, BOB).json()
    assert bob["state"] == "queued"

    released = service.call("DELETE", f"leases/{held[0]['id']}", token=ALICE).json()
    assert released["state"] == "released" and released["returning"] is True
    assert {s["lease_id"]: s["returning"] for s in shares(service, ALICE)} == {held[0]["id"]: True,
                                                                               held[1]["id"]: False}
    assert service.call("GET", f"leases/{bob['id']}", token=BOB).json()["state"] == "queued"

    # another user cannot say alice's holder is gone; alice can
    assert service.call("POST", "holders/gone", {"holders": ["server:1"]}, BOB).json() == {"leases": []}
    returned = service.call("POST", "holders/gone", {"holders": ["server:1"]}, ALICE).json()["leases"]
    assert [l["id"] for l in returned] == [held[0]["id"]] and returned[0]["returning"] is False
    assert service.call("GET", f"leases/{bob['id']}", token=BOB).json()["state"] == "granted"

    # a release whose caller knows the holder is gone frees at once; on a returning lease too
    service.call("DELETE", f"leases/{bob['id']}", token=BOB)
    assert service.call("DELETE", f"leases/{bob['id']}", token=BOB).status == 404
    assert service.call("DELETE", f"leases/{bob['id']}?holder_gone=true", token=BOB).status == 200
    again = service.call("DELETE", f"leases/{held[1]['id']}?holder_gone=1", token=ALICE).json()
    assert again["returning"] is False and shares(service, ALICE) == []


def test_bad_input_names_the_field(fresh_service):
    service = fresh_service(config=WAITING).start()
    lease = service.call("POST", "leases", {"spec": WHOLE_L4, "holder": "server"}, ALICE).json()
    answer = service.call("DELETE", f"leases/{lease['id']}?holder_gone=maybe", token=ALICE)
    assert answer.status == 400 and answer.json()["field"] == "holder_gone"
    for body, field in (({}, "holders"), ({"holders": ["nobody"]}, "holders"), ({"holders": "server"}, "holders")):
        answer = service.call("POST", "holders/gone", body, ALICE)
        assert answer.status == 400 and answer.json().get("field", "").startswith(field), (body, answer)
