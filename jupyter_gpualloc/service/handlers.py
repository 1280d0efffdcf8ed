"""REST API v1: thin tornado handlers that validate input, call one scheduler method and write JSON.

Every error is JSON, `{"error": "..."}` plus what the client needs to act on it (`field`,
`quota`, `lease_id`, `reason`). A user sees only their own leases; another user's lease is
answered as if it did not exist (404). Scheduler calls run on the IOLoop thread only.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from datetime import datetime
from http.client import responses
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import msgspec
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.log import app_log

from ..core.model import Lease, LeaseState, PriorityClass, SpecError
from ..core.errors import HolderBusy, NotFound, QuotaExceeded, StoreFailed
from ..core.holders import job_holder
from ..core.scheduler import Scheduler
from ..core.store import StoreError
from .auth import Forbidden, Identity
from .events import JSON_ENCODER, EventBroker, parse_event_id
from .group_commit import GroupCommit
from .metrics import CONTENT_TYPE, ServiceMetrics
from .openapi import MAX_EPOCH, MIN_EPOCH, openapi_document
from .validation import InputError, RequestValidator, parse_json

MAX_BODY_BYTES = 64 * 1024
# what a job's token may call besides /heartbeat, on its own job only: the pod runner's calls
JOB_TOKEN_CALLS = {("/jobs/{job_id}", "GET"), ("/jobs/{job_id}/start", "POST"), ("/jobs/{job_id}/finish", "POST")}
REQUESTS = RequestValidator(openapi_document("/"))
_RFC3339 = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}):([0-9]{2})(\.[0-9]+)?"
                      r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


@dataclass
class ServiceContext:
    """What every handler needs: the core, its events and metrics, who is calling, and limits."""

    scheduler: Scheduler
    broker: EventBroker
    metrics: ServiceMetrics
    authenticator: Any
    backend_name: str
    max_wait: float = 60.0
    retry_after: int = 30
    authenticate_prometheus: bool = True
    connections_are_activity: bool = False
    keepalive_interval: float = 15.0
    clock: Callable[[], float] = time.time
    jobs: Any = None  # core.jobs.Jobs: the job records over the same scheduler
    usage: Any = None  # core.usage.UsageLedger: usage reports, windows and quotas over the same leases
    group: GroupCommit | None = None  # lease changes of one IOLoop turn in one transaction
    cluster: Any = None  # service.cluster.ClusterReconciler with the kubernetes backend: the cluster's view
    job_pods: Any = None  # service.job_pods.JobPods when jobs run in Kubernetes Jobs of their own
    kernel_pods: Any = None  # service.kernel_pods.KernelPods when GPU kernels run in pods of their own
    job_workdir_roots: tuple[str, ...] = ()  # GpuAllocService.job_workdir_roots; () confines nobody

    def __post_init__(self) -> None:
        if self.group is None:
            self.group = GroupCommit(self.scheduler)


class ApiError(web.HTTPError):
    """An HTTP error whose JSON body carries `extra` next to the message."""

    def __init__(self, status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(status, reason=_reason_phrase(status))
        self.message = message
        self.headers = headers or {}
        self.extra = extra


def _reason_phrase(status: int) -> str:
    return responses.get(status, "Error")


def _no_form_parsing() -> None:
    """What the API's requests do instead of tornado's HTTPServerRequest._parse_body(): nothing."""


class ApiHandler(web.RequestHandler):
    """Base of the API: authentication, JSON bodies and JSON errors."""

    auth_required = True
    identity: Identity

    def initialize(self, ctx: ServiceContext, route: str = "") -> None:
        self.ctx = ctx
        self.route = route  # the path template in the OpenAPI document, e.g. /leases/{lease_id}
        self.body: dict[str, Any] = {}
        # Bodies are JSON, read by check_request() (a multipart one is 415) or ignored where the document
        # has none: tornado's form parsing, which it runs before prepare(), would answer a form it cannot
        # parse (a multipart Content-Type without a body) 400, on GETs too, where no body is documented.
        self.request._parse_body = _no_form_parsing  # type: ignore[method-assign]

    @property
    def scheduler(self) -> Scheduler:
        return self.ctx.scheduler

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def compute_etag(self) -> None:
        """No ETag: answers are `no-store`, so hashing every body would be wasted."""
        return None

    async def prepare(self) -> None:
        if self.auth_required:
            await self.authenticate()
        self.check_request()

    async def authenticate(self) -> None:
        """Who is calling (401 if unknown, 403 if not allowed); XSRF for browser writes."""
        try:
            identity = await self.ctx.authenticator.identify(self)
        except Forbidden as err:
            raise ApiError(403, str(err)) from None
        if identity is None:
            raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>'",
                           headers={"WWW-Authenticate": 'Bearer realm="gpualloc"'})
        self.identity = identity
        if identity.job is not None and not self._job_token_may_call(identity.job):
            raise ApiError(403, f"the token of job {identity.job} is for that job's runner calls only")
        if self.request.method not in ("GET", "HEAD", "OPTIONS"):
            self.ctx.authenticator.check_xsrf(self)

    def _job_token_may_call(self, job_id: str) -> bool:
        """A job's token reads its job, claims and reports its attempt, and heartbeats its holder."""
        if (self.route, self.request.method) == ("/heartbeat", "POST"):
            return True
        return (self.route, self.request.method) in JOB_TOKEN_CALLS and self.path_args[:1] == [job_id]

    def check_xsrf_cookie(self) -> None:
        """XSRF is checked in prepare(), by the authenticator, once the caller is known."""

    def check_request(self) -> None:
        """The query and the JSON body as the OpenAPI document describes them, else 400 naming the field."""
        method = self.request.method or ""
        try:
            REQUESTS.check_query(self.route, method, self.request.query_arguments)
            if REQUESTS.has_body(self.route, method):
                self.body = self._read_body()
                REQUESTS.check_body(self.route, method, self.body)
        except InputError as err:
            raise ApiError(400, f"{err.field} {err.message}", field=err.field) from None

    def _read_body(self) -> Any:
        raw = self.request.body
        if len(raw) > MAX_BODY_BYTES:
            raise ApiError(413, f"request body over {MAX_BODY_BYTES} bytes", field="body")
        if self.request.headers.get("Content-Type", "").lower().startswith("multipart/"):
            raise ApiError(415, "the body must be JSON (application/json), not multipart", field="body")
        return parse_json(raw) if raw.strip() else {}

    def allowed_methods(self) -> list[str]:
        """The HTTP methods this route implements, for a 405's Allow header."""
        return [m for m in ("GET", "POST", "PUT", "PATCH", "DELETE")
                if getattr(type(self), m.lower()) is not getattr(web.RequestHandler, m.lower())]

    def require_admin(self) -> None:
        if not self.identity.admin:
            raise ApiError(403, "this needs the allocator's admin permission")

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(JSON_ENCODER.encode(data))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        exc = error_status(exc) or exc
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
        if isinstance(exc, ApiError):
            self.set_status(exc.status_code)
            for name, value in exc.headers.items():
                self.set_header(name, value)
            body = {"error": exc.message, **exc.extra}
        elif isinstance(exc, web.HTTPError) and status_code < 500:
            body = {"error": exc.log_message or _reason_phrase(status_code)}
            if status_code == 400:  # tornado refused the body before any handler saw it
                body["field"] = "body"
        else:
            body = {"error": "internal error; the service log has the details"}
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(JSON_ENCODER.encode(body))

    def log_exception(self, typ, value, tb) -> None:
        """Errors about the request are logged as warnings, without a traceback."""
        mapped = error_status(value)
        if mapped is not None:
            self.log_request_error(mapped)
        else:
            super().log_exception(typ, value, tb)

    def log_request_error(self, error: ApiError) -> None:
        app_log.warning("%d %s %s: %s", error.status_code, self.request.method, self.request.path, error.message)

    def json_body(self) -> dict[str, Any]:
        """The request body, checked in prepare() against the document; an empty body is an empty object."""
        return self.body

    def visible_lease(self, lease_id: str) -> Lease:
        """The lease if the caller may see it (theirs, or any for an admin); else 404."""
        try:
            lease = self.scheduler.lease(lease_id)
        except NotFound:
            lease = None
        if lease is None or (lease.user != self.identity.user and not self.identity.admin):
            raise ApiError(404, f"no lease {lease_id}")
        return lease

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        data = lease.to_json()
        data["position"] = self.scheduler.position(lease.id) if lease.state is LeaseState.QUEUED else None
        data["deadline"] = self.scheduler.deadline(lease.id)
        data["idle_release"] = self.scheduler.idle_release(lease.id)
        reservation = self.scheduler.reservations.of_lease(lease.id)
        data["reservation"] = reservation.name if reservation else None
        if self.ctx.cluster is not None:
            data["pod"] = self.ctx.cluster.pod(lease)
        return data


