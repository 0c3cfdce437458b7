"""Read endpoints for the console's live pages, and switching an agent's role.

GET /v1/report: the shared metrics and time series of a recorded window, in the twin
report's names (backend.observe.live_report). GET /v1/cache: the hottest blocks with their
replicas and holders, and each instance's pool occupancy by tier. POST
/v1/admin/agents/{instance_id}/role (admin token): drain an agent and switch its role,
audited.
"""

import math
import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from backend.api.auth import AdminToken, ApiKey
from backend.api.routes.admin import RuntimeDep, SessionsDep
from backend.api.routes.observe import AgentView, agent_view
from backend.api.schemas.errors import ErrorBody
from backend.db import cluster_log, config_store, request_log
from backend.observe.live_report import build_live_report, default_interval_s
from backend.policy.decode_load import forecast_error
from backend.runtime.roles import RoleSwitchRefused

router = APIRouter(prefix="/v1", tags=["observe"])

MAX_WINDOW_S = 7 * 24 * 3600.0
MAX_WINDOWS = 2_000
_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid window"},
    401: {"model": ErrorBody, "description": "Missing or invalid credentials"},
    503: {"model": ErrorBody, "description": "No database attached"},
}


class HotBlockView(BaseModel):
    key: str = Field(description="The block's chained xxh3_64 key, hexadecimal")
    depth: int = Field(description="Its position in the prompts that reuse it (0 = first)")
    hits: int = Field(description="Prefills that reused it")
    num_replicas: int
    holders: dict[str, str] = Field(description="instance id -> tier (dram or ssd)")


class PoolView(BaseModel):
    instance_id: str
    role: str
    dram_blocks: int
    ssd_blocks: int
    indexed_blocks: int = Field(description="Blocks the Conductor's index places there")
    dram_bytes: int
    dram_capacity_bytes: int
    ssd_bytes: int
    ssd_capacity_bytes: int


class CacheView(BaseModel):
    hot_blocks: list[HotBlockView]
    instances: list[PoolView]
    num_indexed_blocks: int


class RoleChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["prefill", "decode"]
    drain_timeout_s: float = Field(default=30.0, gt=0, le=600)


@router.get(
    "/report",
    summary="Metrics and time series of a recorded window, named as in the twin's report",
    responses=_ERRORS,
)
def read_report(
    principal: ApiKey,
    runtime: RuntimeDep,
    sessions: SessionsDep,
    window_s: Annotated[float, Query(gt=0, le=MAX_WINDOW_S)] = 300.0,
    start_s: Annotated[
        float | None, Query(description="Window start, Unix seconds; below end_s")
    ] = None,
    end_s: Annotated[
        float | None, Query(description="Window end, Unix seconds (default: now)")
    ] = None,
    interval_s: Annotated[float | None, Query(gt=0, le=MAX_WINDOW_S)] = None,
) -> dict[str, Any]:
    """Requests that arrived in [start_s, end_s) (default: the last `window_s`), with the
    pools' load sampled then; `interval_s` is the series' window (default: about 60)."""
    end_s = time.time() if end_s is None else end_s
    start_s = end_s - window_s if start_s is None else start_s
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s <= start_s:
        raise _bad_window("need finite start_s < end_s")
    if end_s - start_s > MAX_WINDOW_S:
        raise _bad_window(f"a window spans at most {MAX_WINDOW_S:g} s")
    interval_s = interval_s or default_interval_s(end_s - start_s)
    if (end_s - start_s) / interval_s > MAX_WINDOWS:
        raise _bad_window(f"at most {MAX_WINDOWS} series windows; raise interval_s")
    runtime.flush_records()
    with sessions() as session:
        requests = request_log.list_requests(session=session, start_s=start_s, end_s=end_s)
        decisions = request_log.list_decisions_between(
            session=session, start_s=start_s, end_s=end_s
        )
        samples = cluster_log.list_load_samples(session=session, start_s=start_s, end_s=end_s)
    report = build_live_report(
        runtime.config,
        requests,
        decisions,
        samples,
        start_s=start_s,
        end_s=end_s,
        interval_s=interval_s,
    )
    # early-predicted's forecasts of the window (kept in memory since this Conductor started).
    with runtime.locked():
        forecasts = runtime.core.forecasts.between(start_s, end_s)
    return {**report, **forecast_error(forecasts)}


@router.get("/cache", summary="Hottest blocks (hits, replicas, holders) and pool occupancy")
def read_cache(
    principal: ApiKey, runtime: RuntimeDep, limit: Annotated[int, Query(ge=1, le=1000)] = 20
) -> CacheView:
    index = runtime.core.index
    agents = runtime.agents()
    with runtime.locked():
        hot = [
            HotBlockView(
                key=f"{block.key:016x}",
                depth=block.depth,
                hits=block.hits,
                num_replicas=index.num_replicas(block.key),
                holders={i: str(tier) for i, tier in sorted(index.holders(block.key).items())},
            )
            for block in runtime.hits.top(limit)
        ]
        indexed = {instance_id: index.num_blocks(instance_id) for instance_id in agents}
        num_indexed_blocks = len(index)
    pools = [
        PoolView(
            instance_id=instance_id,
            role=agent.join.role,
            dram_blocks=agent.load.num_dram_blocks,
            ssd_blocks=agent.load.num_ssd_blocks,
            indexed_blocks=indexed.get(instance_id, 0),
            dram_bytes=agent.load.dram_bytes,
            dram_capacity_bytes=agent.load.dram_capacity_bytes,
            ssd_bytes=agent.load.ssd_bytes,
            ssd_capacity_bytes=agent.load.ssd_capacity_bytes,
        )
        for instance_id, agent in sorted(agents.items())
    ]
    return CacheView(hot_blocks=hot, instances=pools, num_indexed_blocks=num_indexed_blocks)


@router.post(
    "/admin/agents/{instance_id}/role",
    summary="Drain an agent and switch its role (admin token); audited",
    responses={
        **_ERRORS,
        403: {"model": ErrorBody, "description": "Needs the admin token"},
        404: {"model": ErrorBody, "description": "No such agent"},
        409: {"model": ErrorBody, "description": "Cannot switch now (last of its role, busy)"},
    },
)
async def switch_role(
    instance_id: str,
    body: RoleChange,
    principal: AdminToken,
    runtime: RuntimeDep,
    sessions: SessionsDep,
) -> AgentView:
    agent = runtime.agents().get(instance_id)
    if agent is None:
        raise HTTPException(
            404, detail={"message": f"no agent {instance_id!r} is joined", "code": "not_found"}
        )
    old_role = agent.join.role
    try:
        await run_in_threadpool(
            runtime.switch_role, instance_id, body.role, drain_timeout_s=body.drain_timeout_s
        )
    except LookupError as error:
        raise HTTPException(404, detail={"message": str(error), "code": "not_found"}) from None
    except RoleSwitchRefused as error:
        raise HTTPException(409, detail={"message": str(error), "code": "conflict"}) from None
    if old_role != body.role:
        with sessions() as session:
            config_store.record_audit(
                session=session,
                actor=principal.name,
                action="agent.role",
                now_s=time.time(),
                old_value={"instance_id": instance_id, "role": old_role},
                new_value={"instance_id": instance_id, "role": body.role},
            )
    return agent_view(runtime, instance_id, runtime.agents()[instance_id])


def _bad_window(message: str) -> HTTPException:
    return HTTPException(400, detail={"message": message, "code": "invalid_window"})
