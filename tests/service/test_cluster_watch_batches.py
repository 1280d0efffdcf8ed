"""What the cluster's watch reads again after a batch of events, without a cluster (service/cluster_watch.py):
the whole fleet once, then only the nodes a batch names (a node's own events, the pool of a ResourceSlice,
the pools of the devices a ResourceClaim holds), reported with their names."""

from __future__ import annotations

import asyncio
import copy
import time

from jupyter_gpualloc.core.devices.kubernetes import KubernetesBackend
from jupyter_gpualloc.service.cluster_watch import ClusterWatch, _claim_record, _Resource
from jupyter_gpualloc.core.devices import dra
from jupyter_gpualloc.core.devices.simulated import SimulatedBackend
from jupyter_gpualloc.core.errors import StoreFailed
from jupyter_gpualloc.core.policy import SchedulerPolicy
from jupyter_gpualloc.core.scheduler import Scheduler
from jupyter_gpualloc.core.store import Store, sqlite_url
from jupyter_gpualloc.service.cluster import ClusterReconciler

from tests.core.devices.dra_slices import allocated_claim, dynamic_mig, mig_device

H100 = "H100 80GB HBM3"
NODES = ["dra-0", "dra-1", "dra-2"]


def node_object(name: str, unschedulable: bool = False) -> dict:
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


class Listener:
    """Records what the watch reports."""

    def __init__(self) -> None:
        self.reports: list[tuple[list[str], list[str] | None]] = []  # (nodes reported, names)
        self.outside: dict[str, object] = {}
        self.active: set[str] = set()  # the leases it calls active

    def nodes_changed(self, nodes, names=None) -> None:
        self.reports.append(([n.name for n in nodes], names))

    def outside_use(self, key, use) -> None:
        self.outside[key] = use

    def own_pod(self, key, pod) -> None:
        pass

    def knows_lease(self, lease_id) -> bool:
        return False

    def lease_active(self, lease_id) -> bool:
        return lease_id in self.active

    def stale(self, since) -> None:
        pass


class Reads(KubernetesBackend):
    """The backend, counting the nodes it reads."""

    def __init__(self) -> None:
        super().__init__(lambda: [])
        self.whole = 0
        self.named: list[list[str]] = []
        self.judged: list[str] = []  # the claims it judged, by name

    def read_nodes(self, *args, **kwargs):
        self.whole += 1
        return super().read_nodes(*args, **kwargs)

    def read_named(self, names, *args, **kwargs):
        self.named.append(list(names))
        return super().read_named(names, *args, **kwargs)

    def claim_use(self, claim):
        self.judged.append(claim["metadata"]["name"])
        return super().claim_use(claim)


def listed_watch() -> tuple[ClusterWatch, Listener, Reads]:
    """A watch over three DynamicMIG nodes, every kind listed once (as `_list` leaves it)."""
    backend, listener = Reads(), Listener()
    watch = ClusterWatch(backend, listener, namespace="hub", instance="hub.gpualloc")
    watch._resources = (_Resource("nodes", None, lambda o: o["metadata"]["name"]),
                        _Resource("pods", None, lambda o: f"pod:{o['metadata']['namespace']}/{o['metadata']['name']}"),
                        _Resource("resourceslices", None, lambda o: o["metadata"]["name"]),
                        _Resource("resourceclaims", None, dra.claim_key, _claim_record))
    for name in NODES:
        event(watch, 0, "ADDED", node_object(name))
        for j, body in enumerate(dynamic_mig(name, H100, 2)):
            body["metadata"].update(name=f"{name}-slice-{j}", resourceVersion="1")
            event(watch, 2, "ADDED", body)
    for resource in watch._resources:
        resource.version = "1"
    watch._flush(watch._resources[0])
    return watch, listener, backend


def event(watch: ClusterWatch, kind: int, type_: str, *objects: dict) -> None:
    """One batch of watch events of the `kind`-th watched kind (0 nodes, 2 slices, 3 claims), applied."""
    resource = watch._resources[kind]
    for obj in objects:
        watch._event(resource, {"type": type_, "object": copy.deepcopy(obj)})
    if resource.version is not None:
        watch._flush(resource)


def test_the_first_report_is_the_whole_fleet_then_a_claim_reads_only_its_node():
    watch, listener, backend = listed_watch()
    assert listener.reports == [(NODES, None), (NODES, NODES)]  # the nodes listed, then their pools
    assert backend.whole == 1
    claim = allocated_claim("ml", "train", "dra-1", mig_device(0, "1g.10gb", 0, H100))
    event(watch, 3, "ADDED", claim)
    assert listener.reports[2:] == [(["dra-1"], ["dra-1"])]
    assert backend.named[1:] == [["dra-1"]] and backend.whole == 1
    assert listener.outside["claim:ml/train"].mig == {"1g.10gb": 1}
    event(watch, 3, "DELETED", claim)
    assert listener.reports[3:] == [(["dra-1"], ["dra-1"])]
    assert listener.outside["claim:ml/train"] is None


