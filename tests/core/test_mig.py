"""MIG catalogue, placement geometry (the consequences listed in reference/MIG.md) and placers."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_gpualloc.core.mig import (
    MIG_PLACER_NAMES, DefaultPlacer, FirstFitPlacer, Layout, MigGeometry, catalogue_differences,
    get_mig_placer, is_legal, known_models, legal_starts, lookup_model, resolve_model,
    _LayoutGraph, _layout_graph, room_for, same_model)
from jupyter_gpualloc.core.model import MigInstance

A100 = lookup_model("A100-SXM4-40GB")
P = A100.profiles
G1, G1ME, G1DOUBLE, G2, G3, G4, G7 = (P[i] for i in (19, 20, 15, 14, 9, 5, 0))
MIG_MODELS = [m for m in known_models() if m.mig_capable]
EMPTY = Layout(A100.geometry)
A30 = lookup_model("A30")


def reachable(profiles):
    """Every layout one GPU can reach from empty."""
    seen = {Layout(MigGeometry.of(profiles))}
    frontier = list(seen)
    while frontier:
        layout = frontier.pop()
        for p in profiles.values():
            for s in legal_starts(layout, p):
                nxt = layout.with_instance(p, s)
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
    return seen


def layout_of(*placements):
    layout = EMPTY
    for profile, start in placements:
        assert start in legal_starts(layout, profile)
        layout = layout.with_instance(profile, start)
    return layout


def inst(profile, start, n=0):
    return MigInstance(f"MIG-{n}", profile.profile_id, start, profile.memory_slices)


# --- consequences in MIG.md -------------------------------------------------------------------

def test_compute_never_above_seven_and_one_slice_profiles_never_use_memory_slice_7():
    layouts = reachable(P)
    assert max(layout.compute_used for layout in layouts) == 7
    for layout in layouts:
        for p in P.values():
            for s in legal_starts(layout, p):
                assert s + p.memory_slices <= 8
                if p.memory_slices == 1:
                    assert s != 7
    for model in MIG_MODELS:
        for p in model.profiles.values():
            if p.memory_slices == 1 and model.geometry.memory_slices == 8:
                assert 7 not in p.starts


def test_3g_and_4g_fit_only_as_4g_at_0_and_3g_at_4():
    both = [(s3, s4) for s3 in G3.starts for s4 in G4.starts
            if is_legal([inst(G3, s3, 1), inst(G4, s4, 2)], P)]
    assert both == [(4, 0)]
    # first-fit puts the 3g at 0, and then the 4g no longer fits
    ff = FirstFitPlacer()
    layout = EMPTY
    _, s = ff.choose([layout], G3, P)
    assert s == 0
    assert ff.choose([layout.with_instance(G3, s)], G4, P) is None


@pytest.mark.parametrize("order", [(G3, G4), (G4, G3)], ids=["3g-first", "4g-first"])
def test_default_placer_fits_3g_and_4g_in_either_order(order):
    placer = get_mig_placer("default")
    layouts = [EMPTY]
    instances = []
    for n, profile in enumerate(order):
        _, start = placer.choose(layouts, profile, P)
        layouts[0] = layouts[0].with_instance(profile, start)
        instances.append(inst(profile, start, n))
    assert {(i.profile_id, i.start) for i in instances} == {(G3.profile_id, 4), (G4.profile_id, 0)}
    assert is_legal(instances, P)


def test_three_1g_at_starts_1_3_5_block_every_2_slice_profile():
    layout = layout_of((G1, 1), (G1, 3), (G1, 5))
    assert layout.free_compute_slices == 4  # the room is there, the geometry forbids it
    assert legal_starts(layout, G2) == []
    # 1g.10gb keeps only its extra start 6 (slices 6-7), which 2g.10gb does not have
    assert legal_starts(layout, G1DOUBLE) == [6]
    assert legal_starts(layout_of((G1, 1), (G1, 3), (G1, 5), (G1, 6)), G1DOUBLE) == []


def expected_compute(layout, table, shares, discount, memo):
    """The placer's value of a layout, by its definition: the compute slices a lone GPU expects
    from the requests to come, the n-th discounted by discount**n, each fitting request placed
    where it keeps the most value (a request that fits nowhere leaves the layout as it is)."""
    if layout in memo:
        return memo[layout]
    placed, stays = 0.0, 0.0
    for profile, share in zip(table, shares):
        starts = legal_starts(layout, profile)
        if not starts:
            stays += share
            continue
        best = max(expected_compute(layout.with_instance(profile, s), table, shares, discount, memo)
                   for s in starts)
        placed += share * (profile.compute_slices + discount * best)
    # v = placed + discount * stays * v, solved for v
    memo[layout] = value = placed / (1 - discount * stays)
    return value


def value_of(graph, values, layout):
    """A layout's value among `graph.values(...)`, which are per class of layouts."""
    return values[graph.classes[graph.index[layout]]]


