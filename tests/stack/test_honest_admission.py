"""100 concurrent streams on a real stack (the Conductor's start path, a prefill and a decode
`tiny` agent): each is either rejected at admission or served within (about) its TTFT SLO.

Before admission scaled its queue estimate by each instance's measured pace, the idle
`tiny-cpu` cost model believed prefills 5-7x faster than the shared machine ran them:
admission let in every request whose *believed* wait fitted the SLO, and the admitted ones
then waited up to 4x their SLO here (18 of 25 late, 3.2-8.4 s against 2 s), 10-30x under
the issue's load (issue 13, item 5).
"""

import json
import random
import time
from concurrent import futures

import httpx
import pytest

from backend.cli.children import free_port
from tests.harness.stack import conductor_stack
from tests.runtime.conftest import make_settings

API_KEY = "api-key-0123456789"
HEADERS = {"x-api-key": API_KEY}
TTFT_SLO_S = 2.0
NUM_STREAMS = 100
PROMPT_TOKENS = 2000  # long enough that the prefill, not the calls, is what queues
# An admitted request may exceed its SLO by what no estimate holds (the first token's
# delivery, a noisy shared machine), not by the multiples an unmeasured queue gives.
TOLERANCE = 1.5


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    database = tmp_path_factory.mktemp("honest") / "conductor.db"
    settings = make_settings(
        database_url=f"sqlite:///{database}",
        grpc_port=free_port(),
        ttft_slo_s=TTFT_SLO_S,
        max_input_tokens=4096,
    )
    with conductor_stack(settings, ["prefill", "decode"], profile="tiny-cpu") as stack:
        yield stack


def _body(rng: random.Random) -> dict:
    # Random token ids: no two prompts share a cached prefix.
    token_ids = [rng.randrange(1, 32_000) for _ in range(PROMPT_TOKENS)]
    return {"token_ids": token_ids, "max_tokens": 4, "stream": True}


def _stream(client: httpx.Client, body: dict) -> tuple[int, float | None, dict]:
    """(status, seconds to the first token event, the error or the last event)."""
    started_s = time.monotonic()
    first_s = None
    last: dict = {}
    with client.stream("POST", "/v1/native/requests", json=body) as response:
        if response.status_code != 200:
            response.read()
            return response.status_code, None, response.json()
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            last = json.loads(line[6:])
            if first_s is None and last.get("token_ids"):
                first_s = time.monotonic() - started_s
    return 200, first_s, last


def test_concurrent_streams_are_served_within_their_slo_or_rejected_early(stack) -> None:
    rng = random.Random(13)
    limits = httpx.Limits(max_connections=NUM_STREAMS)
    with httpx.Client(base_url=stack.url, headers=HEADERS, timeout=120, limits=limits) as client:
        # A Conductor that has served a little: its agents' real prefill pace is measured.
        for _ in range(3):
            assert _stream(client, _body(rng))[0] == 200
        bodies = [_body(rng) for _ in range(NUM_STREAMS)]
        with futures.ThreadPoolExecutor(NUM_STREAMS) as pool:
            answers = list(pool.map(lambda body: _stream(client, body), bodies))

    served = [first_s for status, first_s, _ in answers if status == 200]
    refused = [error for status, _, error in answers if status == 429]
    assert len(served) + len(refused) == NUM_STREAMS, [a[0] for a in answers]
    assert served and refused, (len(served), len(refused))
    for error in refused:
        assert (error["error"]["stage"], error["error"]["reason"]) == ("admission", "ttft_slo")
    assert all(first_s is not None for first_s in served)
    # TTFT as the Conductor records it (arrival to the first token leaving it): the test's
    # 100 client threads share the process and its cores, which no estimate covers.
    recorded = [
        stack.runtime.request(last["id"]).result(30).ttft_s
        for status, _, last in answers
        if status == 200
    ]
    late = sorted(s for s in recorded if s is None or s > TOLERANCE * TTFT_SLO_S)
    # One straggler in ten is the shared machine (under the whole suite on a 2-CPU host one
    # stream of 11 took 3.16 s, and none on its own three times after); the admission this
    # guards against made most of the served streams late, by multiples of their SLO.
    stragglers_allowed = len(served) // 10
    far = [s for s in late if s is None or s > 2 * TOLERANCE * TTFT_SLO_S]
    assert len(late) <= stragglers_allowed and not far, (
        f"{len(late)} of {len(served)} served streams waited {late} s"
    )
