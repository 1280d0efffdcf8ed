"""The OpenAPI 3.1 document of REST API v1, built from the same route table the app serves.

The API validates every request against this document's own schemas (service/validation.py),
so the rules here, cross-field ones included, are exactly the rules the API applies.
"""

from __future__ import annotations

import copy
from typing import Any

from ..core.holders import GRAMMAR, KINDS, SERVER, SERVER_GRAMMAR
from ..core.jobs import (INSIDE_WORKDIR_PATTERN, INSIDE_WORKDIR_RULE, SYSTEM_DIRS_PATTERN, WORKDIR_PATTERN,
                         WORKDIR_RULE)
from ..core.model import MAX_EPOCH, MIN_EPOCH, NAME_MAX_LENGTH, PROFILE_PATTERN, SPEC_LIMITS, UNPRINTABLE

API_VERSION = "1"
MAX_SECONDS = 10 ** 9
MAX_HOLDERS = 1000


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return _json(_ref("Error"), description)


NULLABLE_NUMBER = {"type": ["number", "null"]}
PYTHON_NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}
# A name: no control or invisible formatting characters, no whitespace at either end.
_NAME_BODY = f"[^\\s{UNPRINTABLE}]([^{UNPRINTABLE}]*[^\\s{UNPRINTABLE}])?"
NAME = {"type": "string", "minLength": 1, "maxLength": NAME_MAX_LENGTH, "pattern": f"^{_NAME_BODY}$",
        "x-rule": "must not hold control or invisible formatting characters, nor start or end with whitespace"}
HOLDER = {**NAME, "pattern": f"^({SERVER}|({'|'.join(KINDS)}):{_NAME_BODY})$",
          "x-rule": f"must be {GRAMMAR}, without control or invisible formatting characters"}
RUNNER = {**NAME, "pattern": f"^({SERVER}|{SERVER}:{_NAME_BODY})$", "default": SERVER,
          "x-rule": f"must be {SERVER_GRAMMAR}, without control or invisible formatting characters",
          "description": "The owner's server whose job runner runs the job: 'server', or 'server:<name>' "
                         "for a JupyterHub named server."}


def _rule(field: str, message: str, refused: dict[str, Any]) -> dict[str, Any]:
    """A cross-field rule of a spec: `refused` matches the specs it refuses; `field` is the one blamed."""
    return {"not": refused, "x-field": field, "x-rule": message, "description": message}


SPEC_RULES = [
    _rule("memory_mib", "give memory_gib or memory_mib, not both", {"required": ["memory_gib", "memory_mib"]}),
    _rule("count", "only whole GPUs come in counts above 1",
          {"required": ["count"], "properties": {"count": {"minimum": 2}},
           "anyOf": [{"required": ["profile"]},
                     {"required": ["kind"], "properties": {"kind": {"enum": ["mig", "shared"]}}}]}),
    _rule("profile", "only a mig slice has a profile",
          {"required": ["profile", "kind"], "properties": {"kind": {"enum": ["shared", "whole"]}}}),
    _rule("memory_gib", "a shared slice needs its memory size",
          {"required": ["kind"], "properties": {"kind": {"const": "shared"}},
           "not": {"anyOf": [{"required": ["memory_gib"]}, {"required": ["memory_mib"]}]}}),
]

# What a request may choose of its lease's terms: only less than the policy gives (core/offers.py)
IDLE_TIMEOUT = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS,
                "description": "A shorter idle timeout (seconds) than the policy's for the offer; a request can "
                               "never lengthen it, nor turn idle release off."}
ONE_SLICE = {"oneOf": [{"required": ["spec"]}, {"required": ["offer"]}], "x-field": "offer",
             "x-rule": "give either an offer's name or a spec"}

# An event's id: `<epoch>-<n>`, n counting one service run's events from 1 (the epoch changes with each run).
EVENT_ID_PATTERN = r"^([0-9a-z]{1,32})-(0|[1-9][0-9]{0,18})$"
EVENT_ID = {"type": "string", "maxLength": 52, "pattern": EVENT_ID_PATTERN}

SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {
            "error": {"type": "string", "description": "What went wrong, for people."},
            "field": {"type": "string", "description": "The offending field of the request, e.g. spec.memory_gib."},
            "quota": {"type": "object", "required": ["scope", "key", "limit"],
                      "properties": {"scope": {"enum": ["user", "group"]}, "key": {"type": "string"},
                                     "limit": {"type": "number"}}},
            "lease_id": {"type": "string", "description": "The holder's existing lease (409 holder busy)."},
            "reason": {"type": "string", "description": "Why a request was rejected (409, 503)."},
            "lease": {"type": "object"},
            "state": {"type": "string"},
        },
    },
    "SliceSpec": {
        "type": "object", "additionalProperties": False,
        "description": "What to ask for. A spec no GPU of this fleet could ever provide (an unknown model "
                       "or node, a profile or size no GPU has) is answered 400 naming the field.",
        "properties": {
            "kind": {"enum": ["mig", "shared", "whole", "any"],
                     "description": "Default: mig when a profile is given, else any."},
            "memory_gib": {"type": "number", "exclusiveMinimum": 0, "maximum": SPEC_LIMITS["memory_gib"]},
            "memory_mib": {"type": "integer", "minimum": 1, "maximum": SPEC_LIMITS["memory_mib"]},
            "profile": {"type": "string", "maxLength": 32, "pattern": f"^{PROFILE_PATTERN}$",
                        "x-rule": "must look like 1g.10gb or 3g.40gb"},
            "model": NAME, "count": {"type": "integer", "minimum": 1, "maximum": SPEC_LIMITS["count"]},
            "node": NAME, "cpu_milli": {"type": "integer", "minimum": 0, "maximum": SPEC_LIMITS["cpu_milli"]},
            "host_memory_mib": {"type": "integer", "minimum": 0, "maximum": SPEC_LIMITS["host_memory_mib"]},
        },
        "allOf": SPEC_RULES,
    },
    "Slice": {
        "type": "object", "required": ["kind", "node", "gpu_uuids", "memory_mib", "visible_devices"],
        "properties": {
            "kind": {"enum": ["mig", "shared", "whole"]}, "node": {"type": "string"},
            "gpu_uuids": {"type": "array", "items": {"type": "string"}},
            "memory_mib": {"type": "integer"}, "profile": {"type": "string"}, "start": {"type": "integer"},
            "mig_uuid": {"type": "string"}, "milli": {"type": "integer"}, "model": {"type": "string"},
            "visible_devices": {"type": "string", "description": "The value for CUDA_VISIBLE_DEVICES."},
        },
    },
    "Lease": {
        "type": "object",
        "required": ["id", "user", "holder", "spec", "priority", "state", "slice", "created_at", "reason"],
        "properties": {
            "id": {"type": "string"}, "user": {"type": "string"}, "holder": {"type": "string"},
            "groups": {"type": "array", "items": {"type": "string"}},
            "spec": _ref("SliceSpec"), "priority": {"enum": ["interactive", "batch"]},
            "preemptible": {"type": "boolean"},
            "state": {"enum": ["queued", "granted", "released", "expired", "preempted", "rejected", "cancelled"]},
            "slice": {"oneOf": [_ref("Slice"), {"type": "null"}]},
            "created_at": {"type": "number"}, "granted_at": NULLABLE_NUMBER, "ended_at": NULLABLE_NUMBER,
            "last_activity": NULLABLE_NUMBER, "heartbeat_at": NULLABLE_NUMBER, "busy": {"type": "boolean"},
            "idle_warned_at": NULLABLE_NUMBER, "idle_timeout": NULLABLE_NUMBER,
            "reason": {"type": "string"},
            "returning": {"type": "boolean",
                          "description": "Ended, its slice still held: nobody else gets it until its holder is gone."},
            "position": {"type": ["integer", "null"],
                         "description": "1-based place in the queue when queued; in every /leases answer, "
                                        "not in the lease a job carries."},
            "pod": {"type": "object", "required": ["namespace", "labels"],
                    "description": "Kubernetes backend only: the namespace and labels that make a pod this "
                                   "lease's (its spawner's pod must have both), and the resources it asks for.",
                    "properties": {"namespace": {"type": "string"},
                                   "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                   "resources": {"type": "object", "additionalProperties": {"type": "string"},
                                                 "description": "Once a slice is granted: the extended resources "
                                                                "its pod asks for, by the names its node "
                                                                "advertises (e.g. nvidia.com/gpu: 1)."}}},
        },
    },
    "LeaseList": {"type": "object", "required": ["leases"],
                  "properties": {"leases": {"type": "array", "items": _ref("Lease")}}},
    "LeaseRequest": {
        "type": "object", "required": ["holder"], "additionalProperties": False,
        "description": "What a user may choose: the slice (an offer's name, or a spec of their own), the holder, "
                       "whether to wait, and less than the policy gives (a shorter idle timeout, a preemptible "
                       "lease). The idle timeout and time limit a lease gets come from the admin's policy for "
                       "its offer (docs/usage.md).",
        "properties": {
            "offer": {**NAME, "description": "An offer's name (GET /offers): its spec, idle timeout and time limit."},
            "spec": _ref("SliceSpec"),
            "holder": HOLDER,
            "priority": {"enum": ["interactive", "batch"], "default": "interactive"},
            "wait": {"type": "number", "minimum": 0, "maximum": MAX_SECONDS,
                     "description": "Seconds to long-poll for a grant (at most the service's max_wait). "
                                    "Absent: queue and answer at once; 0: reject (409) if nothing fits now."},
            "preemptible": {"type": "boolean", "description": (
                "true makes the lease preemptible; false (not to be preempted) is refused for batch work "
                "unless the policy allows it (allow_non_preemptible).")},
            "idle_timeout": IDLE_TIMEOUT,
        },
        "allOf": [ONE_SLICE],
    },
    "Touch": {
        "type": "object", "additionalProperties": False,
        "properties": {
            "last_activity": {"oneOf": [{"type": "number", "minimum": MIN_EPOCH, "maximum": MAX_EPOCH},
                                        {"type": "string", "format": "date-time", "maxLength": 64,
                                         "pattern": "^(19[7-9][0-9]|[2-9][0-9]{3})-"}],
                              "description": "Epoch seconds or an RFC 3339 time from 1970 to 9999 (its offset may "
                                             "take it past either end, where it counts as that end); a time "
                                             "after now counts as now."},
            "busy": {"type": "boolean"}, "connections": {"type": "integer", "minimum": 0, "maximum": 2 ** 31 - 1},
        },
    },
    "Heartbeat": {"type": "object", "additionalProperties": False,
                  "properties": {"holders": {"type": "array", "items": NAME, "maxItems": MAX_HOLDERS}}},
    "HoldersGone": {"type": "object", "additionalProperties": False, "required": ["holders"],
                    "properties": {"holders": {"type": "array", "items": HOLDER, "maxItems": MAX_HOLDERS}}},
    "Inventory": {
        "type": "object", "required": ["nodes", "queue"],
        "properties": {
            "nodes": {"type": "array", "items": {
                "type": "object", "required": ["name", "gpus"],
                "properties": {"name": {"type": "string"}, "cpu_milli": {"type": "integer"},
                               "unschedulable": {"type": ["string", "null"],
                                                 "description": "Why nothing new goes there (cordoned, not Ready)."},
                               "memory_mib": {"type": "integer"}, "free_cpu_milli": {"type": "integer"},
                               "free_memory_mib": {"type": "integer"},
                               "gpus": {"type": "array", "items": _ref("Gpu")}}}},
            "queue": {"type": "object", "additionalProperties": {"type": "integer"}},
            "unusable_nodes": {"type": "array", "items": {
                "type": "object", "required": ["name", "reason"],
                "properties": {"name": {"type": "string"}, "reason": {"type": "string"}}}},
            "over_committed": {"type": "array", "description": (
                "Outside holders (GPU pods the allocator did not place) whose devices found no free one."),
                "items": {"type": "object", "properties": {
                    "outside": {"type": "string"}, "unplaced": {"type": "array", "items": {"type": "string"}}}}},
        },
    },
    "Gpu": {
        "type": "object", "required": ["uuid", "model", "memory_mib", "mig_mode", "drained"],
        "properties": {
            "uuid": {"type": "string"}, "index": {"type": "integer"}, "model": {"type": "string"},
            "memory_mib": {"type": "integer"}, "mig_mode": {"enum": ["off", "static", "dynamic"]},
            "drained": {"type": "boolean"},
            "cordoned": {"type": ["string", "null"], "description": "Why its node takes nothing new, if so."},
            "instances": {"type": "array", "items": {"type": "object"}},
            "memory_slices": {"type": "integer"}, "compute_slices": {"type": "integer"},
            "free_memory_slices": {"type": "integer"}, "free_compute_slices": {"type": "integer"},
            "free_profiles": {"type": "object", "additionalProperties": {"type": "integer"}},
            "shares": {"type": "array", "items": {"type": "object"}},
            "free_memory_mib": {"type": "integer"}, "free_milli": {"type": "integer"},
            "whole_free": {"type": "boolean"},
        },
        "description": ("Lease ids of other users' slices read 'other' unless the caller is an admin. An instance or "
                        "share held outside the allocator (a GPU pod it did not place) has `outside`: the pod's "
                        "namespace/name for an admin, 'outside the allocator' for others."),
    },
    "Offers": {"type": "object", "required": ["offers"], "properties": {"offers": {"type": "array", "items": {
        "type": "object", "required": ["name", "label", "spec", "available"],
        "properties": {"name": {"type": "string"}, "label": {"type": "string"}, "spec": _ref("SliceSpec"),
                       "idle_timeout": NULLABLE_NUMBER, "available": {"type": "integer"},
                       "over_quota": {"type": ["string", "null"],
                                      "description": "The caller's quota never allows this offer: 'at most 20 GiB'."},
                       "quota_full": {"type": ["string", "null"], "description": (
                           "The quota the caller's slices in use fill now, in the words of a queued lease's "
                           "reason: a request for this offer waits (or, asked with no wait, is refused) until "
                           "one of them ends. `available` counts free GPUs whoever asks.")}}}},
        "refused_holders": {"type": "object", "propertyNames": {"enum": ["kernel", "job"]},
                            "additionalProperties": {"type": "string"},
                            "description": ("Each kind of holder that gets no slice on this backend, with why and "
                                            "what would enable it (on Kubernetes: kernels, and jobs unless the "
                                            "service runs them in Kubernetes Jobs); empty where every kind can.")},
        "kernel_pods": {"type": "boolean", "description": (
            "Whether GPU kernels (kernelspecs asking for a slice) run in kernel pods of their own, which "
            "their server's provisioner asks for at /kernels/{kernel_id}/pod (Kubernetes).")}}},
    "Health": {"type": "object", "required": ["status"],
               "properties": {"status": {"const": "ok"}, "version": {"type": "string"},
                              "backend": {"type": "string"}, "gpus": {"type": "integer"},
                              "cluster": {"type": "string", "description": (
                                  "With the kubernetes backend: 'current', or 'stale since <UTC time>' while "
                                  "the API server cannot be reached (the service decides from its last view).")},
                              "broken_rules": {"type": "array", "description": (
                                  "Rules of the scheduler's tick that fail now (dead holders, idle release, usage "
                                  "quotas, time limits, reservation, reservation displacement, scheduling pass): "
                                  "each is undone and skipped while the others go on; a reservation's is "
                                  "'reservation', without its name. The service log says why once; the metric "
                                  "gpualloc_tick_errors_total counts each failure."),
                                  "items": {"type": "object", "required": ["rule", "since"],
                                            "properties": {"rule": {"type": "string"},
                                                           "since": {"type": "number",
                                                                     "description": "Epoch seconds."}}}}}},
    "Identity": {"type": "object", "required": ["user", "admin", "groups"],
                 "properties": {"user": {"type": "string"}, "admin": {"type": "boolean"},
                                "groups": {"type": "array", "items": {"type": "string"}}}},
    "Drain": {"type": "object", "required": ["gpu", "drained"],
              "properties": {"gpu": {"type": "string"}, "drained": {"type": "boolean"}}},
}