# -------------------------------------------------------------------- validation


def _reject_unknown(body: dict, allowed: set[str]) -> None:
    for key in body:
        if key not in allowed:
            raise ApiError(400, f"unknown field {key!r}", field=key)


def parse_timestamp(value: Any, name: str) -> float | None:
    """Epoch seconds or an RFC 3339 time (a leap second reads as :59) -> epoch seconds."""
    if value is None:
        return None
    if not isinstance(value, str):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not MIN_EPOCH <= value <= MAX_EPOCH:
            raise ApiError(400, f"{name} must be epoch seconds or an RFC 3339 time", field=name)
        return float(value)
    found = _RFC3339.fullmatch(value)
    try:
        if found is None:
            raise ValueError(value)
        day, minutes, seconds, fraction, offset = found.groups()
        offset = "+00:00" if offset in ("Z", "z") else offset
        text = f"{day}T{minutes}:{min(int(seconds), 59):02d}{(fraction or '')[:7]}{offset}"
        return min(max(datetime.fromisoformat(text).timestamp(), MIN_EPOCH), MAX_EPOCH)
    except (ValueError, OverflowError):
        raise ApiError(400, f"{name} must be epoch seconds or an RFC 3339 time", field=name) from None


# -------------------------------------------------------------------- handlers


def _package_version() -> str:
    try:
        return version("jupyter-gpualloc")
    except PackageNotFoundError:
        return "unknown"


