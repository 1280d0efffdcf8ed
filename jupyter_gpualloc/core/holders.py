"""The holder grammar, in one place: who holds a lease.

A holder is `server` (a user's default server), `server:<name>` (a named server), `kernel:<id>`
(a kernel) or `job:<id>` (a background job). Standard library only, so the kernel side and
every client may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

SERVER, KERNEL, JOB = "server", "kernel", "job"
KINDS = (SERVER, KERNEL, JOB)
GRAMMAR = "'server', 'server:<name>', 'kernel:<id>' or 'job:<id>'"
SERVER_GRAMMAR = "'server' or 'server:<name>'"


@dataclass(frozen=True)
class Holder:
    """A parsed holder: its kind (server, kernel or job) and its name ('' for the default server)."""

    kind: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else self.kind


def parse_holder(text: str) -> Holder | None:
    """The holder `text` names, or None if it follows no form of the grammar."""
    parts = _kind_and_name(text)
    return Holder(*parts) if parts is not None else None


@lru_cache(maxsize=8192)
def _kind_and_name(text: str) -> tuple[str, str] | None:
    """parse_holder's answer as a tuple: the tests on every request make no Holder (and each
    request asks about its holder several times)."""
    if text == SERVER:
        return SERVER, ""
    kind, colon, name = text.partition(":")
    if colon and name and kind in KINDS:
        return kind, name
    return None


def kind_of(text: str) -> str:
    """'server', 'kernel' or 'job'; what comes before the colon for text outside the grammar."""
    parts = _kind_and_name(text)
    return parts[0] if parts is not None else text.partition(":")[0]


def is_holder(text: str) -> bool:
    return _kind_and_name(text) is not None


def is_server(text: str) -> bool:
    """Whether `text` is a server's holder: 'server' or 'server:<name>'."""
    parts = _kind_and_name(text)
    return parts is not None and parts[0] == SERVER


def server_holder(name: str = "") -> str:
    """'server' for the default server, 'server:<name>' for a named one."""
    return str(Holder(SERVER, name))


def kernel_holder(kernel_id: str) -> str:
    return str(Holder(KERNEL, kernel_id))


def job_holder(job_id: str) -> str:
    return str(Holder(JOB, job_id))


def kernel_of(text: str | None) -> str | None:
    """'kernel:<id>' -> '<id>'; None for other holders."""
    return _name_of(text, KERNEL)


def job_of(text: str | None) -> str | None:
    """'job:<id>' -> '<id>'; None for other holders."""
    return _name_of(text, JOB)


def _name_of(text: str | None, kind: str) -> str | None:
    parts = _kind_and_name(text) if text else None
    return parts[1] if parts is not None and parts[0] == kind else None