LEASE_ID = {"name": "lease_id", "in": "path", "required": True, "schema": {"type": "string"}}
GPU_UUID = {"name": "gpu_uuid", "in": "path", "required": True, "schema": {"type": "string"}}
AUTH_ERRORS = {"401": _error("No or unknown credentials."),
               "403": _error("Known caller without permission for this; in a Jupyter server also a request "
                             "without its credentials, or from a foreign Host or Origin.")}
# What a client can do next with the lease it was given (schemathesis' stateful phase follows these).
LEASE_LINKS = {
    name: {"operationRef": f"#/paths/~1leases~1{{lease_id}}{suffix}", "parameters": {"lease_id": "$response.body#/id"}}
    for name, suffix in (("GetLease", "/get"), ("ReleaseLease", "/delete"), ("TouchLease", "~1touch/post"))}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}}
# Answers every operation may give, added to each where it applies.
COMMON_ERRORS = {
    "query": {"400": _error("A query parameter not as documented; `field` names it.")},
    "body": {"400": _error("Bad input; `field` names it."), "413": _error("A body over 64 KiB."),
             "415": _error("A multipart body: bodies are JSON.")},
    "store": {"503": {**_error("The store is out of order: nothing was changed; retry after `Retry-After`."),
                      "headers": RETRY_AFTER}},
}
# The operations that read or write the store (the others answer from memory): 503 during an outage.
STORE_OPERATIONS = {
    ("/leases", "post"), ("/leases/{lease_id}", "get"), ("/leases/{lease_id}", "delete"),
    ("/leases/{lease_id}/touch", "post"), ("/leases/{lease_id}/extend", "post"),
    ("/leases/{lease_id}/utilization", "post"), ("/gpus/{gpu_uuid}/drain", "post"),
    ("/gpus/{gpu_uuid}/drain", "delete"), ("/metrics", "get"), ("/usage", "get"), ("/usage/efficiency", "get"),
    ("/jobs", "get"), ("/jobs", "post"), ("/jobs/{job_id}", "get"), ("/jobs/{job_id}", "delete"),
    ("/jobs/{job_id}/log", "get"), ("/jobs/{job_id}/rerun", "post"), ("/jobs/{job_id}/start", "post"),
    ("/jobs/{job_id}/finish", "post"), ("/kernels/{kernel_id}/pod", "post"), ("/kernels/{kernel_id}/pod", "delete"),
    ("/jobs/runners/gone", "post"),
}