class HealthHandler(ApiHandler):
    auth_required = False

    def get(self) -> None:
        health = {"status": "ok", "version": _package_version(), "backend": self.ctx.backend_name,
                  "gpus": self.scheduler.gpu_count(),  # a reservation's rule without its name: members' business
                  "broken_rules": [{"rule": b["kind"], "since": b["since"]} for b in self.scheduler.broken_rules()]}
        if self.ctx.cluster is not None:
            health["cluster"] = self.ctx.cluster.status()
        self.write_json(health)


class UserHandler(ApiHandler):
    def get(self) -> None:
        self.write_json(self.identity.to_json())


OUTSIDE = "outside the allocator"  # what a user reads for a pod the allocator did not place


class InventoryHandler(ApiHandler):
    def get(self) -> None:
        """Each held slice names its lease, user and holder: all of them for an admin, the
        caller's own for a user (another user's lease reads 'other'; a pod the allocator did not
        place reads 'outside the allocator' but for an admin, who sees its namespace/name)."""
        inventory = self.scheduler.inventory()
        whose = None if self.identity.admin else self.identity.user
        visible = {l.id: l for l in self.scheduler.leases(whose) + self.scheduler.returning(whose)}
        for node in inventory["nodes"]:
            for gpu in node["gpus"]:
                for held in gpu.get("instances", []) + gpu.get("shares", []):
                    if held.get("outside") and not self.identity.admin:
                        held["outside"] = OUTSIDE
                    lease = visible.get(held.get("lease_id"))
                    if lease is not None:
                        held.update(user=lease.user, holder=lease.holder)
                    elif held.get("lease_id") is not None:
                        held["lease_id"] = "other"
        if not self.identity.admin:
            for entry in inventory.get("over_committed", []):
                entry["outside"] = OUTSIDE
        self.write_json(inventory)


class OffersHandler(ApiHandler):
    def get(self) -> None:
        """The caller's offers, each with how often a time-boxed lease on it may be extended and the
        usage quota (if any) that would refuse it now; and the kinds of holder that get no slice here, with why."""
        offers = self.scheduler.offers(self.identity.user, self.identity.groups, now=self.ctx.clock())
        self.write_json({"offers": offers, "refused_holders": self.scheduler.refused_holders(),
                         "kernel_pods": self.ctx.kernel_pods is not None})


class LeasesHandler(ApiHandler):
    def get(self) -> None:
        everyone = self.get_query_argument("all", "0") == "1"
        if everyone:
            self.require_admin()
        leases = self.scheduler.leases(None if everyone else self.identity.user)
        self.write_json({"leases": [self.lease_json(l) for l in leases]})

    async def post(self) -> None:
        body = self.json_body()
        wait = body.get("wait")
        def submit() -> Lease:
            spec = self.scheduler.requested_spec(body, self.identity.groups)
            with self.ctx.metrics.timed("submit"):
                return self.scheduler.submit(
                    self.identity.user, body["holder"], spec, PriorityClass(body.get("priority", "interactive")),
                    now=self.ctx.clock(), groups=self.identity.groups, preemptible=body.get("preemptible"),
                    wait=wait != 0, idle_timeout=body.get("idle_timeout"))
        try:
            lease = await self.ctx.group.change(submit)
        except SpecError as err:
            field = field_as_asked(err.field, body.get("spec") or {})
            raise ApiError(400, f"{field}: {err.message}", field=field) from None
        if lease.state is LeaseState.QUEUED and wait:
            await self.ctx.broker.wait_for_change(lease.id, min(wait, self.ctx.max_wait))
            lease = self.scheduler.lease(lease.id)
        self.respond_with(lease)

    def respond_with(self, lease: Lease) -> None:
        if lease.state.active:
            self.set_header("Location", self.reverse_url("lease", lease.id))
            self.write_json(self.lease_json(lease), 201 if lease.state is LeaseState.GRANTED else 202)
        elif self.scheduler.retry_later(lease):
            raise ApiError(503, lease.reason, headers={"Retry-After": str(self.ctx.retry_after)},
                           reason=lease.reason, lease=lease.to_json())
        else:
            raise ApiError(409, lease.reason, reason=lease.reason, lease=lease.to_json())


