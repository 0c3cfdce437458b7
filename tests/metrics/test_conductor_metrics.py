"""The Conductor's /metrics through a real TestClient: what the runtime records shows up in
the Prometheus text, and each app keeps its own registry."""

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backend.api.app import create_app
from backend.policy.effects import CachePlan, DispatchPrefill, FetchSpan, Reject, Replicate
from backend.rpc.reports import AgentLoad
from backend.settings import load_settings

SETTINGS = load_settings(
    {
        "api_keys": "alice:alice-key-0123456789",
        "admin_token": "admin-token-0123456789",
        "agent_secret": "agent-secret-0123456789",
        "block_size": 16,
    }
)


def dispatch(request_id: str, plan: CachePlan) -> DispatchPrefill:
    return DispatchPrefill(request_id, "p0", "d0", plan, 0.0, 0.0, 0.1, 0.1, ())


def scrape(client: TestClient) -> dict[str, float]:
    """Every sample as {"name{label=value,...}": value}."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_recorded_events_appear_in_metrics_text() -> None:
    app = create_app(SETTINGS)
    metrics = app.state.metrics
    metrics.record_submitted("/v1/completions")
    metrics.record_submitted("/v1/completions")
    metrics.record_accepted("/v1/completions")
    metrics.record_decision(dispatch("a", CachePlan((1, 2), None, 32, 8)))
    metrics.record_decision(
        dispatch("b", CachePlan((1,), FetchSpan("p1", (2, 3, 4)), 64, 4)), scheduler="random"
    )
    metrics.record_rejection(Reject("c", "overload", "admission", "busy", 1.0))
    metrics.record_outcome("rejected", reason="overload", stage="admission")
    metrics.record_outcome("completed")
    metrics.record_replication(Replicate("b", "p1", "p0", (2, 3, 4)))
    metrics.observe_ttft(0.3)
    metrics.observe_tbt(0.02)
    metrics.set_instance_load("p0", "prefill", AgentLoad(num_queued=3, queued_tokens=900))
    metrics.set_instance_load("d0", "decode", AgentLoad(batch_size=5, predicted_tbt_s=0.04))

    with TestClient(app) as client:  # no API key: open like /healthz
        samples = scrape(client)

    assert samples["kvcentric_requests_submitted_total{endpoint=/v1/completions}"] == 2
    assert samples["kvcentric_requests_accepted_total{endpoint=/v1/completions}"] == 1
    assert samples["kvcentric_decisions_total{branch=local,scheduler=kvcache-centric}"] == 1
    assert samples["kvcentric_decisions_total{branch=transfer,scheduler=random}"] == 1
    assert samples["kvcentric_rejections_total{reason=overload,stage=admission}"] == 1
    rejected = "kvcentric_requests_terminal_total{reason=overload,stage=admission,state=rejected}"
    assert samples[rejected] == 1
    assert samples["kvcentric_requests_terminal_total{reason=,stage=,state=completed}"] == 1
    assert samples["kvcentric_input_tokens_total{}"] == 32 + 8 + 64 + 4
    assert samples["kvcentric_reused_tokens_total{}"] == 96
    assert samples["kvcentric_prefill_tokens_total{}"] == 12
    assert samples["kvcentric_transferred_tokens_total{}"] == 3 * 16
    assert samples["kvcentric_replications_total{}"] == 1
    assert samples["kvcentric_replicated_blocks_total{}"] == 3
    assert samples["kvcentric_ttft_seconds_count{}"] == 1
    assert samples["kvcentric_ttft_seconds_bucket{le=0.01}"] == 0
    assert samples["kvcentric_ttft_seconds_bucket{le=120.0}"] == 1
    assert samples["kvcentric_tbt_seconds_bucket{le=0.001}"] == 0
    assert samples["kvcentric_tbt_seconds_bucket{le=1.0}"] == 1
    assert samples["kvcentric_instance_prefill_queued_requests{instance_id=p0,role=prefill}"] == 3
    assert samples["kvcentric_instance_prefill_queued_tokens{instance_id=p0,role=prefill}"] == 900
    assert samples["kvcentric_instance_decode_batch_size{instance_id=d0,role=decode}"] == 5


def test_each_app_has_its_own_registry() -> None:
    first, second = create_app(SETTINGS), create_app(SETTINGS)
    first.state.metrics.record_rejection(Reject("a", "overload", "decode", "busy", 1.0))
    with TestClient(second) as client:
        samples = scrape(client)
    assert "kvcentric_rejections_total{reason=overload,stage=decode}" not in samples
    assert "kvcentric_ttft_seconds_count{}" in samples  # the names are there, unrecorded


def test_removed_instance_is_no_longer_reported() -> None:
    app = create_app(SETTINGS)
    app.state.metrics.set_instance_load("p0", "prefill", AgentLoad(num_queued=1))
    app.state.metrics.set_instance_load("p0", "decode", AgentLoad(batch_size=2))  # role switch
    with TestClient(app) as client:
        samples = scrape(client)
    assert "kvcentric_instance_decode_batch_size{instance_id=p0,role=prefill}" not in samples
    assert samples["kvcentric_instance_decode_batch_size{instance_id=p0,role=decode}"] == 2
    app.state.metrics.remove_instance("p0")
    with TestClient(app) as client:
        samples = scrape(client)
    assert not any("instance_id=p0" in key for key in samples)


def test_metrics_route_is_configurable() -> None:
    moved = create_app(SETTINGS, metrics_path="/internal/metrics")
    off = create_app(SETTINGS, metrics_path=None)
    with TestClient(moved) as client:
        assert client.get("/internal/metrics").status_code == 200
        assert client.get("/metrics").status_code == 404
    with TestClient(off) as client:
        assert client.get("/metrics").status_code == 404
