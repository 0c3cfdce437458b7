"""Configuration endpoints: read the policy's knobs (GET /v1/config), change them with the
admin token (PUT /v1/config: validated, versioned, audited, applied to the running core) and
read the audit log (GET /v1/audit). `attach_database` gives an app made by `create_app` its
database and restores the last saved configuration, so a restart keeps it.
"""

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session, sessionmaker

from backend.api.auth import AdminToken, ApiKey
from backend.api.schemas.errors import ErrorBody
from backend.db import config_store
from backend.db.errors import ConfigVersionConflict
from backend.db.records import AuditEntry
from backend.policy.config import PolicyConfig, policy_from_json, policy_to_json
from backend.runtime import ConductorRuntime

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/v1", tags=["configuration"])

_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid configuration"},
    401: {"model": ErrorBody, "description": "Missing or invalid credentials"},
    403: {"model": ErrorBody, "description": "Needs the admin token"},
    409: {"model": ErrorBody, "description": "The configuration changed meanwhile"},
    503: {"model": ErrorBody, "description": "No database attached"},
}
# Agents joined with the block size and the index is keyed by it: fixed while running.
_FIXED_FIELDS = frozenset({"block_size"})


async def get_sessions(request: Request) -> sessionmaker[Session]:
    sessions = getattr(request.app.state, "sessions", None)
    if sessions is None:
        raise HTTPException(503, detail={"message": "no database attached", "code": "no_database"})
    return sessions


async def get_runtime(request: Request) -> ConductorRuntime:
    return get_runtime_of(request.app)


SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
RuntimeDep = Annotated[ConductorRuntime, Depends(get_runtime)]


class ConfigView(BaseModel):
    version: int | None = Field(description="The saved version in force; None before any save.")
    config: dict[str, Any]


class ConfigChange(BaseModel):
    """Fields of the policy config to change (the others keep their values)."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(
        description="e.g. {'kvcache_balancing_threshold': 4}; \"inf\" for an infinite number"
    )
    prediction: dict[str, Any] | None = Field(
        default=None, description="The twin's what-if report that motivated the change."
    )
    expected_version: int | None = Field(
        default=None, description="Refuse (409) unless this is still the current version."
    )


class AuditView(BaseModel):
    entry_id: int
    time_s: float
    actor: str
    action: str
    old_value: Any
    new_value: Any
    prediction: dict[str, Any] | None
    config_version: int | None


@router.get("/config", summary="The policy configuration in force", response_model=ConfigView)
async def read_config(principal: ApiKey, runtime: RuntimeDep, request: Request) -> ConfigView:
    version = getattr(request.app.state, "config_version", None)
    return ConfigView(version=version, config=policy_to_json(runtime.core.config))


@router.put(
    "/config",
    summary="Change the policy configuration (admin token): versioned, audited, applied now",
    description="A body that changes nothing (`{}`, or the values in force) saves no new "
    "version and writes no audit entry; it answers the version in force.",
    response_model=ConfigView,
    responses=_ERRORS,
)
def change_config(
    body: ConfigChange,
    principal: AdminToken,
    runtime: RuntimeDep,
    sessions: SessionsDep,
    request: Request,
) -> ConfigView:
    current = dataclasses.asdict(runtime.core.config)
    changes = policy_from_json(body.config)
    unknown = sorted(set(changes) - set(current))
    if unknown:
        raise _invalid(f"unknown setting(s): {', '.join(unknown)}")
    fixed = sorted(n for n in _FIXED_FIELDS & set(changes) if changes[n] != current[n])
    if fixed:
        raise _invalid(f"{', '.join(fixed)} cannot change while the Conductor runs")
    if changes.get("eviction_policy", current["eviction_policy"]) != current["eviction_policy"]:
        # The pools are the agents': their shards evict in their own order, set when they
        # start; a change here would reach the twin's model and not the cluster it models.
        raise _invalid(
            "eviction_policy cannot change while the cluster runs: the agents' pools keep "
            f"the order they started with ({current['eviction_policy']})"
        )
    try:
        config = PolicyConfig(**{**current, **changes})
    except (TypeError, ValueError) as error:
        raise _invalid(str(error)) from None
    new = policy_to_json(config)
    if config == runtime.core.config:  # nothing changes: no new version, nothing to audit
        version = getattr(request.app.state, "config_version", None)
        if body.expected_version is not None and body.expected_version != version:
            conflict = ConfigVersionConflict(body.expected_version, version)
            raise HTTPException(409, detail={"message": str(conflict), "code": "version_conflict"})
        return ConfigView(version=version, config=new)
    try:
        with sessions() as session:
            saved, _ = config_store.save_config_version(
                session=session,
                config=new,
                actor=principal.name,
                now_s=time.time(),
                expected_version=body.expected_version,
                prediction=body.prediction,
            )
    except ConfigVersionConflict as error:
        raise HTTPException(
            409, detail={"message": str(error), "code": "version_conflict"}
        ) from None
    apply_config(request.app, config, version=saved.version)
    logger.info("configuration version %d by %s", saved.version, principal.name)
    return ConfigView(version=saved.version, config=new)


@router.get("/audit", summary="The audit log, newest first", response_model=list[AuditView])
def read_audit(
    principal: ApiKey,
    sessions: SessionsDep,
    start_s: float | None = None,
    end_s: float | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> list[AuditView]:
    with sessions() as session:
        entries = config_store.list_audit(
            session=session, start_s=start_s, end_s=end_s, limit=limit
        )
    return [_audit_view(entry) for entry in entries]


def attach_database(app: FastAPI, sessions: sessionmaker[Session], *, now_s: float) -> int:
    """Give the app its database; apply the last saved configuration, or save the running
    one (from settings) as the first version. Returns the version in force.

    The block size always stays the settings' one: agents join with it.
    """
    app.state.sessions = sessions
    runtime = get_runtime_of(app)
    with sessions() as session:
        current = config_store.get_current_config(session=session)
        if current is None:
            current, _ = config_store.save_config_version(
                session=session,
                config=policy_to_json(runtime.core.config),
                actor="settings",
                now_s=now_s,
                action="config.initial",
            )
    stored = _known_fields(policy_from_json(current.config))
    stored["block_size"] = runtime.config.block_size
    apply_config(app, PolicyConfig(**stored), version=current.version)
    return current.version


def apply_config(app: FastAPI, config: PolicyConfig, *, version: int) -> None:
    """Switch the running core's knobs under the runtime's lock (the core's only owner), and
    the API's default SLOs with them."""
    runtime = get_runtime_of(app)
    runtime.reconfigure(config)
    app.state.served = dataclasses.replace(
        app.state.served, default_ttft_slo_s=config.ttft_slo_s, default_tbt_slo_s=config.tbt_slo_s
    )
    app.state.config_version = version


def get_runtime_of(app: FastAPI) -> ConductorRuntime:
    return app.state.served.runtime


def _known_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(PolicyConfig)}
    return {name: value for name, value in config.items() if name in names}


def _invalid(message: str) -> HTTPException:
    return HTTPException(400, detail={"message": message, "code": "invalid_config"})


def _audit_view(entry: AuditEntry) -> AuditView:
    return AuditView(
        entry_id=entry.entry_id,
        time_s=entry.time_s,
        actor=entry.actor,
        action=entry.action,
        old_value=entry.old_value,
        new_value=entry.new_value,
        prediction=dict(entry.prediction) if entry.prediction is not None else None,
        config_version=entry.config_version,
    )
