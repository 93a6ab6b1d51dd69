"""Nodes from where they live: node files (CSV as the catalog spells it, YAML, JSON), a plan's nodes, batches under
the body limit, and `hetplan serve --nodes/--from-plan` on a real uvicorn; bad files fail with one line."""

import json
import subprocess
import sys
from pathlib import Path
from datetime import datetime, timezone

import httpx
import pytest

from hetplan.allocator.nodes_io import NodeFileError, load_nodes, node_batches, nodes_from_plan
from hetplan.allocator.spec import Node
from hetplan.cli.serve import STORE_ENV_NAME
from hetplan.contracts import Plan
from hetplan.hints import STORE_ENV, HintStore
from servers import TOKEN, Server

# Rows in the form of Alibaba's public 2023 GPU fleet (cluster-trace-gpu-v2023, openb_node_list_gpu_node.csv:
# sn,cpu_milli,memory_mib,gpu,model), rewritten to hetplan's columns; G2 and G3 are GPU models that trace
# leaves unnamed, A40 one hetplan does not list.
OPENB_CSV = """name,gpu_type,gpus,vcpus,mem_gb
openb-node-0022,G3,8,128,768
openb-node-0023,V100M32,8,96,768
openb-node-0026,G2,8,96,384
openb-node-0035,T4,4,96,384
openb-node-0051,P100,2,16,120
lab-a40,NVIDIA A40,4,64,512
"""


def test_a_csv_as_the_catalog_spells_it_loads_with_unknown_gpu_types_kept_opaque(tmp_path):
    path = tmp_path / "fleet.csv"
    path.write_text(OPENB_CSV)
    nodes = {n.name: n for n in load_nodes(path)}
    assert [n.gpu_type for n in nodes.values()] == ["G3", "V100-32GB", "G2", "T4", "P100", "A40"]
    assert nodes["openb-node-0023"] == Node("openb-node-0023", "V100-32GB", 8, 96.0, 768.0)


def test_a_node_list_in_kubernetes_units_loads_as_alibabas_trace_writes_it(tmp_path):
    path = tmp_path / "openb_node_list_gpu_node.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0022,128000,786432,8,G3\n"
                    "openb-node-0025,32000,131072,4,V100M16\nopenb-node-0143,8000,32768,1,V100M16\n")
    nodes = load_nodes(path)
    assert nodes[0] == Node("openb-node-0022", "G3", 8, 128.0, 768.0)
    assert [(n.gpus, n.cpus, n.mem_gb) for n in nodes[1:]] == [(4, 32.0, 128.0), (1, 8.0, 32.0)]
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,32768,1,T4\nn2,8000,lots,1,T4\n")
    with pytest.raises(NodeFileError, match=r"openb_node_list_gpu_node.csv:3:memory_mib: not a number"):
        load_nodes(path)
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,8000,32768,0,T4\n")
    with pytest.raises(NodeFileError, match=r"csv:2:gpu: must be a whole number from 1"):
        load_nodes(path)


def test_yaml_json_the_older_cpus_column_and_counts(tmp_path):
    (tmp_path / "a.yaml").write_text("nodes:\n  - {name: y, gpu_type: H100, gpus: 8, vcpus: 96, mem_gb: 1024,"
                                     " labels: {pool: p5}}\n  - {name: z, gpu_type: B200, gpus: 8, vcpus: 112,"
                                     " mem_gb: 2048, count: 2}\n")
    (tmp_path / "b.json").write_text(json.dumps([{"name": "j", "gpu_type": "T4", "gpus": 1, "cpus": 4, "mem_gb": 16}]))
    (tmp_path / "c.csv").write_text("name,gpu_type,gpus,cpus,mem_gb,count\nold,V100,8,64,488,3\n")
    yaml_nodes = load_nodes(tmp_path / "a.yaml")
    assert [n.name for n in yaml_nodes] == ["y", "z-1", "z-2"] and dict(yaml_nodes[0].labels) == {"pool": "p5"}
    assert load_nodes(tmp_path / "b.json")[0].cpus == 4.0
    assert [n.name for n in load_nodes(tmp_path / "c.csv")] == ["old-1", "old-2", "old-3"]


def test_the_shipped_owned_fleet_file_serves_as_a_node_file():
    from hetplan.catalog.fleet import DEFAULT_FLEET
    from hetplan.contracts import FLEET

    fleet = FLEET.load(DEFAULT_FLEET)
    nodes = load_nodes(DEFAULT_FLEET)
    assert len(nodes) == int(fleet["count"].sum())
    assert sum(n.gpus for n in nodes) == int((fleet["gpus"] * fleet["count"]).sum())


