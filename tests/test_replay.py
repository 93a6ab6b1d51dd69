"""Pods as they come: the pod-list reader, the replay loop, and a real public fleet and pod list in process."""

from pathlib import Path

import pytest

from hetplan.allocator import Allocator
from hetplan.allocator.nodes_io import load_nodes
from hetplan.allocator.replay import filling, in_process, pod_events, replay
from hetplan.contracts import ContractError

OPENB = Path(__file__).resolve().parents[1] / "bench" / "data" / "openb"
HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def test_pods_become_requests_in_time_order_with_shares_cpu_only_and_own_requests(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "p0,12000,16384,1,1000,,LS,Running,0,100,0\n"
                             "p1,6000,12288,1,460,,LS,Running,100,200,100\n"  # created as p0 leaves
                             "p2,20000,65536,0,0,,LS,Running,50,,50\n"  # CPU-only, never deleted
                             "p3,88000,327680,8,1000,V100M32|G3,Burstable,Succeeded,60,90,60\n")
    events = pod_events(path, model="openb")
    assert [(e.at, e.path, e.body["job_id"]) for e in events] == [
        (0, "/v1/allocate", "p0"), (50, "/v1/allocate", "p2"), (60, "/v1/allocate", "p3"),
        (90, "/v1/release", "p3"), (100, "/v1/release", "p0"), (100, "/v1/allocate", "p1"), (200, "/v1/release", "p1")]
    asks = {e.body["job_id"]: e.body for e in events if not e.release}
    assert asks["p1"] == {"job_id": "p1", "model": "openb", "num_gpus": 0.46, "cpus": 6.0, "mem_gb": 12.0}
    assert (asks["p2"]["num_gpus"], asks["p3"]["num_gpus"], asks["p3"]["mem_gb"]) == (0, 8, 320.0)
    twice = filling(events, 2)
    assert [e.body["job_id"] for e in twice] == ["p0~0", "p2~0", "p3~0", "p1~0", "p0~1", "p2~1", "p3~1", "p1~1"]


def test_a_bad_pod_row_names_file_row_and_column(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text(HEADER + "p0,12000,16384,1,1000,,LS,Running,0,100,0\np1,six,12288,1,460,,LS,Running,1,2,1\n")
    with pytest.raises(ContractError, match=r"pods.csv:3:cpu_milli"):
        pod_events(path)


@pytest.fixture(scope="module")
def fleet():
    return load_nodes(OPENB / "openb_node_list_gpu_node.csv")


@pytest.fixture(scope="module")
def pods():
    return pod_events(OPENB / "openb_pod_list_default.csv", model="openb")


def test_every_node_of_the_real_fleet_joins_opaque_types_and_all(fleet):
    assert len(fleet) == 1213 and len({n.name for n in fleet}) == 1213
    assert {"G2", "G3", "T4", "P100"} <= {n.gpu_type for n in fleet}


@pytest.mark.parametrize("policy", ["hint", "first-fit", "proportional"])
def test_the_real_pod_list_replays_without_refusal_overcommit_or_a_pod_below_its_request(fleet, pods, policy):
    alloc = Allocator(fleet, policy)
    report = replay(pods, in_process(alloc))
    assert report.refused == {} and report.below_request == [] and alloc.cluster.check() == []
    assert report.asked == len({e.body["job_id"] for e in pods}) and report.placed == report.asked
    assert min(report.asked_by_kind.values()) > 100  # whole, share and CPU-only pods all came


def test_filling_the_real_fleet_packs_at_least_as_many_pods_as_first_fit(fleet, pods):
    """The issue's target on real data: deterministic (fixed files, seeded policies), so a regression shows."""
    placed = {}
    for policy in ("hint", "first-fit"):
        alloc = Allocator(fleet, policy)
        report = replay(filling(pods, 2), in_process(alloc))
        assert alloc.cluster.check() == [] and report.below_request == []
        assert set(report.rejected) == {"no-capacity"}  # the fleet filled up
        placed[policy] = report.placed
    assert placed["hint"] >= placed["first-fit"]
