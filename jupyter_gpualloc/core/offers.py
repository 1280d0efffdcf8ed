"""The offers: the slice choices the admin's policy makes, each with the terms a lease on it gets.

An offer is one typed object, resolved by the core from its name or from the spec a request
gives. Its idle timeout and time limit come from the admin's configuration, never from a
request: a request may only ask for less (a shorter idle timeout, a preemptible lease), never
more and never none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .holders import JOB, SERVER, parse_holder
from .model import PriorityClass, SliceSpec, SpecError

CONFIG_KEYS = ("name", "label", "spec", "idle_timeout", "max_duration", "groups")
MAX_SECONDS = 10 ** 9  # the longest timeout or time limit anyone may give (about 31 years)


@dataclass(frozen=True)
class Offer:
    """One slice choice: its name, its label, the spec a lease on it asks for, and its terms.

    `idle_timeout` and `max_duration` are the offer's own (seconds; 0 turns the rule off for this
    offer); None leaves them to the policy's value for the holder's kind. `groups`: only their
    members may take it (empty: everyone)."""

    name: str
    label: str
    spec: SliceSpec
    idle_timeout: float | None = None
    max_duration: float | None = None
    groups: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, entry: Any, where: str = "offer") -> Offer:
        """An offer from the admin's configuration; ValueError naming the key otherwise."""
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where} must be a dict with {', '.join(CONFIG_KEYS)}")
        unknown = sorted(set(entry) - set(CONFIG_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown key {unknown[0]!r} (use {', '.join(CONFIG_KEYS)})")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.name must be a non-empty string")
        label = entry.get("label", name)
        if not isinstance(label, str):
            raise ValueError(f"{where}.label must be a string")
        try:
            spec = SliceSpec.from_json(entry.get("spec"))
        except SpecError as err:
            raise ValueError(f"{where} {name!r}: {err.field}: {err.message}") from None
        groups = entry.get("groups") or ()
        if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
            raise ValueError(f"{where} {name!r}: groups must be a list of group names")
        return cls(name, label, spec, _seconds(entry, "idle_timeout", f"{where} {name!r}"),
                   _seconds(entry, "max_duration", f"{where} {name!r}"), tuple(groups))

    def open_to(self, groups: Iterable[str]) -> bool:
        """Whether a member of `groups` may take this offer."""
        return not self.groups or not set(self.groups).isdisjoint(groups)


def _seconds(entry: Mapping, key: str, where: str) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise ValueError(f"{where}: {key} must be a number of seconds from 0 to {MAX_SECONDS}")
    return float(value)


@dataclass(frozen=True)
class Terms:
    """What a new lease gets from policy: its idle timeout (None: never idle-released) and whether it
    may be preempted."""

    idle_timeout: float | None
    preemptible: bool


class Offers:
    """The offers in force (configured, or derived from the fleet), with the policy's terms for a lease.

    One catalogue for every part of the core: the offer list a user sees, the offer usage is
    accounted to, the idle timeout and the time limit a lease gets. `replace` swaps the offers when
    the fleet changes (derived offers follow the fleet)."""

    def __init__(self, policy, offers: Sequence[Offer] = ()):
        self.policy = policy
        self.replace(offers)

    def replace(self, offers: Sequence[Offer]) -> None:
        self._offers = list(offers)
        self._by_name = {}
        for offer in self._offers:
            self._by_name.setdefault(offer.name, offer)
        self._by_spec: dict[SliceSpec, Offer | None] = {}

    def __iter__(self) -> Iterator[Offer]:
        return iter(self._offers)

    def __len__(self) -> int:
        return len(self._offers)

    def named(self, name: Any, groups: Iterable[str] = ()) -> Offer:
        """The offer called `name` that a member of `groups` may take; SpecError on `offer` otherwise."""
        offer = self._by_name.get(name) if isinstance(name, str) else None
        if offer is None:
            raise SpecError("offer", f"no offer named {name!r} (GET /offers lists them)")
        self.check_open(offer, groups)
        return offer

    def spec_of(self, request: Mapping[str, Any], groups: Iterable[str] = ()) -> SliceSpec:
        """The spec a request asks for: its offer's (`offer`, a name) or its own (`spec`)."""
        if request.get("offer") is not None:
            return self.named(request["offer"], groups).spec
        return SliceSpec.from_json(request.get("spec"))

    def of_spec(self, spec: SliceSpec) -> Offer | None:
        """The offer whose spec this request is (None for a request of its own), also when the service
        pinned it to a node (a kernel pod on its server's node): O(1) after a spec's first lease."""
        try:
            return self._by_spec[spec]
        except KeyError:
            pass
        if len(self._by_spec) >= 4096:  # requests of many odd sizes: start over
            self._by_spec.clear()
        anywhere = replace(spec, node=None)
        offer = next((o for o in self._offers if o.spec == spec), None) or \
            next((o for o in self._offers if o.spec == anywhere and o.spec.node is None), None)
        self._by_spec[spec] = offer
        return offer

    def name_of(self, spec: SliceSpec) -> str:
        """The name of the offer whose spec this is ('' for a request of its own)."""
        offer = self.of_spec(spec)
        return offer.name if offer is not None else ""

    @staticmethod
    def check_open(offer: Offer | None, groups: Iterable[str]) -> None:
        """SpecError on `offer` when the offer is only for groups the requester is not in."""
        if offer is not None and not offer.open_to(groups):
            raise SpecError("offer", f"offer {offer.name!r} is only for members of {', '.join(offer.groups)}")

    def terms(self, holder: str, spec: SliceSpec, priority: PriorityClass, *,
              idle_timeout: float | None = None, preemptible: bool | None = None) -> Terms:
        """The terms of a new lease: the policy's for its offer and holder, with what the request asked
        for where it asks for less. `idle_timeout`: a shorter idle timeout (seconds, more than 0);
        `preemptible`: True makes any lease preemptible, False is allowed only where policy lets
        requests opt out (`allow_non_preemptible`). SpecError naming the field otherwise."""
        if idle_timeout is not None and (isinstance(idle_timeout, bool) or not isinstance(idle_timeout, (int, float))
                                         or not 0 < idle_timeout <= MAX_SECONDS or math.isnan(idle_timeout)):
            raise SpecError("idle_timeout", f"must be more than 0 and at most {MAX_SECONDS} seconds: a request "
                                            "may shorten its idle timeout, never turn idle release off")
        policy_timeout = self.idle_timeout(holder, spec)
        if idle_timeout is not None and parse_holder(holder).kind != JOB:
            policy_timeout = min(policy_timeout or math.inf, float(idle_timeout))
        default = priority is PriorityClass.BATCH and self.policy.batch_preemptible
        if preemptible is False and default and not self.policy.allow_non_preemptible:
            raise SpecError("preemptible", "batch work is preemptible on this hub; a request cannot opt out")
        return Terms(policy_timeout, default if preemptible is None else preemptible)

    def idle_timeout(self, holder: str, spec: SliceSpec) -> float | None:
        """The policy's idle timeout for a lease of this holder on this spec's offer; None when idle
        release does not apply (jobs, or a timeout of 0)."""
        kind = parse_holder(holder).kind
        if kind == JOB:
            return None
        offer = self.of_spec(spec)
        if offer is not None and offer.idle_timeout is not None:
            return offer.idle_timeout or None
        base = self.policy.server_idle_timeout if kind == SERVER else self.policy.idle_timeout
        return base or None

    def max_duration(self, holder_kind: str, spec: SliceSpec | None = None, offer: Offer | None = None) -> float | None:
        """Seconds a lease of this holder kind on this offer (or spec) may last; None: no limit."""
        offer = offer if offer is not None else self.of_spec(spec) if spec is not None else None
        if offer is not None and offer.max_duration is not None:
            return offer.max_duration or None
        return float(self.policy.max_duration.get(holder_kind, 0)) or None