class LeaseHandler(ApiHandler):
    def get(self, lease_id: str) -> None:
        self.write_json(self.lease_json(self.visible_lease(lease_id)))

    async def delete(self, lease_id: str) -> None:
        """End the lease; `holder_gone=true`: its holder no longer uses the GPU, the slice returns
        at once (also for a lease that ended and is still returning)."""
        holder_gone = self.get_query_argument("holder_gone", "false")
        if holder_gone not in HOLDER_GONE:
            raise ApiError(400, "holder_gone must be true or false", field="holder_gone")
        holder_gone = HOLDER_GONE[holder_gone]
        lease = self.visible_lease(lease_id)
        if not lease.state.active and not (holder_gone and lease.returning):
            raise ApiError(404, f"lease {lease_id} has already ended", state=lease.state.value)
        def release() -> Lease:
            with self.ctx.metrics.timed("release"):
                return self.scheduler.release(lease_id, now=self.ctx.clock(), reason=f"released by {self.identity.user}",
                                              holder_gone=holder_gone)
        lease = await self.ctx.group.change(release)
        self.write_json(self.lease_json(lease))


HOLDER_GONE = {"true": True, "1": True, "false": False, "0": False}


class HoldersGoneHandler(ApiHandler):
    async def post(self) -> None:
        """The caller's holders ended: their leases end and their slices return to the pool."""
        holders, now = self.json_body()["holders"], self.ctx.clock()
        def gone() -> list[Lease]:
            try:
                return self.scheduler.holders_gone(self.identity.user, holders, now=now)
            except SpecError as err:
                raise ApiError(400, str(err), field="holders") from None
        leases = await self.ctx.group.change(gone)
        self.write_json({"leases": [self.lease_json(l) for l in leases]})


class TouchHandler(ApiHandler):
    async def post(self, lease_id: str) -> None:
        lease = self.visible_lease(lease_id)
        body = self.json_body()
        now = self.ctx.clock()
        last_activity = parse_timestamp(body.get("last_activity"), "last_activity")
        busy = body.get("busy")
        if body.get("connections") and self.ctx.connections_are_activity:
            last_activity = now
        if not lease.state.active:
            raise ApiError(404, f"lease {lease_id} has already ended", state=lease.state.value)
        def touch() -> Lease:
            with self.ctx.metrics.timed("touch"):
                return self.scheduler.touch(lease_id, now=now, last_activity=last_activity, busy=busy)
        lease = await self.ctx.group.change(touch)
        self.write_json(self.lease_json(lease))


class HeartbeatHandler(ApiHandler):
    async def post(self) -> None:
        """Alive in memory at once; the accrual joins the group commit, and waits in memory if the store refuses it."""
        holders, now = self.json_body().get("holders"), self.ctx.clock()
        if self.identity.job is not None:  # a job's token keeps its own job's lease alive, nothing else
            holders = [job_holder(self.identity.job)]
        leases = await self.ctx.group.change(lambda: self.scheduler.heartbeat(self.identity.user, holders, now=now),
                                             outlives_refusal=True)
        if holders and self.ctx.jobs is not None:  # jobs that waited for their runner, heartbeated by it again
            try:
                self.ctx.jobs.runner_seen(self.identity.user, holders, now=now)
            except StoreFailed:
                pass  # they wait on; its next heartbeat tries again
        self.write_json({"leases": [self.lease_json(l) for l in leases]})


class DrainHandler(ApiHandler):
    def post(self, gpu_uuid: str) -> None:
        self._drain(gpu_uuid, True)

    def delete(self, gpu_uuid: str) -> None:
        self._drain(gpu_uuid, False)

    def _drain(self, gpu_uuid: str, drained: bool) -> None:
        self.require_admin()
        with self.ctx.metrics.timed("drain"):
            self.scheduler.drain(gpu_uuid, drained, now=self.ctx.clock())
        self.write_json({"gpu": gpu_uuid, "drained": drained})


