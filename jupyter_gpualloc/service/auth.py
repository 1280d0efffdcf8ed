"""Who is calling: JupyterHub tokens and OAuth cookies (hub mode) or a static token map (standalone),
and the tokens of jobs run in Kubernetes Jobs.

Every authenticator turns a request into an `Identity` (user name, admin or not, groups) or None.
In hub mode administrators are those holding a custom scope (`custom:gpualloc:admin` by default),
people or JupyterHub services (an operator's script); a service without that scope is refused;
in standalone mode they are the token map's entries marked `"admin": True`. A job's token
(`JobTokenAuthenticator`) acts for the job's owner on that one job only (`Identity.job`).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any, Mapping

from jupyterhub.services.auth import HubOAuth, check_scopes
from tornado import web
from tornado.httputil import url_concat

ADMIN_SCOPE = "custom:gpualloc:admin"
SERVICE_PREFIX = "service:"  # an administering JupyterHub service's identity: "service:<its name>"
_AUTH_HEADER = re.compile(r"(?:token|bearer)\s+(\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Identity:
    """An authenticated caller."""

    user: str
    admin: bool = False
    groups: tuple[str, ...] = ()
    job: str | None = None  # a job's token: only that job's runner calls are allowed

    def to_json(self) -> dict[str, Any]:
        return {"user": self.user, "admin": self.admin, "groups": list(self.groups)}


class Forbidden(Exception):
    """The caller is known but not allowed to use this service at all."""


def bearer_token(handler: web.RequestHandler) -> str | None:
    """The token of an `Authorization: Bearer <token>` (or `token <token>`) header."""
    match = _AUTH_HEADER.match(handler.request.headers.get("Authorization", ""))
    return match.group(1) if match else None


class TokenAuthenticator:
    """Standalone mode: bearer tokens from `GpuAllocService.api_tokens`.

    Tokens are looked up by their SHA-256 digest: one dictionary lookup per request however many
    tokens there are, and the lookup's timing can tell an attacker about digests, never about tokens.
    """

    def __init__(self, tokens: Mapping[str, Mapping[str, Any]]):
        self._identities: dict[bytes, Identity] = {}
        for token, entry in tokens.items():
            self._identities[token_digest(token)] = parse_token_entry(token, entry)

    async def identify(self, handler: web.RequestHandler) -> Identity | None:
        token = bearer_token(handler)
        if not token:
            return None
        return self._identities.get(token_digest(token))

    def check_xsrf(self, handler: web.RequestHandler) -> None:
        """Bearer tokens are never sent by a browser on its own: nothing to check."""


JOB_TOKEN_PREFIX = "gpualloc-job."


def job_token(job_id: str, secret: str) -> str:
    """The token a job's pod runner calls with: names its job, so it is checked against that job alone."""
    return f"{JOB_TOKEN_PREFIX}{job_id}.{secret}"


class JobTokenAuthenticator:
    """The tokens of jobs run in Kubernetes Jobs (service/job_pods.py), before `fallback` (the
    service's own authenticator) for every other token. A job's token is valid while the job is
    active and its SHA-256 is the one stored in the job's record (a new one for each attempt)."""

    def __init__(self, jobs: Any, fallback: Any):
        self.jobs, self.fallback = jobs, fallback

    async def identify(self, handler: web.RequestHandler) -> Identity | None:
        token = bearer_token(handler)
        if not token or not token.startswith(JOB_TOKEN_PREFIX):
            return await self.fallback.identify(handler)
        job_id = token[len(JOB_TOKEN_PREFIX):].partition(".")[0]
        job = self.jobs.active_job(job_id)
        if job is None or not job.token_sha256:
            return None
        if not hmac.compare_digest(hashlib.sha256(token.encode()).hexdigest(), job.token_sha256):
            return None
        return Identity(job.user, False, job.groups, job=job.id)

    def check_xsrf(self, handler: web.RequestHandler) -> None:
        if bearer_token(handler) is None:
            self.fallback.check_xsrf(handler)


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_token_entry(token: str, entry: Any) -> Identity:
    """One `api_tokens` entry, `{"user": "alice", "admin": False, "groups": [...]}`, checked."""
    where = f"api_tokens[{token[:4]}...]"
    if not isinstance(token, str) or len(token) < 8:
        raise ValueError(f"{where}: a token must be a string of at least 8 characters")
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where}: must be a dict like {{'user': 'alice', 'admin': False}}")
    unknown = set(entry) - {"user", "admin", "groups"}
    if unknown:
        raise ValueError(f"{where}: unknown key {sorted(unknown)[0]!r} (use user, admin, groups)")
    user = entry.get("user")
    if not isinstance(user, str) or not user:
        raise ValueError(f"{where}: 'user' must be a non-empty string")
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ValueError(f"{where}: 'admin' must be True or False")
    groups = entry.get("groups", [])
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) for g in groups):
        raise ValueError(f"{where}: 'groups' must be a list of group names")
    return Identity(user, admin, tuple(groups))


