"""The names people give GPU models and MIG profiles, matched to what a fleet has.

A model may be asked for by its family (`H100`), by a shorter form (`h100-80gb`), by NVML's name
(`NVIDIA H100 80GB HBM3`), by GPU Feature Discovery's product label (`NVIDIA-H100-80GB-HBM3`) or by
a catalogue alias (`A100-80GB`), in any case. A name that matches nothing is an error that lists
the names that would work, so the REST API, the spawner and the magics all answer alike.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterable, Mapping

from . import mig
from .model import SpecError

_VENDOR_WORDS = ("nvidia", "tesla")


@lru_cache(maxsize=1024)
def name_words(name: str) -> tuple[str, ...]:
    """A model name as comparable words: 'NVIDIA H100 80 GB HBM3' -> ('h100', '80gb', 'hbm3')."""
    text = re.sub(r"\b(\d+)\s*(?:gib|gb|g)\b", r"\1gb", name.strip().lower())
    words = [w for w in re.split(r"[\s_\-/]+", text) if w]
    while words and words[0] in _VENDOR_WORDS:
        words.pop(0)
    return tuple(words)


def spellings(model: str) -> list[str]:
    """A fleet model's name and the catalogue's other names for it."""
    known = mig.lookup_model(model)
    return [model] if known is None else [model, known.name, *known.aliases]


def names_model(asked: str, model: str) -> bool:
    """Whether `asked` names `model`: the same family word first, and every other word in one of its names."""
    wanted = name_words(asked)
    if not wanted:
        return False
    for spelling in spellings(model):
        words = name_words(spelling)
        if words and words[0] == wanted[0] and set(wanted) <= set(words):
            return True
    return False


def models_named(asked: str, models: Iterable[str]) -> list[str]:
    """The fleet's models that `asked` names; SpecError on spec.model listing the valid names if none."""
    models = sorted(set(models))
    found = [m for m in models if names_model(asked, m)]
    if not found:
        valid = ", ".join(models) if models else "none"
        raise SpecError("spec.model", f"no GPU model {asked!r} in this fleet: valid models are {valid}")
    return found


def check_profile(asked: str, profiles: Mapping[str, Iterable[str]], where: str = "") -> None:
    """SpecError on spec.profile, listing the valid profiles, unless one of the models offers `asked`.

    `profiles` maps each candidate MIG model to its profile names; `where` says which models
    were considered (e.g. ' on H100 80GB HBM3').
    """
    offered = {name for names in profiles.values() for name in names}
    if asked in offered:
        return
    if not offered:
        raise SpecError("spec.profile", f"no MIG GPU{where} in this fleet offers profile {asked!r}")
    valid = ", ".join(sorted(offered, key=profile_order))
    raise SpecError("spec.profile", f"no MIG profile {asked!r}{where} in this fleet: valid profiles are {valid}")


def profile_order(name: str) -> tuple[int, int, str]:
    """'1g.10gb' before '2g.10gb' before '7g.80gb': by compute slices, then memory, then name."""
    found = re.match(r"(\d+)g\.(\d+)gb", name)
    return (int(found.group(1)), int(found.group(2)), name) if found else (0, 0, name)
