"""Fleet files: parsing, layouts, deterministic UUIDs and errors that name their path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpualloc.core import mig
from jupyter_gpualloc.core.fleet import FleetError, gpu_uuid, load_fleet
from jupyter_gpualloc.core.model import MigMode

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "fleets"


def one_node(*gpus, **node):
    return {"nodes": [{"name": "n", "cpu_milli": 8000, "memory_mib": 32768, "gpus": list(gpus), **node}]}


def test_demo_fleet():
    [node] = load_fleet(EXAMPLES / "demo.yaml")
    assert (node.name, node.cpu_milli, node.memory_mib) == ("local", 32000, 131072)
    assert [(g.index, g.model, g.mig_mode) for g in node.gpus] == [
        (0, "A100-SXM4-80GB", MigMode.DYNAMIC), (1, "A100-SXM4-80GB", MigMode.DYNAMIC),
        (2, "H100 80GB HBM3", MigMode.OFF), (3, "L4", MigMode.OFF)]
    assert node.gpus[2].mig_capable and not node.gpus[3].mig_capable
    assert node.gpus[0].memory_mib == 81920


@pytest.mark.parametrize("name", ["demo.yaml", "static-mig.yaml", "multi-node.yaml"])
def test_every_example_loads_with_legal_layouts(name):
    for node in load_fleet(EXAMPLES / name):
        for gpu in node.gpus:
            if gpu.instances:
                assert mig.is_legal(gpu.instances, mig.lookup_model(gpu.model).profiles)


def test_layout_by_name_takes_the_lowest_legal_start_in_order():
    [node] = load_fleet(one_node({"model": "A100-SXM4-40GB", "mig": "static",
                                  "layout": ["2g.10gb", "1g.5gb", {"profile": "3g.20gb", "start": 4}, "1g.5gb"]}))
    gpu = node.gpus[0]
    assert [(i.profile_id, i.start, i.size, i.gi_id, i.ci_id) for i in gpu.instances] == [
        (14, 0, 2, 1, 0), (19, 2, 1, 2, 0), (9, 4, 4, 3, 0), (19, 3, 1, 4, 0)]
    assert len({i.uuid for i in gpu.instances}) == 4
    [node] = load_fleet(one_node({"model": "A100-SXM4-40GB", "mig": "static",
                                  "layout": ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]}))
    # first fit would put 3g at 0 and strand the last 1g; the legal layout is found instead
    assert [(i.profile_id, i.start) for i in node.gpus[0].instances] == [(9, 4), (14, 0), (19, 2), (19, 3)]
    assert all(i.uuid.startswith("MIG-") for i in gpu.instances)


def test_json_file_and_yaml_off(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(one_node({"model": "T4", "count": 3})))
    [node] = load_fleet(path)
    assert [g.index for g in node.gpus] == [0, 1, 2] and node.gpus[0].model == "T4"
    yaml_path = tmp_path / "fleet.yaml"
    yaml_path.write_text("nodes:\n- {name: a, cpu_milli: 1000, memory_mib: 1024, gpus: [{model: L4, mig: off}]}\n")
    assert load_fleet(yaml_path)[0].gpus[0].mig_mode is MigMode.OFF


def test_unknown_model_needs_memory():
    with pytest.raises(FleetError, match=r"^nodes\[0\]\.gpus\[1\]\.model: unknown GPU model 'X': give memory_mib$"):
        load_fleet(one_node({"model": "L4"}, {"model": "X"}))
    [node] = load_fleet(one_node({"model": "X", "memory_mib": 12000}))
    assert (node.gpus[0].model, node.gpus[0].memory_mib, node.gpus[0].mig_capable) == ("X", 12000, False)


@pytest.mark.parametrize("gpu, message", [
    ({"model": "L4", "mig": "dynamic"}, r"gpus\[0\]\.mig: L4 is not MIG-capable"),
    ({"model": "A100-SXM4-40GB", "mig": "sometimes"}, r"gpus\[0\]\.mig: must be one of off, static, dynamic"),
    ({"model": "A100-SXM4-40GB", "layout": ["1g.5gb"]}, r"gpus\[0\]\.layout: a layout needs mig"),
    ({"model": "A100-SXM4-40GB", "mig": "static", "layout": ["1g.10gb+me"]},
     r"gpus\[0\]\.layout\[0\]: unknown MIG profile '1g.10gb\+me'"),
    ({"model": "A100-SXM4-40GB", "mig": "static", "layout": [{"profile": "3g.20gb", "start": 2}]},
     r"gpus\[0\]\.layout\[0\]: 3g.20gb cannot start at 2 here; legal starts: \[0, 4\]"),
    ({"model": "A100-SXM4-40GB", "mig": "static", "layout": ["4g.20gb", "4g.20gb"]},
     r"gpus\[0\]\.layout\[1\]: 4g.20gb does not fit"),
    ({"model": "A100-SXM4-40GB", "mig": "static", "layout": ["3g.20gb", "3g.20gb", "1g.5gb+me"]},
     r"gpus\[0\]\.layout\[2\]: 1g.5gb\+me does not fit"),
    ({"model": "L4", "count": 0}, r"gpus\[0\]\.count: must be a positive integer"),
    ({"model": "L4", "colour": "green"}, r"gpus\[0\]\.colour: unknown field"),
    ({"model": "L4", "utilization": 120}, r"gpus\[0\]\.utilization: must be a percentage from 0 to 100"),
    ({"model": "L4", "utilization": []}, r"gpus\[0\]\.utilization: must be a percentage or a non-empty list"),
    ({"model": "L4", "utilization": [[60, 90], [0, 0]]}, r"gpus\[0\]\.utilization\[1\]\[0\]: seconds must be"),
    ({"model": "L4", "utilization": [[60, "busy"]]}, r"gpus\[0\]\.utilization\[0\]\[1\]: must be a percentage"),
    ({"model": "L4", "utilization": [60]}, r"gpus\[0\]\.utilization\[0\]: must be \[seconds, percent\]"),
])
def test_gpu_entry_errors_name_their_path(gpu, message):
    with pytest.raises(FleetError, match=r"^nodes\[0\]\." + message):
        load_fleet(one_node(gpu))


def test_utilization_patterns_by_gpu_uuid():
    found = {}
    [node] = load_fleet(one_node({"model": "L4", "count": 2, "utilization": [[600, 90], [1800, 0]]},
                                 {"model": "T4"}, {"model": "A10", "utilization": 35}), found)
    l4a, l4b, t4, a10 = (g.uuid for g in node.gpus)
    assert set(found) == {l4a, l4b, a10}
    pattern = found[l4a]
    assert [pattern.at(t) for t in (0, 599, 600, 2399, 2400, 2400 + 599)] == [90, 90, 0, 0, 90, 90]
    assert found[a10].at(12345.6) == 35
    assert load_fleet(one_node({"model": "L4", "utilization": 50}))  # without a dict to fill: accepted


def test_node_errors():
    with pytest.raises(FleetError, match=r"^nodes: must be a non-empty list"):
        load_fleet({"nodes": []})
    with pytest.raises(FleetError, match=r"^nodes\[0\]\.cpu_milli: must be a positive integer"):
        load_fleet(one_node(cpu_milli="lots"))
    with pytest.raises(FleetError, match=r"^nodes\[1\]\.name: duplicate node name 'n'"):
        load_fleet({"nodes": one_node()["nodes"] * 2})
    with pytest.raises(FleetError, match=r"^fleet\.gpus: unknown field"):
        load_fleet({"nodes": one_node()["nodes"], "gpus": []})


def test_file_errors_name_the_file(tmp_path):
    with pytest.raises(FleetError, match="missing.yaml: cannot read fleet file"):
        load_fleet(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(FleetError, match="bad.yaml: not valid YAML"):
        load_fleet(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("nodes:\n- {name: a, cpu_milli: 1, memory_mib: 1, gpus: [{model: Q}]}\n")
    with pytest.raises(FleetError, match=r"wrong.yaml: nodes\[0\]\.gpus\[0\]\.model: unknown GPU model 'Q'"):
        load_fleet(wrong)


def test_uuids_are_deterministic_and_well_formed():
    a, b = load_fleet(one_node({"model": "L4", "count": 2})), load_fleet(one_node({"model": "L4", "count": 2}))
    assert [g.uuid for g in a[0].gpus] == [g.uuid for g in b[0].gpus]
    assert a[0].gpus[0].uuid != a[0].gpus[1].uuid
    assert a[0].gpus[1].uuid == gpu_uuid("n", 1) != gpu_uuid("m", 1)


def test_an_a30_layout_is_placed_on_its_four_memory_slices():
    [node] = load_fleet(one_node({"model": "NVIDIA A30", "mig": "static", "layout": ["1g.6gb", "2g.12gb", "1g.6gb"]}))
    [gpu] = node.gpus
    profiles = mig.lookup_model("A30").profiles
    assert [(profiles[i.profile_id].name, i.start) for i in gpu.instances] == [
        ("1g.6gb", 0), ("2g.12gb", 2), ("1g.6gb", 1)]
    assert mig.is_legal(gpu.instances, profiles)
    with pytest.raises(FleetError, match=r"gpus\[0\]\.layout\[2\]: 2g\.12gb does not fit"):
        load_fleet(one_node({"model": "A30", "mig": "static", "layout": ["2g.12gb"] * 3}))


def test_a_shipped_example_fleet_is_named_example_colon_name():
    """An installed package runs on simulated GPUs without a checkout: `example:demo` is the README's fleet."""
    from jupyter_gpualloc.core.fleet import example_fleets, fleet_path, load_fleet

    assert {"demo", "multi-node", "static-mig"} <= set(example_fleets())
    nodes = load_fleet("example:demo")
    assert sorted(g.model for n in nodes for g in n.gpus)[:2] == ["A100-SXM4-80GB", "A100-SXM4-80GB"]
    assert fleet_path("fleets/demo.yaml").as_posix() == "fleets/demo.yaml"  # a path stays a path
    with pytest.raises(FleetError, match=r"example:nope: no such example fleet \(there are: example:"):
        load_fleet("example:nope")
