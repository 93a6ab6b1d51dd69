"""Controls behind two losses of the out-of-sample bench (`bench/evaluate.py`), one row group at a time.

`knees` (trace 2869ce, all clouds, 100 $/h): the status quo's nodes replayed with the sensitivity-aware setup
and with one thing changed at a time: oracle knees (`truth_hints`) instead of fitted ones, no re-size or move
costs, co-adaptive rounds with no hints (every job at its GPU-proportional share), placement-only knee hints
(`hint-static`), and the same arrivals without the 32-GPU gangs. JCT speedup as the bench reports it: over the
jobs every setup ran (here: those under 32 GPUs, the gangs hetplan's cluster cannot run).

`draws` (trace 2869ce, AWS + GCP + Azure, 100 $/h): the proportional baselines place on a node drawn at random
(`SimConfig.seed`); the GPU-only mix's and the status quo's average JCT over `--seeds` draws beside hetplan's.

Same inputs and seeds as `bench/evaluate.py`; prints Markdown rows, records nothing.
"""

from __future__ import annotations

import argparse

import pandas as pd

from hetplan.codesign.candidates import STATUS_QUO
from hetplan.evaluation import EvaluationResult, ProblemInputs, evaluate
from hetplan.hints import HintSet
from hetplan.planner.baselines import GPU_ONLY, HETPLAN, SENSITIVITY_AWARE
from hetplan.reference import default_profiles
from hetplan.sim.engine import SimConfig, simulate
from hetplan.sim.setups import truth_hints
from hetplan.sim.truth import TruthCurves
from common import fitted_curves, machine
from evaluate import catalogs, halves

TRACE = "gavel_philly_2869ce.trace"
JOB_COLUMNS = ["job_id", "model", "sim_model", "num_gpus", "arrival_s", "duration_s"]


def run_group(catalog: str, rhos: tuple[float, ...]) -> tuple[EvaluationResult, TruthCurves]:
    """The bench's row group (plan on the first half, replay the second) and the truth its replays read."""
    curves, _ = fitted_curves()
    truth = TruthCurves.from_profiles(default_profiles(), fallback=curves)
    plan_half, replay_half = halves(TRACE)
    result = evaluate(replay_half, ProblemInputs(curves, dict(catalogs())[catalog], 100.0), truth,
                      plan_trace=plan_half, rhos=rhos, relabel_unknown=True, seed=0)
    return result, truth.extended(next(iter(result.plans.values())).weighing.problem.defaults.curves)


def replayed(result: EvaluationResult, rho: float) -> pd.DataFrame:
    """The jobs the setups replayed at `rho`, in the order the simulator was given them."""
    jobs = result.jobs
    return jobs[(jobs["rho"] == rho) & (jobs["setup"] == STATUS_QUO)][JOB_COLUMNS].reset_index(drop=True)