OPERATIONS: dict[str, dict[str, dict[str, Any]]] = {
    "/health": {"get": {"summary": "Liveness; needs no authentication.", "security": [],
                        "responses": {"200": _json(_ref("Health"), "The service is up.")}}},
    "/user": {"get": {"summary": "Who the caller is to the allocator.",
                      "responses": {"200": _json(_ref("Identity"), "The caller."), **AUTH_ERRORS}}},
    "/inventory": {"get": {"summary": "GPUs, MIG layouts and free capacity per profile and kind.",
                           "responses": {"200": _json(_ref("Inventory"), "The fleet now."), **AUTH_ERRORS}}},
    "/offers": {"get": {"summary": "The slice choices policy offers the caller, with how many could be granted now.",
                        "responses": {"200": _json(_ref("Offers"), "Offers."), **AUTH_ERRORS}}},
    "/leases": {
        "get": {"summary": "The caller's active leases (everyone's with all=1, for admins).",
                "parameters": [{"name": "all", "in": "query", "required": False, "schema": {"enum": ["0", "1"]}}],
                "responses": {"200": _json(_ref("LeaseList"), "Active leases, oldest first."), **AUTH_ERRORS}},
        "post": {"summary": "Ask for a slice.",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("LeaseRequest")}}},
                 "responses": {
                     "201": {**_json(_ref("Lease"), "Granted."), "links": LEASE_LINKS},
                     "202": {**_json(_ref("Lease"), "Queued, with its position."), "links": LEASE_LINKS},
                     "400": _error("Bad input; `field` names it."),
                     "401": AUTH_ERRORS["401"],
                     "403": _error("Quota exceeded; `quota` says which."),
                     "409": _error("No capacity and no waiting (`reason`), "
                                   "or the holder already has a lease (`lease_id`)."),
                     "503": {**_error("The fleet for this request is drained, or the store is out of order "
                                      "(nothing was changed); retry after `Retry-After`."),
                             "headers": RETRY_AFTER},
                 }},
    },
    "/leases/{lease_id}": {
        "parameters": [LEASE_ID],
        "get": {"summary": "One lease, active or ended.",
                "responses": {"200": _json(_ref("Lease"), "The lease."), "401": AUTH_ERRORS["401"],
                              "404": _error("No such lease (or not the caller's).")}},
        "delete": {"summary": "Release a granted slice or withdraw a queued request.",
                   "description": "The slice goes to nobody else until its holder is gone: at once with "
                                  "`holder_gone=true` (the caller knows the holder no longer uses the GPU); "
                                  "otherwise the ended lease is `returning` until POST /holders/gone names its "
                                  "holder, or the holder's heartbeats stop (policy `wait_for_holders`). "
                                  "`holder_gone=true` on a returning lease gives its slice back.",
                   "parameters": [{"name": "holder_gone", "in": "query", "required": False,
                                   "schema": {"enum": ["true", "false", "1", "0"]},
                                   "description": "Whether the holder no longer uses the GPU."}],
                   "responses": {"200": _json(_ref("Lease"), "The ended lease."),
                                 "400": _error("A `holder_gone` that is not true or false."),
                                 "401": AUTH_ERRORS["401"],
                                 "404": _error("No such active lease (or not the caller's).")}},
    },
    "/leases/{lease_id}/touch": {
        "parameters": [LEASE_ID],
        "post": {"summary": "Report the holder's activity; counts as a heartbeat.",
                 "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("Touch")}}},
                 "responses": {"200": _json(_ref("Lease"), "The lease."), "400": _error("Bad input."),
                               "401": AUTH_ERRORS["401"], "404": _error("No such active lease.")}},
    },
    "/heartbeat": {
        "post": {"summary": "Mark the caller's holders alive (all of their leases without holders).",
                 "description": "Answered from memory: a store outage does not end a lease that heartbeats "
                                "(its usage accrual is written once the store is back).",
                 "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("Heartbeat")}}},
                 "responses": {"200": _json(_ref("LeaseList"), "The leases kept alive."),
                               "400": _error("Bad input."), "401": AUTH_ERRORS["401"]}},
    },
    "/holders/gone": {
        "post": {"summary": "Say that some of the caller's holders ended (a server stopped, a kernel's or "
                            "a job's process exited).",
                 "description": "Their active leases end (released, or cancelled while queued) and every "
                                "slice they still held returns to the pool; answers the leases whose slices "
                                "returned.",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("HoldersGone")}}},
                 "responses": {"200": _json(_ref("LeaseList"), "The leases whose slices returned."),
                               "400": _error("Bad input."), "401": AUTH_ERRORS["401"]}},
    },
    "/events": {
        "get": {"summary": "Server-sent events: the caller's leases, and the fleet's with fleet=1 (everything for "
                           "admins).",
                "description": "Each message is `id: <event id>` and `data: {Event JSON}`; the opening comment "
                               "(`: connected`) and the keep-alives carry an `id:` too, the stream's position. "
                               "A client that reconnects with the last id it read (Last-Event-ID, else `since`) "
                               "first gets the events after it that it may see, in order, then the live ones. When "
                               "they cannot be replayed (the service restarted, or more events than "
                               "event_replay_size came since) the first event is `stream.reset`, whose `reason` "
                               "says why: read the state again (GET /leases, /jobs), then go on from its id.",
                "parameters": [
                    {"name": "fleet", "in": "query", "required": False, "schema": {"enum": ["0", "1"]},
                     "description": "1: the fleet's events too (gpu.*, mig.*; a user sees them without lease "
                                    "ids); 0: only leases' events. Default 1 for administrators, 0 for others."},
                    {"name": "since", "in": "query", "required": False, "schema": EVENT_ID,
                     "description": "Resume after this event id (Last-Event-ID wins when both are sent)."},
                    {"name": "Last-Event-ID", "in": "header", "required": False, "schema": EVENT_ID,
                     "description": "Resume after this event id (sent by browsers' EventSource on reconnect)."}],
                "responses": {"200": {"description": "An event stream, one `id:` + `data: {json}` message per event "
                                                     "(schema Event).",
                                      "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                              "400": _error("`since` or Last-Event-ID is not an event id; `field` names it."),
                              "401": AUTH_ERRORS["401"]}},
    },
    "/gpus/{gpu_uuid}/drain": {
        "parameters": [GPU_UUID],
        "post": {"summary": "Stop granting new slices on a GPU (admin).",
                 "responses": {"200": _json(_ref("Drain"), "Drained."), **AUTH_ERRORS,
                               "404": _error("No such GPU.")}},
        "delete": {"summary": "Resume granting on a GPU (admin).",
                   "responses": {"200": _json(_ref("Drain"), "Undrained."), **AUTH_ERRORS,
                                 "404": _error("No such GPU.")}},
    },
    "/metrics": {
        "get": {"summary": "Prometheus metrics (admin unless authenticate_prometheus is off).",
                "responses": {"200": {"description": "Prometheus text format.",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}},
                              **AUTH_ERRORS}},
    },
    "/openapi.json": {"get": {"summary": "This document.", "security": [],
                              "responses": {"200": {"description": "OpenAPI 3.1.",
                                                    "content": {"application/json": {"schema": {"type": "object"}}}}}}},
}

SCHEMAS.update({
    "JobSource": {  # as core/jobs.py reads it; `kind` picks the rules, so errors name their field
        "type": "object", "required": ["kind"], "properties": {"kind": {"enum": ["cell", "notebook"]}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": "cell"}}}, "then":
            {"type": "object", "required": ["kind", "code"], "additionalProperties": False,
             "properties": {"kind": {"const": "cell"}, "code": {"type": "string", "pattern": "\\S"},
                            "inputs": {"type": "array", "items": PYTHON_NAME},
                            "outputs": {"type": "array", "items": PYTHON_NAME},
                            "inputs_file": {"type": ["string", "null"], "pattern": INSIDE_WORKDIR_PATTERN,
                                            "x-rule": INSIDE_WORKDIR_RULE,
                                            "description": "cloudpickle file of the inputs, relative to workdir."}},
             "allOf": [{"not": {"required": ["inputs"], "properties": {"inputs": {"minItems": 1}},
                                "not": {"required": ["inputs_file"], "properties": {"inputs_file": {"type": "string"}}}},
                        "x-field": "inputs_file", "x-rule": "is required with inputs"}]}},
            {"if": {"properties": {"kind": {"const": "notebook"}}}, "then":
            {"type": "object", "required": ["kind", "path"], "additionalProperties": False,
             "properties": {"kind": {"const": "notebook"},
                            "path": {"type": "string", "description": "The notebook, relative to workdir.",
                                     "allOf": [{"pattern": "\\.ipynb$", "x-rule": "must be the path of an .ipynb file"},
                                               {"pattern": INSIDE_WORKDIR_PATTERN, "x-rule": INSIDE_WORKDIR_RULE}]},
                            "parameters": {"type": "object", "propertyNames": PYTHON_NAME,
                                           "description": "Injected after the cell tagged `parameters`."}}}},
        ],
    },
    "JobRequest": {
        "type": "object", "required": ["spec", "source", "workdir"], "additionalProperties": False,
        "properties": {
            "name": {**NAME, "maxLength": 200}, "spec": _ref("SliceSpec"), "source": _ref("JobSource"),
            "workdir": {"type": "string", "pattern": WORKDIR_PATTERN, "not": {"pattern": SYSTEM_DIRS_PATTERN},
                        "maxLength": 4096, "x-rule": WORKDIR_RULE,
                        "description": "Absolute directory the job runs in; its files land in "
                                       "<workdir>/.gpualloc/jobs/<id>/. The standalone service may confine it "
                                       "further (c.GpuAllocService.job_workdir_roots: by default the home "
                                       "directory of a user with a local account): 400 elsewhere."},
            "kernel_name": {"type": "string", "pattern": "^[A-Za-z0-9._-]+$", "default": "python3"},
            "priority": {"enum": ["batch", "interactive"], "default": "batch"},
            "preemptible": {"type": "boolean"},
            "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_SECONDS,
                        "description": "Seconds per attempt."},
            "retries": {"type": "integer", "minimum": 0, "maximum": 100, "default": 0},
            "runner": RUNNER,
        },
    },
    "Job": {
        "type": "object",
        "required": ["id", "user", "name", "spec", "priority", "state", "attempts", "position", "reason"],
        "properties": {
            "id": {"type": "string"}, "user": {"type": "string"}, "name": {"type": "string"},
            "spec": _ref("SliceSpec"), "priority": {"enum": ["interactive", "batch"]},
            "preemptible": {"type": "boolean"}, "source": _ref("JobSource"), "workdir": {"type": "string"},
            "kernel_name": {"type": "string"},
            "state": {"enum": ["queued", "running", "succeeded", "failed", "cancelled", "timed_out"]},
            "created_at": {"type": "number"}, "started_at": NULLABLE_NUMBER, "ended_at": NULLABLE_NUMBER,
            "groups": {"type": "array", "items": {"type": "string"}},
            "timeout": NULLABLE_NUMBER, "retries": {"type": "integer"}, "attempts": {"type": "integer"},
            "preemptions": {"type": "integer"}, "lease_id": {"type": ["string", "null"]},
            "reason": {"type": "string"}, "rerun_of": {"type": ["string", "null"]},
            "runner": {"type": "string", "description": RUNNER["description"] + " 'pod': the job runs in "
                       "Kubernetes Jobs the service makes from the submitting server's pod."},
            "position": {"type": ["integer", "null"],
                         "description": "When queued: 1-based place in the queue, 0 once its slice is granted."},
            "lease": {"oneOf": [_ref("Lease"), {"type": "null"}]},
            "slice": {"oneOf": [_ref("Slice"), {"type": "null"}]},
            "runtime_s": NULLABLE_NUMBER, "preempt_grace": {"type": "number"},
            "waiting_for_runner": {"type": "boolean", "description": "Queued without a lease (no slice, no quota) "
                                   "until the runner of its server, which stopped, heartbeats it again."},
        },
    },
    "JobList": {"type": "object", "required": ["jobs"],
                "properties": {"jobs": {"type": "array", "items": _ref("Job")}}},
    "JobFinish": {
        "type": "object", "required": ["attempt", "outcome"], "additionalProperties": False,
        "properties": {"attempt": {"type": "integer", "minimum": 1},
                       "outcome": {"enum": ["succeeded", "failed", "timed_out", "interrupted"]},
                       "reason": {"type": "string"}},
    },
    "RunnerGone": {"type": "object", "additionalProperties": False, "properties": {"runner": {
        **RUNNER, "description": "The caller's server whose job runner stopped."}}},
    "JobStart": {"type": "object", "additionalProperties": False, "properties": {"runner": {
        **RUNNER, "pattern": f"^(pod|{SERVER}|{SERVER}:{_NAME_BODY})$",
        "x-rule": f"must be {SERVER_GRAMMAR} or 'pod', without control or invisible formatting characters",
        "description": "Who claims the job: its server's runner, or 'pod' (the runner in its Kubernetes Job)."}}},
})

JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_JOB_404 = _error("No such job (or not the caller's).")
_JOB_409 = _error("The job's state does not allow this; `state` says what it is.")

OPERATIONS.update({
    "/jobs": {
        "get": {"summary": "The caller's jobs, newest first (everyone's with all=1, for admins).",
                "parameters": [{"name": "all", "in": "query", "required": False, "schema": {"enum": ["0", "1"]}}],
                "responses": {"200": _json(_ref("JobList"), "Jobs."), **AUTH_ERRORS}},
        "post": {"summary": "Queue a cell or notebook as a background job on a batch lease.",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobRequest")}}},
                 "responses": {"201": _json(_ref("Job"), "Queued (position 0: its slice is already granted)."),
                               "400": _error("Bad input; `field` names it."), "401": AUTH_ERRORS["401"],
                               "403": _error("A quota refuses this job even with nothing else held.")}},
    },
    "/jobs/runners/gone": {
        "post": {"summary": "The runner of the caller's server stopped: its jobs wait for it, without a lease "
                            "(no slice, no quota), until it heartbeats them again.",
                 "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("RunnerGone")}}},
                 "responses": {"200": _json(_ref("JobList"), "The runner's queued and running jobs, now waiting "
                                            "for it (a running one once its attempt's end is reported)."),
                               "401": AUTH_ERRORS["401"]}},
    },
    "/jobs/{job_id}": {
        "parameters": [JOB_ID],
        "get": {"summary": "One job.", "responses": {"200": _json(_ref("Job"), "The job."),
                                                     "401": AUTH_ERRORS["401"], "404": _JOB_404}},
        "delete": {"summary": "Cancel a queued or running job (its runner stops the kernel).",
                   "responses": {"200": _json(_ref("Job"), "The cancelled job."), "401": AUTH_ERRORS["401"],
                                 "404": _JOB_404, "409": _JOB_409}},
    },
    "/jobs/{job_id}/log": {
        "parameters": [JOB_ID, {"name": "follow", "in": "query", "required": False, "schema": {"enum": ["0", "1"]}}],
        "get": {"summary": "The job's log (job.log); follow=1 streams it until the job ends.",
                "description": "The log is opened with no symbolic link followed on any component of its path, "
                               "and served only when it is a regular file with one link, owned by the job's "
                               "user (their local account's uid; for a user without a local account, the "
                               "service's own account).",
                "responses": {"200": {"description": "The log as far as it reached when the request began (empty "
                                                     "when not written yet); with follow=1, then what it gains "
                                                     "until the job ends.",
                                      "content": {"text/plain": {"schema": {"type": "string"}}}},
                              "401": AUTH_ERRORS["401"],
                              "403": _error("The log is not served: a symbolic link on its path, not a regular "
                                            "file (a directory, a FIFO, a device), hard-linked, not owned by the "
                                            "job's user, or one the service cannot open; `error` says which."),
                              "404": _JOB_404}},
    },
    "/jobs/{job_id}/rerun": {
        "parameters": [JOB_ID],
        "post": {"summary": "Queue a new job with the same request as an ended one.",
                 "responses": {"201": _json(_ref("Job"), "The new job."), "401": AUTH_ERRORS["401"],
                               "404": _JOB_404, "409": _JOB_409}},
    },
    "/jobs/{job_id}/start": {
        "parameters": [JOB_ID],
        "post": {"summary": "The runner of the job's server claims it, queued with its slice granted: it is running.",
                 "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("JobStart")}}},
                 "responses": {"200": _json(_ref("Job"), "Running, with its lease."), "401": AUTH_ERRORS["401"],
                               "404": _JOB_404, "409": _JOB_409}},
    },
    "/jobs/{job_id}/finish": {
        "parameters": [JOB_ID],
        "post": {"summary": "The runner reports how an attempt ended; the lease ends, the job moves on.",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("JobFinish")}}},
                 "responses": {"200": _json(_ref("Job"), "The job."), "400": _error("Bad input."),
                               "401": AUTH_ERRORS["401"], "404": _JOB_404, "409": _JOB_409}},
    },
})


