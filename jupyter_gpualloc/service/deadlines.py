"""POST /leases/<id>/extend: move a time-boxed lease's deadline later."""

from __future__ import annotations

from ..core.deadlines import ExtensionRefused
from .handlers import ApiError, ApiHandler


class ExtendHandler(ApiHandler):
    def post(self, lease_id: str) -> None:
        lease = self.visible_lease(lease_id)
        try:
            with self.ctx.metrics.timed("extend"):
                lease = self.scheduler.extend(lease.id, now=self.ctx.clock())
        except ExtensionRefused as err:
            raise ApiError(409, str(err), reason=str(err)) from None
        self.write_json(self.lease_json(lease))
