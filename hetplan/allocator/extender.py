"""Moved to `hetplan.allocator.k8s.extender`; this name is kept so that existing imports keep working (the same
module object: `hetplan.allocator.extender is hetplan.allocator.k8s.extender`)."""

import sys

from hetplan.allocator.k8s import extender as _moved

sys.modules[__name__] = _moved