@pytest.mark.parametrize("model", [A100, A30], ids=lambda m: m.name)
def test_default_placer_values_every_layout_exactly_by_its_definition(model):
    """Values are worked out per class of layouts and by compiled arithmetic, yet every layout's
    is the very float its definition gives (terms added in profile order), under the placer's
    own mix and under lopsided ones."""
    placer = DefaultPlacer()
    smallest = min(model.profiles.values(), key=lambda p: (p.memory_slices, p.media_extensions))
    empty = Layout(model.geometry)
    placer.choose([empty], smallest, model.profiles)  # learns one 1g-class instance
    table = tuple(p for _, p in sorted(model.profiles.items()))
    graph = _layout_graph(table, (empty,))
    assert set(graph.layouts) == reachable(model.profiles)
    assert len(graph.values(placer._shares(table), placer.discount)) < len(graph.layouts) / 5
    rng = random.Random(7)
    for shares in [placer._shares(table), *([c / sum(counts) for c in counts] for counts in
                                              ([rng.randint(0, 900) for _ in table] for _ in range(3)))]:
        values = graph.values(shares, placer.discount)
        memo = {}
        for layout in graph.layouts:
            assert value_of(graph, values, layout) == expected_compute(layout, table, shares, placer.discount, memo)
    full = [layout for layout in graph.layouts if not any(legal_starts(layout, p) for p in table)]
    assert full and all(value_of(graph, values, layout) == 0 for layout in full)


def test_default_placer_takes_the_candidate_that_loses_least_value():
    placer = DefaultPlacer()
    table = tuple(p for _, p in sorted(P.items()))
    graph = _layout_graph(table, (EMPTY,))
    values = graph.values(placer._shares(table), placer.discount)
    layouts = [layout_of((G1, 1)), layout_of((G4, 0)), EMPTY]
    g, start = placer.choose(layouts, G2, P)
    chosen = value_of(graph, values, layouts[g].with_instance(G2, start)) - value_of(graph, values, layouts[g])
    for i, layout in enumerate(layouts):
        for s in legal_starts(layout, G2):
            other = value_of(graph, values, layout.with_instance(G2, s)) - value_of(graph, values, layout)
            assert chosen >= other - 1e-9


def count_value_passes(monkeypatch) -> list:
    """A list that gets one entry per `_LayoutGraph.values` pass from now on."""
    passes = []
    values = _LayoutGraph.values

    def counted(graph, shares, discount):
        passes.append(shares)
        return values(graph, shares, discount)
    monkeypatch.setattr(_LayoutGraph, "values", counted)
    return passes


def test_default_placer_works_out_fresh_values_for_each_of_its_first_placements(monkeypatch):
    """Each of a placer's first hundred or so placements moves the expected mix by more than
    `mix_tolerance`, so each is chosen on fresh values: arrival streams as short as the packing
    benchmark's (at most 56 instances on 8 GPUs) are placed as if values were never kept."""
    passes = count_value_passes(monkeypatch)
    placer, rng = DefaultPlacer(), random.Random(16)
    profiles = [p for p in P.values() if not p.media_extensions]
    layouts, placed = [EMPTY] * 8, 0
    while placed < 80:
        profile = rng.choice(profiles)
        choice = placer.choose(layouts, profile, P)
        if choice is None:  # full for this profile: a fresh fleet, the same placer
            layouts = [EMPTY] * 8
            continue
        g, start = choice
        layouts[g] = layouts[g].with_instance(profile, start)
        placed += 1
    assert len(passes) == placed


