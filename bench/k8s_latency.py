"""From an action's number to its PATCH: the controller on the STAND-IN API server (issue 22). Run from the root:

    .venv/bin/python bench/k8s_latency.py [--pods 200] [--repeats 1] [--no-record]

The e2e's setting (`tests/k8s_rig.py`; the stand-in is `tests/standin_apiserver.py`, NOT a real kube-apiserver):
`hetplan serve` (hint policy, tick 1 s, node sync from the stand-in) and two `hetplan controller` replicas as
subprocesses, 40 nodes of 3 GPU types, pods of 6 models (1/2/4 GPUs, **synthetic**) arriving every 40 ms and
running 1-6 s. Side by side in one run, each setting `--repeats` times:

- `steady`: no kill; the controller's defaults (`--poll 0.2`, 8 workers) but a 2 s lease;
- `serial`: the same with `--workers 1` (a batch's actions applied one after the other, as before issue 22's end);
- `kills`: the leader SIGKILLed at pods 30% and 70%, the service at 50%, `--poll 0.2`, lease 2 s.

For each: the delay from every `resize` action's `at` (the allocator's clock, when it was logged) to the stand-in
receiving the PATCH of the pod's resize subresource with its cores and RAM; p50/p99 over all actions, and p99 over
the actions logged while a leader was alive (outside the windows from a leader's SIGKILL to the first Lease write
by another replica); the windows' lengths; overcommits (actuated resources above allocatable at any pod change).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import commit, machine, record  # noqa: E402
from k8s_rig import Rig, cluster, quantile, run_pods, without_leader  # noqa: E402

SERVE = ["--tick", "1", "--hint-poll", "0.5"]
BASE = ["--reconcile", "30", "--orphan-grace", "3", "--checkpoint-grace", "0.3", "--lease-seconds", "2",
        "--allocate-wait", "15"]
SETTINGS = {"steady": (["--poll", "0.2", "--workers", "8"], False),
            "serial": (["--poll", "0.2", "--workers", "1"], False),
            "kills": (["--poll", "0.2", "--workers", "8"], True)}


def run(setting: str, count: int, seed: int) -> dict:
    args, kills = SETTINGS[setting]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rig = Rig(root, cluster(root), root / "store", SERVE, BASE + args)
        try:
            rig.start()
            at = {round(count * 0.3): "controller", round(count * 0.5): "service", round(count * 0.7): "controller"}
            run_pods(rig, count, seed, at if kills else {})
            actions = rig.actions()["actions"]
        finally:
            rig.close()
    delays = rig.resize_delays(actions)
    windows = rig.leaderless()
    alive = [d for d, a in delays if not without_leader(a, windows)]
    for d, a in delays:
        if d > 1:  # what came before a slow one, for the record
            print(f"slow: {d:.2f} s {a['job_id']} seq {a['seq']}, "
                  f"{'in' if without_leader(a, windows) else 'outside'} a leaderless window; its actions:", [
                (x["seq"], x["kind"], round(x["at"] - a["at"], 2)) for x in actions if x["job_id"] == a["job_id"]])
    return {"delays": [d for d, _ in delays], "alive_delays": alive,
            "resizes": sum(a["kind"] == "resize" for a in actions), "matched": len(delays),
            "p50": quantile([d for d, _ in delays], 0.5), "p99": quantile([d for d, _ in delays], 0.99),
            "max": max((d for d, _ in delays), default=float("nan")),
            "alive": len(alive), "alive_p99": quantile(alive, 0.99), "windows": [b - a for a, b in windows],
            "overcommits": len(rig.api.overcommits)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--settings", default="steady,serial,kills", help="comma-separated, of steady, serial, kills")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {s: [] for s in args.settings.split(",")}
    started = time.perf_counter()
    for k in range(args.repeats):  # interleaved, so that the machine's load hits the settings alike
        for setting in results:
            results[setting].append(run(setting, args.pods, 22 + k))
            print(setting, results[setting][-1], flush=True)
    head = commit()
    lines = [f"\n## The controller: an action's number to its PATCH, on the stand-in API server (`bench/k8s_latency.py`, "
             f"issue 22), {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC\n",
             f"Run: `.venv/bin/python bench/k8s_latency.py --pods {args.pods} --repeats {args.repeats}`; {machine()}; "
             f"commit {head}; {time.perf_counter() - started:.0f} s. The STAND-IN API server on loopback "
             "(not a real kube-apiserver), 40 nodes, pods of 6 models (**synthetic**); the delays of all repeats "
             "pooled.\n",
             "| setting | resize actions (PATCHed) | p50 | p99, all | p99, a leader alive (actions) | max | "
             "leaderless windows | overcommits |", "|---|---:|---:|---:|---:|---:|---|---:|"]
    for setting, runs in results.items():
        delays = [d for r in runs for d in r["delays"]]  # pooled over the repeats (~40 a run: a run's p99 is its max)
        alive = [d for r in runs for d in r["alive_delays"]]
        windows = ", ".join(f"{w:.1f}" for r in runs for w in r["windows"]) or "none"
        lines.append(f"| `{setting}` | {sum(r['resizes'] for r in runs)} ({len(delays)}) | {quantile(delays, 0.5):.3f} s"
                     f" | {quantile(delays, 0.99):.3f} s | {quantile(alive, 0.99):.3f} s ({len(alive)}) | "
                     f"{max(delays, default=float('nan')):.3f} s | {windows} s | "
                     f"{sum(r['overcommits'] for r in runs)} |")
    lines.append("")
    print("\n".join(lines))
    if not args.no_record:
        record(lines)


if __name__ == "__main__":
    main()
