"""SliceSpec.from_json keeps the specs it parsed: the same answers, whatever was asked before."""

from __future__ import annotations

import pytest

from jupyter_gpualloc.core.model import SliceKind, SliceSpec, SpecError


def test_the_same_spec_object_gives_the_same_spec_equal_to_one_built_directly():
    first = SliceSpec.from_json({"kind": "mig", "profile": "1g.10gb"})
    again = SliceSpec.from_json({"kind": "mig", "profile": "1g.10gb"})
    built = SliceSpec(kind=SliceKind.MIG, profile="1g.10gb")
    assert again is first
    assert first == built and hash(first) == hash(built)
    assert {built: "found"}[first] == "found"


def test_a_value_of_another_type_is_judged_on_its_own_even_after_an_equal_one_was_kept():
    assert SliceSpec.from_json({"count": 1}).count == 1
    with pytest.raises(SpecError) as refused:
        SliceSpec.from_json({"count": True})  # True == 1 and hashes alike, but is no count
    assert refused.value.field == "spec.count"
    assert SliceSpec.from_json({"kind": "shared", "memory_gib": 4}).memory_mib == 4096
    assert SliceSpec.from_json({"kind": "shared", "memory_gib": 4.0}).memory_mib == 4096


def test_a_value_no_dict_can_key_is_refused_naming_its_field():
    with pytest.raises(SpecError) as refused:
        SliceSpec.from_json({"kind": "whole", "model": ["A100"]})
    assert refused.value.field == "spec.model"


def test_each_caller_gets_a_spec_json_of_its_own():
    spec = SliceSpec.from_json({"kind": "shared", "memory_gib": 8, "model": "H100"})
    mine = spec.to_json()
    mine["memory_gib"] = 1
    assert spec.to_json() == {"kind": "shared", "count": 1, "memory_gib": 8.0, "model": "H100"}
