"""Model and profile names as people type them, matched to a fleet's, and the scheduler answering with them."""

import pytest

from jupyter_gpualloc.core import names
from jupyter_gpualloc.core.model import SliceSpec, SpecError
from tests.core.conftest import fleet

FLEET_MODELS = ["A100-SXM4-80GB", "A100-SXM4-40GB", "A10", "H100 80GB HBM3", "H100 NVL", "L4", "L40S", "T4"]


@pytest.mark.parametrize("asked, expected", [
    ("H100", ["H100 80GB HBM3", "H100 NVL"]),
    ("h100-80gb", ["H100 80GB HBM3"]),
    ("H100 94GB", ["H100 NVL"]),
    ("H100 80GB HBM3", ["H100 80GB HBM3"]),
    ("NVIDIA H100 80GB HBM3", ["H100 80GB HBM3"]),          # NVML's name
    ("NVIDIA-H100-80GB-HBM3", ["H100 80GB HBM3"]),          # GPU Feature Discovery's product label
    ("h100 80 GB", ["H100 80GB HBM3"]),
    ("H100-SXM5-80GB", ["H100 80GB HBM3"]),                 # a catalogue alias
    ("l4", ["L4"]),                                          # not L40S
    ("L40S", ["L40S"]),
    ("A100", ["A100-SXM4-40GB", "A100-SXM4-80GB"]),
    ("a100-80gb", ["A100-SXM4-80GB"]),
    ("NVIDIA A100-SXM4-40GB", ["A100-SXM4-40GB"]),
    ("Tesla T4", ["T4"]),
    ("A10G", ["A10"]),                                       # an alias, not "A10 GB"
])
def test_names_people_know_match_the_fleet_models(asked, expected):
    assert names.models_named(asked, FLEET_MODELS) == expected


@pytest.mark.parametrize("asked", ["H200", "L", "80GB", "A1", "", "H100 96GB"])
def test_a_name_that_matches_nothing_is_refused_with_the_valid_names(asked):
    with pytest.raises(SpecError) as err:
        names.models_named(asked, FLEET_MODELS)
    assert err.value.field == "spec.model"
    assert f"no GPU model {asked!r} in this fleet" in err.value.message
    assert "valid models are A10, A100-SXM4-40GB, A100-SXM4-80GB, H100 80GB HBM3, H100 NVL, L4, L40S, T4" in err.value.message


def test_profiles_are_checked_against_the_models_considered():
    names.check_profile("1g.10gb", {"A100-SXM4-80GB": ["1g.10gb", "7g.80gb"]})
    with pytest.raises(SpecError) as err:
        names.check_profile("9g.99gb", {"A": ["7g.80gb", "1g.10gb", "2g.20gb", "1g.20gb"]}, " on A")
    assert err.value.field == "spec.profile"
    assert err.value.message == ("no MIG profile '9g.99gb' on A in this fleet: "
                                 "valid profiles are 1g.10gb, 1g.20gb, 2g.20gb, 7g.80gb")
    with pytest.raises(SpecError, match="no MIG GPU on L4 in this fleet offers profile '1g.10gb'"):
        names.check_profile("1g.10gb", {}, " on L4")


def test_the_scheduler_takes_the_same_names(harness):
    s = harness(fleet({"model": "A100-SXM4-40GB", "mig": "dynamic"}, {"model": "L4"}, {"model": "T4"})).scheduler
    models = ["A100-SXM4-40GB", "L4", "T4"]
    whole = s.submit("a", "kernel:1", SliceSpec.from_json({"kind": "whole", "model": "nvidia-l4"}), now=0)
    assert whole.slice.model == "L4"
    with pytest.raises(SpecError) as err:
        s.submit("a", "kernel:2", SliceSpec.from_json({"kind": "whole", "model": "B200"}), now=0)
    assert err.value.field == "spec.model" and ", ".join(models) in err.value.message
    with pytest.raises(SpecError) as err:
        s.submit("a", "kernel:3", SliceSpec.from_json({"kind": "mig", "profile": "9g.99gb"}), now=0)
    assert err.value.field == "spec.profile" and "valid profiles are 1g." in err.value.message
