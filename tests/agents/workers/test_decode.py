"""Decode: exact greedy tokens, continuous batching, max_tokens, sampling and arrival checks."""

import dataclasses

import pytest
import torch

from agents.workers import (
    BlockSource,
    DecodeRequest,
    DecodeWorker,
    PrefillWorker,
    SamplingParams,
    sample,
)
from backend.policy.cost_model import DecodeFit
from backend.policy.effects import ArrivalCheck
from tests.agents.model.helpers import BLOCK_SIZE, prompt


@pytest.fixture(scope="module")
def prefill(tiny_model):
    return PrefillWorker(tiny_model, BLOCK_SIZE)


def make_request(prefill, request_id, tokens, max_tokens, sampling=SamplingParams(), source=None):
    result = prefill.prefill(tokens, source=source)
    first = sample(result.logits, sampling, sampling.generator())
    return DecodeRequest(request_id, result.paged_kv(BLOCK_SIZE), first, max_tokens, sampling)


def decode(model, arrivals, **options):
    """Run requests joining at the given step numbers; returns outputs and the token stream."""
    outputs, stream = {}, []
    worker = DecodeWorker(
        model,
        on_token=lambda request_id, token, _: stream.append((request_id, token)),
        on_finish=lambda outcome: outputs.__setitem__(outcome.request_id, outcome),
        **options,
    )
    pending = sorted(arrivals, key=lambda pair: pair[1])
    step = 0
    while pending or not worker.is_idle:
        while pending and pending[0][1] <= step:
            worker.submit(pending.pop(0)[0])
        worker.step()
        step += 1
    return outputs, stream


def test_greedy_tokens_equal_recomputing_the_whole_sequence(tiny_model, prefill):
    tokens = prompt(45, seed=31)
    request = make_request(prefill, "r", tokens, max_tokens=6)
    outputs, _ = decode(tiny_model, [(request, 0)])
    expected, sequence = [], torch.as_tensor(tokens, dtype=torch.int64)
    for _ in range(6):
        logits, _ = tiny_model.full_prefill(sequence)
        expected.append(int(logits.argmax()))
        sequence = torch.cat((sequence, torch.tensor(expected[-1:])))
    assert outputs["r"].output_tokens == tuple(expected)


def test_log_probabilities_are_those_of_the_whole_sequence_and_only_when_asked(tiny_model, prefill):
    tokens = prompt(45, seed=35)
    asked = make_request(
        prefill, "asked", tokens, max_tokens=4, sampling=SamplingParams(logprobs=True)
    )
    plain = make_request(prefill, "plain", tokens, max_tokens=4)
    seen = []
    worker = DecodeWorker(tiny_model, on_token=lambda *args: seen.append(args))
    worker.submit(asked)
    worker.submit(plain)
    worker.run_until_idle()
    by_request = {r: [(t, lp) for rid, t, lp in seen if rid == r] for r in ("asked", "plain")}
    assert all(lp is None for _, lp in by_request["plain"])
    first, *later = by_request["asked"]
    assert first[1] is None  # the prefill sampled the first token and reports its own
    sequence = torch.as_tensor([*tokens, first[0]], dtype=torch.int64)
    for token, logprob in later:
        logits, _ = tiny_model.full_prefill(sequence)
        expected = torch.log_softmax(logits, -1)[token]
        assert logprob.logprob == pytest.approx(float(expected), abs=1e-4)
        sequence = torch.cat((sequence, torch.tensor([token])))


def test_greedy_output_is_the_same_with_and_without_prefix_reuse(tiny_model, prefill):
    tokens = prompt(70, seed=33)
    cold = make_request(prefill, "cold", tokens, max_tokens=8)
    blocks = prefill.prefill(tokens).new_blocks[:3]
    warm = make_request(prefill, "warm", tokens, max_tokens=8, source=BlockSource(blocks))
    outputs, _ = decode(tiny_model, [(cold, 0), (warm, 0)])
    assert outputs["warm"].output_tokens == outputs["cold"].output_tokens
    assert len(outputs["cold"].output_tokens) == 8


