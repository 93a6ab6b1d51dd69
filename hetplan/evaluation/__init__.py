"""Evaluation: plan on one trace, replay another in the simulator, hetplan beside the status quo, the
sensitivity-aware status quo and the GPU-only mix, at the loads asked for (`evaluate`)."""

from __future__ import annotations

from hetplan.evaluation.evaluate import (
    ELASTIC_COLUMNS, ElasticEvaluation, EvaluationResult, LoadPoint, ProblemInputs, evaluate, load_points,
)

__all__ = ["ELASTIC_COLUMNS", "ElasticEvaluation", "EvaluationResult", "LoadPoint", "ProblemInputs", "evaluate",
           "load_points"]
