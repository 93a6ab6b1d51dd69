"""Test helper: hetplan's wheel, built from a copy of this checkout, and clean virtualenvs that install it.

The virtualenvs install the versions requirements.txt pins, as constraints, like the production image
(`Dockerfile`), with one pinned pip (`PIP_VERSION`, fetched once by `download_pip` and installed from that wheel
into each virtualenv): the pip that CPython 3.11's ensurepip bundles (23.2) took about three times as long to
resolve the image's 210 packages. pip installs without byte-compiling (`--no-compile`): compiling every module of
every package was most of an install's time, and a test imports a fraction of them, which Python compiles on
first import and caches in the virtualenv for the next command (`clean_env` lets it write that bytecode).
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
PIP_VERSION = "26.2.1"  # the installer of every test virtualenv (and of the wheel's isolated build)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a virtualenv's commands: this test run's PYTHONPATH and virtualenv left out, and
    bytecode written (the virtualenv's modules are compiled once, on first import, not by each command)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.prefix))))
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def download_pip(out: Path) -> Path:
    """pip `PIP_VERSION`'s wheel, downloaded into `out` (a wheel of pip runs as pip: `python <wheel>/pip`)."""
    done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                           "-d", str(out), f"pip=={PIP_VERSION}"], capture_output=True, text=True,
                          timeout=PIP_TIMEOUT_S, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob(f"pip-{PIP_VERSION}-*.whl")
    return wheel


def build_wheel(out: Path, pip: Path) -> Path:
    """hetplan's wheel, built by `pip` (a wheel of pip; isolated, as `pip install .` does) from a copy of the
    checkout."""
    src = out / "src"
    shutil.copytree(REPO, src, ignore=SOURCE_IGNORE)
    done = subprocess.run([sys.executable, str(pip / "pip"), "wheel", "--no-deps", "-q", "-w", str(out / "dist"),
                           str(src)], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (out / "dist").glob("hetplan-*.whl")
    return wheel


def make_venv(path: Path, *pip_args: str, pip: Path, pinned: bool = True) -> Path:
    """A fresh virtualenv at `path` with `pip` (a wheel of pip) installed, then `pip install <pip_args>` run in it
    (`pinned`: with requirements.txt as constraints; not byte-compiled, see above); its bin/."""
    venv.EnvBuilder(with_pip=False, clear=True).create(path)
    python = str(path / "bin" / "python")
    for argv in ([python, str(pip / "pip"), "install", "-q", "--no-index", "--no-compile", str(pip)],
                 [python, "-m", "pip", "install", "-q", "--no-compile",
                  *(["-c", str(REPO / "requirements.txt")] if pinned else []), *pip_args]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=clean_env())
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return path / "bin"
