"""Placement: fit semantics, bookkeeping and each policy's choice on hand-built clusters."""

import numpy as np
import pytest

from jupyter_gpualloc.core.placement import (
    POLICY_NAMES,
    ClusterView,
    Demand,
    Fragmentation,
    NodeCapacity,
    ShareCopiesFragmentation,
    _INTERN,
    get_policy,
)


def node(name, gpus=0, model="A100", cpu=64_000, mem=256_000):
    return NodeCapacity(name, cpu, mem, (model,) * gpus)


def share(milli, cpu=1000, models=None):
    return Demand(cpu_milli=cpu, memory_mib=1024, num_gpu=1, gpu_milli=milli, models=models)


def test_fit_semantics():
    view = ClusterView([node("a", 2), node("b", 4, "T4"), node("cpu")])
    assert list(view.feasible(Demand(cpu_milli=1000))) == [True, True, True]
    assert list(view.feasible(Demand(cpu_milli=65_000))) == [False, False, False]
    assert list(view.feasible(Demand(memory_mib=300_000))) == [False, False, False]
    assert list(view.feasible(Demand(num_gpu=3))) == [False, True, False]
    assert list(view.feasible(share(500, models=frozenset({"A100"})))) == [True, False, False]
    view.allocate(1, (0,), share(300))
    # a multi-GPU demand needs fully free GPUs: 3 are left on b
    assert view.fits(1, Demand(num_gpu=3)) and not view.fits(1, Demand(num_gpu=4))
    view.allocate(1, (1, 2, 3), Demand(num_gpu=3))
    assert view.fits(1, share(700)) and not view.fits(1, share(701))
    assert not view.fits(1, Demand(num_gpu=1, gpu_milli=1000))


def test_allocate_release_restore_capacity_exactly():
    view = ClusterView([node("a", 4)])
    before = (view.cpu_free.copy(), view.mem_free.copy(), view.gpu_vis.copy(), int(view.state_id[0]))
    demands = [(share(250, cpu=3000), (0,)), (share(500), (0,)), (Demand(cpu_milli=8000, num_gpu=2), (1, 2))]
    for d, gpus in demands:
        view.allocate(0, gpus, d)
    assert view.gpu_free(0, 0) == 250 and view.gpu_free_total[0] == 1250
    for d, gpus in reversed(demands):
        view.release(0, gpus, d)
    assert (view.cpu_free == before[0]).all() and (view.mem_free == before[1]).all()
    assert (view.gpu_vis == before[2]).all() and view.state_id[0] == before[3]
    assert view.classes[0] == {}
    with pytest.raises(ValueError):
        view.release(0, (0,), share(100))
    with pytest.raises(ValueError):
        view.allocate(0, (0,), Demand(num_gpu=2))
    view.allocate(0, (0,), share(800))
    with pytest.raises(ValueError):
        view.allocate(0, (0,), share(300))


def test_disabled_gpu_is_invisible_and_copy_is_independent():
    view = ClusterView([node("a", 2)])
    view.set_gpu_enabled(0, 0, False)
    assert view.fitting_gpus(0, share(100)).tolist() == [1]
    assert not view.fits(0, Demand(num_gpu=2))
    with pytest.raises(ValueError):
        view.allocate(0, (0,), share(100))
    other = view.copy()
    other.allocate(0, (1,), share(600))
    assert view.gpu_free(0, 1) == 1000 and other.gpu_free(0, 1) == 400
    view.set_gpu_enabled(0, 0, True)
    assert view.fits(0, Demand(num_gpu=2))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_every_policy_places_validly_and_reports_infeasible(name):
    typical = [(share(500), 0.5), (Demand(cpu_milli=1000, num_gpu=1, gpu_milli=1000), 0.5)]
    policy = get_policy(name, seed=1, typical=typical)
    view = ClusterView([node("a", 2), node("b", 8, "T4"), node("c", 1, cpu=4000)])
    rng = np.random.default_rng(0)
    placed = 0
    for _ in range(60):
        num = int(rng.choice([0, 1, 1, 2]))
        d = Demand(cpu_milli=int(rng.integers(0, 4000)), num_gpu=num,
                   gpu_milli=int(rng.integers(1, 1001)) if num == 1 else 0)
        choice = policy.choose(view, d)
        if choice is None:
            assert not view.feasible(d).any()
            continue
        view.allocate(choice[0], choice[1], d)  # raises if the choice does not fit
        placed += 1
    assert placed > 5
    assert policy.choose(view, Demand(num_gpu=9)) is None
    assert policy.choose(view, share(100), node_mask=np.zeros(3, dtype=bool)) is None


