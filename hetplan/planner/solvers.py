"""Solver backends: the same `MilpModel` solved by HiGHS (highspy) or Gurobi (gurobipy).

`auto` uses Gurobi when it is installed and the model fits its pip licence (at most 2,000 variables and
2,000 constraints), else HiGHS; a Gurobi size-limit error at solve time also falls back to HiGHS. Three
ways a solve can fail, each its own error with a one-line message: the licence is too small
(`LicenceError`), no plan exists (`InfeasibleError`), or the time limit passed before any plan was found
(`SolveTimeout`). A time limit reached *with* a plan returns it, with the solver's own gap. With
`bound=True` the LP relaxation is solved too and reported as the bound to measure the gap against.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from hetplan.planner.model import MilpModel

logger = logging.getLogger(__name__)

SolverName = Literal["auto", "gurobi", "highs"]
SOLVERS: tuple[str, ...] = ("auto", "gurobi", "highs")
GUROBI_PIP_LIMIT = 2000
GUROBI_SIZE_LIMIT_ERRNO = 10010


class SolveError(ValueError):
    """A solve that produced no plan; the message is one line a person can act on."""


class InfeasibleError(SolveError):
    """No plan satisfies the constraints (caps, budget, fairness floor or target)."""


class SolveTimeout(SolveError):
    """The time limit passed before the solver found any plan."""


class LicenceError(SolveError):
    """The model is larger than the installed solver's licence allows."""


@dataclass(frozen=True)
class Solution:
    values: np.ndarray
    objective: float
    lp_bound: float  # the LP relaxation's optimum (or the objective when no bound was asked for)
    gap: float  # |lp_bound - objective| / max(|lp_bound|, 1e-9)
    mip_gap: float  # the solver's own gap against its best bound
    solver: str
    seconds: float
    timed_out: bool = False  # the time limit stopped the search; `values` is the best plan found by then


def gurobi_fits(model: MilpModel) -> bool:
    """True when gurobipy imports and the model is within its size-limited pip licence."""
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False
    return model.num_vars <= GUROBI_PIP_LIMIT and model.num_rows <= GUROBI_PIP_LIMIT


def solve(model: MilpModel, solver: SolverName = "auto", time_limit: float = 60.0, gap: float = 1e-3,
          bound: bool = False) -> Solution:
    """Solve the MILP (and with `bound` its LP relaxation) with the chosen backend."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; one of {', '.join(SOLVERS)}")
    if solver == "gurobi" or (solver == "auto" and gurobi_fits(model)):
        try:
            return _timed(_solve_gurobi, model, time_limit, gap, bound)
        except _SizeLimit:
            if solver == "gurobi":
                raise LicenceError(f"the model ({model.num_vars} variables, {model.num_rows} constraints) exceeds "
                                   f"gurobipy's size-limited licence ({GUROBI_PIP_LIMIT} of each); use --solver "
                                   f"highs or auto") from None
            logger.info("gurobipy refused the model's size; solving with HiGHS")
        except ImportError:
            raise LicenceError("gurobipy is not installed; use --solver highs or auto") from None
    return _timed(_solve_highs, model, time_limit, gap, bound)


class _SizeLimit(RuntimeError):
    pass


def _timed(backend, model: MilpModel, time_limit: float, gap: float, bound: bool) -> Solution:
    start = time.perf_counter()
    values, objective, mip_gap, name, timed_out = backend(model, time_limit, gap, relax=False)
    lp = backend(model, time_limit, gap, relax=True)[1] if bound else objective
    seconds = time.perf_counter() - start
    rel = abs(lp - objective) / max(abs(lp), 1e-9)
    return Solution(values, objective, lp, rel, mip_gap, name, seconds, timed_out)


@contextlib.contextmanager
def stdout_to_stderr():
    """HiGHS prints a banner on the process's stdout (fd 1) when its first instance is made; send it to
    stderr (fd 2), where logs go, whatever Python's `sys.stdout` is at the time."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _solve_highs(model: MilpModel, time_limit: float, gap: float, relax: bool):
    import highspy

    with stdout_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.num_vars, model.num_rows
    lp.col_cost_ = model.cost
    lp.col_lower_, lp.col_upper_ = model.lower, np.where(np.isinf(model.upper), highspy.kHighsInf, model.upper)
    lp.row_lower_ = np.where(np.isinf(model.row_lower), -highspy.kHighsInf, model.row_lower)
    lp.row_upper_ = np.where(np.isinf(model.row_upper), highspy.kHighsInf, model.row_upper)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = model.matrix.indptr
    lp.a_matrix_.index_ = model.matrix.indices
    lp.a_matrix_.value_ = model.matrix.data
    lp.sense_ = highspy.ObjSense.kMaximize if model.maximize else highspy.ObjSense.kMinimize
    pinned = model.lower[model.integer] == model.upper[model.integer]
    if not relax and not pinned.all():
        lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                           for i in model.integer]
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status in (highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kUnboundedOrInfeasible):
        raise InfeasibleError("no plan satisfies the constraints (budget, availability caps, fairness or target)")
    info = h.getInfo()
    values = np.array(h.getSolution().col_value)
    timed_out = status == highspy.HighsModelStatus.kTimeLimit
    if len(values) != model.num_vars or info.primal_solution_status == 0:
        if timed_out:
            raise SolveTimeout(f"HiGHS found no plan within the time limit ({time_limit:g} s); raise --time-limit")
        raise SolveError(f"HiGHS stopped without a plan ({h.modelStatusToString(status)})")
    mip_gap = 0.0 if relax or not len(lp.integrality_) else float(info.mip_gap)
    return values, float(info.objective_function_value), mip_gap, "highs", timed_out


def _solve_gurobi(model: MilpModel, time_limit: float, gap: float, relax: bool):
    import gurobipy as gp
    from gurobipy import GRB

    with gp.Env(params={"OutputFlag": 0}) as env, gp.Model(env=env) as m:
        m.Params.TimeLimit = float(time_limit)
        m.Params.MIPGap = float(gap)
        m.Params.Threads = 1
        vtype = np.where(model.integer & (not relax), GRB.INTEGER, GRB.CONTINUOUS)
        x = m.addMVar(model.num_vars, lb=model.lower, ub=model.upper, vtype=vtype)
        finite_hi = ~np.isinf(model.row_upper)
        finite_lo = ~np.isinf(model.row_lower)
        csr = model.matrix.tocsr()
        if finite_hi.any():
            m.addMConstr(csr[finite_hi], x, "<", model.row_upper[finite_hi])
        if finite_lo.any():
            m.addMConstr(csr[finite_lo], x, ">", model.row_lower[finite_lo])
        m.setObjective(model.cost @ x, GRB.MAXIMIZE if model.maximize else GRB.MINIMIZE)
        try:
            m.optimize()
        except gp.GurobiError as exc:
            if exc.errno == GUROBI_SIZE_LIMIT_ERRNO:
                raise _SizeLimit(str(exc)) from exc
            raise
        if m.Status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
            raise InfeasibleError("no plan satisfies the constraints (budget, availability caps, fairness or target)")
        timed_out = m.Status == GRB.TIME_LIMIT
        if m.SolCount == 0:
            if timed_out:
                raise SolveTimeout(f"Gurobi found no plan within the time limit ({time_limit:g} s); raise --time-limit")
            raise SolveError(f"Gurobi stopped without a plan (status {m.Status})")
        mip_gap = 0.0 if relax or not model.integer.any() else float(m.MIPGap)
        return np.array(x.X), float(m.ObjVal), mip_gap, "gurobi", timed_out
