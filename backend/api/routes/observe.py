"""Read endpoints for the console and the twin: the recorded traffic of a window as a
Mooncake-format trace (GET /v1/export/trace), per-agent state (GET /v1/agents) and request
statistics over a recent window (GET /v1/stats). Queries live in `backend.db`."""

import dataclasses
import json
import math
import time
from collections import Counter
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response
from pydantic import BaseModel, Field

from backend.api.auth import ApiKey
from backend.api.routes.admin import RuntimeDep, SessionsDep
from backend.api.schemas.errors import ErrorBody
from backend.db.request_log import list_requests
from backend.db.trace_export import export_trace
from backend.observe.measures import percentile
from backend.rpc.reports import AgentLoad
from backend.runtime import ConductorRuntime
from backend.runtime.runtime import AgentInfo
from backend.traces.loader import TRACE_BLOCK_SIZE

router = APIRouter(prefix="/v1", tags=["observe"])

NDJSON = "application/x-ndjson"
MAX_STATS_WINDOW_S = 7 * 24 * 3600.0
MAX_EXPORT_WINDOW_S = 31 * 24 * 3600.0
_ERRORS: dict[int | str, dict[str, object]] = {
    400: {"model": ErrorBody, "description": "Invalid window"},
    401: {"model": ErrorBody, "description": "Missing or invalid credentials"},
    503: {"model": ErrorBody, "description": "No database attached"},
}


class AgentView(BaseModel):
    instance_id: str
    role: str
    rpc_address: str
    data_address: str
    last_heartbeat_s: float
    seconds_since_heartbeat: float
    transport: str
    preset: str
    state: str = Field(description="active, or draining while its role is being switched")
    load: dict[str, float | int]
    num_indexed_blocks: int = Field(
        description="Blocks the Conductor's index believes this agent holds (its heartbeats "
        "report how many it does hold: load.num_dram_blocks + load.num_ssd_blocks)"
    )


class Percentiles(BaseModel):
    p50: float | None
    p90: float | None
    p99: float | None


class StatsView(BaseModel):
    window_s: float
    num_requests: int
    by_outcome: dict[str, int]
    rejections_by_reason: dict[str, int]
    rejections_by_stage: dict[str, int]
    failures_by_reason: dict[str, int]
    ttft_s: Percentiles


@router.get(
    "/export/trace",
    summary="Requests that arrived in [start_s, end_s) as a Mooncake-format JSONL trace",
    response_class=Response,
    responses={**_ERRORS, 200: {"content": {NDJSON: {}}, "description": "One row a line"}},
)
def export_trace_jsonl(
    principal: ApiKey,
    runtime: RuntimeDep,
    sessions: SessionsDep,
    start_s: Annotated[
        float, Query(description="Window start, Unix seconds; finite and below end_s")
    ],
    end_s: Annotated[float, Query(description="Window end, Unix seconds; finite, above start_s")],
    block_size: Annotated[
        int,
        Query(
            ge=1,
            le=1 << 20,
            description="Tokens per hash id: 512 as the public traces, or the Conductor's "
            "own block size, so every recorded cacheable block keeps its id.",
        ),
    ] = TRACE_BLOCK_SIZE,
) -> Response:
    if not (math.isfinite(start_s) and math.isfinite(end_s)) or end_s <= start_s:
        raise HTTPException(
            400, detail={"message": "need finite start_s < end_s", "code": "invalid_window"}
        )
    if end_s - start_s > MAX_EXPORT_WINDOW_S:
        message = f"an export spans at most {MAX_EXPORT_WINDOW_S:g} s; split the window"
        raise HTTPException(400, detail={"message": message, "code": "invalid_window"})
    runtime.flush_records()
    with sessions() as session:
        records = export_trace(session=session, start_s=start_s, end_s=end_s, block_size=block_size)
    body = "".join(
        json.dumps(record.to_json_dict(), separators=(",", ":")) + "\n" for record in records
    )
    return Response(body, media_type=NDJSON)


