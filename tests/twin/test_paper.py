"""twin.paper: the experiments it runs, the doc it writes, and a whole run on a short trace."""

import json
from itertools import islice
from pathlib import Path

from backend.traces.loader import load_trace
from tests.twin.report_helpers import parse_page
from twin.paper import (
    CACHE_CAPACITIES,
    CACHE_POLICIES,
    PLACEHOLDER,
    load_account,
    paper_experiments,
    render_doc,
    run_paper,
)


def test_experiments_cover_the_paper_settings():
    experiments = paper_experiments()

    schedulers = experiments["schedulers"]
    assert [c.scheduler for c in schedulers] == [
        "random",
        "load-balancing",
        "cache-aware",
        "kvcache-centric",
    ]
    assert {(c.num_prefill, c.num_decode, c.speed, c.rejection) for c in schedulers} == {
        (8, 8, 1.0, "none")
    }
    overload = experiments["overload"]
    assert {(c.rejection, c.speed) for c in overload} == {
        (r, s) for r in ("baseline", "early", "early-predicted") for s in (1.0, 2.0, 3.0, 4.0, 5.0)
    }
    assert {(c.num_prefill, c.num_decode, c.scheduler) for c in overload} == {
        (8, 8, "kvcache-centric")
    }
    assert {c.num_prefill + c.num_decode for c in experiments["splits"]} == {16}


def fake_summary() -> dict:
    def row(**values: object) -> dict:
        return {"num_requests": 100, "slo_attainment": 0.9, "goodput_rps": 1.0, **values}

    return {
        "trace": {"file": "t.jsonl", "num_rows": 100},
        "base_config": {"num_prefill": 8},
        "schedulers": [
            row(scheduler=name, ttft_mean_s=mean, ttft_p90_s=2 * mean)
            for name, mean in (
                ("random", 40.0),
                ("load-balancing", 20.0),
                ("cache-aware", 30.0),
                ("kvcache-centric", 10.0),
            )
        ],
        "overload": [
            row(rejection=name, speed=speed, num_rejected=7 if speed == 2.0 else 1)
            for name in ("baseline", "early", "early-predicted")
            for speed in (1.0, 2.0, 3.0, 4.0, 5.0)
        ],
        "splits": [row(split="8:8", speed=1.0, ttft_mean_s=1.0, num_rejected=0)],
        "decode_bound": [
            row(rejection=name, num_rejected=n)
            for name, n in (("baseline", 9), ("early", 8), ("early-predicted", 6))
        ],
        "policies": [
            row(split=split, speed=speed, rejection=name, num_rejected=n, goodput_rps=g)
            for split in ("7:1", "6:2")
            for speed in (1.0, 2.0)
            for name, n, g in (("baseline", 9, 1.0), ("early", 8, 1.1), ("early-predicted", 6, 1.2))
        ],
        "cache": [
            {"policy": policy, "capacity_blocks": capacity, "hit_ratio": 0.123}
            for policy in CACHE_POLICIES
            for capacity in CACHE_CAPACITIES
        ],
    }


def test_doc_puts_our_numbers_beside_the_papers_and_says_what_differs(tmp_path):
    doc = render_doc(fake_summary(), tmp_path / "out", tmp_path / "docs" / "results.md")

    assert "| random | 40.00 | 80.00 | 92.07 | 0.43 | 1.000 | 1.000 |" in doc
    assert "| baseline | 7 |" in doc and "| 4,183 |" in doc
    assert "| 1,000 | 0.123 | 0.300 |" in doc
    assert "| unlimited | 0.123 | 0.510 |" in doc
    # Orders are computed, ties shown as ties, and a mismatch is said plainly.
    assert "ours random > cache-aware > load-balancing > kvcache-centric" in doc
    assert "(a different order)" in doc
    assert "ours baseline = early = early-predicted; paper baseline > early" in doc
    assert doc.count(PLACEHOLDER.split("{")[0]) == 8
    assert "[schedulers.html](../out/schedulers.html)" in doc
    assert "| early-predicted | 6 |" in doc  # the decode-bound table
    # (f): the policies side by side per split and speed, and how many cells follow Table 3.
    assert "| 7:1 | 1.0 | baseline | 9 |" in doc
    assert "4 have policies that reject different numbers of requests; of those, 4 follow" in doc
    assert "in 4 early-predicted has the highest goodput" in doc


def test_the_hand_written_account_fills_its_sections(tmp_path):
    account_file = tmp_path / "paper-account.md"
    account_file.write_text("## a\nSchedulers explained.\n\n## differences\nAll of them.\n")
    account = load_account(account_file)
    doc = render_doc(fake_summary(), tmp_path / "out", tmp_path / "results.md", account)
    assert "Schedulers explained." in doc and "All of them." in doc
    assert doc.count(PLACEHOLDER.split("{")[0]) == 6  # b, b', c, d, e, f still open


def test_a_whole_run_writes_every_table_page_and_the_doc(shipped_trace, tmp_path):
    num_rows = len(load_trace(shipped_trace, minutes=(0.0, 1.0)))
    trace = tmp_path / "short.jsonl"
    with open(shipped_trace) as lines:
        trace.write_text("".join(islice(lines, num_rows)))
    out, doc = tmp_path / "out", tmp_path / "docs" / "paper-results.md"
    ticks: list[tuple[int, int]] = []

    summary = run_paper(
        trace, out, doc_path=doc, workers=2, on_progress=lambda *tick: ticks.append(tick)
    )

    experiments = paper_experiments()
    assert len(summary["schedulers"]) == 4
    assert len(summary["overload"]) == len(experiments["overload"])
    assert len(summary["cache"]) == len(CACHE_POLICIES) * len(CACHE_CAPACITIES)
    assert ticks[-1][0] == ticks[-1][1] == len(ticks)
    assert json.loads((out / "paper.json").read_text()) == json.loads(json.dumps(summary))
    assert len(summary["policies"]) == len(experiments["policies"]) == 45
    for name in ("schedulers", "overload", "splits", "cache", "policies"):
        assert (out / f"{name}.csv").is_file()
        assert parse_page(out / f"{name}.html").div_ids
    reports = json.loads((out / "reports.json").read_text())
    assert all("requests" not in r for r in reports["overload"])
    text = doc.read_text()
    assert f"{num_rows:,} requests" in text
    assert Path("../out/overload.html").as_posix() in text
