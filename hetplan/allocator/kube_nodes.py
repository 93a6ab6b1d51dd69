"""Moved to `hetplan.allocator.k8s.nodes`; this name is kept so that existing imports keep working (the same
module object: `hetplan.allocator.kube_nodes is hetplan.allocator.k8s.nodes`)."""

import sys

from hetplan.allocator.k8s import nodes as _moved

sys.modules[__name__] = _moved