_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
SCHEMAS.update({
    "KernelPodRequest": {
        "type": "object", "required": ["argv", "connection"], "additionalProperties": False, "allOf": [ONE_SLICE],
        "properties": {
            "offer": {**NAME, "description": "An offer's name (GET /offers): its spec, idle timeout and time limit."},
            "spec": _ref("SliceSpec"), "server": RUNNER,
            "priority": {"enum": ["interactive", "batch"], "default": "interactive"},
            "idle_timeout": IDLE_TIMEOUT,
            "argv": {"type": "array", "minItems": 1, "maxItems": 100, "items": {"type": "string", "maxLength": 4096},
                     "description": "The kernel's command line; '{connection_file}' is where its connection file goes."},
            "env": {"type": "object", "maxProperties": 50,
                    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]{0,127}$"},
                    "additionalProperties": {"type": "string", "maxLength": 4096},
                    "description": "Added to the kernel's env (from a Secret): the kernel's link to the service."},
            "workdir": {"type": "string", "maxLength": 4096, "description": "The kernel's working directory."},
            "resume": {"type": "boolean", "default": False, "description": (
                "The request again, after the service restarted: take back the kernel's active lease and its "
                "pod as they are (404 when its lease has ended); never a new lease.")},
            "connection": {
                "type": "object", "required": ["key", "signature_scheme", "shell_port", "iopub_port", "stdin_port",
                                               "control_port", "hb_port"], "additionalProperties": False,
                "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 256},
                               "signature_scheme": {"enum": ["hmac-sha256"]}, "kernel_name": {"type": "string"},
                               "shell_port": _PORT, "iopub_port": _PORT, "stdin_port": _PORT,
                               "control_port": _PORT, "hb_port": _PORT}},
        },
    },
    "KernelPod": {
        "type": "object", "required": ["kernel_id", "state"],
        "properties": {"kernel_id": {"type": "string"},
                       "state": {"enum": ["queued", "starting", "running", "ended"]},
                       "position": {"type": ["integer", "null"]}, "ip": {"type": ["string", "null"]},
                       "pod": {"type": ["string", "null"]}, "reason": {"type": "string"},
                       "lease": {"oneOf": [_ref("Lease"), {"type": "null"}]}},
    },
})
KERNEL_ID = {"name": "kernel_id", "in": "path", "required": True, "schema": {"type": "string"}}
_KERNEL_404 = _error("No such kernel pod request of the caller's, or kernel pods are off.")
OPERATIONS.update({
    "/kernels/{kernel_id}/pod": {
        "parameters": [KERNEL_ID],
        "post": {"summary": "A GPU kernel's pod (Kubernetes): queue its lease; once granted its pod is made.",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("KernelPodRequest")}}},
                 "responses": {"201": _json(_ref("KernelPod"), "Queued, or its pod on the way."),
                               "400": _error("Bad input; `field` names it (no running server pod: `runner`)."),
                               "401": AUTH_ERRORS["401"],
                               "404": _error("Kernel pods are off, or (`resume`) the kernel's lease has ended."),
                               "409": _error("The kernel has a lease already.")}},
        "get": {"summary": "Where the kernel's pod is: queued (position), starting, running (its IP), ended (why).",
                "responses": {"200": _json(_ref("KernelPod"), "The kernel's pod."), "401": AUTH_ERRORS["401"],
                              "404": _KERNEL_404}},
        "delete": {"summary": "The kernel shut down (or its start was cancelled): its lease ends, then its pod.",
                   "responses": {"200": _json(_ref("KernelPod"), "Ended."), "401": AUTH_ERRORS["401"],
                                 "404": _KERNEL_404}},
    },
})

SCHEMAS.update({
    "UsageQuota": {
        "type": "object",
        "required": ["scope", "who", "gpu_hours", "limit", "window", "resets_at", "standing", "message"],
        "properties": {
            "scope": {"enum": ["user", "group"]}, "who": {"type": "string"},
            "gpu_hours": {"type": "number", "description": "Used in the window now."},
            "limit": {"type": "number"}, "window": {"type": "string", "description": "e.g. 7d or calendar_week."},
            "resets_at": {**NULLABLE_NUMBER, "description": "Calendar: the window's end; rolling: when use "
                                                            "falls under the limit if nothing more runs."},
            "warn_fraction": {"type": "number", "description": "The used fraction from which the quota's running "
                                                                "leases are warned (policy usage_warn_fraction)."},
            "standing": {"enum": ["ok", "warning", "exceeded"],
                         "description": "exceeded at the limit, warning from warn_fraction of it: the quota's "
                                        "running leases get the event usage.<standing>."},
            "message": {"type": "string", "description": "e.g. you have used 12.50 of 40 GPU-hours this week."},
        },
    },
    "UsageReport": {
        "type": "object", "required": ["since", "until", "by", "user", "rows", "total", "quotas"],
        "properties": {
            "since": {"type": "number"}, "until": {"type": "number"},
            "by": {"enum": ["user", "group", "model", "kind", "offer", "holder_kind", "day", "reservation"]},
            "user": {"type": ["string", "null"], "description": "Whose usage; null: everyone's (admins)."},
            "rows": {"type": "array", "items": {
                "type": "object", "required": ["gpu_hours", "gib_hours", "leases"],
                "properties": {"gpu_hours": {"type": "number"}, "gib_hours": {"type": "number"},
                               "leases": {"type": "integer"}},
                "description": "One row per value of `by` (a key named after it), largest first."}},
            "total": {"type": "object", "required": ["gpu_hours", "gib_hours"],
                      "properties": {"gpu_hours": {"type": "number"}, "gib_hours": {"type": "number"}}},
            "quotas": {"type": "array", "items": _ref("UsageQuota"),
                       "description": "The caller's usage quotas and where they stand."},
        },
    },
})

# What the usage report's since and until accept (service/usage.py reads each of them).
USAGE_TIME = {"anyOf": [
    {"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    {"type": "string", "format": "date-time",
     "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"},
    {"type": "string", "pattern": "^[0-9]{1,11}(\\.[0-9]+)?$"}],
    "x-rule": "must be a date (2026-11-01), an RFC 3339 time or epoch seconds"}

OPERATIONS["/usage"] = {
    "get": {"summary": "GPU-hours and GiB-hours between since and until, per `by`: the caller's "
                       "(everyone's, or one user's, for admins). CSV with Accept: text/csv.",
            "parameters": [
                {"name": "since", "in": "query", "required": False, "schema": USAGE_TIME,
                 "description": "ISO-8601 time or epoch seconds (UTC); default the start of this month."},
                {"name": "until", "in": "query", "required": False, "schema": USAGE_TIME,
                 "description": "ISO-8601 time or epoch seconds (UTC); default now."},
                {"name": "by", "in": "query", "required": False,
                 "schema": {"enum": ["user", "group", "model", "kind", "offer", "holder_kind", "day", "reservation"],
                            "default": "user"}},
                {"name": "user", "in": "query", "required": False, "schema": NAME,
                 "description": "Admins: one user's usage only."},
            ],
            "responses": {"200": {"description": "The report.",
                                  "content": {"application/json": {"schema": _ref("UsageReport")},
                                              "text/csv": {"schema": {"type": "string"}}}},
                          "400": _error("Bad query argument; `field` names it."),
                          "401": AUTH_ERRORS["401"],
                          "403": _error("Another user's usage, asked by a non-admin.")}},
}

SCHEMAS["Offers"]["properties"]["offers"]["items"]["properties"]["max_duration"] = {
    **NULLABLE_NUMBER, "description": "Seconds a server's lease on this offer may last; null: no limit."}
SCHEMAS["Offers"]["properties"]["offers"]["items"]["properties"].update({
    "max_extensions": {"type": ["integer", "null"], "description": "How often a lease on this offer may be "
                                                                   "extended; null when it has no max_duration."},
    "over_usage_quota": {"type": ["string", "null"],
                         "description": "The usage quota that refuses a request now: 'you have used 40.00 of 40 "
                                        "GPU-hours this week (resets Mon 2026-12-07 00:00 UTC)'."},
})

