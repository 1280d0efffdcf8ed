"""Hostile values in every field of every JSON body and every query parameter, both ways the API is served.

Fields are read from the served OpenAPI document, so a field added later is covered too. Each
hostile value (lone surrogates, NUL and other controls, RTL marks, 100,000 characters, 0,
negatives, NaN and Infinity spelled out, 1e308, 2^63, wrong types, null) answers 4xx naming the
field (413 naming the body when it is over 64 KiB), never 5xx; after each, a normal request of
the same user is still granted, so one bad value never poisons anyone's later writes.
"""

from __future__ import annotations

import copy
import json
import math
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from .servers import EmbeddedServer, start_standalone

TARGET = "kernel:touch-target"
CANARY = {"spec": {"kind": "shared", "memory_gib": 1}, "holder": "kernel:canary"}
# A valid body per operation; a field is made hostile on top of it, so the error can only be that field's.
BASES = {
    ("/leases", "POST"): {"spec": {"kind": "shared", "memory_gib": 1}, "holder": "kernel:h"},
    ("/leases/{lease_id}/touch", "POST"): {"busy": True},
    ("/heartbeat", "POST"): {"holders": ["kernel:h"]},
    ("/jobs", "POST"): {"spec": {"kind": "shared", "memory_gib": 1}, "workdir": "/tmp",
                        "source": {"kind": "cell", "code": "1"}},
}
HOSTILE_TEXT = ["\ud800", "kernel:\udfff", "a\x00b", "kernel:\x00", "\x1b[31m", "\u202eevil", "kernel:\u200f",
                "x" * 100_000, "", " padded ", "\ufeff"]
# tornado drops a request line over 64 KiB before any handler: queries stay under it.
QUERY_TEXT = [t if len(t) < 1000 else "x" * 60_000 for t in HOSTILE_TEXT]
HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 2 ** 63, -2 ** 63, 2 ** 1000, -1, -0.5, 0, 0.5]
OTHER_TYPES = [True, None, [], {}, [1, 2]]


def resolve(schema: dict, components: dict) -> dict:
    while "$ref" in schema:
        schema = components["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def body_fields(document: dict) -> list[tuple[str, str, tuple]]:
    """(path template, method, field path) of every property of every JSON body we have a base for."""
    found = []
    for template, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {}).get("application/json") \
                if isinstance(operation, dict) else None
            if content is None or (template, method.upper()) not in BASES:
                continue
            stack = [((), resolve(content["schema"], document["components"]))]
            while stack:
                path, schema = stack.pop()
                for name, sub in schema.get("properties", {}).items():
                    sub = resolve(sub, document["components"])
                    found.append((template, method.upper(), path + (name,)))
                    if sub.get("type") == "object" and "properties" in sub:
                        stack.append((path + (name,), sub))
                    elif sub.get("type") == "array":
                        found.append((template, method.upper(), path + (name, 0)))
    return found


def query_fields(document: dict) -> list[tuple[str, str]]:
    """(path template, parameter) of every query parameter of every GET without path parameters."""
    return [(template, p["name"]) for template, operations in document["paths"].items()
            if "{" not in template and "get" in operations
            for p in operations.get("parameters", []) + operations["get"].get("parameters", []) if p["in"] == "query"]


def field_name(path: tuple) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else p) for i, p in enumerate(path))


def with_value(base: dict, path: tuple, value) -> dict:
    body = copy.deepcopy(base)
    container = body
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        container = container.setdefault(part, {})
    last = path[-1]
    if isinstance(last, int):
        body_list = body
        for part in path[:-2]:
            body_list = body_list[part]
        body_list[path[-2]] = [value]
    else:
        container[last] = value
    return body


class Target:
    """One way the API is served, with the state the checks need."""

    def __init__(self, api):
        self.api = api
        self.document = api.call("GET", "openapi.json").json()
        self.lease = self.submit({**CANARY, "holder": TARGET})

    def submit(self, body: dict) -> dict:
        response = self.api.call("POST", "leases", body, self.api.user)
        assert response.status_code == 201, response.text[:300]
        return response.json()

    def still_serves(self) -> None:
        """A normal request of the same user is granted (and released), whatever came before."""
        lease = self.submit(CANARY)
        assert self.api.call("DELETE", f"leases/{lease['id']}", headers=self.api.user).status_code == 200

    def clean_up(self, response) -> None:
        """End what an accepted request made (a lease, a job), keeping the touch target."""
        if response.status_code >= 300:
            return
        for lease in self.api.call("GET", "leases", params={"all": "1"}, headers=self.api.admin).json()["leases"]:
            if lease["holder"] != TARGET:
                self.api.call("DELETE", f"leases/{lease['id']}", headers=self.api.admin)
        for job in self.api.call("GET", "jobs", params={"all": "1"}, headers=self.api.admin).json()["jobs"]:
            if job["state"] in ("queued", "running"):
                self.api.call("DELETE", f"jobs/{job['id']}", headers=self.api.admin)

    def send_body(self, template: str, method: str, path: tuple, value):
        raw = json.dumps(with_value(BASES[(template, method)], path, value)).encode()  # NaN, 1e308: as spelled
        response = self.api.call(method, template.replace("{lease_id}", self.lease["id"]), raw=raw,
                                 headers=self.api.user)
        return response

    def send_query(self, template: str, name: str, value: str):
        encoded = quote(value.encode("utf-8", "surrogatepass"), safe="")
        return self.api.call("GET", f"{template.lstrip('/')}?{name}={encoded}", headers=self.api.user)


