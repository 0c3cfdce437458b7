"""Admission under overload: accept a request or reject it early, with a reason and stage.

- `none`: accept everything the cluster can physically take.
- `baseline`: accept when the chosen prefill instance meets the TTFT SLO; decode load is
  checked only when the request reaches decode (late rejection, prefill wasted).
- `early`: also require the decode batch running now to take the request within the TBT SLO.
- `early-predicted`: like `early`, against the mean decode load predicted for the moment the
  request's prefill will finish (see decode_load.predicted_mean_ratio), the request's own KV
  counted `predicted_size_weight` times: near the limit the large requests go first.
"""

from dataclasses import dataclass
from typing import Literal

Stage = Literal["admission", "decode"]


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused; `retry_after_s` is a hint for the client's Retry-After."""

    reason: str
    stage: Stage
    message: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The loads admission looks at, computed by the core for the chosen instances.

    `prefill_load` is the chosen instance's TTFT over the TTFT SLO; the decode loads are TBT
    ratios. `predicted_decode_load` is None unless the policy is `early-predicted`.
    """

    estimated_ttft_s: float
    ttft_slo_s: float
    current_decode_load: float
    predicted_decode_load: float | None
    decode_time_s: float
    predicted_load_limit: float = 1.0
    # The request's own KV share of the predicted (mean) load, and how many times it counts
    # (PolicyConfig.predicted_size_weight): the first time is in predicted_decode_load.
    own_decode_share: float = 0.0
    predicted_size_weight: float = 1.0

    @property
    def prefill_load(self) -> float:
        return self.estimated_ttft_s / self.ttft_slo_s


def admit(policy: str, loads: LoadSnapshot) -> Rejection | None:
    """Apply the admission `policy` to `loads`: None accepts, a Rejection refuses."""
    if policy == "none":
        return None
    if loads.prefill_load > 1.0:
        excess_s = loads.estimated_ttft_s - loads.ttft_slo_s
        return Rejection(
            reason="ttft_slo",
            stage="admission",
            message=(
                f"prefill pool overloaded: estimated TTFT {loads.estimated_ttft_s:.2f} s "
                f"exceeds the {loads.ttft_slo_s:.2f} s SLO"
            ),
            retry_after_s=_hint(excess_s),
        )
    if policy == "baseline":
        return None
    if policy == "early":
        decode_load, limit = loads.current_decode_load, 1.0
        what = "current"
    else:
        assert loads.predicted_decode_load is not None, "early-predicted needs a prediction"
        extra = (loads.predicted_size_weight - 1.0) * loads.own_decode_share
        decode_load, limit = loads.predicted_decode_load + extra, loads.predicted_load_limit
        what = "predicted (this request's KV weighted by its size)" if extra else "predicted"
    if decode_load > limit:
        return Rejection(
            reason="tbt_slo",
            stage="admission",
            message=(
                f"decode pool overloaded: {what} load is {decode_load:.0%}, over "
                f"{limit:.0%} (TBT against its SLO, or KV memory)"
            ),
            retry_after_s=_hint(loads.decode_time_s * (decode_load - limit)),
        )
    return None


MAX_RETRY_AFTER_S = 3600.0


def _hint(wait_s: float) -> float:
    """A client's retry hint: the expected wait, between 1 s and an hour (a vanishing SLO
    would make it infinite)."""
    return min(max(1.0, wait_s), MAX_RETRY_AFTER_S)