class EventsHandler(ApiHandler):
    """Server-sent events: one `id: <event id>` and `data: {json}` message per event the caller may see;
    the fleet's events (gpu.*, mig.*) with `fleet=1`, the default for administrators only.

    A client that sends the last id it read (`Last-Event-ID`, as browsers' EventSource do when
    they reconnect, else `?since=`) first gets the events after it, or a `stream.reset` when
    those are gone. The opening comment and the keep-alives carry the stream's position too.
    """

    async def get(self) -> None:
        after = self.resume_after()
        self.set_header("Content-Type", "text/event-stream; charset=utf-8")
        self.set_header("X-Accel-Buffering", "no")
        fleet = self.get_query_argument("fleet", None)
        self.stream = stream = self.ctx.broker.open_stream(self.identity, after, now=self.ctx.clock(),
                                                           fleet=None if fleet is None else fleet == "1")
        try:
            self.write(f": connected\nid: {stream.start}\n\n")
            await self.flush()
            while True:
                try:
                    message = await stream.next(self.ctx.keepalive_interval)
                except EOFError as err:
                    if self.request.connection.stream.closed():
                        return
                    self.write(f"event: end\ndata: {json.dumps({'error': str(err)})}\n\n")
                    break
                if message is None:  # nothing queued: every event so far was offered to this stream
                    self.write(f": keepalive\nid: {self.ctx.broker.position}\n\n")
                else:
                    self.write(message)  # serialised once by the broker for every stream that sends it
                await self.flush()
        except StreamClosedError:
            return
        finally:
            self.ctx.broker.close_stream(stream)
        self.finish()

    def resume_after(self) -> tuple[str, int] | None:
        """The event id to resume after: Last-Event-ID, else `since`; None for a stream from now on."""
        for field, given in (("Last-Event-ID", self.request.headers.get("Last-Event-ID")),
                             ("since", self.get_query_argument("since", None, strip=False))):
            if given is not None:
                after = parse_event_id(given)
                if after is None:
                    raise ApiError(400, f"{field} must be an event id as the stream sent it, e.g. 3f9a0c21-17",
                                   field=field)
                return after
        return None

    def on_connection_close(self) -> None:
        stream = getattr(self, "stream", None)
        if stream is not None:
            self.ctx.broker.close_stream(stream, "the client went away")


class MetricsHandler(ApiHandler):
    async def prepare(self) -> None:
        self.auth_required = self.ctx.authenticate_prometheus
        await super().prepare()

    def get(self) -> None:
        if self.ctx.authenticate_prometheus:
            self.require_admin()
        self.set_header("Content-Type", CONTENT_TYPE)
        self.finish(self.ctx.metrics.render())


class OpenApiHandler(ApiHandler):
    auth_required = False

    def initialize(self, ctx: ServiceContext, document: dict, route: str = "") -> None:
        super().initialize(ctx, route)
        self.document = document

    def get(self) -> None:
        self.write_json(self.document)


class NotFoundHandler(ApiHandler):
    auth_required = False

    def prepare(self) -> None:
        raise ApiError(404, f"no such endpoint: {self.request.method} {self.request.path}")


def field_as_asked(field: str, spec: dict[str, Any]) -> str:
    """The core names memory in MiB; blame memory_gib when that is how the request gave it."""
    return "spec.memory_gib" if field == "spec.memory_mib" and "memory_gib" in spec else field


def error_status(exc: BaseException) -> ApiError | None:
    """The API error for an exception the core raises about a request, or None for others."""
    if isinstance(exc, SpecError):
        return ApiError(400, str(exc), field=exc.field)
    if isinstance(exc, QuotaExceeded):
        return ApiError(403, str(exc), quota={"scope": exc.scope, "key": exc.key, "limit": exc.limit})
    if isinstance(exc, HolderBusy):
        return ApiError(409, str(exc), lease_id=exc.lease_id)
    if isinstance(exc, NotFound):
        return ApiError(404, str(exc))
    if isinstance(exc, StoreFailed):  # the core undid the change; the database may be back soon
        return ApiError(503, str(exc), headers={"Retry-After": "5"})
    if isinstance(exc, StoreError):  # a read, or usage accrual, the database did not answer
        return ApiError(503, f"the store is out of order ({exc.kind})", headers={"Retry-After": "5"})
    return None
