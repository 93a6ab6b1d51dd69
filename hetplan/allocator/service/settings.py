"""How the service runs: `ServiceSettings` (from arguments or `HETPLAN_ALLOCATOR_*` variables)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from hetplan.allocator.policies import POLICIES

TOKEN_ENV = "HETPLAN_ADMIN_TOKEN"
WRITE_TOKEN_ENV = "HETPLAN_WRITE_TOKEN"
KiB = 1024


class ServiceSettings(BaseModel):
    """How the service runs. `from_env` reads `HETPLAN_ALLOCATOR_*` variables (and `HETPLAN_ADMIN_TOKEN`,
    `HETPLAN_WRITE_TOKEN`)."""

    model_config = ConfigDict(extra="forbid")

    db: Path = Path(".hetplan") / "allocator.db"
    store: Path | None = None  # hint store root; None: $HETPLAN_HINT_STORE or .hetplan/hints
    policy: str = "hint"
    strict: bool = False  # hint policy only: place a class only on the GPU types its hints list
    token: SecretStr | None = None
    write_token: SecretStr | None = None  # allocate, release, adopt need it (or the admin token); None: open
    nodes: Path | None = None  # nodes to upsert at start-up (JSON, YAML or CSV)
    kubeconfig: Path | None = None  # sync the nodes with this cluster's Nodes (`k8s.nodes`); None: no sync
    hint_poll_seconds: float = Field(1.0, ge=0)
    max_body_bytes: int = Field(64 * KiB, ge=1)
    max_extender_body_bytes: int = Field(32 * KiB * KiB, ge=1)  # Nodes mode carries whole v1.Node objects
    synchronous: Literal["FULL", "NORMAL", "EXTRA"] = "FULL"
    tick_seconds: float = Field(60.0, ge=0)  # a scheduling round every so often; 0: only on request
    order: Literal["las", "fifo"] = "las"  # the queue's order (`hetplan.scheduler.orders`)
    regrow: bool = True  # after a release the freed nodes' jobs grow at once (False: at the next round, as simulated)
    action_log: int = Field(10_000, ge=1)  # actions kept for GET /v1/actions
    scaling_models: Path | None = None  # `hetplan fit --scaling`'s table: rounds choose elastic jobs' counts

    @model_validator(mode="after")
    def _known_policy(self) -> ServiceSettings:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; one of {', '.join(sorted(POLICIES))}")
        if self.strict and self.policy not in ("hint", "hint-static"):
            raise ValueError("strict applies to the hint policy only")
        return self

    @classmethod
    def from_env(cls) -> ServiceSettings:
        values: dict[str, Any] = {}
        for field in cls.model_fields:
            raw = os.environ.get(f"HETPLAN_ALLOCATOR_{field.upper()}")
            if raw is not None:
                values[field] = raw
        if "token" not in values and os.environ.get(TOKEN_ENV):
            values["token"] = os.environ[TOKEN_ENV]
        if "write_token" not in values and os.environ.get(WRITE_TOKEN_ENV):
            values["write_token"] = os.environ[WRITE_TOKEN_ENV]
        return cls.model_validate(values)