def test_default_placer_keeps_its_values_while_the_mix_holds_and_reworks_them_when_it_moves(monkeypatch):
    """Kept values change only near-ties: each choice loses at most a hundredth of a compute
    slice of expected value more than the best choice on fresh values would."""
    placer = DefaultPlacer()
    table = tuple(p for _, p in sorted(P.items()))
    graph, fresh_values = _layout_graph(table, (EMPTY,)), _LayoutGraph.values
    layouts = [layout_of((G1, 1)), layout_of((G4, 0)), layout_of((G2, 0), (G1, 4)), EMPTY]
    regrets = []

    def place(profile, times):
        for _ in range(times):
            value = fresh_values(graph, placer._shares(table), placer.discount)
            changes = {(g, s): value_of(graph, value, layout.with_instance(profile, s)) - value_of(graph, value, layout)
                       for g, layout in enumerate(layouts) for s in legal_starts(layout, profile)}
            regrets.append(max(changes.values()) - changes[placer.choose(layouts, profile, P)])
    place(G1, 1000)  # a hub that has placed a thousand 1g instances
    passes = count_value_passes(monkeypatch)
    place(G1, 1000)
    assert 10 <= len(passes) <= 40  # once every 40 or so placements
    place(G3, 40)  # the mix moves: 40 of 2,000 is 0.02 of it, ten times the tolerance
    assert len(passes) >= 10 + 4
    assert max(regrets) <= 0.01


def test_default_placer_keeps_values_per_model_when_a_fleet_has_two_mig_models(monkeypatch):
    """GPUs of two models asked about in turn keep each model's values: the kept values of one
    model are not thrown away because the other was asked about in between."""
    h100 = lookup_model("H100-80GB")
    placer = DefaultPlacer()
    for _ in range(1000):  # a hub that has placed a thousand 1g instances
        placer.choose([EMPTY], G1, P)
    passes = count_value_passes(monkeypatch)
    h100_1g = next(p for p in h100.profiles.values() if p.name == "1g.10gb")
    for _ in range(100):
        placer.choose([EMPTY], G1, dict(P))  # an equal table in another object is a table of its own
        placer.choose([Layout(h100.geometry)], h100_1g, h100.profiles)
    assert len(passes) <= 10


def test_at_most_one_media_extension_instance_per_gpu():
    assert G1ME.media_extensions and G1ME.max_instances == 1
    layout = layout_of((G1ME, 0))
    assert legal_starts(layout, G1ME) == []
    assert legal_starts(layout, G1) == [1, 2, 3, 4, 5, 6]
    assert not is_legal([inst(G1ME, 0, 1), inst(G1ME, 2, 2)], P)
    for model in MIG_MODELS:
        me = [p for p in model.profiles.values() if p.media_extensions]
        assert me and all(p.max_instances == 1 and p.name.endswith("+me") for p in me)


def test_whole_gpu_profile_only_on_an_empty_gpu():
    assert legal_starts(EMPTY, G7) == [0]
    for p in P.values():
        if p is not G7:
            assert legal_starts(layout_of((p, p.starts[-1])), G7) == []


def test_is_legal_rejects_what_the_driver_would():
    assert is_legal([], P)
    assert is_legal([inst(G2, 0, 1), inst(G2, 2, 2), inst(G2, 4, 3), inst(G1, 6, 4)], P)
    assert not is_legal([inst(G2, 0, 1), inst(G1, 1, 2)], P)           # shared memory slice
    assert not is_legal([inst(G2, 6, 1)], P)                              # 2g may not start at 6
    assert not is_legal([inst(G1, 7, 1)], P)                              # 1-slice never at 7
    assert not is_legal([MigInstance("MIG-x", 14, 0, 1)], P)              # wrong size
    assert not is_legal([MigInstance("MIG-x", 99, 0, 1)], P)              # unknown profile
    assert not is_legal([inst(G4, 0, 1), inst(G3, 4, 2), inst(G1, 7, 3)], P)


