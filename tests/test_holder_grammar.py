"""The holder grammar has one definition, core/holders.py; the panel's copy in TypeScript
(labextension/src/model/holders.ts) follows the same cases (tests/holder_grammar.json), which
vitest checks on its side. Here: the core against the cases, and the TypeScript's kinds against the core's."""

from __future__ import annotations

import json
import re
from pathlib import Path

from jupyter_gpualloc.core.holders import KINDS, parse_holder

REPO = Path(__file__).resolve().parents[1]
CASES = json.loads((REPO / "tests" / "holder_grammar.json").read_text())


def test_the_core_parses_every_case_as_written():
    for text, expected in CASES["cases"]:
        parsed = parse_holder(text)
        assert (None if parsed is None else [parsed.kind, parsed.name]) == expected, text


def test_the_panel_and_the_cases_know_the_core_s_kinds():
    source = (REPO / "labextension" / "src" / "model" / "holders.ts").read_text()
    kinds = re.search(r"HOLDER_KINDS = \[([^\]]*)\]", source).group(1)
    assert re.findall(r"'([a-z]+)'", kinds) == list(KINDS) == CASES["kinds"]
