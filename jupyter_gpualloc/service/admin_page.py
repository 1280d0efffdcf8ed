"""The service's root: a page for people (every GPU, slice, queue and usage; the admin's actions) and,
for API clients, who the caller is as JSON.

The page is static HTML and a small script (static/) that reads the REST API with fetch(). It holds
no data itself: what it shows is what the API shows its caller, so a user who is not an admin sees
their own slices, queue and usage only, and no actions. In hub mode a browser logs in through
JupyterHub's OAuth and the script sends JupyterHub's XSRF token with every call; in standalone mode
the script asks for an API token, keeps it in the tab's sessionStorage and sends it as a bearer
header (never in a URL or a cookie).
"""

from __future__ import annotations

from pathlib import Path

from tornado import web

from . import handlers as h
from .auth import oauth_login_url

STATIC_DIR = Path(__file__).with_name("static")  # the page's script and style, served as they are
TEMPLATES_DIR = Path(__file__).with_name("templates")  # the page itself, given its settings when served
# The page loads its own script and style only, and no other site may frame it (its actions confirm in dialogs).
PAGE_POLICY = "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"


def media_quality(accept: str, media_type: str) -> float:
    """The quality an Accept header gives `media_type`: its own entry, else type/*, else */*; 0 if none."""
    kind = media_type.split("/")[0]
    found: dict[str, float] = {}
    for entry in accept.split(","):
        name, *params = (part.strip() for part in entry.split(";"))
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        found.setdefault(name.lower(), quality)
    for name in (media_type, f"{kind}/*", "*/*"):
        if name in found:
            return found[name]
    return 0.0


def wants_page(accept: str) -> bool:
    """Whether a request asks for HTML (a browser) rather than JSON (an API client): HTML named
    explicitly and preferred to JSON. No Accept, or */* alone, is an API client."""
    html = media_quality(accept, "text/html")
    return "text/html" in accept.lower() and html > 0 and html >= media_quality(accept, "application/json")


class RootHandler(h.ApiHandler):
    """`<prefix>`: the page for a browser, the caller's identity as JSON for an API client.

    In hub mode a browser is sent through JupyterHub's OAuth login first. In standalone mode the
    page itself is served to anyone (it holds no data; its script asks for a token)."""

    async def prepare(self) -> None:
        self.page = self.request.method == "GET" and wants_page(self.request.headers.get("Accept", ""))
        hub_auth = self.settings.get("hub_auth")
        if hub_auth is not None and not await hub_auth.get_user(self, sync=False):
            self.set_status(302)
            self.set_header("Location", oauth_login_url(hub_auth, self))
            self.finish()
            return
        if self.page and hub_auth is None:
            self.check_request()
            return
        await super().prepare()

    def get(self) -> None:
        self.set_header("Vary", "Accept")
        if not self.page:
            self.write_json({**self.identity.to_json(), "api": self.reverse_url("openapi")})
            return
        hub = self.settings.get("hub_auth") is not None
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", PAGE_POLICY)
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Referrer-Policy", "same-origin")
        self.finish(self.render_string(
            "gpualloc.html", auth="hub" if hub else "token", xsrf=self.xsrf_token.decode() if hub else "",
            api=self.reverse_url("openapi").rsplit("/", 1)[0] + "/", static=self.page_file_url))

    def get_template_path(self) -> str:
        return str(TEMPLATES_DIR)

    def page_file_url(self, name: str) -> str:
        """A file of static/ with its content's hash, so a browser caches it until it changes."""
        version = PageFileHandler.get_version({"static_path": str(STATIC_DIR)}, name)
        return f"{self.reverse_url('page_static', name)}?v={version}"


class PageFileHandler(web.StaticFileHandler):
    """The page's script and style: public (they hold no data), cached while their `?v=` hash holds."""

    def set_extra_headers(self, path: str) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")


def page_routes(base_url: str, ctx: h.ServiceContext) -> list[web.URLSpec]:
    """The page's files under `<base_url>static/` and the root itself."""
    base = "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"
    return [web.url(base + "static/(.*)", PageFileHandler, {"path": str(STATIC_DIR)}, name="page_static"),
            web.url(base + "?", RootHandler, {"ctx": ctx}, name="root")]
