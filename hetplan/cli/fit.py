"""`hetplan fit` and `hetplan curves`: fit sensitivity models, look at knees and curves."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import typer
from rich.table import Table

from hetplan.cli.common import CurvesFile, console, contract_errors, curves_or_default, errors, warn
from hetplan.contracts import CURVES, PROFILES
from hetplan.contracts.plan import fingerprint
from hetplan.contracts.table import ContractError, Problem
from hetplan.gpus import REFERENCE, normalize_gpu
from hetplan.progress import Reporter
from hetplan.sensitivity import DEFAULT_KNEE_FRACTION, FitReport, fit_profiles

EXIT_PARTIAL = 3
DEFAULT_CURVES = Path(".hetplan/curves.parquet")
DEFAULT_SCALING = Path(".hetplan/scaling.csv")
# The GPU-proportional share speedups are measured against: the reference allocation's (Synergy's server).
PROPORTIONAL_SHARE = REFERENCE[1:]

curves_app = typer.Typer(help="Look at fitted sensitivity curves: knees, speedups, plots.", no_args_is_help=True)


def fit(
    profiles: Path = typer.Option(..., "--profiles", help="Profile records (CSV or Parquet)."),
    out: Path = typer.Option(DEFAULT_CURVES, "--out", help="Curve table to write (.parquet or .csv)."),
    tracking_uri: str | None = typer.Option(None, "--tracking-uri", help="MLflow URI (default $MLFLOW_TRACKING_URI "
                                            "or sqlite:///.hetplan/mlflow.db)."),
    no_mlflow: bool = typer.Option(False, "--no-mlflow", help="Do not log runs or register models."),
    gpu_types: str = typer.Option("", "--gpu-types", help="Comma-separated GPU types that need a curve even "
                                  "without points (transferred)."),
    knee_fraction: float = typer.Option(DEFAULT_KNEE_FRACTION, "--knee-fraction", min=0.5, max=1.0),
    scaling: bool = typer.Option(False, "--scaling", help="Also fit the multi-GPU scaling models (Pollux's form) "
                                 "per (model, GPU type) and log them to MLflow (experiment hetplan-scaling)."),
    scaling_profile: Path | None = typer.Option(None, "--scaling-profile", help="Measured multi-GPU step times "
                                                "(default: the shipped copy of Sia's)."),
    scaling_out: Path = typer.Option(DEFAULT_SCALING, "--scaling-out", help="Scaling table to write (CSV)."),
) -> None:
    """Fit a monotone throughput model per (model, GPU type); exit 3 if some pairs had to be skipped."""
    job = None
    if scaling:
        fit_scaling_models(scaling_profile, scaling_out, None if no_mlflow else tracking_uri, not no_mlflow)
    with Reporter("fit", errors) as progress:
        with contract_errors():
            table = PROFILES.load(profiles)
            extra = [normalize_gpu(g) for g in gpu_types.split(",") if g.strip()]
            report = fit_profiles(table, extra, knee_fraction, progress=progress)
            if report.curves.empty:
                raise ContractError([Problem(str(profiles), f"no (model, GPU type) could be fitted: "
                                             f"{'; '.join(str(s) for s in report.skipped)}")])
            CURVES.write(report.curves, out)
        if not no_mlflow:
            progress(0, 0, "logging to MLflow")
            from hetplan.sensitivity.tracking import log_fit_job
            from hetplan.tracking import tracking_uri as resolve_uri

            uri = resolve_uri(tracking_uri)
            job = log_fit_job(report, uri, params={"profiles": str(profiles), "profiles_sha256": fingerprint(profiles),
                                                   "knee_fraction": str(knee_fraction)},
                              profiles=table, profiles_source=str(profiles), progress=progress)
    if job is not None:
        promoted = sum(r.promoted for r in job.registrations)
        console.print(f"MLflow: run {job.parent_run_id} in experiment hetplan-sensitivity; "
                      f"{len(job.registrations)} models registered, {promoted} now champion, "
                      f"{len(job.unchanged)} unchanged", highlight=False)
    _summary(report, out)
    warn(str(s) for s in report.skipped)
    if report.skipped:
        raise typer.Exit(EXIT_PARTIAL)


def fit_scaling_models(profile: Path | None, out: Path, tracking_uri: str | None, log: bool) -> None:
    """`hetplan fit --scaling`: fit and write the scaling table, warn of rejected profile rows (file and row, one
    line each), log to MLflow when `log`. A profile that cannot be read is one error line and exit 2."""
    from hetplan.scaling import ProfileError, fit_scaling, leave_one_type_out, load_profile, load_single_gpu
    from hetplan.scaling.data import SHIPPED

    try:
        table = load_profile(profile or SHIPPED)
    except ProfileError as exc:
        errors.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    result = fit_scaling(table, load_single_gpu())
    warn(f"{p}; {p.model} on {p.gpu_type} uses a borrowed shape (source = borrowed)" for p in result.rejected)
    fitted = result.table()
    out.parent.mkdir(parents=True, exist_ok=True)
    fitted.to_csv(out, index=False)
    counts = fitted["source"].value_counts().to_dict()
    console.print(f"[green]wrote[/] {out}: scaling models {counts}", highlight=False)
    if log:
        from hetplan.scaling.tracking import log_scaling

        run = log_scaling(result, table, leave_one_type_out(table), tracking_uri,
                          params={"scaling_profile": str(profile or SHIPPED)})
        console.print(f"MLflow: run {run} in experiment hetplan-scaling", highlight=False)


def _summary(report: FitReport, out: Path) -> None:
    per_method = report.curves.groupby(["model", "gpu_type"])["method"].first().value_counts().to_dict()
    console.print(f"[green]wrote[/] {out}: {per_method.get('fit', 0)} fitted and {per_method.get('transferred', 0)} "
                  f"transferred curves, {len(report.skipped)} skipped", highlight=False)
    if report.fits:
        winners = pd.Series([f.estimator_name for f in report.fits]).value_counts().to_dict()
        mape = pd.Series([f.cv_mape for f in report.fits])
        console.print(f"estimators chosen by CV: {winners}; CV MAPE median {mape.median():.1%}, max {mape.max():.1%}",
                      highlight=False)


@curves_app.command("show")
def show(
    curves: CurvesFile = None,
    model: str | None = typer.Option(None, "--model", help="Only this model."),
    share: str = typer.Option(f"{PROPORTIONAL_SHARE[0]:g},{PROPORTIONAL_SHARE[1]:g}", "--share",
                              help="GPU-proportional share 'cores,GB' per GPU that speedups compare against."),
) -> None:
    """A table of knees and the speedup of the knee over the GPU-proportional share, per (model, GPU type)."""
    cores, mem = _share(share)
    curves = curves_or_default(curves)
    with contract_errors():
        table = CURVES.load(curves)
        if model is not None:
            table = table[table["model"] == model]
            if table.empty:
                raise ContractError([Problem(str(curves), f"no curves for model {model!r}", column="model")])
    out = Table(title=f"knees ({table['knee_fraction'].iloc[0]:.0%} of plateau) and speedup over "
                f"{cores:g} cores + {mem:g} GB per GPU")
    for column in ("model", "gpu_type", "method", "knee cores", "knee GB", "collapse below GB", "plateau",
                   "speedup", "CV MAPE / uncertainty"):
        out.add_column(column, justify="left" if column in ("model", "gpu_type", "method") else "right")
    for (name, gpu), rows in table.groupby(["model", "gpu_type"]):
        first = rows.iloc[0]
        at_share = _value_at(rows, cores, mem)
        speedup = f"{first['plateau'] / at_share:.2f}x" if at_share > 0 else "-"
        error = (f"{first['cv_mape']:.1%}" if first["method"] == "fit"
                 else f"±{first['uncertainty']:.0%} (from {first['source'].split(':', 1)[1]})")
        out.add_row(str(name), str(gpu), str(first["method"]), f"{first['knee_cpus']:g}", f"{first['knee_mem_gb']:g}",
                    f"{first['collapse_mem_gb']:g}", f"{first['plateau']:,.0f}", speedup, error)
    unit = table["throughput_unit"].dropna().unique()
    out.caption = f"throughput in {unit[0] if len(unit) == 1 else 'per-GPU units'}; sources: " + ", ".join(
        sorted(table["source"].unique()))
    console.print(out)


def _share(text: str) -> tuple[float, float]:
    try:
        cores, mem = (float(x) for x in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not 'cores,GB' (e.g. 3,62.5)", param_hint="--share") from None
    return cores, mem


def _value_at(rows: pd.DataFrame, cores: float, mem: float) -> float:
    """Throughput at the grid point nearest to (cores, mem) from below."""
    below = rows[(rows["cpus_per_gpu"] <= cores) & (rows["mem_gb_per_gpu"] <= mem)]
    return float(below["throughput"].max()) if len(below) else 0.0


@curves_app.command("plot")
def plot(
    model: str = typer.Option(..., "--model", help="Model to plot on every GPU type."),
    out: Path = typer.Option(..., "--out", help="PNG to write."),
    curves: CurvesFile = None,
) -> None:
    """Plot one model's curves on every GPU type (most RAM; knees starred; transferred dashed)."""
    from hetplan.sensitivity.plots import plot_model

    curves = curves_or_default(curves)
    with contract_errors():
        table = CURVES.load(curves)
        if model not in set(table["model"]):
            raise ContractError([Problem(str(curves), f"no curves for model {model!r}", column="model")])
    figure = plot_model(table, model)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    console.print(f"[green]wrote[/] {out}")