@router.get("/agents", summary="Each joined agent's role, addresses, heartbeat and load")
def read_agents(principal: ApiKey, runtime: RuntimeDep) -> list[AgentView]:
    return [
        agent_view(runtime, instance_id, agent)
        for instance_id, agent in sorted(runtime.agents().items())
    ]


def agent_view(runtime: ConductorRuntime, instance_id: str, agent: AgentInfo) -> AgentView:
    now_s = runtime.now_s()  # heartbeats are stamped on its clock
    with runtime.locked():
        num_indexed = runtime.core.index.num_blocks(instance_id)
    return AgentView(
        instance_id=instance_id,
        role=agent.join.role,
        rpc_address=agent.join.control_address,
        data_address=agent.join.data_address,
        last_heartbeat_s=agent.last_seen_s,
        seconds_since_heartbeat=max(0.0, now_s - agent.last_seen_s),
        transport=agent.join.transport,
        preset=agent.join.preset,
        state="draining" if agent.draining else "active",
        load=_load(agent.load),
        num_indexed_blocks=num_indexed,
    )


class LinkView(BaseModel):
    source: str = Field(description="The instance whose shard the KV came from")
    destination: str = Field(description="The prefill instance that fetched it")
    bandwidth_bytes_per_s: float | None = Field(
        description="Believed bandwidth from its fetches (None: no time beyond the latency)"
    )
    num_measurements: int = Field(description="Fetches the estimate rests on")


class LinksView(BaseModel):
    profile_bandwidth_bytes_per_s: float = Field(
        description="The cost model's bandwidth, used for every pair not measured yet"
    )
    latency_s: float = Field(description="The cost model's fixed latency of a transfer")
    measured: list[LinkView]


@router.get("/links", summary="The KV bandwidth the policy believes between prefill instances")
def read_links(principal: ApiKey, runtime: RuntimeDep) -> LinksView:
    """Each (source, destination) pair's bandwidth measured from its fetches, which Algorithm
    1's transfer branch uses (a slow link makes the Conductor fetch less from behind it)."""
    with runtime.locked():
        link = runtime.core.cost.link
        rows = runtime.core.links.snapshot()
    return LinksView(
        profile_bandwidth_bytes_per_s=link.bandwidth_bytes_per_s,
        latency_s=link.latency_s,
        measured=[LinkView.model_validate(row) for row in rows],
    )


@router.get(
    "/stats",
    summary="Outcomes, rejections by reason and stage, TTFT percentiles of the last window_s",
    responses=_ERRORS,
)
def read_stats(
    principal: ApiKey,
    runtime: RuntimeDep,
    sessions: SessionsDep,
    window_s: Annotated[float, Query(gt=0, le=MAX_STATS_WINDOW_S)] = 300.0,
) -> StatsView:
    runtime.flush_records()
    now_s = time.time()
    with sessions() as session:
        # Arrivals up to one window earlier may have finished inside this window.
        requests = list_requests(session=session, start_s=now_s - 2 * window_s, end_s=now_s + 1)
    finished = [
        r.outcome
        for r in requests
        if r.outcome is not None and r.outcome.finished_time_s >= now_s - window_s
    ]
    rejected = [o for o in finished if o.state == "rejected"]
    ttfts = sorted(o.ttft_s for o in finished if o.state == "completed" and o.ttft_s is not None)
    return StatsView(
        window_s=window_s,
        num_requests=len(finished),
        by_outcome=dict(Counter(o.state for o in finished)),
        rejections_by_reason=dict(Counter(o.reason or "unknown" for o in rejected)),
        rejections_by_stage=dict(Counter(o.stage or "unknown" for o in rejected)),
        failures_by_reason=dict(
            Counter(o.reason or "unknown" for o in finished if o.state == "failed")
        ),
        ttft_s=Percentiles(
            p50=percentile(ttfts, 50), p90=percentile(ttfts, 90), p99=percentile(ttfts, 99)
        ),
    )


def _load(load: AgentLoad) -> dict[str, float | int]:
    return dataclasses.asdict(load)
