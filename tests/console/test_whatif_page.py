"""The What-if page against the real backend: the twin models the live cluster, runs current
vs proposed on a recorded window (or an upload, whose bad lines are named), shows the twin's
numbers, and Apply needs the admin token, changes the running Conductor and leaves the
prediction in the audit log, where the page then compares it with what the cluster measured."""

import json
import time
from pathlib import Path

from console import format as fmt
from console.settings import DEFAULT_TWIN_PROFILE
from console.whatif import rows_from_jsonl
from tests.console.conftest import ADMIN_TOKEN, NUM_COMPLETED, NUM_REJECTED
from tests.console.pages import errors, metrics, num_charts, open_page, sign_in_as_admin
from twin.compare import compare
from twin.config import TwinConfig

RUN_TIMEOUT_S = 120.0


def _run_whatif(app, threshold: float):
    app.number_input(key="whatif_threshold").set_value(threshold)
    app.button[0].click().run(timeout=RUN_TIMEOUT_S)  # the form's "Run what-if"
    assert not app.exception, [e.value for e in app.exception]
    return app


def _twin_of_the_live_cluster(backend, profile: str) -> TwinConfig:
    policy = backend.get("/v1/config")["config"]
    roles = [agent["role"] for agent in backend.get("/v1/agents")]
    return TwinConfig(
        num_prefill=roles.count("prefill"),
        num_decode=roles.count("decode"),
        scheduler=policy["prefill_scheduler"],
        rejection=policy["rejection_policy"],
        threshold=policy["kvcache_balancing_threshold"],
        eviction=policy["eviction_policy"],
        ttft_slo_s=policy["ttft_slo_s"],
        tbt_slo_s=policy["tbt_slo_s"],
        decode_time_s=policy["decode_time_s"],
        learn_decode_time=policy["learn_decode_time"],
        seed=policy["seed"],
        profile=profile,
        block_size=policy["block_size"],  # recorded windows export at the Conductor's
    )


def test_the_page_describes_the_live_cluster_it_will_simulate(app, backend):
    open_page(app, "whatif")
    config = backend.get("/v1/config")
    caption = app.caption[0].value
    assert caption.startswith("Live cluster: 1 prefill : 1 decode agents, kvcache-centric")
    assert f"threshold {fmt.number(config['config']['kvcache_balancing_threshold'])}" in caption
    assert f"configuration version {config['version']}" in caption
    assert str(DEFAULT_TWIN_PROFILE) in caption


def test_a_recorded_window_runs_current_vs_proposed_in_the_twin(app, backend):
    open_page(app, "whatif")
    _run_whatif(app, threshold=4.0)
    assert not errors(app)
    (bar,) = app.get("progress")
    assert bar.proto.value == 100 and bar.proto.text.startswith("done in")
    whatif = app.session_state["whatif_result"]
    result = whatif["result"]
    assert result["trace"]["num_rows"] >= NUM_COMPLETED + NUM_REJECTED
    assert result["changed_settings"] == {"threshold": {"baseline": 2.0, "candidate": 4.0}}
    # The same comparison, built here from the backend's own answers, gives the same numbers:
    # on the live profile the page fetched (GET /v1/calibration), saved as a file.
    profile = result["reports"]["baseline"]["config"]["profile"]
    saved = json.loads(Path(profile).read_text())
    assert saved.keys() >= {"prefill_points", "decode_points", "serving", "believed"}
    current = _twin_of_the_live_cluster(backend, profile)
    window = {key: whatif["trace"][key] for key in ("start_s", "end_s")}
    assert window["end_s"] - window["start_s"] == 600  # the default: the last 10 minutes
    text = backend.get_text("/v1/export/trace", **window, block_size=current.block_size)
    rows = rows_from_jsonl(text.encode(), "export", block_size=current.block_size)
    assert len(rows) == result["trace"]["num_rows"]
    interval_s = result["reports"]["baseline"]["config"]["series_interval_s"]
    expected = compare(
        current.with_changes(series_interval_s=interval_s),
        current.with_changes(threshold=4.0, series_interval_s=interval_s),
        rows,
        workers=1,
    )
    assert result["deltas"] == expected["deltas"]
    candidate = expected["reports"]["candidate"]
    shown = metrics(app)
    assert shown["TTFT p90 (proposed)"] == fmt.seconds(candidate["ttft_p90_s"])
    assert shown["SLO attainment (proposed)"] == fmt.ratio(candidate["slo_attainment"])
    assert shown["Rejected (proposed)"] == fmt.count(candidate["num_rejected"])
    table = app.dataframe[0].value.set_index("metric")
    assert table.loc["ttft_p50_s", "current"] == fmt.seconds(
        expected["reports"]["baseline"]["ttft_p50_s"]
    )
    assert num_charts(app) == 3  # TTFT CDFs, pool loads, rejections: both runs side by side