SCHEMAS["Event"] = {
    "type": "object", "required": ["type", "time", "lease_id", "user", "data", "id"],
    "description": "One message of GET /events: a scheduler event (lease.*, job.*, gpu.*, mig.*, ...), or "
                   "`stream.reset` when a resumed stream cannot replay what was missed (data.reason, "
                   "data.last_event_id); its id is the position the stream goes on from.",
    "properties": {
        "type": {"type": "string"}, "time": {"type": "number", "description": "Epoch seconds."},
        "lease_id": {"type": ["string", "null"]}, "user": {"type": ["string", "null"]},
        "data": {"type": "object"}, "id": EVENT_ID,
    },
}
SCHEMAS["Lease"]["properties"]["idle_release"] = {
    "type": ["object", "null"],
    "description": ("When idle release takes this lease back if its holder stays idle (times in epoch seconds): "
                    "warned at `warn_at`, released `grace` seconds later at `release_at`; any activity of a person "
                    "starts it over. Null without idle release, or while the holder is busy."),
    "properties": {"since": {"type": "number"}, "warn_at": {"type": "number"}, "release_at": {"type": "number"},
                   "grace": {"type": "number"}, "warned": {"type": "boolean"}},
}
SCHEMAS["Lease"]["properties"]["deadline"] = {
    "type": ["object", "null"], "description": "A time-boxed lease's deadline; null when it has none.",
    "properties": {"at": {"type": "number"}, "extensions": {"type": "integer"},
                   "extensions_left": {"type": "integer"}, "warned_at": NULLABLE_NUMBER},
}

SCHEMAS.update({
    "Utilization": {
        "type": "object", "required": ["sm_percent"], "additionalProperties": False,
        "properties": {"sm_percent": {"type": "number", "minimum": 0, "maximum": 100,
                                      "description": "SM utilisation of the lease's GPU (or MIG instance) now."}},
    },
    "EfficiencyReport": {
        "type": "object", "required": ["since", "until", "user", "rows"],
        "properties": {
            "since": {"type": "number"}, "until": {"type": "number"}, "user": {"type": ["string", "null"]},
            "rows": {"type": "array", "items": {
                "type": "object",
                "required": ["lease_id", "user", "gpu_hours", "busy_gpu_hours", "efficiency", "message"],
                "properties": {
                    "lease_id": {"type": "string"}, "user": {"type": "string"}, "holder_kind": {"type": "string"},
                    "model": {"type": "string"}, "kind": {"type": "string"}, "memory_gib": {"type": "number"},
                    "gpu_hours": {"type": "number"}, "busy_gpu_hours": {"type": "number"},
                    "efficiency": {"type": "number", "description": "Busy over held GPU-hours, 0 to 1."},
                    "message": {"type": "string"}}}},
        },
    },
})

_PERIOD = [
    {"name": "since", "in": "query", "required": False, "schema": USAGE_TIME,
     "description": "ISO-8601 time or epoch seconds (UTC); default the start of this month."},
    {"name": "until", "in": "query", "required": False, "schema": USAGE_TIME,
     "description": "ISO-8601 time or epoch seconds (UTC); default now."},
    {"name": "user", "in": "query", "required": False, "schema": NAME,
     "description": "Admins: one user's leases only."},
]

OPERATIONS["/usage/efficiency"] = {
    "get": {"summary": "Leases with GPU utilisation samples: GPU-hours held vs. busy, least efficient first "
                       "(the caller's; everyone's for admins).",
            "parameters": _PERIOD,
            "responses": {"200": _json(_ref("EfficiencyReport"), "The report."),
                          "400": _error("Bad query argument; `field` names it."), "401": AUTH_ERRORS["401"],
                          "403": _error("Another user's leases, asked by a non-admin.")}},
}

OPERATIONS["/usage/history"] = {
    "get": {"summary": "GPU-hours per UTC day, split by offer: the caller's (everyone's, or one user's, for admins); "
                       "by default the last 14 days.",
            "parameters": [{**_PERIOD[0], "description": "ISO-8601 time or epoch seconds (UTC); default 00:00 UTC "
                                                         "13 days ago."}, *_PERIOD[1:]],
            "responses": {"200": _json(_ref("UsageHistory"), "Days with use, in order."),
                          "400": _error("Bad query argument; `field` names it."), "401": AUTH_ERRORS["401"],
                          "403": _error("Another user's usage, asked by a non-admin.")}},
}
SCHEMAS["UsageHistory"] = {
    "type": "object", "required": ["since", "until", "user", "days"],
    "properties": {
        "since": {"type": "number"}, "until": {"type": "number"}, "user": {"type": ["string", "null"]},
        "days": {"type": "array", "items": {
            "type": "object", "required": ["day", "gpu_hours", "offers"],
            "properties": {"day": {"type": "string", "description": "YYYY-MM-DD (UTC)."},
                           "gpu_hours": {"type": "number"},
                           "offers": {"type": "object", "additionalProperties": {"type": "number"},
                                      "description": "GPU-hours per offer, largest first; \"\" for requests "
                                                     "of no offer."}}}},
    },
}
STORE_OPERATIONS |= {("/usage/history", "get")}

OPERATIONS["/leases/{lease_id}/utilization"] = {
    "parameters": [LEASE_ID],
    "post": {"summary": "Report a GPU utilisation sample of a lease (its holder's watchdog, or an admin).",
             "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("Utilization")}}},
             "responses": {"200": _json(_ref("Lease"), "The lease."), "400": _error("Bad input; `field` names it."),
                           "401": AUTH_ERRORS["401"], "404": _error("No such active lease (or not the caller's).")}},
    "get": {"summary": "A lease's GPU utilisation samples of the last minutes (its owner's, or an admin's).",
            "responses": {"200": _json(_ref("UtilizationSamples"), "The samples, oldest first; none where "
                                       "nothing samples the lease's GPU."),
                          "401": AUTH_ERRORS["401"], "404": _error("No such lease (or not the caller's).")}},
}
SCHEMAS["UtilizationSamples"] = {
    "type": "object", "required": ["lease_id", "window", "now", "samples"],
    "properties": {
        "lease_id": {"type": "string"}, "now": {"type": "number"},
        "window": {"type": "number", "description": "How many seconds back the samples go."},
        "samples": {"type": "array", "items": {
            "type": "object", "required": ["at", "sm_percent"],
            "properties": {"at": {"type": "number"}, "sm_percent": {"type": "number", "minimum": 0, "maximum": 100}}}},
    },
}
STORE_OPERATIONS |= {("/leases/{lease_id}/utilization", "get")}  # an ended lease is read from the store

OPERATIONS["/leases/{lease_id}/extend"] = {
    "parameters": [LEASE_ID],
    "post": {"summary": "Move a time-boxed lease's deadline later by the policy's extension.",
             "responses": {"200": _json(_ref("Lease"), "The lease with its new deadline."),
                           "401": AUTH_ERRORS["401"],
                           "404": _error("No such active lease (or not the caller's)."),
                           "409": _error("Not extended: no deadline, no extensions left, others wait, "
                                         "or not granted (`reason`).")}},
}
SCHEMAS["Lease"]["properties"]["reservation"] = {
    "type": ["string", "null"], "description": "The reservation it was granted from (it ends with its window); null if none."}
