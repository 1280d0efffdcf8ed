"""The fast body predicate against jsonschema: it may only accept what jsonschema accepts unchanged."""

from __future__ import annotations

import builtins
import importlib.util
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from jupyter_gpualloc.service.openapi import openapi_document
from jupyter_gpualloc.service.validation import (
    InputError, RequestValidator, _IntegersOnly, accepts, compile_check, fast_check, inline_refs)

DOCUMENT = openapi_document("/")
VALIDATOR = RequestValidator(DOCUMENT)
FAST_ROUTES = [("/leases", "POST"), ("/leases/{lease_id}/touch", "POST"), ("/heartbeat", "POST")]


def body_schema(route: str, method: str) -> dict:
    content = DOCUMENT["paths"][route][method.lower()]["requestBody"]["content"]["application/json"]
    return inline_refs(content["schema"], DOCUMENT["components"])


def names_in(schema) -> set[str]:
    """Every property name a schema mentions, to build bodies that reach deep into it."""
    found: set[str] = set()
    if isinstance(schema, dict):
        found |= set(schema.get("properties", {}))
        found |= {n for n in schema.get("required", []) if isinstance(n, str)}
        for value in schema.values():
            found |= names_in(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= names_in(value)
    return found


SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(-3, 3), st.sampled_from([0, 1, 2, 1024, 1025, 2**31 - 1, 2**31, 253402300799, 253402300800, 2**40]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0, 2.0, 0.5, 1e12, -1.0]),
    st.text(max_size=6), st.sampled_from(["1g.10gb", "mig", "shared", "whole", "any", "interactive", "batch",
                                          "server", "kernel:abc", "job:1", " x", "x ", "a\u200bb",
                                          "2026-12-03T10:00:00Z",
                                          "", "A100-SXM4-80GB", "3g.40gb+me", "x" * 300]))


def bodies(schema):
    keys = st.sampled_from(sorted(names_in(schema) | {"unknown"}))
    return st.recursive(SCALARS, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)


VALID = {
    ("/leases", "POST"): [{"spec": {"kind": "mig", "profile": "1g.10gb"}, "holder": "kernel:ab", "wait": 0},
                          {"spec": {"kind": "shared", "memory_gib": 10}, "holder": "server", "priority": "batch"},
                          {"spec": {"kind": "whole", "count": 2, "model": "A100-SXM4-80GB"}, "holder": "job:1"}],
    ("/leases/{lease_id}/touch", "POST"): [{"last_activity": 1764757200.5, "busy": False, "connections": 1}],
    ("/heartbeat", "POST"): [{"holders": ["server", "kernel:ab"]}],
}


@st.composite
def near_valid(draw, route, method, schema):
    """A valid body with up to three of its values replaced, removed or added."""
    body = json.loads(json.dumps(draw(st.sampled_from(VALID[(route, method)]))))
    for _ in range(draw(st.integers(0, 3))):
        container = body
        if isinstance(body.get("spec"), dict) and draw(st.booleans()):
            container = body["spec"]
        action = draw(st.sampled_from(["set", "drop"]))
        if action == "drop" and container:
            container.pop(draw(st.sampled_from(sorted(container))))
        else:
            container[draw(st.sampled_from(sorted(names_in(schema))))] = draw(SCALARS)
    return body


@pytest.mark.parametrize("route, method", FAST_ROUTES)
def test_the_routes_kernels_call_most_have_a_fast_predicate(route, method):
    assert fast_check(body_schema(route, method)) is not None


@pytest.mark.parametrize("route, method", FAST_ROUTES)
@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fast_predicate_accepts_only_what_jsonschema_accepts_unchanged(route, method, data):
    schema = body_schema(route, method)
    body = data.draw(st.one_of(bodies(schema), near_valid(route, method, schema)))
    if accepts(compile_check(schema), body):
        assert Draft202012Validator(schema).is_valid(body)
        assert _IntegersOnly(schema).is_valid(body)  # nothing left to turn into an int


