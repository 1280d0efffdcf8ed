"""The spawn form's GPU choices, and the one check of what a user chose.

The GPU choice is one field, `gpu`, beside whatever the spawner's own form offers (e.g.
KubeSpawner's `profile`): `render_form` lists the service's offers (with how many are free now,
how long a time-boxed one lasts, and those the user's quota can never allow, or a used-up usage
quota refuses now, greyed out) as radio buttons, under where the user stands against their usage
quotas; `gpu_from_form` reads
the submitted field; `chosen_name` and `choose_offer` check `user_options["gpu"]` however it
arrived (form or REST API). Nothing here talks to JupyterHub or the service.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape
from typing import Any, Iterable, Mapping

OPTION = "gpu"
NO_GPU = "none"


class OptionsError(ValueError):
    """A GPU choice that names no offer, or is malformed; the message is for the user."""


def no_gpu_offer(label: str = "No GPU") -> dict[str, Any]:
    """The choice of a server without a GPU slice."""
    return {"name": NO_GPU, "label": label, "spec": None, "available": None}


def hours_text(seconds: float) -> str:
    """14400 -> '4 h', 5400 -> '1 h 30 min', 600 -> '10 min'."""
    hours, minutes = divmod(int(round(seconds / 60)), 60)
    return " ".join(part for part in (f"{hours} h" if hours else "", f"{minutes} min" if minutes else "")
                    if part) or f"{seconds:g} s"


def clock_text(at: float, now: float) -> str:
    """A moment for people: '14:00 UTC' on now's UTC day, else 'Fri 02:00 UTC' (or the date, further off)."""
    moment, today = datetime.fromtimestamp(at, timezone.utc), datetime.fromtimestamp(now, timezone.utc)
    if moment.date() == today.date():
        return moment.strftime("%H:%M UTC")
    return moment.strftime("%a %H:%M UTC" if abs(at - now) < 6 * 86400 else "%Y-%m-%d %H:%M UTC")


def time_box(offer: Mapping[str, Any]) -> str:
    """'up to 4 h, extendable 2x', 'up to 4 h, not extendable', or '' for an offer without a time limit."""
    limit = offer.get("max_duration")
    if not limit:
        return ""
    extensions = offer.get("max_extensions") or 0
    return f"up to {hours_text(limit)}, " + (f"extendable {extensions}x" if extensions else "not extendable")


def refusal(offer: Mapping[str, Any]) -> str:
    """Why the user cannot choose this offer now ('' when they can)."""
    if offer.get("over_quota"):
        return f"over your quota: {offer['over_quota']}"
    if offer.get("over_usage_quota"):
        return f"usage quota used up: {offer['over_usage_quota']}"
    return ""


def availability(offer: Mapping[str, Any]) -> str:
    """'3 free now', 'none free now: you will wait in the queue', 'your quota is full now: ...',
    or '' (no count: No GPU)."""
    free = offer.get("available")
    if free is None:
        return ""
    if offer.get("quota_full"):
        return f"your quota is full now: {offer['quota_full']}"
    if free <= 0:
        return "none free now: you will wait in the queue"
    return f"{free} free now"


def offer_note(offer: Mapping[str, Any]) -> str:
    """What the form says after an offer's label: why it is refused, else what is free and its time limit."""
    return refusal(offer) or "; ".join(part for part in (availability(offer), time_box(offer)) if part)


def render_form(offers: Iterable[Mapping[str, Any]], selected: str | None = None, *,
                message: str = "", standing: Iterable[str] = (), reservations: Iterable[str] = ()) -> str:
    """The HTML snippet JupyterHub puts inside its spawn form: one radio button per offer.

    Offers the user's quota can never allow, or a used-up usage quota refuses now, are shown
    disabled with the reason; `standing` (one sentence per usage quota) and `reservations` (one
    line per reservation of the user: 'ml101 reservation: 22 of 30 free until 12:00 UTC') above them.
    """
    offers = list(offers)
    choosable = [o["name"] for o in offers if not refusal(o)]
    if selected not in choosable:
        selected = choosable[0] if choosable else None
    rows = []
    for i, offer in enumerate(offers):
        ident = f"gpualloc-offer-{i}"
        checked = " checked" if offer["name"] == selected else ""
        disabled = " disabled" if refusal(offer) else ""
        note = offer_note(offer)
        note_html = f' <small class="text-muted">({escape(note)})</small>' if note else ""
        rows.append(
            f'<div class="form-check">'
            f'<input class="form-check-input" type="radio" name="{OPTION}" id="{ident}" '
            f'value="{escape(offer["name"], quote=True)}"{checked}{disabled}>'
            f'<label class="form-check-label{" text-muted" if disabled else ""}" for="{ident}">'
            f'{escape(offer["label"])}{note_html}</label>'
            f'</div>')
    intro = f'<p class="text-muted">{escape(message)}</p>' if message else ""
    usage = "".join(f'<p class="gpualloc-usage small">GPU usage: {escape(line)}</p>' for line in standing)
    usage += "".join(f'<p class="gpualloc-reservation small">{escape(line)}</p>' for line in reservations)
    return (f'<fieldset class="gpualloc-offers mb-3"><legend>GPU for this server</legend>{intro}{usage}'
            + "".join(rows) + "</fieldset>")


def gpu_from_form(values: list[str]) -> str:
    """The submitted values of the `gpu` field (a list of strings) -> the offer name."""
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].strip():
        raise OptionsError("choose exactly one GPU option")
    return values[0].strip()


def chosen_name(user_options: Any, default: str = NO_GPU) -> str:
    """The offer name `user_options` choose (`{"gpu": name}`; absent means `default`).

    Other keys belong to the spawner class (e.g. KubeSpawner's `profile`) and are not looked at.
    """
    if user_options is None:
        return default
    if not isinstance(user_options, Mapping):
        raise OptionsError('user_options must be an object like {"%s": "<offer name>"}' % OPTION)
    chosen = user_options.get(OPTION, default)
    if not isinstance(chosen, str) or not chosen:
        raise OptionsError(f"option {OPTION!r} must be the name of a GPU offer, e.g. {NO_GPU!r}")
    return chosen


def choose_offer(name: str, offers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The offer called `name`; OptionsError lists the valid names when there is none."""
    offers = {o["name"]: dict(o) for o in offers}
    if name not in offers:
        raise OptionsError(f"no GPU offer named {name!r} for you: choose one of {', '.join(offers)}")
    return offers[name]
