"""Benchmark: wall time of one `airflow dags test hetplan_nightly` on the embedded defaults.

A fresh AIRFLOW_HOME (SQLite, `airflow db migrate` first, timed apart), a fresh workspace and MLflow SQLite
store in a temporary directory; the DAG's default params otherwise (token-batch measured at 1 and 2 cores as
T4, every model x GPU type fitted and registered, plan under 200 $/h). Appends a dated section to
bench/RESULTS.md unless `--no-record`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).with_name("RESULTS.md")
AIRFLOW = Path(sys.executable).with_name("airflow")


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=env["AIRFLOW_HOME"])
    return time.perf_counter() - start, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--no-record", action="store_true", help="Do not append to bench/RESULTS.md.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hetplan-nightly-") as tmp:
        home = Path(tmp)
        env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
               "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
               "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}"}
        migrate_s, done = timed([str(AIRFLOW), "db", "migrate"], env)
        done.check_returncode()
        conf = json.dumps({"workspace": str(home / "ws")})
        wall_s, done = timed([str(AIRFLOW), "dags", "test", "hetplan_nightly", "-c", conf], env)
        if done.returncode != 0:
            sys.stderr.write(done.stdout[-5000:] + done.stderr[-5000:])
            raise SystemExit(f"airflow dags test failed (rc={done.returncode})")
        latest = (home / "ws" / "hints" / "LATEST").read_text().strip()
    print(f"db migrate {migrate_s:.1f} s; airflow dags test hetplan_nightly {wall_s:.1f} s; published {latest}")
    if not args.no_record:
        section = (f"\n## Nightly DAG wall time ({dt.date.today().isoformat()})\n\n"
                   f"`python bench/nightly.py` on {os.cpu_count()} cores, Python {platform.python_version()}: "
                   f"`airflow dags test hetplan_nightly` on the DAG's default params (token-batch measured for "
                   f"real at 1 and 2 cores as T4, 2 s windows x 2; all 7 models x 17 GPU types fitted and "
                   f"registered in MLflow on SQLite; plan under 200 $/h; hints published), fresh AIRFLOW_HOME "
                   f"and workspace.\n\n"
                   f"| step | wall time |\n|---|---|\n| `airflow db migrate` (once) | {migrate_s:.1f} s |\n"
                   f"| `airflow dags test hetplan_nightly` | {wall_s:.1f} s |\n\n"
                   f"Target: under 5 minutes.\n")
        with RESULTS.open("a") as handle:
            handle.write(section)


if __name__ == "__main__":
    main()
