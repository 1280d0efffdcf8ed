"""The spawn form's GPU choices, and the one strict check of what a user chose.

`render_form` lists the service's offers (with how many are free now) as radio buttons;
`options_from_form` turns the submitted form into `user_options` (`{"gpu": "<offer name>"}`);
`choose_offer` validates `user_options` however they arrived (form or REST API) against the
offers and returns the chosen one. Nothing here talks to JupyterHub or the service.
"""

from __future__ import annotations

from html import escape
from typing import Any, Iterable, Mapping

OPTION = "gpu"
NO_GPU = "none"


class OptionsError(ValueError):
    """user_options that name no offer, or are malformed; the message is for the user."""


def no_gpu_offer(label: str = "No GPU") -> dict[str, Any]:
    """The choice of a server without a GPU slice."""
    return {"name": NO_GPU, "label": label, "spec": None, "idle_timeout": None, "available": None}


def availability(offer: Mapping[str, Any]) -> str:
    """'3 free now', 'none free now: you will wait in the queue', or '' for no GPU."""
    free = offer.get("available")
    if free is None:
        return ""
    if free <= 0:
        return "none free now: you will wait in the queue"
    return f"{free} free now"


def render_form(offers: Iterable[Mapping[str, Any]], selected: str | None = None, *,
                message: str = "") -> str:
    """The HTML snippet JupyterHub puts inside its spawn form: one radio button per offer."""
    offers = list(offers)
    names = [o["name"] for o in offers]
    if selected not in names:
        selected = names[0] if names else None
    rows = []
    for i, offer in enumerate(offers):
        ident = f"gpualloc-offer-{i}"
        checked = " checked" if offer["name"] == selected else ""
        note = availability(offer)
        note_html = f' <small class="text-muted">({escape(note)})</small>' if note else ""
        rows.append(
            f'<div class="form-check">'
            f'<input class="form-check-input" type="radio" name="{OPTION}" id="{ident}" '
            f'value="{escape(offer["name"], quote=True)}"{checked}>'
            f'<label class="form-check-label" for="{ident}">{escape(offer["label"])}{note_html}</label>'
            f'</div>')
    intro = f'<p class="text-muted">{escape(message)}</p>' if message else ""
    return (f'<fieldset class="gpualloc-offers mb-3"><legend>GPU for this server</legend>{intro}'
            + "".join(rows) + "</fieldset>")


def options_from_form(formdata: Mapping[str, list[str]]) -> dict[str, str]:
    """Submitted form data (a dict of lists of strings) -> `{"gpu": name}`, strictly."""
    for key in formdata:
        if key not in (OPTION, "_xsrf"):  # JupyterHub's own XSRF field may come in the body
            raise OptionsError(f"unexpected form field {key!r}")
    values = formdata.get(OPTION, [])
    if len(values) != 1 or not isinstance(values[0], str) or not values[0].strip():
        raise OptionsError("choose exactly one GPU option")
    return {OPTION: values[0].strip()}


def choose_offer(user_options: Any, offers: Iterable[Mapping[str, Any]], *, default: str = NO_GPU,
                 key: str = OPTION, extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The offer `user_options` names (`{key: name}`; empty options mean `default`).

    Strict: user_options must be an object whose only key is `key` (or starts with one of
    `extra_keys`), and the name must be one of `offers`; otherwise OptionsError says what is wrong.
    """
    offers = {o["name"]: dict(o) for o in offers}
    if user_options is None:
        user_options = {}
    if not isinstance(user_options, Mapping):
        raise OptionsError("user_options must be an object like {\"%s\": \"<offer name>\"}" % key)
    for name in user_options:
        if name != key and not any(name.startswith(p) for p in extra_keys):
            raise OptionsError(f"unknown option {name!r}: the only option is {key!r}, one of "
                               f"{', '.join(offers)}")
    chosen = user_options.get(key, default)
    if not isinstance(chosen, str) or not chosen:
        raise OptionsError(f"option {key!r} must be the name of an offer: one of {', '.join(offers)}")
    if chosen not in offers:
        raise OptionsError(f"no GPU offer named {chosen!r} for you: choose one of {', '.join(offers)}")
    return offers[chosen]
