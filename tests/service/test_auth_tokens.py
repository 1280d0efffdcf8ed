"""Standalone bearer tokens over real HTTP: found by digest, exactly, and nothing else is anybody."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .conftest import ALICE, ROOT


def who(service, authorization: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(service.url + "user")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.mark.parametrize("authorization, user, admin", [
    (f"Bearer {ALICE}", "alice", False), (f"token {ALICE}", "alice", False), (f"bearer {ROOT}  ", "root", True),
])
def test_a_known_token_names_its_user(service, authorization, user, admin):
    status, body = who(service, authorization)
    assert (status, body["user"], body["admin"]) == (200, user, admin)


@pytest.mark.parametrize("authorization", [
    None, "", "Bearer", f"Bearer {ALICE[:-1]}", f"Bearer {ALICE}X", f"Bearer {ALICE.upper()}", f"Basic {ALICE}",
    f"Bearer {ALICE} {ROOT}", "Bearer \u00e9\u00e9", "Bearer " + "x" * 8000,
])
def test_anything_else_is_nobody(service, authorization):
    status, body = who(service, authorization)
    assert status == 401 and "Bearer" in body["error"]
