"""BackendClient against the real backend (and a port where nothing listens): every failure
is a BackendError whose message an operator can act on."""

import httpx
import pytest

from console.client import BackendClient, BackendError, error_from_response
from console.format import data_size, metric, seconds
from tests.console.conftest import ADMIN_TOKEN, API_KEY, free_port


def test_reads_with_the_api_key(backend):
    client = BackendClient(backend.url, api_key=API_KEY)
    ids = [agent["instance_id"] for agent in client.agents()]  # heartbeat ages move on
    assert ids == [agent["instance_id"] for agent in backend.get("/v1/agents")]
    assert client.config() == backend.get("/v1/config")


@pytest.mark.parametrize(
    ("client", "words", "status"),
    [
        (BackendClient("", api_key=API_KEY), "cannot reach the backend", None),
        (BackendClient("http://127.0.0.1:1", api_key=API_KEY), "connection refused", None),
        (BackendClient("URL", api_key=""), "no API key: sign in with one in the sidebar", None),
        (BackendClient("URL", api_key="wrong"), "refused the credentials (401", 401),
        (BackendClient("URL", api_key="Bearer x y"), "(401 unauthorized)", 401),
    ],
)
def test_a_failed_read_is_one_readable_error(backend, client, words, status):
    client = BackendClient(client.base_url.replace("URL", backend.url), api_key=client.api_key)
    with pytest.raises(BackendError) as raised:
        client.agents()
    assert words in str(raised.value)
    assert raised.value.status_code == status
    assert "Traceback" not in str(raised.value)


def test_an_unreachable_backend_names_its_url():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(BackendError, match=rf"^cannot reach the backend at {url} \("):
        BackendClient(url, api_key=API_KEY).report(window_s=60)


def test_changes_need_the_admin_token_not_an_api_key(backend):
    as_key = BackendClient(backend.url, api_key=API_KEY, admin_token=API_KEY)
    with pytest.raises(
        BackendError, match=r"not allowed \(403 forbidden\): .*needs the admin token"
    ):
        as_key.change_config({"decode_time_s": 9.0})
    without = BackendClient(backend.url, api_key=API_KEY)
    with pytest.raises(BackendError, match="this change needs the admin token"):
        without.switch_role("anyone", "decode")


def test_4xx_bodies_become_their_message(backend):
    admin = BackendClient(backend.url, api_key=API_KEY, admin_token=ADMIN_TOKEN)
    with pytest.raises(BackendError) as raised:
        admin.change_config({"kvcache_balancing_threshold": 0.5})
    assert str(raised.value) == (
        "PUT /v1/config failed (400): kvcache_balancing_threshold must be in [1, inf], got 0.5"
    )
    assert raised.value.code == "invalid_config"
    with pytest.raises(BackendError, match=r"not found \(404\): no agent 'nobody' is joined"):
        admin.switch_role("nobody", "decode")
    with pytest.raises(BackendError, match=r"failed \(409\): configuration changed concurrently"):
        admin.change_config({}, expected_version=10_000)


def test_a_429_says_when_to_retry():
    request = httpx.Request("GET", "http://backend/v1/report")
    body = {"error": {"message": "rate limited", "type": "rate_limit_error", "code": "slow"}}
    response = httpx.Response(429, json=body, headers={"Retry-After": "3"}, request=request)
    error = error_from_response("GET", "/v1/report", response)
    assert str(error) == (
        "the backend is rejecting requests (429 too many requests): rate limited; retry after 3 s"
    )
    plain = httpx.Response(502, text="<html>bad gateway</html>", request=request)
    assert str(error_from_response("GET", "/v1/report", plain)) == (
        "GET /v1/report failed (502): <html>bad gateway</html>"
    )


@pytest.mark.parametrize(
    ("name", "value", "text"),
    [
        ("ttft_p90_s", 0.0123, "12.3 ms"),
        ("ttft_p90_s", 2.5, "2.50 s"),
        ("ttft_p90_s", None, "n/a"),
        ("slo_attainment", 0.25, "25.0 %"),
        ("cache_hit_ratio", 1.0, "100.0 %"),
        ("goodput_rps", 1.234, "1.23 req/s"),
        ("num_requests", 12345, "12,345"),
        ("wasted_prefill_tokens", 640, "640"),
        ("prefill_load_amplitude", 0.456, "0.46"),
    ],
)
def test_metrics_are_written_by_their_unit(name, value, text):
    assert metric(name, value) == text


def test_sizes_and_infinity():
    assert [data_size(n) for n in (0, 1536, 256 << 20, 3 << 30)] == [
        "0 B",
        "1.5 KiB",
        "256.0 MiB",
        "3.0 GiB",
    ]
    assert seconds(float("inf")) == "∞"