def test_an_uploaded_trace_with_a_bad_line_names_the_line(app):
    open_page(app, "whatif")
    app.radio(key="whatif_source").set_value("Uploaded trace").run()
    good = {"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
    bad = {"timestamp": 5, "input_length": 600, "output_length": 4, "hash_ids": "x"}
    body = f"{json.dumps(good)}\n{json.dumps(bad)}\n".encode()
    app.file_uploader[0].set_value(("mine.jsonl", body, "application/jsonl")).run()
    _run_whatif(app, threshold=4.0)
    (message,) = errors(app)
    assert message.startswith("cannot run the what-if: mine.jsonl, line 2: ")
    assert "hash_ids" in message
    assert "whatif_result" not in app.session_state


def test_an_uploaded_trace_runs_in_the_twin(app):
    open_page(app, "whatif")
    app.radio(key="whatif_source").set_value("Uploaded trace").run()
    lines = [
        {"timestamp": 100 * i, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 3 + i]}
        for i in range(20)
    ]
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    app.file_uploader[0].set_value(("shared.jsonl", body, "application/jsonl")).run()
    _run_whatif(app, threshold=1.0)
    assert not errors(app)
    result = app.session_state["whatif_result"]["result"]
    assert result["trace"]["num_rows"] == 20
    assert "20 requests (shared.jsonl)" in app.caption[1].value


def test_apply_needs_the_admin_token_and_then_changes_the_conductor(app, backend):
    open_page(app, "whatif")
    before = backend.get("/v1/config")
    _run_whatif(app, threshold=3.0)
    app.button(key="whatif_apply").click().run()
    assert errors(app) == [
        "Applying a change needs the admin token: sign in with it in the sidebar. Nothing changed."
    ]
    assert backend.get("/v1/config") == before

    sign_in_as_admin(app, ADMIN_TOKEN)
    app.button(key="whatif_apply").click().run()
    assert not errors(app)
    after = backend.get("/v1/config")
    assert after["version"] == before["version"] + 1
    assert after["config"]["kvcache_balancing_threshold"] == 3.0
    assert backend.conductor.runtime.core.config.kvcache_balancing_threshold == 3.0
    assert app.success[0].value.startswith(f"Applied as configuration version {after['version']}")
    entry = backend.get("/v1/audit", limit=1)[0]
    prediction = entry["prediction"]
    assert entry["config_version"] == after["version"] and entry["actor"] == "admin"
    assert prediction["format"] == "kvcentric-console-prediction/1"
    assert prediction["config_change"] == {"kvcache_balancing_threshold": 3.0}
    assert prediction["changed_settings"]["threshold"] == {"baseline": 2.0, "candidate": 3.0}
    assert {"deltas", "baseline", "candidate", "trace", "split"} <= set(prediction)
    assert "requests" not in prediction["candidate"] and "series" not in prediction["candidate"]
    assert len(json.dumps(prediction)) < 20_000  # compact: no per-request rows

    # Afterwards: the prediction next to what the cluster measured since the change.
    app.run()
    table = app.dataframe[-1].value.set_index("metric")
    assert list(table.columns) == [
        "predicted",
        "actual",
        "difference",
        "scales with traffic",
    ]
    assert table.loc["ttft_p90_s", "predicted"] == fmt.seconds(
        prediction["candidate"]["ttft_p90_s"]
    )
    actual = backend.get("/v1/report", start_s=entry["time_s"], end_s=time.time())
    assert table.loc["num_requests", "actual"] == fmt.count(actual["num_requests"])

    # Put the threshold back for the other tests.
    backend.put_config(
        {"kvcache_balancing_threshold": before["config"]["kvcache_balancing_threshold"]}
    )


def test_a_past_window_without_traffic_has_nothing_to_simulate(app):
    open_page(app, "whatif")
    app.number_input(key="whatif_ago").set_value(120.0)  # the backend started minutes ago
    _run_whatif(app, threshold=4.0)
    assert [w.value for w in app.warning] == ["That window holds no requests: nothing to simulate."]
    assert "whatif_result" not in app.session_state


def test_an_upload_is_needed_before_running_on_one(app):
    open_page(app, "whatif")
    app.radio(key="whatif_source").set_value("Uploaded trace").run()
    _run_whatif(app, threshold=4.0)
    assert errors(app) == ["cannot run the what-if: choose a Mooncake JSONL file to upload first"]


def test_a_live_infinite_threshold_is_modelled_as_infinite(app, backend):
    backend.put_config({"kvcache_balancing_threshold": float("inf")})  # sent as "inf"
    try:
        assert backend.conductor.runtime.core.config.kvcache_balancing_threshold == float("inf")
        open_page(app, "whatif")
        assert not errors(app)
        assert "threshold ∞" in app.caption[0].value
        assert app.checkbox[0].value  # "never fetch remote prefixes" starts ticked
    finally:
        backend.put_config({"kvcache_balancing_threshold": 2.0})


def test_the_page_shows_how_far_to_trust_the_twin_on_the_window(app, backend):
    open_page(app, "whatif")
    _run_whatif(app, threshold=4.0)
    # On the live profile the twin's Conductor believes what live's believed, when it did.
    assert "the twin's Conductor believed what the live Conductor believed" in " ".join(
        caption.value for caption in app.caption
    )
    assert "How far to trust the twin" in [h.value for h in app.subheader]
    whatif = app.session_state["whatif_result"]
    window = {key: whatif["trace"][key] for key in ("start_s", "end_s")}
    measured = backend.get("/v1/report", **window)
    trust = next(frame.value for frame in app.dataframe if "live (measured)" in frame.value.columns)
    rows = {row["metric"]: row for row in trust.to_dict("records")}
    assert rows["num_completed"]["live (measured)"] == fmt.metric(
        "num_completed", measured["num_completed"]
    )
    current = whatif["result"]["reports"]["baseline"]
    assert rows["ttft_p50_s"]["twin (current config)"] == fmt.metric(
        "ttft_p50_s", current["ttft_p50_s"]
    )
