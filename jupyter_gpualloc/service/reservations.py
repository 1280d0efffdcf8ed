"""REST API v1 for reservations: thin handlers over the core's `Reservations`.

Admins (the admin scope in hub mode, `"admin": True` tokens standalone) create and delete them
and see every one; a user sees the reservations they are a member of (by name or group), and
another one is answered as if it did not exist (404). A reservation the fleet cannot hold is
refused with 409 naming the field and how many fit.
"""

from __future__ import annotations

from typing import Any

from ..core.reservations import Reservation, ReservationConflict, Reservations, parse_request
from .handlers import ApiError, ApiHandler


class ReservationApiHandler(ApiHandler):
    """Base of the reservation handlers: members see theirs, conflicts are 409 with `field` and `fits`."""

    @property
    def reservations(self) -> Reservations:
        return self.scheduler.reservations

    def visible(self, name: str) -> Reservation:
        found = next((r for r in self.reservations.all() if r.name == name), None)
        if found is None or not (self.identity.admin or found.member(self.identity.user, self.identity.groups)):
            raise ApiError(404, f"no reservation {name}")
        return found

    def view(self, r: Reservation) -> dict[str, Any]:
        """The reservation as the core shows it; a member who is no admin reads 'other' for another
        member's name, a group of theirs they are not in, and another user's lease, as in the inventory."""
        data = self.reservations.view(r, self.ctx.clock())
        if not self.identity.admin:
            me, groups = self.identity.user, self.identity.groups
            mine = {lease.id for lease in self.scheduler.leases(me)}
            data["users"] = [u if u == me else "other" for u in data["users"]]
            data["groups"] = [g if g in groups else "other" for g in data["groups"]]
            data["leases"] = [i if i in mine else "other" for i in data["leases"]]
        return data

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, ReservationConflict):
            kwargs["exc_info"] = (ApiError, ApiError(409, str(exc), field=exc.field, fits=exc.fits), None)
        super().write_error(status_code, **kwargs)

    def log_exception(self, typ, value, tb) -> None:
        if isinstance(value, ReservationConflict):
            self.log_request_error(ApiError(409, str(value)))
        else:
            super().log_exception(typ, value, tb)


class ReservationsHandler(ReservationApiHandler):
    def get(self) -> None:
        who = {} if self.identity.admin else {"user": self.identity.user, "groups": self.identity.groups}
        self.write_json({"reservations": [self.view(r) for r in self.reservations.all(**who)]})

    def post(self) -> None:
        self.require_admin()
        now = self.ctx.clock()
        reservation = parse_request(self.json_body(), self.identity.user, now)
        warnings = self.reservations.create(reservation, now)
        self.set_header("Location", self.reverse_url("reservation", reservation.name))
        self.write_json({**self.view(reservation), "warnings": warnings}, 201)


class ReservationHandler(ReservationApiHandler):
    def get(self, name: str) -> None:
        self.write_json(self.view(self.visible(name)))

    def delete(self, name: str) -> None:
        self.require_admin()
        reservation = self.reservations.delete(self.visible(name).name, self.ctx.clock())
        self.write_json(self.view(reservation))


RESERVATION_ROUTES = [
    ("/reservations", ReservationsHandler, "reservations"),
    ("/reservations/{name}", ReservationHandler, "reservation"),
]