def check_refused(target: Target, response, field: str, value) -> None:
    what = (field, repr(value)[:60], response.status_code, response.text[:300])
    assert response.status_code < 500, what
    if response.status_code < 400:
        target.clean_up(response)
    else:
        body = response.json()
        expected = "body" if response.status_code == 413 else field
        named = body.get("field") or ""
        assert body.get("error") and (named == expected or named.startswith((expected + "[", expected + "."))), what
    target.still_serves()


def must_refuse(value) -> bool:
    """Whether no field of the API may accept `value` (0, null and booleans are valid somewhere)."""
    if isinstance(value, str):
        return True
    return isinstance(value, float) and (math.isnan(value) or abs(value) > 1e30) or \
        (isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0)


@pytest.fixture(scope="module", params=["standalone", "embedded"])
def target(request, tmp_path_factory):
    workdir = tmp_path_factory.mktemp(request.param)
    if request.param == "standalone":
        service, api = start_standalone(workdir)
        yield Target(api)
        service.kill()
    else:
        server = EmbeddedServer(workdir).start()
        try:
            yield Target(server.api())
        finally:
            server.stop()


def test_every_hostile_value_in_every_body_field_is_refused_naming_it(target):
    fields = body_fields(target.document)
    assert {("/leases", "POST", ("spec", "model")), ("/heartbeat", "POST", ("holders", 0))} <= set(fields)
    for template, method, path in fields:
        for value in HOSTILE_TEXT + HOSTILE_NUMBERS + OTHER_TYPES:
            response = target.send_body(template, method, path, value)
            if must_refuse(value):
                assert response.status_code >= 400, (template, path, value, response.text[:200])
            check_refused(target, response, field_name(path), value)


def test_every_hostile_value_in_every_query_parameter_is_refused_naming_it(target):
    fields = query_fields(target.document)
    assert ("/leases", "all") in fields
    for template, name in fields:
        for value in QUERY_TEXT + ["NaN", "1e308", str(2 ** 63), "-1", "2", "true"]:
            response = target.send_query(template, name, value)
            check_refused(target, response, name, value)


hostile_text = st.text(st.characters(categories=("Cc", "Cf", "Cs", "Zl", "Zp", "Zs", "Lo", "Mn")), min_size=1,
                       max_size=300)


@settings(max_examples=40, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_hostile_names_are_refused_naming_the_field(target, data):
    name_fields = [f for f in body_fields(target.document) if f[2][-1] in ("holder", "model", "node", "profile", 0)]
    template, method, path = data.draw(st.sampled_from(name_fields))
    text = data.draw(hostile_text.filter(lambda t: any(ord(c) < 32 or 0xD800 <= ord(c) <= 0xDFFF
                                                       or 0x200B <= ord(c) <= 0x200F or 0x202A <= ord(c) <= 0x202E
                                                       for c in t)))
    value = data.draw(st.sampled_from([text, "kernel:" + text, "job:" + text + "x"]))
    response = target.send_body(template, method, path, value)
    assert response.status_code == 400, (path, repr(value), response.text[:200])
    check_refused(target, response, field_name(path), value)


def test_what_no_json_encoder_writes_is_refused_naming_the_body_or_field(target):
    api = target.api
    cases = [
        (b"[" * 30_000 + b"]" * 30_000, 400, "body"),
        (b'{"spec": {}, "holder": "kernel:a", "x": ' + b'{"y": ' * 20 + b"1" + b"}" * 21, 400, "x.y.y.y"),
        (b'{"spec": {"memory_gib": Infinity}, "holder": "kernel:a"}', 400, "spec.memory_gib"),
        (b'{"spec": {"count": 1' + b"0" * 5000 + b'}, "holder": "kernel:a"}', 400, "body"),
        (b'{"spec": {}, "holder": "kernel:\xed\xa0\x80"}', 400, "body"),
        (b'{"spec": {}, "holder": "kernel:a"', 400, "body"),
        (b"\xff\xfe{}", 400, "body"),
    ]
    for raw, status, field in cases:
        response = api.call("POST", "leases", raw=raw, headers=api.user)
        named = response.json().get("field") or ""
        assert response.status_code == status and named.startswith(field), (raw[:60], response.text[:200])
        target.still_serves()
    multipart = b'--b\r\nContent-Disposition: form-data; name="spec"\r\n\r\n{}\r\n--b--\r\n'
    response = api.call("POST", "leases", raw=multipart,
                        headers={**api.user, "Content-Type": "multipart/form-data; boundary=b"})
    assert (response.status_code, response.json()["field"]) == (415, "body")
    response = api.call("PATCH", "leases", {}, api.user)
    assert response.status_code == 405 and response.headers["Allow"] == "GET, POST"
    assert api.call("GET", "leases", params={"all": "yes"}, headers=api.user).json()["field"] == "all"
    assert api.call("GET", "leases", params={"all": "0"}, headers=api.user).status_code == 200


@pytest.mark.parametrize("target", ["embedded"], indirect=True)
def test_the_sidebar_api_refuses_hostile_bodies_too(target):
    sidebar = target.api.url.replace("/api/v1/", "/api/")
    for path, raw in [("request", b'{"kernel_id": []}'), ("request", b'{"offer": {"a": 1}}'),
                      ("request", b'{"offer": "x", "wait": NaN}'), ("request", b"[" * 30_000 + b"]" * 30_000),
                      ("request", b'{"spec": {"model": "\\ud800"}}'), ("release", b'{"lease_id": 5}'),
                      ("extend", b'{"lease_id": ["a"]}'), ("release", b"\xff")]:
        response = target.api.session.post(sidebar + path, data=raw, timeout=30,
                                           headers={**target.api.user, "Content-Type": "application/json"})
        assert response.status_code == 400, (path, raw[:40], response.status_code, response.text[:200])
        target.still_serves()