# --- catalogue --------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling,canonical", [
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
    ("A100-80GB", "A100-SXM4-80GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA-A100-80GB-PCIe", "A100 80GB PCIe"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA-A100-PCIE-40GB", "A100-PCIE-40GB"),
    ("NVIDIA-A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA-H100-80GB-HBM3", "H100 80GB HBM3"),
    ("NVIDIA A30", "A30"),
    ("NVIDIA-B200", "B200"),
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA-GH200-480GB", "GH200 480GB"),
    ("NVIDIA GH200 144G HBM3e", "GH200 144G HBM3e"),
    ("NVIDIA GH200 120GB", "GH200 480GB"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA H100 96GB HBM3", "H100 96GB HBM3"),
    ("NVIDIA A800-SXM4-80GB", "A800-SXM4-80GB"),
    ("NVIDIA H800", "H800 80GB HBM3"),
    ("H100-SXM5-80GB", "H100 80GB HBM3"),
    ("H100-80GB", "H100 80GB HBM3"),
    ("NVIDIA H100 80GB HBM3", "H100 80GB HBM3"),
    ("H100-NVL-94GB", "H100 NVL"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("H200-141GB", "H200"),
    ("NVIDIA H200", "H200"),
    ("L4", "L4"),
    ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"),
    ("T4", "T4"),
    ("NVIDIA A10", "A10"),
    ("l40s", "L40S"),
    ("V100", "V100-SXM2-16GB"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
])
def test_lookup_model_accepts_aliases(spelling, canonical):
    model = lookup_model(spelling)
    assert model is not None and model.name == canonical
    assert same_model(spelling, canonical)


@pytest.mark.parametrize("name,profile,memory_gib,sms", [
    ("A100-SXM4-40GB", "1g.5gb", 4.75, 14), ("A100-SXM4-40GB", "1g.10gb", 9.62, 14),
    ("A100-80GB", "3g.40gb", 39.25, 42), ("A100-80GB", "1g.10gb", 9.50, 14),
    ("A100-80GB", "2g.20gb", 19.50, 28), ("A100-80GB", "7g.80gb", 79.00, 98),
    ("H100-80GB", "1g.20gb", 19.62, 26),
    ("H100-NVL-94GB", "7g.94gb", 93.12, 132), ("H200-141GB", "1g.18gb", 16.00, 16),
    ("H200-141GB", "1g.35gb", 32.25, 26), ("H200-141GB", "2g.35gb", 32.25, 32),
    ("H200-141GB", "3g.71gb", 69.50, 60), ("H200-141GB", "7g.141gb", 139.75, 132),
    ("GH200 144G HBM3e", "1g.18gb", 17.50, 16), ("GH200 144G HBM3e", "2g.36gb", 35.25, 32),
    ("B200", "1g.23gb", 22.00, 18), ("B200", "1g.45gb", 44.25, 30), ("B200", "2g.45gb", 44.25, 36),
    ("A30", "1g.6gb", 5.81, 14), ("A30", "2g.12gb+me", 11.69, 28), ("A30", "4g.24gb", 23.44, 56),
    ("GH200 480GB", "1g.12gb", 11.00, 16), ("GH200 480GB", "1g.24gb", 23.00, 26),
    ("GH200 480GB", "3g.48gb", 46.50, 60), ("GH200 480GB", "7g.96gb", 93.00, 132),
])
def test_profile_names_memory_and_sms_match_the_reference(name, profile, memory_gib, sms):
    p = lookup_model(name).profile(profile)
    assert p.memory_mib == round(memory_gib * 1024) and p.sms == sms


@pytest.mark.parametrize("name,memory_mib", [
    ("A30", 24576), ("A800-SXM4-80GB", 81920), ("H800", 81559), ("H100 NVL", 95830), ("GH200 480GB", 97871),
    ("H20", 97871), ("H200 NVL", 143771), ("GH200 144G HBM3e", 146831), ("B200", 183359),
])
def test_total_memory_is_what_nvidia_smi_reports(name, memory_mib):
    assert lookup_model(name).memory_mib == memory_mib


def test_each_model_has_its_own_geometry():
    eight = [m for m in MIG_MODELS if m is not A30]
    for model in eight:
        assert model.geometry == MigGeometry(memory_slices=8, compute_slices=7)
        assert sorted(model.profiles) == [0, 5, 9, 14, 15, 19, 20]
        for pid, p in model.profiles.items():
            assert (p.compute_slices, p.memory_slices, p.max_instances, p.starts) == (
                P[pid].compute_slices, P[pid].memory_slices, P[pid].max_instances, P[pid].starts)
    for model in MIG_MODELS:
        for pid, p in model.profiles.items():
            assert p.name.startswith(f"{p.compute_slices}g.")
            assert model.profile(pid) is p and model.profile(p.name) is p
            assert p.memory_mib < model.memory_mib
    assert {m.name for m in MIG_MODELS} >= {
        "A30", "B200", "H200 NVL", "GH200 480GB", "GH200 144G HBM3e", "H100 96GB HBM3", "H20",
        "A800-SXM4-80GB", "A800-SXM4-40GB", "H800 80GB HBM3", "A100-PCIE-40GB"}
    with pytest.raises(KeyError):
        A100.profile("5g.30gb")
    with pytest.raises(ValueError):
        lookup_model("L4").geometry


def test_a30_has_four_memory_and_four_compute_slices_and_its_own_ids():
    assert A30.geometry == MigGeometry(memory_slices=4, compute_slices=4)
    assert A30.profile(5).name == "2g.12gb" and A100.profile(5).name == "4g.20gb"
    g1, g2, g4 = A30.profile("1g.6gb"), A30.profile("2g.12gb"), A30.profile("4g.24gb")
    empty = Layout(A30.geometry)
    assert legal_starts(empty, g1) == [0, 1, 2, 3] and legal_starts(empty, g2) == [0, 2]
    two = empty.with_instance(g2, 0).with_instance(g1, 2)
    assert legal_starts(two, g1) == [3] and legal_starts(two, g2) == [] and legal_starts(two, g4) == []
    assert two.free_memory_slices == 1 and two.free_compute_slices == 1
    assert room_for(empty, g1) == 4 and room_for(empty, g2) == 2
    assert len(reachable(A30.profiles)) < len(reachable(P))
    instances = [MigInstance("MIG-a", 5, 0, 2), MigInstance("MIG-b", 14, 2, 1), MigInstance("MIG-c", 14, 3, 1)]
    assert is_legal(instances, A30.profiles)
    assert Layout.of(instances, A30.profiles).free_memory_slices == 0
    assert not is_legal([MigInstance("MIG-a", 5, 0, 2), MigInstance("MIG-b", 5, 2, 2),
                         MigInstance("MIG-c", 14, 3, 1)], A30.profiles)


def test_catalogue_differences_name_what_the_driver_reports_otherwise():
    assert catalogue_differences("NVIDIA A100-SXM4-80GB", A100.profiles) != []
    same = lookup_model("A100-SXM4-80GB").profiles
    assert catalogue_differences("NVIDIA A100-SXM4-80GB", same) == []
    assert catalogue_differences("NVIDIA L4", {}) == [] and catalogue_differences("RTX 9999", same) == []
    driver = dict(same)
    driver[19] = dataclasses.replace(same[19], memory_mib=9984)
    del driver[20]
    notes = catalogue_differences("A100-80GB", driver)
    assert len(notes) == 2
    assert "memory_mib is 9984 on the driver, 9728 in the catalogue" in notes[0]
    assert "1g.10gb+me" in notes[1] and "only the catalogue" in notes[1]


def test_non_mig_models_and_unknown_models():
    for name in ("L4", "T4", "A10", "L40S", "V100"):
        model = lookup_model(name)
        assert not model.mig_capable and model.memory_mib > 0
    assert lookup_model("RTX 9999") is None
    unknown = resolve_model("NVIDIA RTX 9999", memory_mib=24576)
    assert unknown.name == "RTX 9999" and unknown.memory_mib == 24576 and not unknown.mig_capable
    assert resolve_model("A100-80GB").name == "A100-SXM4-80GB"
    with pytest.raises(ValueError, match="memory_mib"):
        resolve_model("RTX 9999")
    assert not same_model("A100-80GB", "A100-40GB")
    assert same_model("RTX 9999", "NVIDIA RTX-9999")


# --- layouts ----------------------------------------------------------------------------------

def test_layout_with_and_without_instance_round_trip():
    base = layout_of((G4, 0), (G1, 6))
    for p in P.values():
        for s in legal_starts(base, p):
            grown = base.with_instance(p, s)
            assert grown != base and grown.count(p.profile_id) == base.count(p.profile_id) + 1
            assert grown.compute_used == base.compute_used + p.compute_slices
            assert grown.without_instance(p, s) == base
    assert base.without_instance(G1, 6).without_instance(G4, 0) == EMPTY
    with pytest.raises(ValueError):
        base.without_instance(G2, 4)
    with pytest.raises(ValueError):
        base.without_instance(G3, 4)
    assert Layout.of([inst(G4, 0, 1), inst(G1, 6, 2)], P) == base
    assert base.free_memory_slices == 3 and base.free_compute_slices == 2


# --- placers ----------------------------------------------------------------------------------

def test_get_mig_placer_by_name():
    assert MIG_PLACER_NAMES == ("firstfit", "default")
    assert isinstance(get_mig_placer(), DefaultPlacer)
    assert get_mig_placer("firstfit").name == "firstfit"
    assert get_mig_placer("default") is not get_mig_placer("default")
    with pytest.raises(ValueError, match="firstfit"):
        get_mig_placer("bestfit")


def test_first_fit_takes_the_first_gpu_and_lowest_start():
    full = layout_of((G7, 0))
    assert FirstFitPlacer().choose([full, EMPTY, EMPTY], G1, P) == (1, 0)
    assert FirstFitPlacer().choose([full], G1, P) is None


def test_default_fills_partly_used_gpus_before_empty_ones():
    used = layout_of((G4, 0))
    assert DefaultPlacer().choose([EMPTY, used, EMPTY], G1, P)[0] == 1
    assert DefaultPlacer().choose([EMPTY, used], G2, P) == (1, 4)
    assert DefaultPlacer().choose([layout_of((G7, 0)), EMPTY], G7, P) == (1, 0)
    assert DefaultPlacer().choose([layout_of((G7, 0))], G1, P) is None


def test_default_prefers_the_start_that_keeps_large_profiles():
    assert DefaultPlacer().choose([EMPTY], G3, P) == (0, 4)
    assert DefaultPlacer().choose([EMPTY], G2, P) == (0, 4)
    assert DefaultPlacer().choose([EMPTY], G1DOUBLE, P) == (0, 6)


def test_default_learns_the_mix_it_is_asked_for():
    """With 1g at 0, a 1g.10gb goes to 2 (3g still fits at 4) until 2g dominates the requests;
    then it goes to 6, where 2g keeps both of its remaining starts."""
    layout = layout_of((G1, 0))
    fresh, learned = DefaultPlacer(), DefaultPlacer()
    for _ in range(20):
        learned.choose([EMPTY], G2, P)
    assert fresh.choose([layout], G1DOUBLE, P) == (0, 2)
    assert learned.choose([layout], G1DOUBLE, P) == (0, 6)
    assert room_for(layout.with_instance(G1DOUBLE, 6), G2) == 2
    assert room_for(layout.with_instance(G1DOUBLE, 2), G3) == 1


@settings(max_examples=150, deadline=None)
@given(model=st.sampled_from(MIG_MODELS), gpus=st.integers(1, 4), data=st.data(),
       placer_name=st.sampled_from(MIG_PLACER_NAMES))
def test_placers_stay_legal_and_never_refuse_a_placeable_request(model, gpus, data, placer_name):
    profiles = model.profiles
    stream = data.draw(st.lists(st.sampled_from(sorted(profiles)), min_size=1, max_size=40))
    placer = get_mig_placer(placer_name)
    layouts = [Layout(model.geometry) for _ in range(gpus)]
    instances = [[] for _ in range(gpus)]
    for n, pid in enumerate(stream):
        profile = profiles[pid]
        placeable = any(legal_starts(layout, profile) for layout in layouts)
        choice = placer.choose(layouts, profile, profiles)
        assert (choice is not None) == placeable
        if choice is None:
            continue
        g, start = choice
        instances[g].append(MigInstance(f"MIG-{n}", pid, start, profile.memory_slices))
        layouts[g] = layouts[g].with_instance(profile, start)
        assert is_legal(instances[g], profiles)
        assert Layout.of(instances[g], profiles) == layouts[g]
        assert layouts[g].compute_used <= model.geometry.compute_slices