@pytest.mark.parametrize("name, text, where", [
    ("f.csv", "name,gpu_type,gpus,cpus_per_node,mem_gb\nn,T4,1,4,16\n", "f.csv:1: missing column(s) vcpus"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1,4,16\nm,T4,1,four,16\n", "f.csv:3:vcpus: not a number"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,0,4,16\n", "f.csv:2:gpus: must be a whole number"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1.5,4,16\n", "f.csv:2:gpus: must be a whole number"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1,4,nan\n", "f.csv:2:mem_gb: not a number: 'nan'"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,\u0664,4,16\n", "f.csv:2:gpus: not a number: '\u0664'"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1,1_000,16\n", "f.csv:2:vcpus: not a number: '1_000'"),
    ("f.json", '[{"name": "n", "gpu_type": "T4", "gpus": 1, "vcpus": "\uff14", "mem_gb": 16}]',
     "f.json:item 1:vcpus: not a number"),
    ("f.json", '[{"name": "n", "gpu_type": "T4", "gpus": 1, "vcpus": 4, "mem_gb": 1e309}]',
     "f.json:item 1:mem_gb: not a finite number"),
    ("f.json", '[{"name": "n\u200b", "gpu_type": "T4", "gpus": 1, "vcpus": 4, "mem_gb": 16}]',
     "f.json:item 1:name: node name must be 1 to 253 printable characters"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1,4,-16\n", "f.csv:2:mem_gb: must be a number > 0"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T 4?,1,4,16\n", "f.csv:2:gpu_type: 'T 4?' is not a GPU type"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\nn,T4,1,4,16\nn,L4,1,4,16\n", "f.csv:3:name: node 'n' again"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\n,T4,1,4,16\n", "f.csv:2:name: missing"),
    ("f.csv", "name,gpu_type,gpus,vcpus,mem_gb\n", "f.csv: no nodes"),
    ("f.yaml", "- {name: n, gpu_type: T4, gpus: 1, vcpus: 4, mem_gib: 16}\n", "f.yaml:item 1:mem_gib: unknown field"),
    ("f.yaml", "- {name: n, gpu_type: T4, gpus: 1, vcpus: 4, mem_gb: 16, labels: [a]}\n", "f.yaml:item 1:labels"),
    ("f.yaml", "nodes: [\n", "f.yaml: not valid YAML"),
    ("f.json", '{"nodes": {"name": "n"}}', "f.json: expected a list of nodes"),
    ("f.txt", "n,T4,1,4,16\n", "f.txt: unknown node file type"),
])
def test_bad_node_files_fail_with_one_line_naming_file_row_and_field(tmp_path, name, text, where):
    message = _refusal(tmp_path / name, text.encode(), where)
    assert message.startswith(str(tmp_path / where.split(":")[0].split(" ")[0]))


def plan_file(tmp_path, shapes=True):
    plan = Plan(plan_id="p-nodes", created_at=datetime(2026, 12, 1, tzinfo=timezone.utc), budget_per_hour=50.0,
                cost_per_hour=40.0, node_counts={"aws:g5.12xlarge": 2, "unused": 0}, owned_nodes={"pai:misc": 1},
                objective=1.0, lp_bound=1.0, gap=0.0, solver="highs", solve_seconds=0.1,
                shapes={"aws:g5.12xlarge": {"gpu_type": "A10G", "gpus": 4, "vcpus": 48, "mem_gb": 192,
                                            "price_per_hour": 5.67},
                        "pai:misc": {"gpu_type": "MISC", "gpus": 8, "vcpus": 96, "mem_gb": 512,
                                     "price_per_hour": 0.0}} if shapes else {})
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def test_a_plans_nodes_are_its_added_and_owned_shapes(tmp_path):
    nodes = nodes_from_plan(plan_file(tmp_path))
    assert [(n.name, n.gpu_type, n.gpus) for n in nodes] == [
        ("aws:g5.12xlarge-1", "A10G", 4), ("aws:g5.12xlarge-2", "A10G", 4), ("pai:misc-1", "MISC", 8)]
    with pytest.raises(NodeFileError, match="does not record this shape"):
        nodes_from_plan(plan_file(tmp_path, shapes=False))


