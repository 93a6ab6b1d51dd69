"""Alibaba's pod list through the webhook and the controller on the STAND-IN API server (issue 22). From the root:

    .venv/bin/python bench/k8s_replay.py [--pods 1000] [--stretch 3000] [--seconds 120] [--hinted] [--no-record]

Fleet and pods: cluster-trace-gpu-v2023 (`bench/data/openb/`, see PROVENANCE.md), its 1,213 GPU nodes as v1.Nodes on
the stand-in (`tests/standin_apiserver.py`, NOT a real kube-apiserver), and its first `--pods` pods with their
creations and deletions, each pod's lifetime multiplied by `--stretch` (as `bench/pods_ticks.py`: a denser
cluster; **synthetic density**), the trace's time compressed so that the events take about `--seconds` (as fast
as admission answers where that is slower). A GPU-sharing pod (`gpu_milli` < 1000) asks one whole GPU
(`nvidia.com/gpu` is whole in Kubernetes). `hetplan serve` (hint policy, tick 1 s, node sync from the stand-in)
and two `hetplan controller` replicas run as subprocesses; every pod is created through the API (the webhook asks
the allocator) and ended at its deletion (Succeeded). With `--hinted` each pod is a model of the **derived** hint
table drawn at random (seeded; **synthetic**) and those hints are served, so that pods are re-sized and moved.

Checked: every pod placed by the allocator ran with at least its own request (what the stand-in kubelet actuated,
at its end); no node's actuated resources above its allocatable at any pod change (the stand-in checks every
change); after the last event, 0 drift and every allocation released once every pod ended.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import commit, machine, record  # noqa: E402
from hetplan.allocator.replay import pod_events  # noqa: E402
from hetplan.hints import HintStore  # noqa: E402
from k8s_rig import OPENB, Rig, openb_nodes, replay_events  # noqa: E402
from standin_apiserver import eventually  # noqa: E402

CONTROLLER = ["--poll", "0.2", "--reconcile", "10", "--orphan-grace", "10", "--checkpoint-grace", "0.2",
              "--lease-seconds", "5", "--allocate-wait", "15"]


def first_pods(count: int, stretch: float) -> list:
    """The creations and deletions of the pod list's first `count` pods (by creation), in trace order."""
    events = pod_events(OPENB / "openb_pod_list_default.csv", stretch=stretch)
    keep = {e.body["job_id"] for e in events if not e.release}
    keep = set(sorted(keep)[:count])
    return [e for e in events if e.body["job_id"] in keep]


def run(count: int, stretch: float, seconds: float, hinted: bool, root: Path) -> dict:
    events = first_pods(count, stretch)
    store = root / "store"
    if hinted:  # each pod a model of the DERIVED hint table, drawn at random (seeded): synthetic
        sys.path.insert(0, str(REPO / "bench"))
        from allocator import derived_hints

        from allocator_helpers import make_plan

        frame = derived_hints()
        HintStore(store).publish(make_plan("bench-derived"), frame)  # the table names its plan
        models = sorted(set(frame["model"]))
        rng = random.Random(0)
        named = {e.body["job_id"]: rng.choice(models) for e in events if not e.release}
        events = [e if e.release else replace(e, body={**e.body, "model": named[e.body["job_id"]]}) for e in events]
    else:
        store.mkdir()
    rig = Rig(root, openb_nodes(), store, ["--tick", "1", "--hint-poll", "0.5"], CONTROLLER)
    try:
        rig.start(timeout=300)
        result = replay_events(rig, events, seconds)
        started = time.monotonic()
        eventually(lambda: not rig.drift(), 120)
        quiet = time.monotonic() - started
        for pod in rig.managed():  # what still runs (pods without a deletion in the trace) ends now
            rig.api.finish(*(pod["metadata"]["namespace"], pod["metadata"]["name"]))
        eventually(lambda: rig.allocations() == {}, 120)
        actions = rig.actions()["actions"]
    finally:
        rig.close()
    kinds = {k: sum(a["kind"] == k for a in actions) for k in ("start", "stop", "resize", "migrate")}
    waits = sorted(rig.api.bind_waits.values())
    return {**result, "quiet": quiet, "kinds": kinds, "overcommits": rig.api.overcommits, "waits": waits,
            "webhook_failures": rig.api.webhook_failures, "nodes": len(rig.nodes), "events": len(events)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--stretch", type=float, default=3000.0)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--hinted", action="store_true")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        r = run(args.pods, args.stretch, args.seconds, args.hinted, Path(tmp))
    c = r["counts"]
    head = commit()
    lines = [f"\n## Alibaba's pods through the webhook and the controller on the stand-in API server "
             f"(`bench/k8s_replay.py`, issue 22), {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n",
             f"Run: `.venv/bin/python bench/k8s_replay.py --pods {args.pods} --stretch {args.stretch:g} --seconds "
             f"{args.seconds:g}{' --hinted' if args.hinted else ''}`; {machine()}; commit {head}; "
             f"{time.perf_counter() - t0:.0f} s. The STAND-IN API server (not a real kube-apiserver), {r['nodes']:,} "
             f"nodes of the trace; lifetimes x{args.stretch:g} (**synthetic density**); GPU-sharing pods ask a whole "
             "GPU; " + ("models a seeded draw from the **derived** hint table (**synthetic**)" if args.hinted else
                        "no hints (the trace's pods carry no model)") + ".\n",
             "| pod events | pods asked / served by the webhook / default path | actions: start, stop, resize, "
             "migrate | pods below their own request (at their end) | overcommitted node changes | pods that waited "
             "for room (longest) | drift after the last event | replay wall |", "|---:|---|---|---:|---:|---|---|---:|",
             f"| {r['events']:,} | {c['asked']:,} / {c['served']:,} / {c['default-path']:,} | "
             f"{', '.join(str(r['kinds'][k]) for k in ('start', 'stop', 'resize', 'migrate'))} | {len(r['below'])} | "
             f"{len(r['overcommits'])} | {len(r['waits'])} ({max(r['waits'], default=0):.1f} s) | 0 after "
             f"{r['quiet']:.1f} s | {c['wall_s']} s |", ""]
    print("\n".join(lines))
    if r["below"] or r["overcommits"]:
        print("below:", r["below"][:5], "overcommits:", r["overcommits"][:5])
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