def knees(rhos: tuple[float, ...]) -> None:
    result, truth = run_group("all clouds", rhos)
    aware = {s.name: s for s in result.setups[f"rho {rhos[0]:g}"]}[SENSITIVITY_AWARE]
    node = aware.nodes[0]
    per_gpu = (round(node.cpus * 1000 / node.gpus), round(node.mem_gb * 1024 / node.gpus))
    print(f"| model | fitted knee per GPU on {node.gpu_type} | truth speed at the knee | at the proportional "
          f"share ({node.cpus / node.gpus:g} cores, {node.mem_gb / node.gpus:g} GiB) |\n|---|---|---:|---:|")
    for model in sorted(set(replayed(result, rhos[0])["sim_model"])):
        entry = next((e for g in (1, 2, 4, 8) for e in aware.hints.lookup(model, g) if e.gpu_type == node.gpu_type),
                     None)  # knees are per GPU: any hinted class of the model
        if entry is not None:
            knee = truth.speed(model, node.gpu_type, 1, round(entry.cpus_per_gpu * 1000),
                               round(entry.mem_gb_per_gpu * 1024))
            print(f"| {model} | {entry.cpus_per_gpu:g} cores, {entry.mem_gb_per_gpu:g} GiB | {knee:.2f} | "
                  f"{truth.speed(model, node.gpu_type, 1, *per_gpu):.2f} |")
    print("| rho | variant | avg JCT h, all jobs | avg JCT h, < 32 GPUs | speedup, < 32 GPUs | avg JCT h, 32-GPU "
          "gangs | preemptions | moves | re-sizes |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for rho in rhos:
        setups = {s.name: s for s in result.setups[f"rho {rho:g}"]}
        quo, aware = setups[STATUS_QUO], setups[SENSITIVITY_AWARE]
        jobs = replayed(result, rho)
        oracle = truth_hints(truth, jobs[["model", "sim_model", "num_gpus"]].drop_duplicates(),
                             sorted({n.gpu_type for n in quo.nodes}))
        variants = [("status quo (proportional)", "proportional", HintSet.empty(), SimConfig("las")),
                    ("sensitivity-aware (fitted knees, rounds)", "hint", aware.hints, SimConfig("las")),
                    ("... oracle knees", "hint", oracle, SimConfig("las")),
                    ("... re-size 0 s, move 0 s", "hint", aware.hints,
                     SimConfig("las", migration_s=0.0, resize_s=0.0)),
                    ("... no hints (proportional shares, rounds)", "hint", HintSet.empty(), SimConfig("las")),
                    ("... placement only (`hint-static`)", "hint-static", aware.hints, SimConfig("las"))]
        base = None
        for name, policy, hints, config in variants:
            run = simulate(jobs, quo.nodes, truth, policy, hints, config)
            done = run.jobs
            small = done[done["num_gpus"] < 32]["jct_s"].mean() / 3600
            base = base or small
            print(f"| {rho:g} | {name} | {done['jct_s'].mean() / 3600:.2f} | {small:.2f} | {base / small:.2f}x | "
                  f"{done[done['num_gpus'] == 32]['jct_s'].mean() / 3600:.2f} | {run.counts['preemptions']:,} | "
                  f"{run.counts['migrations']:,} | {run.counts['resizes']:,} |")
        no_gangs = jobs[jobs["num_gpus"] < 32].reset_index(drop=True)
        without = [simulate(no_gangs, quo.nodes, truth, s.policy, s.hints, SimConfig("las")).jobs["jct_s"].mean()
                   / 3600 for s in (quo, aware)]
        print(f"| {rho:g} | without the 32-GPU gangs: status quo / sensitivity-aware | {without[0]:.2f} / "
              f"{without[1]:.2f} | | {without[0] / without[1]:.2f}x | | | | |")


def draws(rho: float, seeds: int) -> None:
    result, truth = run_group("AWS + GCP + Azure", (rho,))
    setups = {s.name: s for s in result.setups[f"rho {rho:g}"]}
    jobs = replayed(result, rho)
    done = result.jobs[(result.jobs["rho"] == rho) & (result.jobs["status"] == "completed")]
    common = set.intersection(*(set(g["job_id"]) for _, g in done.groupby("setup")))

    def avg(frame: pd.DataFrame) -> float:
        return frame[frame["job_id"].isin(common)]["jct_s"].mean() / 3600

    hetplan = avg(done[done["setup"] == HETPLAN])
    print(f"| seed | status quo h | GPU-only mix h | GPU-only speedup | hetplan speedup ({hetplan:.2f} h) |\n"
          "|---:|---:|---:|---:|---:|")
    for seed in range(seeds):
        quo, gpu_only = (avg(simulate(jobs, setups[name].nodes, truth, setups[name].policy, setups[name].hints,
                                      SimConfig("las", seed=seed)).jobs) for name in (STATUS_QUO, GPU_ONLY))
        print(f"| {seed} | {quo:.2f} | {gpu_only:.2f} | {quo / gpu_only:.2f}x | {quo / hetplan:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("control", choices=["knees", "draws"])
    parser.add_argument("--rhos", type=float, nargs="+", default=[1.0, 1.3])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    print(machine(), flush=True)
    if args.control == "knees":
        knees(tuple(args.rhos))
    else:
        draws(args.rhos[-1], args.seeds)


if __name__ == "__main__":
    main()