def test_bestfit_prefers_least_leftover_and_best_fitting_gpu():
    view = ClusterView([node("big", 8), node("small", 2)])
    policy = get_policy("bestfit")
    assert policy.choose(view, share(300)) == (1, (0,))
    view.allocate(0, (3,), share(600))  # GPU 3 of big now has 400 free
    view.allocate(0, tuple(range(4, 8)), Demand(num_gpu=4))
    view.allocate(0, (0, 1, 2), Demand(num_gpu=3))
    assert policy.choose(view, share(300)) == (0, (3,))


def test_dotprod_and_binpack_pack_spread_spreads():
    view = ClusterView([node("a", 8), node("b", 8)])
    view.allocate(1, (0, 1, 2, 3), Demand(num_gpu=4))
    assert get_policy("dotprod").choose(view, Demand(num_gpu=4)) == (1, (4, 5, 6, 7))
    view.allocate(1, (4,), share(500))
    assert get_policy("binpack").choose(view, share(200)) == (1, (4,))
    assert get_policy("spread").choose(view, share(200)) == (0, (0,))


def test_clustering_keeps_kinds_together():
    view = ClusterView([node("a", 4), node("b", 4), node("c", 4)])
    view.allocate(1, (0,), Demand(num_gpu=1, gpu_milli=1000))
    view.allocate(2, (0,), share(500))
    policy = get_policy("clustering")
    assert policy.choose(view, share(200))[0] == 2
    assert policy.choose(view, Demand(num_gpu=1, gpu_milli=1000))[0] == 1
    assert policy.choose(view, Demand(num_gpu=2))[0] == 0


def test_packing_prefers_shared_gpu_then_used_node_then_small_idle_node():
    view = ClusterView([node("idle8", 8), node("idle2", 2), node("used", 4)])
    policy = get_policy("packing")
    assert policy.choose(view, share(300))[0] == 1  # idle nodes: fewer GPUs first
    view.allocate(2, (0,), Demand(num_gpu=1, gpu_milli=1000))
    assert policy.choose(view, share(300))[0] == 2  # a free GPU on a used node beats idle nodes
    view.allocate(0, (5,), share(500))
    assert policy.choose(view, share(300)) == (0, (5,))  # a partly used GPU beats everything


def test_random_is_seeded_and_uses_any_fitting_gpu():
    view = ClusterView([node(f"n{i}", 4) for i in range(5)])
    picks = [get_policy("random", seed=7).choose(view, share(100)) for _ in range(2)]
    assert picks[0] == picks[1]
    rng_picks = {get_policy("random", seed=s).choose(view, share(100)) for s in range(30)}
    assert len({n for n, _ in rng_picks}) > 2 and len({g for _, g in rng_picks}) > 2


def test_fragmentation_measure():
    typical = [(Demand(cpu_milli=2000), 0.25), (share(500, cpu=2000), 0.5),
               (Demand(num_gpu=2, cpu_milli=2000), 0.25)]
    frag = Fragmentation(typical)
    view = ClusterView([node("a", 2)])
    # idle node: the CPU-only pod cannot use any of its 2000 idle milli, the others use all
    assert frag.of_state(view.state(0)) == pytest.approx(0.25 * 2000)
    view.allocate(0, (0,), share(700))
    # 1300 idle; share pod wastes GPU 0 (300 < 500); 2-GPU pod lacks total GPU -> all idle
    assert frag.of_state(view.state(0)) == pytest.approx(0.25 * 1300 + 0.5 * 300 + 0.25 * 1300)
    view.allocate(0, (), Demand(cpu_milli=63_000))
    assert frag.of_state(view.state(0)) == pytest.approx(1300)  # no CPU left for any typical pod


def test_share_copies_fragmentation_counts_gpus_the_cpu_cannot_feed():
    typical = [(share(500, cpu=4000), 1.0)]
    view = ClusterView([node("a", 8, cpu=12_000)])
    # 12 cores feed three 4-core shares: FGD counts all 8 idle GPUs usable, the copy count 3
    assert Fragmentation(typical).of_state(view.state(0)) == 0
    assert ShareCopiesFragmentation(typical).of_state(view.state(0)) == pytest.approx(5000)
    view.allocate(0, (0,), share(700, cpu=0))
    view.allocate(0, (1,), share(200, cpu=0))
    # the three usable GPUs are those with the most free milli: 1000, 1000, 1000 (not 800 or 300)
    assert ShareCopiesFragmentation(typical).of_state(view.state(0)) == pytest.approx(8000 - 900 - 3000)
    # whole-GPU and CPU-free typical demands, and nodes a model-restricted demand needs, keep FGD's rule
    for other in ([(Demand(num_gpu=1, gpu_milli=1000, cpu_milli=4000), 1.0)], [(share(500, cpu=0), 1.0)],
                  typical + [(Demand(num_gpu=1, gpu_milli=1000, models=frozenset({"A100"})), 0.0001)]):
        assert (ShareCopiesFragmentation(other).of_state(view.state(0))
                == pytest.approx(Fragmentation(other).of_state(view.state(0))))


