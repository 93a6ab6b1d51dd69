"""Test helper: hetplan's wheel, built from a copy of this checkout, and clean virtualenvs that install it.

The virtualenvs use pip's own cache (nothing is downloaded twice across runs) and the versions
requirements.txt pins, as constraints, like the production image (`Dockerfile`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE_IGNORE = shutil.ignore_patterns(".git", ".venv", ".hetplan", "build", "dist", "*.egg-info", "__pycache__",
                                       ".pytest_cache", ".hypothesis", "tests", "bench", "mlruns", ".env")
PIP_TIMEOUT_S = 1200


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a virtualenv's commands: this test run's PYTHONPATH and virtualenv left out."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.prefix))))
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def build_wheel(out: Path) -> Path:
    """hetplan's wheel, built by pip (isolated, as `pip install .` does) from a copy of the checkout."""
    src = out / "src"
    shutil.copytree(REPO, src, ignore=SOURCE_IGNORE)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out / "dist"),
                           str(src)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (out / "dist").glob("hetplan-*.whl")
    return wheel


def make_venv(path: Path, *pip_args: str, pinned: bool = True) -> Path:
    """A fresh virtualenv at `path`, `pip install <pip_args>` run in it (`pinned`: with requirements.txt as
    constraints); its bin/."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    pins = ["-c", str(REPO / "requirements.txt")] if pinned else []
    done = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", *pins, *pip_args],
                          capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=clean_env())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return path / "bin"
