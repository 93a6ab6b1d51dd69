"""`python -m hetplan.cli.nightly`: steps of the nightly Airflow DAG, for where they run outside Airflow.

`profile-gpu` is what each profiling pod of the DAG's Kubernetes path runs (`hetplan_airflow.pods`): exactly
the local `profile` task, `hetplan.pipeline.profile_gpu`, on the shared workspace. Like that task it exits 0
when profiling fails (the status record then says "stale"); the record is printed as JSON.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

app = typer.Typer(name="hetplan-nightly", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)


@app.callback()
def _root() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


@app.command("profile-gpu")
def profile_gpu_command(
    workspace: Path = typer.Option(..., "--workspace", help="Workspace directory (the mounted shared workspace)."),
    run_key: str = typer.Option(..., "--run-key", help="The DAG run's key: files go to <workspace>/runs/<key>/."),
    gpu_type: str = typer.Option(..., "--gpu-type", help="GPU type to profile as (T4, L4, A100, ...)."),
    workload: str = typer.Option(..., "--workload", help="Built-in workload or module:function."),
    cpus: str = typer.Option(..., "--cpus", help="Cores per GPU to measure, e.g. 1,2,4."),
    mem_gb: str | None = typer.Option(None, "--mem-gb", help="RAM per GPU (GiB), e.g. 8,16 (default: the host's)."),
    warmup_s: float = typer.Option(2.0, "--warmup-s", min=0),
    measure_s: float = typer.Option(2.0, "--measure-s", min=0.01),
    repeats: int = typer.Option(2, "--repeats", min=1),
) -> None:
    """Profile one GPU type into the run directory (falling back to its last good profiles); print the status."""
    from hetplan.pipeline import profile_gpu

    status = profile_gpu(workspace, run_key, gpu_type, workload, cpus=cpus, mem_gb=mem_gb or None,
                         warmup_s=warmup_s, measure_s=measure_s, repeats=repeats)
    typer.echo(json.dumps(status))


if __name__ == "__main__":
    app()