_WHEN = {"anyOf": [{"type": "number", "minimum": MIN_EPOCH, "maximum": MAX_EPOCH}, {"type": "string", "pattern": (
             r"^(19[7-9]\d|[2-9]\d{3})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])([T ]([01]\d|2[0-3]):[0-5]\d(:[0-5]\d(\.\d{1,6})?)?)?"
             r"(Z|[+-]([01]\d|2[0-3]):?[0-5]\d)?$")}],
         "description": "Epoch seconds, or an ISO 8601 time such as 2026-12-08T10:00 (UTC unless it names its offset), "
                        "from 1970-01-01 to 9999-12-31T23:59:59Z."}
_NAMES = {"type": "array", "items": NAME, "maxItems": MAX_HOLDERS}
SCHEMAS.update({
    "ReservationRequest": {
        "type": "object", "required": ["name", "spec", "start", "end"], "additionalProperties": False,
        "anyOf": [{"required": ["users"], "properties": {"users": {"minItems": 1}}},
                  {"required": ["groups"], "properties": {"groups": {"minItems": 1}}}],
        "description": "Names at least one user or group.",
        "properties": {
            "name": {**NAME, "maxLength": 64, "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$",
                     "x-rule": "must be letters, digits, '.', '_' or '-'"},
            "users": _NAMES, "groups": _NAMES, "spec": _ref("SliceSpec"),
            "count": {"type": "integer", "minimum": 1, "maximum": 100000, "default": 1,
                      "description": "How many slices of `spec` it holds."},
            "start": _WHEN, "end": _WHEN,
            "weekly": {"type": "boolean", "default": False, "description": "The window repeats every week."},
            "lead_seconds": {"type": "number", "minimum": 0, "maximum": 604800, "default": 600,
                             "description": "Seconds before the start at which preemptible work on its "
                                            "capacity is preempted (and interactive work warned, with "
                                            "preempt_interactive)."},
            "preempt_interactive": {"type": "boolean", "default": False,
                                    "description": "End interactive work on its capacity at the start "
                                                   "(warned at start - lead) instead of keeping other capacity."},
        },
    },
    "Reservation": {
        "type": "object",
        "required": ["name", "owner", "users", "groups", "spec", "count", "start", "end", "weekly", "lead_seconds",
                     "preempt_interactive", "state", "next_start", "next_end", "held", "in_use", "free",
                     "gpu_hours", "summary"],
        "properties": {
            "name": {"type": "string"}, "owner": {"type": "string"},
            "users": {"type": "array", "items": {"type": "string"},
                      "description": "Its members by name; another user reads 'other' unless the caller is an admin."},
            "groups": {"type": "array", "items": {"type": "string"},
                       "description": "Its member groups; one the caller is not in reads 'other' unless the caller "
                                      "is an admin."},
            "spec": _ref("SliceSpec"),
            "count": {"type": "integer"}, "start": {"type": "number"}, "end": {"type": "number"},
            "weekly": {"type": "boolean"}, "lead_seconds": {"type": "number"}, "preempt_interactive": {"type": "boolean"},
            "state": {"enum": ["upcoming", "active", "ended"]},
            "next_start": NULLABLE_NUMBER, "next_end": NULLABLE_NUMBER,
            "held": {"type": "array", "items": {"type": "string"}, "description": "UUIDs of the GPUs it holds now."},
            "in_use": {"type": "integer", "description": "Its slices granted to members now."},
            "free": {"type": "integer", "description": "Its slices members can still get now (0 outside the window)."},
            "leases": {"type": "array", "items": {"type": "string"},
                       "description": "Ids of its leases granted now; another user's reads 'other' unless the "
                                      "caller is an admin."},
            "gpu_hours": {"type": "number", "description": "GPU-hours used inside it since it was created."},
            "summary": {"type": "string", "description": "'ml101 reservation: 22 of 30 free until 12:00 UTC'."},
            "warnings": {"type": "array", "items": {"type": "string"},
                         "description": "At creation: what it cannot promise without preempt_interactive."},
        },
    },
    "ReservationList": {"type": "object", "required": ["reservations"],
                        "properties": {"reservations": {"type": "array", "items": _ref("Reservation")}}},
})
_RESERVATION_404 = _error("No such reservation (or the caller is not a member).")
OPERATIONS["/reservations"] = {
    "get": {"summary": "Reservations: every one for admins, those the caller is a member of for others.",
            "responses": {"200": _json(_ref("ReservationList"), "Reservations, by start.")}},
    "post": {"summary": "Hold a count of slices for users and groups in a window, once or weekly (admins).",
             "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ReservationRequest")}}},
             "responses": {"201": _json(_ref("Reservation"), "Created; `warnings` says what it cannot promise."),
                           "403": _error("Needs the allocator's admin permission."),
                           "409": _error("The fleet cannot hold it (`field`: count, and `fits`: how many fit "
                                         "beside overlapping reservations) or the name exists (`field`: name).")}},
}
OPERATIONS["/reservations/{name}"] = {
    "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
    "get": {"summary": "One reservation.",
            "responses": {"200": _json(_ref("Reservation"), "The reservation."), "404": _RESERVATION_404}},
    "delete": {"summary": "Delete a reservation: its capacity is free again (admins); its leases keep their deadlines.",
               "responses": {"200": _json(_ref("Reservation"), "The deleted reservation."),
                             "403": _error("Needs the allocator's admin permission."), "404": _RESERVATION_404}},
}
STORE_OPERATIONS |= {("/reservations", "post"), ("/reservations/{name}", "delete")}



def openapi_document(api_prefix: str, cookie_name: str = "gpualloc") -> dict[str, Any]:
    """The document for the API served under `api_prefix` (e.g. /services/gpualloc/api/v1)."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "jupyter-gpualloc scheduler service", "version": API_VERSION,
                 "description": "GPU slices (MIG, memory-capped shares, whole GPUs) from one scheduler core."},
        "servers": [{"url": api_prefix.rstrip("/")}],
        "security": [{"bearer": []}, {"hubCookie": []}],
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "A JupyterHub token (hub mode) or a token of api_tokens (standalone)."},
                "hubCookie": {"type": "apiKey", "in": "cookie", "name": cookie_name,
                              "description": "The service's JupyterHub OAuth cookie (browsers, hub mode)."},
            },
        },
        "paths": _with_common_errors(OPERATIONS),
    }


def _with_common_errors(operations: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each operation's answers plus those every operation of its shape may give (auth, bad input, store outage)."""
    paths = copy.deepcopy(operations)
    for path, item in paths.items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            responses = operation["responses"]
            extra: dict[str, Any] = {}
            if operation.get("security") != []:
                extra.update(AUTH_ERRORS)
            parameters = item.get("parameters", []) + operation.get("parameters", [])
            if any(p["in"] == "query" for p in parameters):
                extra.update(COMMON_ERRORS["query"])
            if "requestBody" in operation:
                extra.update(COMMON_ERRORS["body"])
            if (path, method) in STORE_OPERATIONS:
                extra.update(COMMON_ERRORS["store"])
            for status, answer in extra.items():
                responses.setdefault(status, answer)
    return paths
