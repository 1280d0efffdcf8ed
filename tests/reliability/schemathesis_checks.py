"""Checks of our own that schemathesis runs next to its built-in ones (SCHEMATHESIS_HOOKS names this module).

- A request the document calls valid may still be refused 400 only on a field in STATE_DEPENDENT
  (mostly: a model, node, profile or size this fleet has no GPU for).
- Every 400 that the API itself writes names the offending field.
- A plain user (GPUALLOC_FUZZ_USER) never sees another user's lease or job.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

import schemathesis


def _json(response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        return None


def _objects(data: Any) -> Iterator[dict]:
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            yield value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


# Fields a request valid by the document may still be refused on, and why no schema can say so.
STATE_DEPENDENT = {
    "spec.": "this fleet has no GPU (model, node, profile, size) for it",
    "until": "a usage report's until must be later than its since (a rule across two query parameters)",
    "priority": "the admin's policy decides whether jobs may run in the interactive class",
    "offer": "the offers are the admin's (or the fleet's), and some only for some groups",
    "retries": "the admin's policy decides how many retries a job may ask for (max_job_retries)",
    "preemptible": "the admin's policy decides whether batch work may ask not to be preempted",
    "end": "a reservation's end must be later than its start (a rule across two fields)",
    "start": "a date the document's pattern allows may not exist (February 30)",
    "last_activity": "a date the document's pattern allows may not exist (February 30)",
}


@schemathesis.check
def valid_requests_refused_only_for_the_fleet(ctx, response, case) -> None:
    meta = case.meta
    if response.status_code != 400 or meta is None or not meta.generation.mode.is_positive:
        return
    body = _json(response) or {}
    field = body.get("field", "")
    if not any(field.startswith(prefix) for prefix in STATE_DEPENDENT):
        raise AssertionError(f"a request valid by the document got 400 on {field!r}: {body.get('error')}")


@schemathesis.check
def bad_input_names_its_field(ctx, response, case) -> None:
    if response.status_code != 400:
        return
    body = _json(response)
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        raise AssertionError("a 400 without a JSON error")
    if not isinstance(body.get("field"), str):
        raise AssertionError(f"a 400 that names no field: {body['error']}")


@schemathesis.check
def no_other_users_data(ctx, response, case) -> None:
    user = os.environ.get("GPUALLOC_FUZZ_USER")
    if not user:
        return
    for item in _objects(_json(response)):
        if "holder" in item and "user" in item and item["user"] != user:
            raise AssertionError(f"{user} was shown a lease of {item['user']}")
        if "source" in item and "user" in item and item["user"] != user:
            raise AssertionError(f"{user} was shown a job of {item['user']}")
