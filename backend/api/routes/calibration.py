"""GET /v1/calibration: what the Conductor believes against what its agents measured.

The cost model in force and the profile it started from, the last refit (what it updated,
why other parts kept their fit), every measurement of the window with the believed time
beside it and the residuals, and the live cluster as a twin profile (what a what-if replays
on by default, `backend.observe.live_profile`).
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from backend.api.auth import ApiKey
from backend.api.routes.admin import RuntimeDep
from backend.observe.live_profile import live_profile, profile_inputs

router = APIRouter(prefix="/v1", tags=["observe"])


@router.get("/calibration", summary="Believed vs measured prefill and decode-step times")
def read_calibration(
    principal: ApiKey,
    runtime: RuntimeDep,
    max_points: Annotated[
        int, Query(ge=0, le=4096, description="The newest measurements of each kind to list.")
    ] = 500,
    inputs: Annotated[
        bool,
        Query(
            description="Also every measurement of the window, the agents and the links the "
            "live profile is built from (`profile_inputs`: what `twin validate` keeps, so "
            "`twin repredict --rebuild-profile` can build it again)."
        ),
    ] = False,
) -> dict[str, Any]:
    calibrator = runtime.calibrator
    with runtime.locked():
        refit = calibrator.last_refit
        residuals = calibrator.residuals()
        window = calibrator.snapshot()
        joins = [agent.join for agent in runtime.agents_locked()]
        links = runtime.core.links.snapshot()
        view: dict[str, Any] = {
            "enabled": runtime.calibrate,
            "status": "calibrated"
            if calibrator.num_refits and refit and refit.updated
            else "profile",
            "num_refits": calibrator.num_refits,
            "last_refit_s": calibrator.last_refit_s if calibrator.num_refits else None,
            "updated": list(refit.updated) if refit else [],
            # What the window lacks now (a refit would keep those parts' fits).
            "notes": calibrator.shortfalls(),
            "believed": calibrator.cost.to_profile(),
            "base": calibrator.base.to_profile(),
            "window": {
                "window_s": calibrator.config.window_s,
                "num_prefill": len(calibrator.prefill),
                "num_decode": len(calibrator.decode),
                "num_serving": len(calibrator.serving),
            },
            "prefill_median_rel_err": residuals["prefill_median_rel_err"],
            "decode_median_rel_err": residuals["decode_median_rel_err"],
            "prefill": residuals["prefill"][-max_points:] if max_points else [],
            "decode": residuals["decode"][-max_points:] if max_points else [],
        }
    # The profile's fits read the snapshot, so requests are not held up behind them.
    view["profile"] = live_profile(window, joins, links=links)
    if inputs:
        view["profile_inputs"] = profile_inputs(window, joins, links)
    return view
