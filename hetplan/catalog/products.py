"""The `nvidia.com/gpu.product` label the nodes of a catalog shape carry, and how it was chosen.

Kubernetes selects GPU nodes by that label, so a scheduler object (a Kueue ResourceFlavor, a node selector) must
name the board a shape really has: an Azure A100 80GB PCIe shape is `NVIDIA-A100-80GB-PCIe`, not the SXM4 label
of the type's common board. Three sources, in order:

1. `rule`: the shipped table `hetplan/data/catalog/gpu_products.csv` (a regular expression on the shape name
   per cloud instance family; see the PROVENANCE.md beside it);
2. `default-board`: a GPU type hetplan knows, on a shape no rule matches (owned fleets, other clouds): the label
   of the type's common board (`hetplan.gpus.K8S_PRODUCT`);
3. `derived`: a GPU type hetplan does not know (an opaque type, see `hetplan.gpus.canonical_gpu`):
   `NVIDIA-<canonical name>`, the form GPU feature discovery gives current NVIDIA boards.

Callers can override any shape's label (`gpu_product(..., overrides=...)`, basis `override`).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from hetplan.gpus import K8S_PRODUCT, UnknownGpuError, canonical_gpu
from hetplan.resources import data_path

Basis = Literal["override", "rule", "default-board", "derived"]


@dataclass(frozen=True)
class Product:
    """A shape's product label and why it is that one (`basis`, with the rule's note where a rule chose it)."""

    label: str
    basis: Basis
    note: str = ""


@lru_cache(maxsize=1)
def product_rules() -> tuple[tuple[re.Pattern[str], str, str], ...]:
    """The shipped rules: (compiled pattern, product label, basis note), first match wins."""
    with open(data_path("catalog", "gpu_products.csv"), newline="") as fh:
        return tuple((re.compile(row["pattern"]), row["product"], row["basis"]) for row in csv.DictReader(fh))


def gpu_product(shape: str, gpu_type: str, overrides: Mapping[str, str] | None = None) -> Product:
    """The `nvidia.com/gpu.product` label of shape `shape` (canonical `gpu_type`)."""
    if overrides and shape in overrides:
        return Product(overrides[shape], "override")
    for pattern, label, note in product_rules():
        if pattern.search(shape) and _gpu_type_of(label) == gpu_type:  # a rule never relabels another GPU type
            return Product(label, "rule", note)
    if gpu_type in K8S_PRODUCT:
        return Product(K8S_PRODUCT[gpu_type], "default-board", f"the common {gpu_type} board")
    return Product(f"NVIDIA-{gpu_type}", "derived", f"{gpu_type} is not a GPU type hetplan knows")


def _gpu_type_of(label: str) -> str | None:
    try:
        return canonical_gpu(label)
    except UnknownGpuError:
        return None