def test_fragmentation_fast_path_equals_the_per_gpu_rules():
    """`_compute` answers unrestricted typical demands from sorted free milli and prefix sums; it must
    give exactly (bit for bit, same summation order) what the per-GPU rules give, or decisions move."""
    rng = np.random.default_rng(7)
    typical = [(Demand(cpu_milli=2000), 0.1), (share(500, cpu=4000), 0.2), (share(810, cpu=3000), 0.15),
               (share(300, cpu=0), 0.05), (Demand(num_gpu=1, gpu_milli=1000, cpu_milli=8000), 0.2),
               (Demand(num_gpu=4, cpu_milli=32_000), 0.1), (Demand(num_gpu=8, cpu_milli=64_000), 0.1),
               (share(470, cpu=2000, models=frozenset({"T4"})), 0.1)]
    ids = [_INTERN.model(m) for m in ("A100", "T4")]  # T4 nodes keep FGD's rule under the copy count
    for measure in (Fragmentation(typical), ShareCopiesFragmentation(typical)):
        for _ in range(400):
            n = int(rng.integers(1, 9))
            gpus = tuple(sorted((ids[int(rng.integers(0, 2))], int(rng.choice([0, 40, 190, 300, 500, 530, 810, 1000])))
                                for _ in range(n)))
            key = (int(rng.choice([0, 1000, 3000, 12_000, 64_000, 96_000])), gpus)
            cpu_free, entries = key
            idle = sum(f for _, f in entries)
            rule = measure._rule(entries)
            expected = 0.0
            if idle:
                for t in measure.typical:
                    expected += t.weight * (idle if t.num_gpu == 0 or cpu_free < t.cpu_milli
                                            else rule(t, cpu_free, entries, idle))
            assert measure._compute(key) == expected, key


def test_fgd_places_share_where_it_fragments_least():
    typical = [(share(500), 1.0)]
    view = ClusterView([node("a", 1), node("b", 1)])
    view.allocate(0, (0,), share(200))  # a: 800 free; b: 1000 free
    # 500 on a leaves 300 (fragment); on b leaves 500 (usable): FGD picks b
    assert get_policy("fgd", typical=typical).choose(view, share(500)) == (1, (0,))
    assert get_policy("default", typical=typical).choose(view, share(500)) == (1, (0,))
    assert get_policy("bestfit").choose(view, share(500)) == (0, (0,))


def test_default_keeps_idle_and_large_nodes_for_whole_gpus():
    typical = [(Demand(cpu_milli=1000), 0.5), (Demand(num_gpu=1, gpu_milli=1000), 0.5)]
    view = ClusterView([node("idle8", 8), node("idle2", 2), node("used8", 8)])
    view.allocate(2, (0,), Demand(num_gpu=1, gpu_milli=1000))
    policy = get_policy("default", typical=typical)
    assert policy.choose(view, Demand(num_gpu=1, gpu_milli=1000))[0] == 2
    view.allocate(2, tuple(range(1, 8)), Demand(num_gpu=7))
    assert policy.choose(view, Demand(num_gpu=1, gpu_milli=1000))[0] == 1
    assert get_policy("fgd", typical=typical).choose(view, Demand(num_gpu=1, gpu_milli=1000))[0] == 0


def test_default_opens_the_smallest_idle_node_unless_a_smaller_one_strands_gpus():
    # on the big node the 16-core pod leaves CPU for seven 12-core shares, on the small one for six:
    # a one-step smaller growth that is only the big node's spare CPU (FGD, without the copy count,
    # sees no difference); the big node is the only one that 120-core pods would fit
    typical = [(Demand(cpu_milli=1000), 0.97), (share(470, cpu=12_000), 0.03)]
    view = ClusterView([node("big", 8, cpu=128_000), node("small", 8, cpu=96_000)])
    policy = get_policy("default", typical=typical)
    pod = Demand(cpu_milli=16_000, num_gpu=1, gpu_milli=1000)
    steps = [policy.state_choice(int(sid), pod)[0][0] for sid in view.state_id]
    assert steps[0] == steps[1] + 1
    assert policy.choose(view, pod)[0] == 1
    # equal scores (an 8-GPU pod leaves nothing to fragment): the smallest that fits, not the first
    assert policy.choose(view, Demand(cpu_milli=64_000, num_gpu=8))[0] == 1
    assert get_policy("fgd", typical=typical).choose(view, Demand(cpu_milli=64_000, num_gpu=8))[0] == 0
    # a 40-core pod leaves the small node CPU for three shares on seven GPUs: more than a step worse,
    # so the big node takes it
    big_pod = Demand(cpu_milli=40_000, num_gpu=1, gpu_milli=1000)
    steps = [policy.state_choice(int(sid), big_pod)[0][0] for sid in view.state_id]
    assert steps[0] > steps[1] + 1
    assert policy.choose(view, big_pod)[0] == 0