@pytest.mark.parametrize("route, method, body", [
    ("/leases/{lease_id}/touch", "POST", {"last_activity": 1764757200.25}),
    ("/leases/{lease_id}/touch", "POST", {"last_activity": "2026-12-03T10:00:00Z", "busy": True, "connections": 2}),
    ("/leases/{lease_id}/touch", "POST", {}),
    ("/heartbeat", "POST", {"holders": ["server", "kernel:0b1f"]}),
    ("/leases", "POST", {"spec": {"kind": "mig", "profile": "1g.10gb"}, "holder": "kernel:0b1f", "wait": 0}),
    ("/leases", "POST", {"spec": {"kind": "shared", "memory_gib": 10.5}, "holder": "server", "priority": "batch"}),
])
def test_common_valid_bodies_take_the_fast_path(route, method, body):
    assert accepts(VALIDATOR._fast[(route, method)], body)
    VALIDATOR.check_body(route, method, body)


@pytest.mark.parametrize("route, method, body, field", [
    ("/leases/{lease_id}/touch", "POST", {"last_activity": -1}, "last_activity"),
    ("/leases/{lease_id}/touch", "POST", {"last_activity": 1.0, "bogus": 1}, "bogus"),
    ("/leases/{lease_id}/touch", "POST", {"connections": 1.5}, "connections"),
    ("/heartbeat", "POST", {"holders": ["server", " kernel"]}, "holders[1]"),
    ("/heartbeat", "POST", {"holders": ["server"] * 1001}, "holders"),
    ("/leases", "POST", {"spec": {"kind": "mig", "profile": "1g.10gb"}}, "holder"),
    ("/leases", "POST", {"spec": {"kind": "shared"}, "holder": "server"}, "spec.memory_gib"),
    ("/leases", "POST", {"spec": {"memory_gib": 1, "memory_mib": 1024}, "holder": "server"}, "spec.memory_mib"),
])
def test_bad_bodies_still_name_their_field(route, method, body, field):
    assert not accepts(VALIDATOR._fast[(route, method)], body)
    with pytest.raises(InputError) as refused:
        VALIDATOR.check_body(route, method, body)
    assert refused.value.field == field


def test_integral_floats_in_integer_fields_still_become_ints():
    body = {"spec": {"kind": "whole", "count": 2.0}, "holder": "server"}
    assert not accepts(VALIDATOR._fast[("/leases", "POST")], body)
    VALIDATOR.check_body("/leases", "POST", body)
    assert body["spec"]["count"] == 2 and isinstance(body["spec"]["count"], int)


def test_an_unknown_keyword_leaves_the_route_to_jsonschema():
    assert fast_check({"type": "object", "minProperties": 1}) is None
    assert fast_check({"$ref": "#/components/schemas/Job"}) is None
    assert fast_check({"type": "decimal"}) is None


# Strings that would break out of a literal, or name the generated code's own variables, if pasted in as code
AWKWARD = ['a"b', "a'b", "x\ny", "back\\slash", "{}", "{0}", '"""', "v", "k1", "c1", "check",
           "'); __import__('builtins').INJECTED = 1; ('", '"); __import__("builtins").INJECTED = 1; ("']


def test_the_schemas_strings_are_matched_exactly_and_never_run():
    schema = {"type": "object", "additionalProperties": False, "required": ["x\ny"],
              "properties": {name: {"enum": [name, name + "{}"]} for name in AWKWARD} | {
                  "quoted": {"type": "string", "pattern": "^a\"b'c\\\\\\d{2}$"}}}
    check = compile_check(schema)
    assert not hasattr(builtins, "INJECTED")
    bodies = [{name: name for name in AWKWARD}, {name: name + "{}" for name in AWKWARD},
              {"x\ny": "x\ny", "quoted": "a\"b'c\\12"}, {"x\ny": "x\ny", "quoted": "a\"b'c\\1"},
              {"x\ny": "x\\ny"}, {"x\\ny": "x\ny"}, {"x\ny": "x\ny", "a'b": 'a"b'}, {"x\ny": "x\ny", "a\"b": "a'b"},
              {"x\ny": "x\ny", "v": "k1"}, {"x\ny": "x\ny", "{}": "{0}"}, {"x\ny": "x\ny", "V": "V"}]
    for body in bodies:
        assert accepts(check, body) == Draft202012Validator(schema).is_valid(body), body
    assert sum(accepts(check, body) for body in bodies) == 3
    assert not hasattr(builtins, "INJECTED")