def test_requests_joining_mid_stream_produce_their_solo_tokens(tiny_model, prefill):
    requests = [
        make_request(prefill, "a", prompt(40, seed=1), max_tokens=10),
        make_request(prefill, "b", prompt(23, seed=2), max_tokens=7),
        make_request(
            prefill, "c", prompt(66, seed=3), max_tokens=9, sampling=SamplingParams(0.9, 40, 5)
        ),
        make_request(prefill, "d", prompt(16, seed=4), max_tokens=4),
    ]
    solo = {r.request_id: decode(tiny_model, [(r, 0)])[0][r.request_id] for r in requests}
    together, stream = decode(tiny_model, list(zip(requests, [0, 2, 3, 5], strict=True)))
    assert together == solo
    # Tokens were streamed as produced, interleaved across requests, in each one's order.
    assert [token for rid, token in stream if rid == "a"] == list(solo["a"].output_tokens)
    # "a" ran alone for two steps (first token at joining, then one per step).
    assert stream[:3] == [("a", token) for token in solo["a"].output_tokens[:3]]
    assert {rid for rid, _ in stream[3:12]} >= {"a", "b", "c"}


def test_a_full_batch_makes_later_requests_wait_without_changing_tokens(tiny_model, prefill):
    requests = [
        make_request(prefill, f"r{i}", prompt(20 + i, seed=i), max_tokens=5) for i in range(3)
    ]
    solo = {r.request_id: decode(tiny_model, [(r, 0)])[0][r.request_id] for r in requests}
    capped, _ = decode(tiny_model, [(r, 0) for r in requests], max_batch_size=2)
    assert capped == solo


@pytest.mark.parametrize("max_tokens", [1, 2, 5])
def test_max_tokens_is_respected(tiny_model, prefill, max_tokens):
    request = make_request(prefill, "r", prompt(30, seed=8), max_tokens=max_tokens)
    outputs, stream = decode(tiny_model, [(request, 0)])
    assert outputs["r"].status == "completed"
    assert len(outputs["r"].output_tokens) == max_tokens
    assert outputs["r"].output_tokens[0] == request.first_token
    assert len(stream) == max_tokens


def test_seeded_sampling_repeats_per_seed(tiny_model, prefill):
    tokens = prompt(30, seed=9)

    def run(seed):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        return decode(tiny_model, [(make_request(prefill, "r", tokens, 8, sampling), 0)])[0]["r"]

    assert run(1) == run(1)
    assert run(1).output_tokens != run(2).output_tokens


def arrival_check(per_request_s, tbt_slo_s):
    return ArrivalCheck(tbt_slo_s, DecodeFit(0.01, per_request_s, per_context_token_s=0.0))


def checked(request, check):
    return dataclasses.replace(request, arrival_check=check)


def test_arrival_check_rejects_when_predicted_tbt_exceeds_the_slo(tiny_model, prefill):
    outcomes = []
    worker = DecodeWorker(tiny_model, on_finish=outcomes.append)
    check = arrival_check(0.02, 0.05)
    requests = [
        checked(make_request(prefill, f"r{i}", prompt(20, seed=i), max_tokens=3), check)
        for i in range(3)
    ]
    # Predicted TBT with b requests: 0.01 + 0.02 b; the SLO of 0.05 s admits two.
    assert worker.submit(requests[0]) is None
    worker.step()
    assert worker.submit(requests[1]) is None
    assert worker.submit(requests[2]) == "tbt_slo"
    assert outcomes[-1].request_id == "r2"
    assert (outcomes[-1].status, outcomes[-1].reason, outcomes[-1].stage) == (
        "rejected",
        "tbt_slo",
        "decode",
    )
    worker.run_until_idle()
    assert sorted(o.request_id for o in outcomes if o.status == "completed") == ["r0", "r1"]


def test_arrival_check_rejects_when_kv_capacity_would_overflow(tiny_model, prefill):
    worker = DecodeWorker(tiny_model, kv_capacity_tokens=50)
    check = arrival_check(0.0, 1.0)
    assert worker.submit(checked(make_request(prefill, "a", prompt(30, seed=1), 2), check)) is None
    second = checked(make_request(prefill, "b", prompt(30, seed=2), 2), check)
    assert worker.submit(second) == "kv_capacity"


def test_a_request_without_a_check_is_admitted_whatever_the_load(tiny_model, prefill):
    worker = DecodeWorker(tiny_model, kv_capacity_tokens=50)
    assert worker.submit(make_request(prefill, "a", prompt(30, seed=1), 2)) is None
    assert worker.submit(make_request(prefill, "b", prompt(30, seed=2), 2)) is None


def test_bad_requests_are_refused(tiny_model, prefill):
    request = make_request(prefill, "r", prompt(20, seed=1), max_tokens=2)
    worker = DecodeWorker(tiny_model)
    worker.submit(request)
    with pytest.raises(ValueError, match="already"):
        worker.submit(request)
    with pytest.raises(ValueError, match="max_tokens"):
        DecodeRequest("x", request.kv, 0, max_tokens=0)
