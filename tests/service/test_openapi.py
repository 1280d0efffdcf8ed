"""The OpenAPI document matches the handlers: same paths and methods, and real answers fit its schemas."""

from __future__ import annotations

import jsonschema
import pytest

from jupyter_gpualloc.service.app import ROUTES
from jupyter_gpualloc.service.handlers import ApiHandler

from .conftest import ALICE, ROOT

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def implemented(handler: type) -> set[str]:
    """HTTP methods a handler class defines itself (or inherits from a class other than the base)."""
    return {m for m in HTTP_METHODS if getattr(handler, m) is not getattr(ApiHandler, m)}


@pytest.fixture(scope="module")
def document(service):
    response = service.call("GET", "openapi.json")
    assert response.status == 200
    return response.json()


def validator(document, schema_name: str):
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": document["components"]}
    return jsonschema.Draft202012Validator(schema)


def test_paths_and_methods_match_the_routes(document):
    assert document["openapi"] == "3.1.0"
    assert document["servers"] == [{"url": "/api/v1"}]
    routed = {template: implemented(handler) for template, handler, _ in ROUTES}
    documented = {path: {m for m in ops if m in HTTP_METHODS} for path, ops in document["paths"].items()}
    assert routed == documented
    for path, ops in document["paths"].items():
        params = {p["name"] for p in ops.get("parameters", []) if p["in"] == "path"}
        assert params == set(part[1:-1] for part in path.split("/") if part.startswith("{")), path


def test_the_document_is_valid_json_schema_throughout(document):
    jsonschema.Draft202012Validator.check_schema({"components": document["components"]})
    for schema in document["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


def test_answers_fit_the_documented_schemas(service, document):
    lease = service.call("POST", "leases", {"spec": {"profile": "1g.5gb"}, "holder": "kernel:a"}, ALICE)
    assert lease.status == 201
    validator(document, "Lease").validate(lease.json())
    checks = [
        ("GET", "leases", None, "LeaseList"), ("GET", f"leases/{lease.json()['id']}", None, "Lease"),
        ("POST", f"leases/{lease.json()['id']}/touch", {"busy": True}, "Lease"),
        ("POST", "heartbeat", {}, "LeaseList"), ("GET", "inventory", None, "Inventory"),
        ("GET", "offers", None, "Offers"), ("GET", "user", None, "Identity"),
        ("DELETE", f"leases/{lease.json()['id']}", None, "Lease"),
        ("POST", "leases", {"spec": {"kind": "shared"}, "holder": "kernel:b"}, "Error"),
        ("GET", "leases/none", None, "Error"),
    ]
    for method, path, body, schema in checks:
        response = service.call(method, path, body, ALICE)
        validator(document, schema).validate(response.json())
    validator(document, "Health").validate(service.call("GET", "health").json())
    gpu = service.call("GET", "inventory", token=ROOT).json()["nodes"][0]["gpus"][0]["uuid"]
    validator(document, "Drain").validate(service.call("POST", f"gpus/{gpu}/drain", token=ROOT).json())
    request_schema = validator(document, "LeaseRequest")
    request_schema.validate({"spec": {"profile": "1g.5gb"}, "holder": "kernel:a", "wait": 5})
    with pytest.raises(jsonschema.ValidationError):
        request_schema.validate({"spec": {}, "holder": "kernel:a", "groups": ["x"]})


def test_a_form_content_type_without_a_body_is_answered_as_documented_everywhere(service, document):
    """The API reads JSON bodies only: a multipart/form-data Content-Type with no body is 415 where an
    operation takes a body, and ignored (the answer as without it) where it takes none, GETs included."""
    import urllib.error
    import urllib.request

    for path, item in document["paths"].items():
        if path == "/events":  # a stream: it would answer 200 and never end
            continue
        for method, operation in item.items():
            if method not in HTTP_METHODS:
                continue
            for token in (ALICE, ROOT):
                request = urllib.request.Request(service.url + path.lstrip("/").replace("{", "").replace("}", ""),
                                                 method=method.upper(),
                                                 headers={"Content-Type": "multipart/form-data",
                                                          "Authorization": f"Bearer {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=30) as answer:
                        status = answer.status
                except urllib.error.HTTPError as err:
                    status = err.code
                assert str(status) in operation["responses"], (method, path, token, status)
                if "requestBody" in operation:
                    assert status == 415, (method, path, status)