def nested(schema: dict, wrappers: str) -> dict:
    """The schema wrapped in properties (p), items (i) or anyOf-not-not (n), innermost first."""
    for wrapper in wrappers:
        schema = {"p": {"type": "object", "properties": {"a": schema}}, "i": {"items": schema},
                  "n": {"anyOf": [{"type": "null"}, {"not": {"not": schema}}]}}[wrapper]
    return schema


def deep(value, wrappers: str):
    """The value in objects (p) and arrays (i), innermost first (n wraps nothing)."""
    for wrapper in wrappers:
        value = {"p": {"a": value}, "i": [value], "n": value}[wrapper]
    return value


@pytest.mark.parametrize("schema, values", [
    ({"oneOf": [{"type": "string"}, {"minLength": 2}, {"enum": ["ab", "x"]}]},
     ["y", "x", "ab", "abc", 5, [], None]),
    ({"oneOf": [{"items": {"type": "string"}}, {"items": {"maxLength": 1}}, {"type": "array", "maxItems": 1}]},
     [[], ["a"], ["ab"], [1], ["ab", "c"], ["a", "b"], [1, 2], "s"]),
    ({"oneOf": [{"properties": {"a": {"const": "x"}}, "additionalProperties": {"type": "number"}},
                {"required": ["a"]}, {"not": {"properties": {"b": {"type": "string"}}}}]},
     [{}, {"a": "x"}, {"a": "y"}, {"a": "x", "b": 1}, {"b": "s"}, {"b": 1}, {"a": 1, "b": "s"}, 1]),
    *[(nested({"type": "string", "maxLength": 1}, wrappers),  # deeper than one function holds
       [None, "a", {}, [], deep("a", wrappers), deep("ab", wrappers), deep(1, wrappers), deep("ab", wrappers[1:]),
        deep(None, wrappers[2:]), deep({"a": "ab"}, wrappers[2:])])
      for wrappers in ("p" * 10, "pn" * 8, "npi" * 8)],
])
def test_the_predicate_counts_one_of_and_reaches_deep_as_jsonschema_does(schema, values):
    check = compile_check(schema)
    for value in values:
        assert accepts(check, value) == Draft202012Validator(schema).is_valid(value), value


IMPORTS_IN_A_FRESH_PROCESS = """
import json, sys
{before}
import jupyter_gpualloc.service.app
from jsonschema import FormatChecker
loaded = "rfc3987_syntax" in sys.modules
import rfc3987_syntax
print(json.dumps({{"loaded": loaded, "iri": "iri" in FormatChecker.checkers}}))
"""


def imports_in_a_fresh_process(before: str = "") -> dict:
    script = IMPORTS_IN_A_FRESH_PROCESS.format(before=before)
    return json.loads(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                                     text=True, timeout=120).stdout)


@pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987_syntax is not installed")
def test_the_service_starts_without_compiling_the_iri_grammars_and_leaves_them_importable():
    """rfc3987_syntax compiles its grammars at import (1.6-1.9 s here); the service checks no
    formats, so its start skips it, and the module stays importable for whoever needs it."""
    assert imports_in_a_fresh_process() == {"loaded": False, "iri": False}


@pytest.mark.skipif(importlib.util.find_spec("rfc3987_syntax") is None, reason="rfc3987_syntax is not installed")
def test_a_process_that_imported_jsonschema_first_keeps_its_iri_format_checker():
    """In a Jupyter server, jupyter_events imports jsonschema first: its format checker is untouched."""
    assert imports_in_a_fresh_process("import jsonschema") == {"loaded": True, "iri": True}