def test_default_gives_a_whole_gpu_the_used_node_with_least_free_cpu():
    """Among used nodes that tie on every key, a whole single GPU goes to the least free CPU (then the
    lowest index), leaving the CPU where GPUs would strand without it; a share still takes the
    lowest index (openb multigpu40, 10 seeds: 96.893 -> 96.907)."""
    nodes = [node("a", 2, cpu=64_000), node("b", 2, cpu=32_000), node("c", 2, cpu=16_000),
             node("d", 2, cpu=8000)]
    view = ClusterView(nodes)
    for n in range(3):
        view.allocate(n, (0,), share(500, cpu=0))  # a, b, c used alike; d idle
    policy = get_policy("default", typical=[])
    assert policy.choose(view, Demand(cpu_milli=4000, num_gpu=1, gpu_milli=1000)) == (2, (1,))
    view.allocate(2, (1,), Demand(num_gpu=1, gpu_milli=1000))  # c's last whole GPU gone
    assert policy.choose(view, Demand(cpu_milli=4000, num_gpu=1, gpu_milli=1000)) == (1, (1,))
    assert policy.choose(view, share(300, cpu=0)) == (0, (0,))


def test_unknown_policy_and_bad_demand():
    with pytest.raises(ValueError):
        get_policy("nope")
    with pytest.raises(ValueError):
        Demand(num_gpu=1, gpu_milli=0)


def test_default_fills_small_nodes_first_unless_restricted_demands_need_their_model():
    def cluster():
        view = ClusterView([node("t4", 2, "T4"), node("a100x8", 8), node("a100x4", 4)])
        for i in range(3):
            view.allocate(i, (0,), Demand(num_gpu=1, gpu_milli=1000))  # no node is idle
        return view

    whole = Demand(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
    open_typical = [(share(500), 1.0)]
    assert get_policy("default", typical=open_typical).choose(cluster(), whole)[0] == 0
    # a few typical pods may only use T4: the T4 node is theirs, so the whole GPU goes elsewhere,
    # and among the nodes nobody is restricted to, the smaller one is filled first
    restricted = [(share(500), 0.99), (Demand(num_gpu=1, gpu_milli=1000, models=frozenset({"T4"})), 0.01)]
    assert get_policy("default", typical=restricted).choose(cluster(), whole)[0] == 2


def test_default_reserves_only_models_restricted_demands_need_beyond_their_share():
    def cluster():
        view = ClusterView([node("t4", 2, "T4"), node("g2a", 8, "G2"), node("g2b", 8, "G2"), node("g2c", 8, "G2")])
        for i in range(4):
            view.allocate(i, (0,), Demand(num_gpu=1, gpu_milli=1000))  # no node is idle
        return view

    whole = Demand(cpu_milli=1000, num_gpu=1, gpu_milli=1000)
    # as much restricted demand on T4 (2 GPUs) as on G2 (24): T4 is needed 6.5x its share, G2 half its
    # share, so only T4 is kept for them and the whole GPU goes to a G2 node (before, both were kept,
    # no node was preferred, and the lowest index, the T4 node, took it)
    typical = [(share(500), 0.9), (Demand(num_gpu=1, gpu_milli=1000, models=frozenset({"T4"})), 0.05),
               (Demand(num_gpu=1, gpu_milli=1000, models=frozenset({"G2"})), 0.05)]
    assert get_policy("default", typical=typical).choose(cluster(), whole)[0] == 1


def test_default_sends_cpu_only_demands_to_small_nodes_even_of_reserved_models():
    view = ClusterView([node("a100", 8), node("t4", 2, "T4")])
    for i in range(2):
        view.allocate(i, (0,), Demand(num_gpu=1, gpu_milli=1000))  # no node is idle
    typical = [(share(500), 0.9), (Demand(num_gpu=1, gpu_milli=1000, models=frozenset({"T4"})), 0.1)]
    policy = get_policy("default", typical=typical)
    # a whole GPU stays off the T4 node the restricted demands need; a CPU-only pod takes no GPU
    # from it, and the small node is where the CPU per GPU is
    assert policy.choose(view, Demand(cpu_milli=1000, num_gpu=1, gpu_milli=1000))[0] == 0
    assert policy.choose(view, Demand(cpu_milli=1000))[0] == 1