def test_a_cordon_and_a_node_gone_read_only_that_node():
    watch, listener, backend = listed_watch()
    event(watch, 0, "MODIFIED", node_object("dra-2", unschedulable=True))
    event(watch, 0, "DELETED", node_object("dra-0"))
    assert listener.reports[2:] == [(["dra-2"], ["dra-2"]), ([], ["dra-0"])]
    assert backend.whole == 1


def test_a_pool_republished_reads_its_node_and_a_claims_outside_use_on_another_node_stays():
    watch, listener, backend = listed_watch()
    event(watch, 3, "ADDED", allocated_claim("ml", "train", "dra-0", mig_device(1, "3g.40gb", 4, H100)))
    republished = dynamic_mig("dra-2", H100, 2, generation=2)
    for j, body in enumerate(republished):
        body["metadata"].update(name=f"dra-2-slice-{j}", resourceVersion="2")
    event(watch, 2, "MODIFIED", *republished)
    assert listener.reports[-1] == (["dra-2"], ["dra-2"])
    assert listener.outside["claim:ml/train"].node == "dra-0"  # judged on its own node only


def test_a_lease_that_ends_has_only_the_claims_on_its_claims_nodes_judged_again():
    watch, listener, backend = listed_watch()
    listener.active = {"L1"}
    ours = allocated_claim("hub", "lease-l1", "dra-1", mig_device(0, "1g.10gb", 0, H100))
    ours["metadata"]["labels"] = {"gpualloc.jupyter.org/lease": "L1", "gpualloc.jupyter.org/instance": "hub.gpualloc"}
    event(watch, 3, "ADDED", ours,
          allocated_claim("ml", "near", "dra-1", mig_device(1, "1g.10gb", 1, H100)),
          *[allocated_claim("ml", f"far-{n}", "dra-2", mig_device(n, "1g.10gb", 0, H100)) for n in range(2)])
    assert "claim:hub/lease-l1" not in listener.outside  # an active lease's own claim holds nothing outside
    backend.judged = []
    watch.recheck_claims("L0")  # a lease with no claim: nothing to judge
    assert backend.judged == []
    listener.active = set()
    watch.recheck_claims("L1")
    assert sorted(backend.judged) == ["lease-l1", "near"]  # dra-1's claims, not dra-2's
    assert listener.outside["claim:hub/lease-l1"].node == "dra-1"  # held until it is deleted
    event(watch, 3, "DELETED", ours)
    assert listener.outside["claim:hub/lease-l1"] is None
    assert watch._lease_claims == {}


def test_reported_again_the_whole_fleet_and_every_outside_use():
    """After the store refused a core call, the core may lack what an incremental report carried."""
    watch, listener, backend = listed_watch()
    event(watch, 3, "ADDED", allocated_claim("ml", "train", "dra-1", mig_device(0, "1g.10gb", 0, H100)))
    event(watch, 0, "MODIFIED", node_object("dra-2", unschedulable=True))
    reports, listener.outside = len(listener.reports), {}
    watch.report_again()
    assert listener.reports[reports:] == [(NODES, None)]  # every node, as at the first report
    assert backend.whole == 2
    assert listener.outside["claim:ml/train"].node == "dra-1"


def test_a_change_the_store_refused_has_the_watch_report_everything_again_once_and_until_it_is_taken(tmp_path):
    store = Store(sqlite_url(tmp_path / "s.sqlite"))
    reconciler = ClusterReconciler(Scheduler(SimulatedBackend([]), store, SchedulerPolicy()),
                                   KubernetesBackend(lambda: []), namespace="hub", instance="hub.gpualloc")
    reconciler.report_again_seconds = 0.05
    refusals, calls, reported = [3], [], []  # the first report again is refused too

    def core_call(*args, now):
        calls.append(args)
        if refusals[0]:
            refusals[0] -= 1
            raise StoreFailed("the database is gone")

    def report_again():
        reported.append(time.monotonic())
        reconciler._core(core_call, "again")

    reconciler.watch.report_again = report_again

    async def main():
        reconciler._core(core_call, "cordon")
        reconciler._core(core_call, "pod")  # refused too: one report again, not two
        await asyncio.sleep(0.5)
    asyncio.run(main())
    store.close()
    assert calls == [("cordon",), ("pod",), ("again",), ("again",)]
    assert len(reported) == 2
