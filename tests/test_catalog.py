"""Catalog importers: SkyPilot price lists of four clouds, on-prem fleets, the shipped default, the CLI."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from hetplan.catalog import (
    DEFAULT_CATALOG, CatalogImport, build_default_catalog, detect_cloud, import_onprem, import_skypilot,
    load_catalog, load_default_catalog,
)
from hetplan.catalog.gcp import attachable_gpus
from hetplan.catalog.skypilot import MAX_PRICE_PER_GPU_HOUR, MIN_PRICE_PER_GPU_HOUR
from hetplan.cli import app
from hetplan.catalog.fleet import DEFAULT_FLEET, build_default_fleet, load_default_fleet
from hetplan.contracts import CATALOG, FLEET, ContractError
from hetplan.resources import upstream_path

AWS = upstream_path("prices", "aws_us_east_1_gpu.csv")
GCP = upstream_path("prices", "gcp_us_central1_subset.csv")
AZURE = upstream_path("prices", "azure_vms_subset.csv")
LAMBDA = upstream_path("prices", "lambda_vms.csv")

AWS_HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone"
P4D_INFO = "\"{'Gpus': [{'Name': 'A100', 'MemoryInfo': {'SizeInMiB': 40960}}]}\""
V100_INFO = "\"{'Gpus': [{'Name': 'V100', 'MemoryInfo': {'SizeInMiB': 16384}}]}\""


@pytest.fixture(scope="module")
def aws() -> CatalogImport:
    return import_skypilot(AWS)


@pytest.fixture(scope="module")
def gcp() -> CatalogImport:
    return import_skypilot(GCP)


@pytest.fixture(scope="module")
def azure() -> CatalogImport:
    return import_skypilot(AZURE)


@pytest.fixture(scope="module")
def lambda_east() -> CatalogImport:
    return import_skypilot(LAMBDA, region="us-east-1")


def shape(imported: CatalogImport, name: str) -> dict:
    rows = imported.shapes[imported.shapes["name"] == name]
    assert len(rows) == 1, f"{name} not in {sorted(imported.shapes['name'])}"
    return rows.iloc[0].to_dict()


def problem_lines(exc: pytest.ExceptionInfo[ContractError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def write(tmp_path: Path, lines: list[str], name: str = "vms.csv") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def aws_row(instance: str = "p4d.24xlarge", vcpus: str = "96.0", price: str = "32.7726", zone: str = "use1-az1",
            region: str = "us-east-1", gpus: str = "8.0", gpu: str = "A100", info: str = P4D_INFO,
            spot: str = "6.7915") -> str:
    return f"{instance},{gpu},{gpus},{vcpus},1152.0,{info},{price},{spot},{region},{zone}"


# --- AWS ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu_type", "gpus", "vcpus", "mem_gb", "price", "spot"),
    [
        ("aws:p4d.24xlarge", "A100", 8, 96, 1152.0, 32.7726, 6.7915),
        ("aws:p4de.24xlarge", "A100-80GB", 8, 96, 1152.0, 40.96575, None),
        ("aws:p5.48xlarge", "H100", 8, 192, 2048.0, 98.32, 30.326),
        ("aws:g4dn.12xlarge", "T4", 4, 48, 192.0, 3.912, 1.5152),
        ("aws:g5.xlarge", "A10G", 1, 4, 16.0, 1.006, 0.4177),
        ("aws:g6e.12xlarge", "L40S", 4, 48, 384.0, 10.49264, 4.2359),
    ],
)
def test_aws_shapes_by_value(aws, name, gpu_type, gpus, vcpus, mem_gb, price, spot):
    row = shape(aws, name)
    assert (row["gpu_type"], row["gpus"], row["vcpus"], row["mem_gb"]) == (gpu_type, gpus, vcpus, mem_gb)
    assert row["price_per_hour"] == pytest.approx(price)
    assert (pd.isna(row["spot_price_per_hour"]) if spot is None else row["spot_price_per_hour"] == pytest.approx(spot))
    assert (row["cloud"], row["region"], row["source"]) == ("aws", "us-east-1", "skypilot:aws")
    assert pd.isna(row["available"])


def test_aws_whole_extract_is_imported_without_warnings(aws):
    assert len(aws.shapes) == 28
    assert aws.warnings == []
    assert aws.shapes["name"].str.startswith("aws:").all()
    CATALOG.validate(aws.shapes)  # already a valid catalog


# --- GCP ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "gpu_type", "gpus", "vcpus", "mem_gb", "price", "spot"),
    [
        ("gcp:a2-highgpu-1g", "A100", 1, 12, 85.0, 0.73948 + 2.93391, 0.29576 + 1.1472),
        ("gcp:a2-highgpu-8g", "A100", 8, 96, 680.0, 5.91582 + 23.47126, 2.36604 + 9.1776),
        ("gcp:a2-ultragpu-1g", "A100-80GB", 1, 12, 170.0, 1.09962 + 1.8462, 0.43983 + 1.5712),
        ("gcp:a3-highgpu-8g", "H100", 8, 208, 1872.0, 9.46006 + 33.60609, 2.17547 + 18.024),
        ("gcp:g2-standard-4", "L4", 1, 4, 16.0, 0.14679 + 0.56004, 0.05874 + 0.2231),
        ("gcp:g2-standard-24", "L4", 2, 24, 96.0, 0.88075 + 1.12008, 0.35242 + 0.4462),
        ("gcp:g2-standard-96", "L4", 8, 96, 384.0, 3.52301 + 4.48032, 1.40966 + 1.7848),
        ("gcp:n1-standard-8+2xV100", "V100", 2, 8, 30.0, 0.38 + 4.96, 0.0963 + 1.984),
        ("gcp:n1-standard-32+4xT4", "T4", 4, 32, 120.0, 1.51999 + 1.4, 0.3852 + 0.56),
        ("gcp:n1-standard-4+1xP100", "P100", 1, 4, 15.0, 0.19 + 1.46, 0.04815 + 0.584),
    ],
)
def test_gcp_vm_price_is_host_plus_accelerator(gcp, name, gpu_type, gpus, vcpus, mem_gb, price, spot):
    row = shape(gcp, name)
    assert (row["gpu_type"], row["gpus"], row["vcpus"], row["mem_gb"]) == (gpu_type, gpus, vcpus, mem_gb)
    assert row["price_per_hour"] == pytest.approx(price, abs=1e-9)
    assert row["spot_price_per_hour"] == pytest.approx(spot, abs=1e-9)
    assert (row["cloud"], row["region"], row["source"]) == ("gcp", "us-central1", "skypilot:gcp")


def test_gcp_a2_highgpu_1g_is_exactly_the_documented_price(gcp):
    assert shape(gcp, "gcp:a2-highgpu-1g")["price_per_hour"] == 3.67339


@pytest.mark.parametrize(
    "absent",
    [
        "gcp:n1-standard-16+1xV100",  # 1 V100 allows at most 12 vCPUs
        "gcp:n1-standard-32+2xV100",  # 2 V100 allow at most 24 vCPUs
        "gcp:n1-standard-32+1xP100",  # 1 P100 allows at most 16 vCPUs
        "gcp:n1-standard-4+8xT4",  # T4 comes in 1, 2 or 4
        "gcp:n1-standard-4",  # a host without GPUs is no GPU shape
    ],
)
def test_gcp_n1_combinations_follow_the_attachable_gpus_table(gcp, absent):
    assert absent not in set(gcp.shapes["name"])


@pytest.mark.parametrize(
    ("machine_type", "vcpus", "expected"),
    [
        ("a2-highgpu-4g", 48, [("A100", 4)]),
        ("a2-megagpu-16g", 96, [("A100", 16)]),
        ("a2-ultragpu-2g", 24, [("A100-80GB", 2)]),
        ("a3-highgpu-8g", 208, [("H100", 8)]),
        ("g2-standard-48", 48, [("L4", 4)]),
        ("g2-standard-32", 32, [("L4", 1)]),
        ("n1-standard-96", 96, [("T4", 4), ("V100", 8)]),
        ("n1-standard-64", 64, [("T4", 4), ("V100", 8), ("P100", 4)]),
        ("e2-standard-8", 8, []),
    ],
)
def test_gcp_machine_type_rules(machine_type, vcpus, expected):
    assert attachable_gpus(machine_type, vcpus) == expected


def test_gcp_n1_shape_count_matches_the_table(gcp):
    n1 = gcp.shapes[gcp.shapes["name"].str.startswith("gcp:n1-")]
    # n1-standard-4 and -8: 3 T4 + 4 V100 + 3 P100; -16: 3 T4 + 3 V100 + 3 P100; -32: 3 T4 + 2 V100 + 2 P100
    assert len(n1) == 10 + 10 + 9 + 7


def test_gcp_p100_only_in_zones_that_offer_it(tmp_path):
    """P100 accelerator rows exist only in us-central1-c/f: a host in zones a/b gets T4s but no P100s."""
    lines = GCP.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    keep = [r for r in rows if r.startswith("n1-standard-8,") and r.endswith(("-a,0.38,0.0963", "-b,0.38,0.0963"))]
    keep += [r for r in rows if r.startswith((",,,P100", ",,,T4"))]
    path = write(tmp_path, [header, *keep])
    names = set(import_skypilot(path).shapes["name"])
    assert names == {"gcp:n1-standard-8+1xT4", "gcp:n1-standard-8+2xT4", "gcp:n1-standard-8+4xT4"}


def test_gcp_p100_offered_where_host_and_accelerator_meet(gcp):
    p100 = gcp.shapes[gcp.shapes["gpu_type"] == "P100"]
    assert set(p100["name"]) >= {"gcp:n1-standard-8+4xP100", "gcp:n1-standard-16+1xP100"}


def test_gcp_fixed_machine_without_accelerator_price_is_warned(tmp_path):
    lines = GCP.read_text().splitlines()
    keep = [r for r in lines[1:] if r.startswith("a3-highgpu-8g") or r.startswith(",,,A100,1,")
            or r.startswith("a2-highgpu-1g")]
    result = import_skypilot(write(tmp_path, [lines[0], *keep]))
    assert list(result.shapes["name"]) == ["gcp:a2-highgpu-1g"]
    assert any("a3-highgpu-8g" in w and "no accelerator price" in w for w in result.warnings)


# --- Azure ----------------------------------------------------------------------------------------------------


def test_azure_nd96isr_h100_v5_is_corrected_to_8_gpus(azure):
    row = shape(azure, "azure:Standard_ND96isr_H100_v5")
    assert (row["gpu_type"], row["gpus"], row["price_per_hour"]) == ("H100", 8, 98.32)
    assert any("Standard_ND96isr_H100_v5" in w and "12 -> 8" in w for w in azure.warnings)


def test_azure_rows_without_price_are_skipped_with_one_warning_naming_them(azure):
    names = set(azure.shapes["name"])
    skipped = ["Standard_NC8ads_A10_v4", "Standard_NC16ads_A10_v4", "Standard_NC32ads_A10_v4", "Standard_ND40s_v3"]
    assert not names & {f"azure:{s}" for s in skipped}
    [warning] = [w for w in azure.warnings if "no on-demand Price" in w]
    assert all(s in warning for s in skipped) and warning.startswith("azure_vms_subset.csv:")


def test_azure_unknown_gpu_is_one_aggregated_warning(azure):
    [warning] = [w for w in azure.warnings if "unknown GPU" in w]
    assert "Radeon MI25" in warning and "4 rows" in warning
    assert not azure.shapes["name"].str.contains(r"Standard_NV\d+as_v4").any()


@pytest.mark.parametrize(
    ("name", "gpu_type", "gpus", "vcpus", "mem_gb", "price"),
    [
        ("azure:Standard_NC24ads_A100_v4", "A100-80GB", 1, 24, 220.0, 3.673),
        ("azure:Standard_ND96asr_v4", "A100", 8, 96, 900.0, 27.197),
        ("azure:Standard_ND40rs_v2", "V100-32GB", 8, 40, 672.0, 22.032),
        ("azure:Standard_NV12s_v3", "M60", 1, 12, 112.0, 1.14),
    ],
)
def test_azure_shapes_by_value(azure, name, gpu_type, gpus, vcpus, mem_gb, price):
    row = shape(azure, name)
    assert (row["gpu_type"], row["gpus"], row["vcpus"], row["mem_gb"], row["price_per_hour"]) == (
        gpu_type, gpus, vcpus, mem_gb, price,
    )
    assert row["region"] == "eastus"


def test_azure_warnings_are_exactly_the_known_quirks(azure):
    assert len(azure.warnings) == 3
    assert len(azure.shapes) == 31 - 4 - 4  # 4 without a price, 4 Radeon MI25


# --- Lambda ---------------------------------------------------------------------------------------------------


def test_lambda_crlf_file_with_region(lambda_east):
    assert b"\r\n" in LAMBDA.read_bytes()  # the shipped file really has CRLF line ends
    row = shape(lambda_east, "lambda:gpu_8x_h100_sxm5")
    assert (row["gpu_type"], row["gpus"], row["vcpus"], row["mem_gb"]) == ("H100", 8, 208, 1800.0)
    assert row["price_per_hour"] == 23.92
    assert row["region"] == "us-east-1" and row["cloud"] == "lambda"
    assert pd.isna(row["spot_price_per_hour"])
    assert len(lambda_east.shapes) == 18  # 18 GPU types, the CPU-only row skipped silently
    assert lambda_east.warnings == []


def test_lambda_without_region_keeps_the_cheapest_offer_and_its_region():
    result = import_skypilot(LAMBDA)
    with LAMBDA.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["InstanceType"] == "gpu_1x_a10" and r["Price"]]
    cheapest = min(rows, key=lambda r: float(r["Price"]))
    row = shape(result, "lambda:gpu_1x_a10")
    assert row["price_per_hour"] == float(cheapest["Price"])
    assert row["region"] == cheapest["Region"]
    assert result.shapes["name"].is_unique


def test_cheapest_region_wins_and_region_filter_keeps_that_region(tmp_path):
    path = write(tmp_path, [
        AWS_HEADER,
        aws_row(price="40.0", region="us-west-2", zone="usw2-az1", spot="9.0"),
        aws_row(price="32.7726", region="us-east-1", zone="use1-az1", spot="7.0"),
        aws_row(price="32.7726", region="us-east-1", zone="use1-az2", spot="6.0"),
    ])
    row = shape(import_skypilot(path), "aws:p4d.24xlarge")
    assert (row["price_per_hour"], row["region"], row["spot_price_per_hour"]) == (32.7726, "us-east-1", 6.0)
    west = shape(import_skypilot(path, region="us-west-2"), "aws:p4d.24xlarge")
    assert (west["price_per_hour"], west["region"]) == (40.0, "us-west-2")


def test_unknown_region_is_an_error_listing_the_regions():
    with pytest.raises(ContractError) as exc:
        import_skypilot(LAMBDA, region="mars-north-1")
    [message] = problem_lines(exc)
    assert "mars-north-1" in message and "us-east-1" in message and "europe-central-1" in message


# --- cloud detection ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "cloud"), [(AWS, "aws"), (GCP, "gcp"), (AZURE, "azure"), (LAMBDA, "lambda")],
)
def test_cloud_is_detected_from_the_file(path, cloud):
    result = import_skypilot(path)
    assert set(result.shapes["cloud"]) == {cloud}
    assert result.shapes["name"].str.startswith(f"{cloud}:").all()


@pytest.mark.parametrize(
    ("columns", "types", "zones", "cloud"),
    [
        (["InstanceType", "Generation"], ["x"], [], "azure"),
        (["InstanceType", "AvailabilityZone"], ["p3.2xlarge"], ["use1-az1"], "aws"),
        (["InstanceType", "AvailabilityZone"], ["n1-standard-8", ""], ["us-central1-a"], "gcp"),
        (["InstanceType", "AvailabilityZone"], ["a2-highgpu-1g"], ["us-central1-a"], "gcp"),
        (["InstanceType", "Region"], ["gpu_1x_a10"], [], "lambda"),
    ],
)
def test_detect_cloud(columns, types, zones, cloud):
    assert detect_cloud(columns, types, zones) == cloud


def test_explicit_cloud_names_the_shapes():
    result = import_skypilot(LAMBDA, region="us-east-1", cloud="lambda")
    assert shape(result, "lambda:gpu_1x_gh200")["gpu_type"] == "GH200"


def test_unknown_cloud_is_an_error():
    with pytest.raises(ContractError, match="unknown cloud 'oracle'"):
        import_skypilot(AWS, cloud="oracle")


# --- broken input ---------------------------------------------------------------------------------------------


def test_non_numeric_cells_are_errors_naming_file_line_and_column(tmp_path):
    path = write(tmp_path, [AWS_HEADER, aws_row(), aws_row(instance="p3.2xlarge", vcpus="eight"),
                            aws_row(instance="p3.8xlarge", price="cheap")])
    with pytest.raises(ContractError) as exc:
        import_skypilot(path)
    assert problem_lines(exc) == [f"{path}:3:vCPUs: not a number: 'eight'", f"{path}:4:Price: not a number: 'cheap'"]


@pytest.mark.parametrize("column", ["vCPUs", "Price", "AcceleratorCount", "InstanceType"])
def test_missing_column_is_an_error(tmp_path, column):
    frame = pd.read_csv(AWS, dtype=str, keep_default_na=False).drop(columns=[column])
    path = tmp_path / "vms.csv"
    frame.to_csv(path, index=False)
    with pytest.raises(ContractError) as exc:
        import_skypilot(path)
    [problem] = exc.value.problems
    assert (problem.row, problem.column) == (1, column) and "missing required column" in problem.message


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "file is empty"), (b"\n \n", "file is empty"), (b"PK\x03\x04\x00\x00\x01\x02binary", "binary")],
)
def test_empty_or_binary_file_is_an_error(tmp_path, content, message):
    path = tmp_path / "vms.csv"
    path.write_bytes(content)
    with pytest.raises(ContractError, match=message):
        import_skypilot(path)


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ContractError, match="no such file"):
        import_skypilot(tmp_path / "nope.csv")


@pytest.mark.parametrize(
    ("price", "gpus"),
    [("700.0", "8.0"), ("0", "1.0"), ("-1.5", "1.0"), ("0.01", "1.0"), ("130.0", "8.0")],
)
def test_implausible_price_is_skipped_with_a_warning(tmp_path, price, gpus):
    path = write(tmp_path, [AWS_HEADER, aws_row(),
                            aws_row(instance="p3.16xlarge", gpu="V100", gpus=gpus, price=price, info=V100_INFO)])
    result = import_skypilot(path)
    assert list(result.shapes["name"]) == ["aws:p4d.24xlarge"]
    [warning] = result.warnings
    assert "implausible price" in warning and "p3.16xlarge" in warning and f"({float(price):g} $/h" in warning


def test_price_bounds_are_plausible_constants():
    assert 0 < MIN_PRICE_PER_GPU_HOUR < 0.35 < 12.29 < MAX_PRICE_PER_GPU_HOUR < 700 / 8


def test_conflicting_duplicates_keep_the_first_with_a_warning(tmp_path):
    """The AWS p4de quirk: two rows for one instance and zone that disagree (GPU name, spot price)."""
    info80 = "\"{'Gpus': [{'Name': 'A100-80GB', 'MemoryInfo': {'SizeInMiB': 81920}}]}\""
    path = write(tmp_path, [
        AWS_HEADER,
        aws_row(instance="p4de.24xlarge", gpu="A100-80GB", info=info80, price="40.96575", spot=""),
        aws_row(instance="p4de.24xlarge", gpu="A100", info=info80, price="40.96575", spot="9.0"),
        aws_row(),
        aws_row(),  # an identical repeat is no conflict
    ])
    result = import_skypilot(path)
    assert sorted(result.shapes["name"]) == ["aws:p4d.24xlarge", "aws:p4de.24xlarge"]
    row = shape(result, "aws:p4de.24xlarge")
    assert row["gpu_type"] == "A100-80GB" and pd.isna(row["spot_price_per_hour"])
    [warning] = result.warnings
    assert "p4de.24xlarge" in warning and "lines 2, 3" in warning


def test_fractional_gpu_count_is_skipped_with_a_warning(tmp_path):
    path = write(tmp_path, [AWS_HEADER, aws_row(), aws_row(instance="g6f.large", gpu="L4", gpus="0.125", price="0.2")])
    result = import_skypilot(path)
    assert list(result.shapes["name"]) == ["aws:p4d.24xlarge"]
    assert any("fractional" in w and "g6f.large" in w for w in result.warnings)


def test_file_with_only_cpu_rows_is_an_error(tmp_path):
    path = write(tmp_path, [AWS_HEADER, "m5.large,,,2.0,8.0,,0.096,0.03,us-east-1,use1-az1"])
    with pytest.raises(ContractError, match="no priced GPU instance types"):
        import_skypilot(path)


def test_row_without_instance_type_is_an_error(tmp_path):
    path = write(tmp_path, [AWS_HEADER.replace(",AvailabilityZone", ""), aws_row(instance="").rsplit(",", 1)[0]])
    with pytest.raises(ContractError) as exc:
        import_skypilot(path, cloud="aws")
    assert problem_lines(exc) == [f"{path}:2:InstanceType: missing value"]


def test_gpu_row_without_vcpus_is_an_error(tmp_path):
    path = write(tmp_path, [AWS_HEADER, aws_row(vcpus="")])
    with pytest.raises(ContractError) as exc:
        import_skypilot(path)
    assert problem_lines(exc)[0].startswith(f"{path}:2:vCPUs:")


# --- default catalog ------------------------------------------------------------------------------------------


def test_shipped_default_catalog_equals_a_fresh_build(tmp_path):
    built = build_default_catalog()
    fresh = CATALOG.write(built.shapes, tmp_path / "default.csv")
    assert DEFAULT_CATALOG.read_bytes() == fresh.read_bytes(), "regenerate with write_default_catalog()"


def test_shipped_default_fleet_equals_a_fresh_build_of_the_pai_sample(tmp_path):
    fresh = FLEET.write(build_default_fleet(), tmp_path / "fleet.csv")
    assert DEFAULT_FLEET.read_bytes() == fresh.read_bytes(), "regenerate with hetplan data rebuild"
    fleet = load_default_fleet()
    assert set(fleet["gpu_type"]) == {"P100", "T4", "V100", "V100-32GB", "MISC"}  # MISC: PAI's unnamed GPUs
    assert fleet.loc[fleet["gpu_type"] == "P100", "count"].sum() == 16  # 798 machines / 50


def test_default_catalog_covers_four_clouds():
    frame = load_default_catalog()
    assert set(frame["cloud"]) == {"aws", "gcp", "azure", "lambda"}
    assert dict(frame.groupby("cloud")["region"].first()) == {
        "aws": "us-east-1", "gcp": "us-central1", "azure": "eastus", "lambda": "us-east-1",
    }
    assert frame["name"].is_unique
    assert (frame["price_per_hour"] / frame["gpus"]).between(MIN_PRICE_PER_GPU_HOUR, MAX_PRICE_PER_GPU_HOUR).all()


def test_default_catalog_provenance_names_the_skipped_rows():
    text = DEFAULT_CATALOG.with_name("PROVENANCE.md").read_text()
    for needle in ("skypilot-org/skypilot-catalog", "Standard_ND40s_v3", "Radeon MI25", "Standard_ND96isr_H100_v5"):
        assert needle in text


# --- on-prem --------------------------------------------------------------------------------------------------

ONPREM_YAML = """\
source: onprem:dc1
prices:
  per_gpu_hour: {V100: 0.9, A100: 1.6}
  per_vcpu_hour: 0.02
  per_gb_hour: 0.003
