"""The co-adaptive step decides exactly as it did before it was split into its stages and given its fast path:
every decision of a few small workloads (`tests/step_golden.py`) against the digests recorded on c75018c."""

from __future__ import annotations

import json

import pytest

from tests.step_golden import BLOCK, GOLDEN, WORKLOADS, digests

RECORDED = json.loads(GOLDEN.read_text())


def test_the_golden_file_covers_every_workload():
    assert set(RECORDED) == set(WORKLOADS)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_decisions_match_the_recorded_ones(name):
    lines = WORKLOADS[name]()
    got, want = digests(lines), RECORDED[name]["blocks"]
    first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if first is None and len(lines) == RECORDED[name]["lines"]:
        return
    k = first if first is not None else min(len(got), len(want)) - 1
    shown = "\n".join(lines[k * BLOCK:(k + 1) * BLOCK])
    pytest.fail(f"{name}: {len(lines)} lines (recorded {RECORDED[name]['lines']}); first differing block: lines "
                f"{k * BLOCK + 1}-{(k + 1) * BLOCK}, now:\n{shown}\n(compare with `tests/step_golden.py --print "
                f"{name}` on c75018c)")