@pytest.mark.parametrize("limit", [2_000, 64 * 1024])
def test_batches_stay_under_the_body_limit_and_carry_every_node_once(limit):
    nodes = [Node(f"n{i:05d}", ["T4", "G2", "H20"][i % 3], 8, 96, 768, {"rack": str(i % 7)}) for i in range(1_500)]
    batches = list(node_batches(nodes, limit))
    assert all(len(json.dumps(b)) <= limit for b in batches)
    assert [n["name"] for b in batches for n in b["upsert"]] == [n.name for n in nodes]
    with pytest.raises(ValueError, match="over the body limit"):
        list(node_batches(nodes[:1], 50))


# --- hetplan serve, for real -----------------------------------------------------------------------------------


def serve_fails(tmp_path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from hetplan.cli import main; main()", "serve",
                           "--db", str(tmp_path / "never.db"), "--port", "1", *args],
                          capture_output=True, text=True, timeout=120)


def test_serve_with_a_bad_node_file_exits_with_one_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "nodes.csv"
    bad.write_text("name,gpu_type,gpus,vcpus,mem_gb\nok,T4,1,4,16\nbad,T4,two,4,16\n")
    done = serve_fails(tmp_path, "--nodes", str(bad))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"error: {bad}:3:gpus: not a number: 'two'"]
    assert not (tmp_path / "never.db").exists()


def test_serve_loads_a_csv_fleet_and_a_plans_nodes_and_takes_larger_batches_in_chunks(tmp_path):
    fleet = tmp_path / "fleet.csv"
    fleet.write_text(OPENB_CSV)
    store = tmp_path / "store"
    HintStore(store)  # empty store: no hints yet
    server = Server(tmp_path, store, fleet, extra=("--from-plan", str(plan_file(tmp_path)))).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            listed = client.get("/v1/nodes").json()
            assert listed["totals"]["nodes"] == 6 + 3
            assert {"G2", "G3", "A40", "MISC", "A10G"} <= {n["gpu_type"] for n in listed["nodes"]}
            more = [Node(f"batch-{i:04d}", ["H20", "L40", "T4"][i % 3], 8, 96, 768) for i in range(1_213)]
            for body in node_batches(more, 64 * 1024):  # the service's --max-body
                response = client.post("/v1/nodes", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
                assert response.status_code == 200, response.text
            assert client.get("/healthz").json()["nodes"] == 9 + 1_213
    finally:
        server.stop()


def test_serve_names_the_same_store_variable_as_the_hint_store():
    assert STORE_ENV_NAME == STORE_ENV


@pytest.mark.parametrize("name, data, where", [
    ("f.json", b"[" * 100_000 + b"]" * 100_000, "f.json: not a node file: JSON nested too deeply"),
    ("f.yaml", b"[" * 100_000 + b"]" * 100_000, "f.yaml: not a node file: YAML nested too deeply"),
    ("f.yaml", b"a:\n" + b"".join(b" " * k + b"a:\n" for k in range(1, 3000)), "f.yaml: not a node file: YAML"),
    ("f.csv", b"name,gpu_type,gpus,vcpus,mem_gb\nn\xe9,T4,1,4,16\n", "f.csv: cannot read: not UTF-8 text (byte 33)"),
    ("f.json", '[{"name": "n"}]'.encode("utf-16"), "f.json: cannot read: not UTF-8 text (byte 0)"),
    ("f.csv", b"name,gpu_type,gpus,vcpus,mem_gb\n" + b"n" * 200_000 + b",T4,1,4,16\n",
     "f.csv: not a valid CSV file: field larger than field limit"),
], ids=["json-deep", "yaml-deep", "yaml-deep-mapping", "csv-latin1", "json-utf16", "csv-huge-field"])
def test_node_files_that_are_no_text_or_too_deep_fail_with_one_line(tmp_path, name, data, where):
    """Issue 30: these raised RecursionError or csv.Error (a traceback from `hetplan serve --nodes`), not one line."""
    _refusal(tmp_path / name, data, where)


def _refusal(path: Path, data: bytes, where: str) -> str:
    """`load_nodes` on a file holding `data`: its one-line error, which names `where` (file, row, field)."""
    path.write_bytes(data)
    with pytest.raises(NodeFileError) as info:
        load_nodes(path)
    message = str(info.value)
    assert "\n" not in message and message.removeprefix(str(path.parent) + "/").startswith(where), message
    return message


def test_a_csv_with_a_byte_order_mark_loads(tmp_path):
    """A spreadsheet's CSV starts with a byte-order mark: no part of the first column's name."""
    path = tmp_path / "f.csv"
    path.write_bytes(b"\xef\xbb\xbfname,gpu_type,gpus,vcpus,mem_gb\nn1,T4,1,4,16\n")
    assert load_nodes(path) == [Node("n1", "T4", 1, 4, 16)]
