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
