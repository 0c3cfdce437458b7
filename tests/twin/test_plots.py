"""twin.plots: what each figure draws from a report, and an HTML page that works offline."""

from tests.twin.report_helpers import fake_report, parse_page
from twin.config import TwinConfig
from twin.plots import (
    PLOTLY_JS,
    load_figure,
    metric_vs_parameter_figure,
    rejections_figure,
    ttft_cdf_figure,
    write_page,
)


def test_ttft_cdf_sorts_the_first_token_times_and_ends_at_one():
    report = fake_report(ttfts=(3.0, None, 1.0, 2.0))

    figure = ttft_cdf_figure({"a": report, "b": fake_report(ttfts=(5.0,))})

    first, second = figure.data
    assert first.name == "a"
    assert list(first.x) == [1.0, 2.0, 3.0]  # the rejected request has no TTFT
    assert list(first.y) == [1 / 3, 2 / 3, 1.0]
    assert list(second.x) == [5.0] and list(second.y) == [1.0]


def test_ttft_cdf_thins_long_curves_but_keeps_both_ends():
    report = fake_report(ttfts=tuple(float(t) for t in range(10_001)))

    (curve,) = ttft_cdf_figure({"run": report}, max_points=100).data

    assert len(curve.x) <= 101
    assert (curve.x[0], curve.y[0]) == (0.0, 1 / 10_001)
    assert (curve.x[-1], curve.y[-1]) == (10_000.0, 1.0)


def test_load_figure_draws_both_pools_of_every_run():
    runs = {"early": fake_report(), "early-predicted": fake_report()}

    figure = load_figure(runs)

    assert [trace.name for trace in figure.data] == [
        "early prefill",
        "early decode",
        "early-predicted prefill",
        "early-predicted decode",
    ]
    assert list(figure.data[1].y) == [0.1, 0.3, 0.8]
    assert list(figure.data[0].x) == [0.0, 10.0, 20.0]


def test_rejections_stack_by_reason_with_one_legend_entry_per_reason():
    reasons = {"admission:ttft_slo": [1, 0, 2], "decode:tbt_slo": [0, 3, 0]}
    runs = {"baseline": fake_report(rejected=reasons), "early": fake_report(rejected={})}

    figure = rejections_figure(runs)

    assert len(figure.data) == 4  # two reasons in each of the two panels
    assert [bar.showlegend for bar in figure.data] == [True, True, False, False]
    assert list(figure.data[1].y) == [0, 3, 0]
    assert list(figure.data[3].y) == [0, 0, 0]  # a reason a run never hit is all zeros
    assert figure.layout.barmode == "stack"
    # The run without rejections says so in its panel; the counts have whole-number ticks.
    assert [a.text for a in figure.layout.annotations if a.text == "no rejections"] == [
        "no rejections"
    ]
    assert figure.layout.yaxis.dtick == 1 and figure.layout.yaxis.tick0 == 0


def test_rejections_of_runs_that_rejected_nothing_read_no_rejections_not_a_blank():
    runs = {"current": fake_report(rejected={}), "proposed": fake_report(rejected={})}

    figure = rejections_figure(runs)

    notes = [a for a in figure.layout.annotations if a.text == "no rejections"]
    assert len(notes) == 2 and list(figure.layout.yaxis.range) == [0, 1]


def test_metric_vs_parameter_sorts_numbers_and_keeps_text_as_categories():
    table = [
        {"speed": 2.0, "threshold": "inf", "rejection": "early", "num_rejected": 9},
        {"speed": 1.0, "threshold": 1.0, "rejection": "early", "num_rejected": 4},
        {"speed": 1.0, "threshold": 1.0, "rejection": "baseline", "num_rejected": 5},
    ]

    by_speed = metric_vs_parameter_figure(table, "speed", ["num_rejected"], ["rejection"])
    by_threshold = metric_vs_parameter_figure(table, "threshold", ["num_rejected"])

    early, baseline = by_speed.data
    assert early.name == "rejection=early"
    assert (list(early.x), list(early.y)) == ([1.0, 2.0], [4, 9])
    assert list(baseline.x) == [1.0]
    assert by_threshold.layout.xaxis.type == "category"
    assert list(by_threshold.layout.xaxis.categoryarray) == ["inf", "1.0"]


def test_page_loads_plotly_from_a_local_copy_written_once(tmp_path):
    runs = {"run": fake_report(TwinConfig())}
    figures = {"ttft": ttft_cdf_figure(runs), "loads": load_figure(runs)}

    first = write_page(figures, tmp_path / "a.html", "first <page>")
    second = write_page(figures, tmp_path / "b.html", "second")

    page = parse_page(first)
    assert page.script_sources == [PLOTLY_JS]
    assert page.div_ids == ["figure-ttft", "figure-loads"]
    assert "first &lt;page&gt;" in first.read_text()
    assert "cdn.plot.ly" not in first.read_text()
    library = tmp_path / PLOTLY_JS
    assert library.stat().st_size > 1_000_000
    assert second.read_text().replace("second", "first &lt;page&gt;") == first.read_text()


def test_count_axes_tick_at_whole_round_numbers_from_zero():
    from twin.plots import count_ticks

    assert count_ticks(0) == {"tick0": 0, "dtick": 1, "range": [0, 1]}  # an empty axis: 0, 1
    assert [count_ticks(n)["dtick"] for n in (1, 7, 13, 835, 12_000)] == [1, 2, 5, 200, 5000]