class HubAuthenticator:
    """Hub mode: a JupyterHub token (user, server or kernel token) or the service's OAuth cookie.

    The caller needs the service's access scopes (`access:services!service=<name>`); holding
    `admin_scope` makes them an administrator of the allocator.
    """

    def __init__(self, hub_auth: HubOAuth, admin_scope: str = ADMIN_SCOPE):
        self.hub_auth = hub_auth
        self.admin_scope = admin_scope

    async def identify(self, handler: web.RequestHandler) -> Identity | None:
        """The caller; a browser opening an API page without a login is sent to the OAuth login."""
        model = await self.hub_auth.get_user(handler, sync=False)
        if not model:
            if is_browser_page_request(handler):
                handler.redirect(oauth_login_url(self.hub_auth, handler))
                raise web.Finish()
            return None
        kind = model.get("kind", "user")
        scopes = set(model.get("scopes", ()))
        access = self.hub_auth.access_scopes
        if access and not check_scopes(access, scopes):
            raise Forbidden(f"{kind} {model['name']} may not use this service "
                            f"(needs one of: {', '.join(sorted(access))})")
        admin = bool(check_scopes({self.admin_scope}, scopes))
        if kind == "service":
            # an operator's script or dashboard, registered as a JupyterHub service: it holds no
            # slices of its own, so it is let in only to administer, by the same scope as a person
            if not admin:
                raise Forbidden(f"service {model['name']} is not a user: a JupyterHub service may use "
                                f"this service only as an administrator (the {self.admin_scope} scope)")
            return Identity(SERVICE_PREFIX + model["name"], True)
        if kind != "user":
            raise Forbidden(f"{kind} {model.get('name')} is not a user")
        return Identity(model["name"], admin, tuple(model.get("groups") or ()))

    def check_xsrf(self, handler: web.RequestHandler) -> None:
        """Cookie-authenticated (browser) writes need JupyterHub's XSRF token; token requests do not."""
        self.hub_auth.check_xsrf_cookie(handler)


def is_browser_page_request(handler: web.RequestHandler) -> bool:
    """A browser opening a page (not a script with a token): GET, no credentials, HTML accepted."""
    request = handler.request
    return (request.method == "GET" and "Authorization" not in request.headers
            and "token" not in request.query_arguments and "text/html" in request.headers.get("Accept", ""))


def oauth_login_url(hub_auth: HubOAuth, handler: web.RequestHandler) -> str:
    """JupyterHub's OAuth login for this service, coming back to the page the browser asked for."""
    params, verifier = {}, None
    if hub_auth.pkce_enabled:
        verifier, challenge, method = hub_auth.generate_pkce_code_challenge()
        params.update(code_challenge=challenge, code_challenge_method=method)
    params["state"] = hub_auth.set_state_cookie(handler, next_url=handler.request.uri, code_verifier=verifier)
    return url_concat(hub_auth.login_url, params)
