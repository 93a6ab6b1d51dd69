"""GPU name normalisation: the many spellings of clouds, NVML, Kubernetes labels and papers."""

import pytest

from hetplan.gpus import GPU_NAMES, UnknownGpuError, canonical_gpu, is_known_gpu, normalize_gpu


@pytest.mark.parametrize(
    ("spelling", "memory_gb", "canonical"),
    [
        ("V100", None, "V100"),
        ("Tesla V100-SXM2-16GB", None, "V100"),  # NVML
        ("Tesla-V100-SXM2-32GB", None, "V100-32GB"),  # k8s label nvidia.com/gpu.product
        ("V100M32", None, "V100-32GB"),  # Alibaba PAI
        ("V100-32GB", None, "V100-32GB"),  # Azure
        ("V100", 32.0, "V100-32GB"),
        ("A100", None, "A100"),
        ("A100", 80.0, "A100-80GB"),  # Lambda/AWS GpuInfo memory disambiguates
        ("A100-80GB", None, "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", None, "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", None, "A100"),
        ("A100-40GB", None, "A100"),  # Sia
        ("NVIDIA H100 80GB HBM3", None, "H100"),
        ("NVIDIA-H100-PCIe", None, "H100"),
        ("NVIDIA H200", None, "H200"),
        ("GH200", None, "GH200"),
        ("Tesla T4", None, "T4"),
        ("NVIDIA L4", None, "L4"),
        ("L40S", None, "L40S"),
        ("NVIDIA A10G", None, "A10G"),
        ("A10", None, "A10"),
        ("NVIDIA RTX A6000", None, "A6000"),
        ("A6000", None, "A6000"),
        ("RTX6000", None, "RTX6000"),
        ("Quadro RTX 6000", None, "RTX6000"),
        ("NVIDIA GeForce RTX 2080 Ti", None, "RTX2080Ti"),
        ("RTX2080Ti", None, "RTX2080Ti"),
        ("p100", None, "P100"),
        ("K80", None, "K80"),
    ],
)
def test_spellings_map_to_one_canonical_name(spelling, memory_gb, canonical):
    assert normalize_gpu(spelling, memory_gb) == canonical
    assert canonical in GPU_NAMES


@pytest.mark.parametrize("name", ["Radeon MI25", "MISC", "CPU", "", "A1000", "L400"])
def test_unknown_names_are_rejected_with_the_known_list(name):
    assert not is_known_gpu(name)
    with pytest.raises(UnknownGpuError, match="known: "):
        normalize_gpu(name)


@pytest.mark.parametrize(("name", "opaque"), [("A800", "A800"), ("NVIDIA H800", "H800"), ("Radeon MI25", "RADEON-MI25"),
                                             ("MISC", "MISC"), ("tesla_A800-SXM4-80GB", "A800-SXM4-80GB")])
def test_unknown_names_are_kept_as_opaque_types(name, opaque):
    assert canonical_gpu(name) == opaque and canonical_gpu(opaque) == opaque


@pytest.mark.parametrize("name", ["", "  ", "bad name!", "a/b", "x" * 65])
def test_names_that_cannot_be_gpu_types_are_refused(name):
    with pytest.raises(UnknownGpuError, match="not a GPU type name"):
        canonical_gpu(name)


def test_known_names_stay_canonical_through_canonical_gpu():
    assert canonical_gpu("Tesla V100-SXM2-32GB") == "V100-32GB" and canonical_gpu("A100", 80) == "A100-80GB"


def test_canonical_names_are_fixed_points():
    for name in GPU_NAMES:
        assert normalize_gpu(name) == name