shapes:
  - {name: dc1-v100x8, gpu_type: V100, gpus: 8, vcpus: 48, mem_gb: 384, available: 12}
  - {name: dc1-a100x4, gpu_type: Tesla A100-SXM4-40GB, gpus: 4, vcpus: 64, mem_gb: 512}
"""


def test_onprem_yaml_prices_each_shape(tmp_path):
    result = import_onprem(write(tmp_path, [ONPREM_YAML], "dc1.yaml"))
    assert result.warnings == []
    v100 = shape(result, "dc1-v100x8")
    assert v100["price_per_hour"] == pytest.approx(8 * 0.9 + 48 * 0.02 + 384 * 0.003)
    assert (v100["gpu_type"], v100["gpus"], v100["available"], v100["source"]) == ("V100", 8, 12, "onprem:dc1")
    a100 = shape(result, "dc1-a100x4")
    assert a100["gpu_type"] == "A100" and pd.isna(a100["available"])
    assert a100["price_per_hour"] == pytest.approx(4 * 1.6 + 64 * 0.02 + 512 * 0.003)


def test_onprem_yaml_default_source_and_rates(tmp_path):
    text = "prices: {per_gpu_hour: {T4: 0.3}}\nshapes:\n  - {name: t4, gpu_type: T4, gpus: 4, vcpus: 48, mem_gb: 192}\n"
    result = import_onprem(write(tmp_path, [text], "lab.yml"))
    row = shape(result, "t4")
    assert row["source"] == "onprem:lab" and row["price_per_hour"] == pytest.approx(1.2)


@pytest.mark.parametrize(
    ("edit", "where", "needle"),
    [
        (("V100: 0.9, ", ""), ":7:gpu_type", "no prices.per_gpu_hour for V100"),
        (("per_vcpu_hour: 0.02", "per_vcpu_hour: -0.02"), ":4:prices.per_vcpu_hour", "non-negative"),
        (("A100: 1.6", "A100: -1"), ":3:prices.per_gpu_hour.A100", "non-negative"),
        ((" gpus: 8,", ""), ":7:gpus", "shapes[0]: missing key"),
        (("gpus: 8,", "gpus: 0,"), ":7:gpus", "shapes[0]: must be at least 1"),
        (("gpus: 4,", "gpus: four,"), ":8:gpus", "shapes[1]: not a number"),
        (("gpu_type: V100,", "gpu_type: A800,"), ":7:gpu_type", "no prices.per_gpu_hour for A800"),
        (("gpu_type: V100,", "gpu_type: 'bad name!',"), ":7:gpu_type", "not a GPU type name"),
        (("dc1-a100x4", "dc1-v100x8"), ":8:name", "duplicate key"),
        (("available: 12", "availble: 12"), ":7:availble", "unknown key"),
        (("shapes:\n", "shapez:\n"), ":6:shapez", "unknown key"),
        (("  per_gb_hour: 0.003\n", "  per_gb_hour: [0.003\n"), ":", "not valid YAML"),
        ((ONPREM_YAML, "- just\n- a list\n"), ":1", "top level must be a mapping"),
        (("source: onprem:dc1\n", "source: onprem:dc1\nsource: [\n"), ":", "not valid YAML"),
    ],
)
def test_onprem_yaml_errors_name_file_line_and_field(tmp_path, edit, where, needle):
    old, new = edit
    assert old in ONPREM_YAML
    path = write(tmp_path, [ONPREM_YAML.replace(old, new, 1)], "dc1.yaml")
    with pytest.raises(ContractError) as exc:
        import_onprem(path)
    lines = problem_lines(exc)
    assert any(line.startswith(f"{path}{where}") and needle in line for line in lines), lines


def test_onprem_yaml_reports_every_problem_at_once(tmp_path):
    text = ONPREM_YAML.replace("per_vcpu_hour: 0.02", "per_vcpu_hour: abc").replace("gpus: 8,", "gpus: 8.5,")
    text = text.replace("mem_gb: 512", "mem_gb: 0, rack: 3")
    path = write(tmp_path, [text], "dc1.yaml")
    with pytest.raises(ContractError) as exc:
        import_onprem(path)
    found = {(p.row, p.column) for p in exc.value.problems}
    assert found == {(4, "prices.per_vcpu_hour"), (7, "gpus"), (8, "mem_gb"), (8, "rack")}


def test_onprem_yaml_without_shapes_or_prices(tmp_path):
    path = write(tmp_path, ["source: onprem:x"], "x.yaml")
    with pytest.raises(ContractError) as exc:
        import_onprem(path)
    columns = {p.column for p in exc.value.problems}
    assert columns == {"prices", "shapes"}


ONPREM_CSV = """\
name,gpu_type,gpus,vcpus,mem_gb,price_per_gpu_hour,price_per_vcpu_hour,price_per_gb_hour,available
rack-a,V100,8,48,384,0.9,0.02,0.003,12
rack-b,RTX2080Ti,4,32,128,0.2,0.01,0,
"""


def test_onprem_csv(tmp_path):
    result = import_onprem(write(tmp_path, [ONPREM_CSV], "fleet.csv"))
    assert shape(result, "rack-a")["price_per_hour"] == pytest.approx(9.312)
    rack_b = shape(result, "rack-b")
    assert (rack_b["gpu_type"], rack_b["price_per_hour"], rack_b["source"]) == ("RTX2080Ti", 1.12, "onprem:fleet")


def test_onprem_csv_negative_price_is_an_error(tmp_path):
    path = write(tmp_path, [ONPREM_CSV.replace("0.2,0.01", "-0.2,0.01")], "fleet.csv")
    with pytest.raises(ContractError) as exc:
        import_onprem(path)
    assert problem_lines(exc) == [f"{path}:3:price_per_gpu_hour: must be at least 0, got -0.2"]


def test_load_catalog_dispatches_on_what_the_file_is(tmp_path):
    own_csv = CATALOG.write(build_default_catalog().shapes, tmp_path / "own.csv")
    own_parquet = CATALOG.write(load_default_catalog(), tmp_path / "own.parquet")
    cases = {
        own_csv: 119,
        own_parquet: 119,
        write(tmp_path, [ONPREM_YAML], "dc1.yaml"): 2,
        write(tmp_path, [ONPREM_CSV], "fleet.csv"): 2,
        AWS: 28,
    }
    for path, rows in cases.items():
        frame = load_catalog(path)
        assert len(frame) == rows, path
        assert list(frame.columns[: len(CATALOG.columns)]) == CATALOG.column_names


def test_load_catalog_reports_a_broken_catalog(tmp_path):
    path = write(tmp_path, ["name,gpu_type,gpus,vcpus,mem_gb,price_per_hour", "x,A100,eight,8,64,1.0"], "c.csv")
    with pytest.raises(ContractError) as exc:
        load_catalog(path)
    assert problem_lines(exc) == [f"{path}:2:gpus: not a number: 'eight'"]


# --- CLI ------------------------------------------------------------------------------------------------------

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_cli_import_skypilot_writes_a_valid_catalog(tmp_path, suffix):
    out = tmp_path / f"azure{suffix}"
    result = runner.invoke(app, ["catalog", "import", "--skypilot", str(AZURE), "--out", str(out)])
    assert result.exit_code == 0, result.output
    frame = CATALOG.load(out)
    assert len(frame) == 23 and frame.loc[frame["name"] == "azure:Standard_ND96isr_H100_v5", "gpus"].item() == 8
    assert "Radeon MI25" in result.stderr and "Standard_ND40s_v3" in result.stderr
    assert "wrote 23 node shapes" in result.stdout


def test_cli_import_with_region_and_cloud(tmp_path):
    out = tmp_path / "lambda.csv"
    args = ["catalog", "import", "--skypilot", str(LAMBDA), "--region", "us-east-1", "--cloud", "lambda"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert set(CATALOG.load(out)["region"]) == {"us-east-1"}


def test_cli_import_onprem(tmp_path):
    out = tmp_path / "dc1.csv"
    result = runner.invoke(app, ["catalog", "import", "--onprem", str(write(tmp_path, [ONPREM_YAML], "dc1.yaml")),
                                 "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert list(CATALOG.load(out)["name"]) == ["dc1-v100x8", "dc1-a100x4"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--skypilot", "{bad}"], "{bad}:3:vCPUs: not a number"),
        (["--skypilot", str(LAMBDA), "--region", "atlantis"], "no rows for region 'atlantis'"),
        (["--onprem", "{yaml}"], ":7:gpus"),
    ],
)
def test_cli_import_bad_input_exits_nonzero_and_writes_nothing(tmp_path, args, expected):
    bad = write(tmp_path, [AWS_HEADER, aws_row(), aws_row(instance="p3.2xlarge", vcpus="eight")])
    yaml_bad = write(tmp_path, [ONPREM_YAML.replace("gpus: 8,", "gpus: -8,")], "bad.yaml")
    args = [a.replace("{bad}", str(bad)).replace("{yaml}", str(yaml_bad)) for a in args]
    expected = expected.replace("{bad}", str(bad))
    out = tmp_path / "out.csv"
    result = runner.invoke(app, ["catalog", "import", *args, "--out", str(out)])
    assert result.exit_code == 1
    assert expected in result.stderr
    assert not out.exists() and not list(tmp_path.glob(".out.csv*"))


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--skypilot", str(AWS), "--onprem", str(AWS)],
        ["--skypilot", str(AWS), "--cloud", "oracle"],
    ],
)
def test_cli_import_usage_errors(tmp_path, args):
    out = tmp_path / "out.csv"
    result = runner.invoke(app, ["catalog", "import", *args, "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()


def test_cli_import_bad_output_suffix(tmp_path):
    result = runner.invoke(app, ["catalog", "import", "--skypilot", str(AWS), "--out", str(tmp_path / "c.txt")])
    assert result.exit_code == 1 and ".csv or .parquet" in result.stderr


def test_cli_show_default_catalog():
    result = runner.invoke(app, ["catalog", "show"], env=WIDE)
    assert result.exit_code == 0, result.output
    for needle in ("$/GPU-h", "vCPU/GPU", "GB/GPU", "lambda:gpu_8x_h100_sxm5", "gcp:a2-highgpu-1g", "skypilot"):
        assert needle in result.stdout


def test_cli_show_filters_and_sorts_by_price_per_gpu():
    result = runner.invoke(app, ["catalog", "show", "--gpu-type", "h100"], env=WIDE)
    assert result.exit_code == 0, result.output
    names = [line.split("│")[1].strip() for line in result.stdout.splitlines() if line.startswith("│")]
    h100 = load_default_catalog().query("gpu_type == 'H100'")
    assert len(names) == len(h100) and set(names) == set(h100["name"])
    per_gpu = (h100.set_index("name")["price_per_hour"] / h100.set_index("name")["gpus"])[names]
    assert per_gpu.is_monotonic_increasing and names[0] == "lambda:gpu_1x_h100_pcie"


def test_cli_show_a_file(tmp_path):
    path = write(tmp_path, [ONPREM_YAML], "dc1.yaml")
    result = runner.invoke(app, ["catalog", "show", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "dc1-v100x8" in result.stdout and "onprem:dc1" in result.stdout and "9.3120" in result.stdout


def test_cli_show_unknown_gpu_type_is_a_usage_error():
    result = runner.invoke(app, ["catalog", "show", "--gpu-type", "TPUv5"])
    assert result.exit_code == 2


def test_cli_show_broken_file_exits_1(tmp_path):
    path = write(tmp_path, ["name,gpu_type", "x,A100"], "c.csv")
    result = runner.invoke(app, ["catalog", "show", str(path)])
    assert result.exit_code == 1 and "missing required column" in result.stderr


def test_blank_spot_price_stays_blank_in_csv(aws):
    """The written catalog keeps spot prices blank where the source has none (no 'nan' text)."""
    text = aws.shapes.to_csv(index=False)
    row = next(r for r in csv.DictReader(io.StringIO(text)) if r["name"] == "aws:p4de.24xlarge")
    assert row["spot_price_per_hour"] == "" and not math.isnan(float(row["price_per_hour"]))
