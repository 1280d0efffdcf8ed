"""openb replay: CSV layouts, the FGD protocol details, and BestFit against the published figure."""

from pathlib import Path

import numpy as np
import pytest

from jupyter_gpualloc.core import openb
from jupyter_gpualloc.core.placement import Demand


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture()
def small_trace(tmp_path):
    nodes = write(tmp_path / "nodes.csv",
                  "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,65536,2,T4\nn0,16000,65536,1,P100\nc0,8000,1024,0,\n")
    pods = write(tmp_path / "pods.csv",
                 "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
                 "p2,1000,100,1,500,T4|P100,LS,Running,0,1,0\n"
                 "p0,2000,100,1,250,,LS,Running,0,1,0\n"
                 "p1,1000,100,0,0,,BE,Running,0,1,0\n")
    return nodes, pods


def test_csv_layouts(small_trace, tmp_path):
    nodes_csv, pods_csv = small_trace
    nodes = openb.load_nodes(nodes_csv)
    assert [n.gpu_models for n in nodes] == [("T4", "T4"), ("P100",), ()]
    pods = openb.load_pods(pods_csv)
    assert pods[0].demand() == Demand(1000, 100, 1, 500, frozenset({"T4", "P100"}))
    five = write(tmp_path / "multi.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nm0,4000,100,4,1000\n")
    (pod,) = openb.load_pods(five)
    assert pod.gpu_spec == "" and pod.gpu_request == 4000
    assert pod.demand() == Demand(4000, 100, 4, 0, None)


def test_workload_shuffles_then_appends_resampled_pods_up_to_ratio(small_trace):
    pods = openb.load_pods(small_trace[1])
    capacity = 3000
    runs = [openb.workload(pods, seed, capacity) for seed in range(6)]
    for run in runs:
        assert sorted(p.name for p in run[:3]) == ["p0", "p1", "p2"]  # originals first, each once
        total = sum(p.gpu_request for p in run)
        assert total <= 1.3 * capacity < total + 500  # stops before the request would pass 1.3x
    assert len({tuple(p.name for p in run[:3]) for run in runs}) > 1  # the seed shuffles
    assert [p.name for p in openb.workload(pods, 3, capacity)] == [p.name for p in runs[3]]


def test_arrived_counts_failed_pods_and_value_at_100(tmp_path):
    nodes = openb.load_nodes(write(tmp_path / "n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn,4000,4096,1,T4\n"))
    pods = openb.load_pods(write(tmp_path / "p.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                 "a,1000,10,1,600\nb,1000,10,1,600\nc,1000,10,1,300\n"))
    run = openb.simulate(nodes, pods, "bestfit", seed=0, typical=openb.typical_pods(pods))
    names = [p.name for p in openb.workload(pods, 0, 1000)]
    assert len(names) == 3  # 1500 arrived already passes 1.3 x 1000: nothing resampled
    assert run["arrived"][-1] == 1500  # failed pods count as arrived
    assert run["used"][-1] in (900, 600)  # one 600 fails whatever the order
    first = int(np.flatnonzero(run["arrived"] >= 1000)[0])
    assert openb.alloc_at(run, 100) == pytest.approx(100 * run["used"][first] / 1000)
    assert openb.alloc_at(run, 130) == pytest.approx(100 * run["used"][-1] / 1000)


def test_typical_pods_cover_95_percent_with_normalised_frequencies():
    pods = [openb.Pod(f"p{i}", 1000, 0, 1, 500) for i in range(90)]
    pods += [openb.Pod(f"q{i}", 2000, 0, 0, 0) for i in range(6)]
    pods += [openb.Pod(f"r{i}", 3000, 0, 2, 1000) for i in range(4)]
    typical = openb.typical_pods(pods)
    assert [d.cpu_milli for d, _ in typical] == [1000, 2000]
    assert sum(w for _, w in typical) == pytest.approx(1.0)


def test_the_env_names_the_folder_of_csv_files_or_a_data_folder_above_it(tmp_path, monkeypatch):
    csv_folder = tmp_path / "data" / "alibaba-gpu-v2023" / "csv"
    csv_folder.mkdir(parents=True)
    monkeypatch.setenv(openb.DATA_ENV, str(tmp_path / "data"))
    assert openb.trace_dir() == csv_folder and openb.default_data_dir() == tmp_path / "data"
    write(csv_folder / "openb_pod_list_default.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    monkeypatch.setenv(openb.DATA_ENV, str(csv_folder))
    assert openb.trace_dir() == csv_folder


def trace_or_skip() -> Path:
    """The folder of the openb CSV files, or skip: the repository does not ship the trace."""
    try:
        folder = openb.trace_dir()
    except FileNotFoundError:
        folder = None
    if folder is None or not (folder / "openb_pod_list_default.csv").exists():
        pytest.skip(f"needs the openb trace (cluster-trace-gpu-v2023/csv of github.com/alibaba/clusterdata): "
                    f"set {openb.DATA_ENV} to the folder holding its CSV files")
    return folder


def test_default_trace_typical_pods_and_bestfit_matches_published():
    folder = trace_or_skip()
    pods = openb.load_pods(folder / "openb_pod_list_default.csv")
    assert len(openb.typical_pods(pods)) == 35
    result = openb.replay(folder / "openb_node_list_gpu_node.csv", folder / "openb_pod_list_default.csv",
                          "bestfit", [42], workers=1)
    assert abs(result["alloc_pct"]["100"]["mean"] - 92.86) < 1.5
    assert result["alloc_pct"]["130"]["mean"] >= result["alloc_pct"]["100"]["mean"]
    assert 10_000 < result["decisions"] < 11_500
