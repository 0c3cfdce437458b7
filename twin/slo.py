"""Default SLOs by the paper's rule: 10x the TTFT and 5x the TBT of a lone
request at the lowest rate, here a request of the trace's mean lengths on the profile."""

from collections.abc import Sequence

from backend.traces.loader import TraceRow
from twin.timing import TimingModel

TTFT_SLO_FACTOR = 10.0
TBT_SLO_FACTOR = 5.0


def derive_slos(timing: TimingModel, rows: Sequence[TraceRow]) -> tuple[float, float]:
    """(TTFT SLO s, TBT SLO s) for `rows` on `timing`, from one request alone on the cluster.

    A lone request's TTFT is its prefill plus the hand-over of its KV to decode; its TBT is
    the step time of a batch of one holding its prompt.
    """
    if not rows:
        return 30.0, 0.1
    mean_input_tokens = round(sum(row.input_length for row in rows) / len(rows))
    ttft_s = timing.prefill_s(mean_input_tokens, 0) + timing.transfer_s(
        mean_input_tokens * timing.kv_bytes_per_token
    )
    tbt_s = timing.decode_step_s(1, mean_input_tokens)
    return TTFT_SLO_FACTOR * ttft_s, TBT_SLO_FACTOR * tbt_s
