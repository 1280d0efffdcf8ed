"""The hub side's link to the scheduler service: every call a spawner makes goes through here.

The spawner acts *as the user*: the hub gives each spawner an API token of that user limited to
`access:services!service=<name>` (`user_service_token`), so the service's ordinary JupyterHub
authentication applies, quotas and group offers included, and no service-side "on behalf of"
power is needed. The token is made by the hub itself (it outlives hub restarts in the hub's
database, but the spawner only keeps it in memory: after a restart it makes a new one and deletes
the old, found by its note).
"""

from __future__ import annotations

from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import get_scopes_for

from ..client import GpuAllocClient, NotFound


def access_scope(service_name: str) -> str:
    return f"access:services!service={service_name}"


def user_service_token(user: Any, service_name: str, note: str) -> str:
    """A new token of JupyterHub `user` that may only reach the service; older ones with `note` go.

    Raises PermissionError, saying which scope an administrator must grant, when the user lacks
    it (JupyterHub then refuses the token, or would make one that does not work).
    """
    db = user.db
    for old in list(user.orm_user.api_tokens):
        if old.note == note:
            db.delete(old)
    db.commit()
    scope = access_scope(service_name)
    refused = PermissionError(f"To use GPUs, an administrator must grant {scope} to you.")
    try:
        token = user.new_api_token(note=note, scopes=[scope])
    except ValueError:  # "Not assigning requested scopes ... not held by User ..."
        raise refused from None
    orm_token = orm.APIToken.find(db, token)
    held = get_scopes_for(orm_token)
    if scope not in held and "access:services" not in held:
        db.delete(orm_token)
        db.commit()
        raise refused
    return token


def delete_token(user: Any, token: str) -> None:
    """Revoke a token made by user_service_token (nothing if it is already gone)."""
    found = orm.APIToken.find(user.db, token)
    if found is not None:
        user.db.delete(found)
        user.db.commit()


class ServiceLink:
    """The service's API as one user sees it, reduced to what a spawner needs (its server's lease
    lives through `client`, in a holder_lease.HolderLease)."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0):
        self.client = GpuAllocClient(url, token, timeout=timeout, env={})

    @property
    def url(self) -> str:
        return self.client.url

    async def close(self) -> None:
        await self.client.close()

    async def offers(self) -> list[dict]:
        return await self.client.offers()

    async def reservations(self) -> list[dict]:
        """The reservations the user is a member of (GET /reservations)."""
        return await self.client.reservations()

    async def usage_quotas(self) -> list[dict]:
        """Where the user stands against each of their usage quotas (GET /usage's `quotas`)."""
        return (await self.client.usage())["quotas"]

    async def release(self, lease_id: str, *, holder_gone: bool = False) -> dict | None:
        """End the lease; None when it had already ended or never existed. With `holder_gone` (the
        server's process has ended) its slice returns to the pool at once, also when the lease had
        already ended and its slice was waiting for the server to go."""
        try:
            return await self.client.release(lease_id, holder_gone=holder_gone)
        except NotFound:
            return None

    async def heartbeat(self, holders: list[str]) -> list[dict]:
        return await self.client.heartbeat(holders)

    async def gpu_memory_mib(self, gpu_uuid: str) -> int | None:
        """A GPU's total memory from the inventory (for memory fractions), or None if not listed."""
        for node in (await self.client.inventory())["nodes"]:
            for gpu in node["gpus"]:
                if gpu.get("uuid") == gpu_uuid:
                    return gpu.get("memory_mib")
        return None
