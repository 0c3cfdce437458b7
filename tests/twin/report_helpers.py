"""Helpers of the twin output tests: reports built by hand and a reader of HTML pages.

The reports are plain data in the shape twin.run.simulate returns, small enough to check
every figure and table built from them by hand.
"""

from html.parser import HTMLParser
from pathlib import Path

from twin.config import TwinConfig

METRICS = {
    "num_requests": 4,
    "num_completed": 3,
    "num_rejected": 1,
    "num_rejected_admission": 1,
    "num_rejected_decode": 0,
    "num_failed": 0,
    "num_cancelled": 0,
    "ttft_p50_s": 2.0,
    "ttft_p90_s": 2.8,
    "ttft_p99_s": 2.98,
    "ttft_mean_s": 2.0,
    "tbt_p50_s": 0.02,
    "tbt_p90_s": 0.03,
    "tbt_p99_s": 0.04,
    "slo_attainment": 0.75,
    "goodput_rps": 0.1,
    "cache_hit_ratio": 0.25,
    "block_hit_ratio": 0.25,
    "reachable_hit_ratio": 0.5,
    "wasted_prefill_tokens": 0,
    "wasted_prefill_s": 0.0,
    "prefill_load_amplitude": 0.4,
    "prefill_load_period_s": 20.0,
    "decode_load_amplitude": 0.3,
    "decode_load_period_s": None,
    "num_transferred_tokens": 512,
    "num_replicated_blocks": 1,
    "sim_duration_s": 30.0,
    "sim_wall_s": 0.01,
}


def fake_report(
    config: TwinConfig | None = None,
    *,
    ttfts: tuple[float | None, ...] = (1.0, 2.0, 3.0, None),
    rejected: dict[str, list[int]] | None = None,
    **metrics: object,
) -> dict:
    """A report of `config` with one request per TTFT (None: rejected at admission)."""
    config = config or TwinConfig(ttft_slo_s=30.0, tbt_slo_s=0.1)  # as simulate resolves them
    requests = [
        {
            "id": f"r{index}",
            "arrival_s": float(index),
            "input_tokens": 1024,
            "output_tokens": 10,
            "outcome": "completed" if ttft is not None else "rejected",
            "reason": None if ttft is not None else "ttft_slo",
            "stage": None if ttft is not None else "admission",
            "prefill_instance": "prefill-00" if ttft is not None else None,
            "decode_instance": "decode-00" if ttft is not None else None,
            "ttft_s": ttft,
            "estimated_ttft_s": ttft,
            "tbt_mean_s": 0.02 if ttft is not None else None,
            "tbt_max_s": 0.03 if ttft is not None else None,
            "reused_tokens": 0,
            "reachable_tokens": 0,
            "transferred_tokens": 0,
            "finish_s": float(index) + (ttft or 0.0),
        }
        for index, ttft in enumerate(ttfts)
    ]
    series = {
        "interval_s": 10.0,
        "t_s": [0.0, 10.0, 20.0],
        "prefill_load": [0.2, 0.9, 0.4],
        "decode_load": [0.1, 0.3, 0.8],
        "admitted": [2, 1, 0],
        "completed": [1, 1, 1],
        "rejected": rejected if rejected is not None else {"admission:ttft_slo": [1, 0, 0]},
        "ttft_p50_s": [1.5, 3.0, None],
        "ttft_p90_s": [1.9, 3.0, None],
    }
    return {
        "format": "kvcentric-twin-report/1",
        "config": config.to_dict(),
        "trace": {"label": "fake", "num_rows": len(ttfts), "minutes": None},
        **METRICS,
        **metrics,
        "rejected_by_reason": {"admission:ttft_slo": 1},
        "series": series,
        "requests": requests,
    }


class PageParser(HTMLParser):
    """Collects the script sources and div ids of an HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.script_sources: list[str] = []
        self.div_ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script" and values.get("src"):
            self.script_sources.append(values["src"] or "")
        if tag == "div" and values.get("id"):
            self.div_ids.append(values["id"] or "")


def parse_page(path: Path) -> PageParser:
    """The page at `path`, parsed (HTMLParser raises nothing on bad HTML, so check fields)."""
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    return parser
