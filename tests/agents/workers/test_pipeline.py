"""Chunked pipeline parallelism: same result as one agent, chunks overlapping across stages."""

import os
import signal
import time

import pytest
import torch

from agents.workers import PrefillWorker
from agents.workers.pipeline import PipelineError, PipelineGroup, split_layers
from agents.workers.pipeline_bench import pipeline_benchmark
from tests.agents.model.helpers import BLOCK_SIZE, prompt

CHUNK_TOKENS = 64


@pytest.fixture(scope="module")
def group():
    with PipelineGroup(
        "tiny", 2, seed=0, block_size=BLOCK_SIZE, prefill_chunk_tokens=CHUNK_TOKENS, device="cpu"
    ) as group:
        yield group


@pytest.fixture(scope="module")
def single_agent(tiny_model):
    return PrefillWorker(tiny_model, BLOCK_SIZE)


def assert_same_prefill(result, reference):
    assert torch.allclose(result.logits, reference.logits, atol=1e-4, rtol=0)
    assert len(result.layers) == len(reference.layers) == 4
    for (k, v), (ref_k, ref_v) in zip(result.layers, reference.layers, strict=True):
        assert k.shape == ref_k.shape
        assert torch.allclose(k, ref_k, atol=1e-4, rtol=0)
        assert torch.allclose(v, ref_v, atol=1e-4, rtol=0)
    prefill = result.prefill
    assert prefill.new_block_keys == reference.new_block_keys
    assert len(prefill.new_blocks) == len(reference.new_blocks)
    for mine, theirs in zip(prefill.new_blocks, reference.new_blocks, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("num_tokens", [300, 4 * CHUNK_TOKENS, CHUNK_TOKENS + 1])
def test_pipelined_prefill_equals_the_single_agent(group, single_agent, num_tokens):
    tokens = prompt(num_tokens, seed=num_tokens)
    result = group.prefill(tokens)
    assert result.is_pipelined
    assert result.num_chunks == -(-num_tokens // CHUNK_TOKENS)
    assert_same_prefill(result, single_agent.prefill(tokens))


@pytest.mark.parametrize("num_tokens", [1, 50, CHUNK_TOKENS])
def test_a_short_prompt_runs_on_one_stage_without_the_pipeline(group, single_agent, num_tokens):
    tokens = prompt(num_tokens, seed=num_tokens)
    result = group.prefill(tokens)
    assert not result.is_pipelined
    assert [(span.stage, span.chunk) for span in result.spans] == [(0, 0)]
    assert_same_prefill(result, single_agent.prefill(tokens))


def test_chunks_overlap_across_stages(group):
    num_chunks = 8
    result = group.prefill(prompt(num_chunks * CHUNK_TOKENS, seed=3))
    spans = {(span.stage, span.chunk): span for span in result.spans}
    assert set(spans) == {(stage, chunk) for stage in (0, 1) for chunk in range(num_chunks)}
    for chunk in range(num_chunks):  # a chunk reaches stage 1 only after stage 0 ran it
        assert spans[1, chunk].start_s >= spans[0, chunk].end_s
    overlapping = [
        chunk
        for chunk in range(num_chunks - 1)
        if spans[0, chunk + 1].start_s < spans[1, chunk].end_s
    ]
    assert overlapping, "stage 0 never ran a chunk while stage 1 ran the one before"


def test_token_ids_outside_the_vocabulary_are_refused_and_the_group_goes_on(group, single_agent):
    with pytest.raises(ValueError, match="token ids"):
        group.prefill([5, 32_000, 7] * 40)
    tokens = prompt(100, seed=1)
    assert_same_prefill(group.prefill(tokens), single_agent.prefill(tokens))


@pytest.mark.parametrize(
    ("num_stages", "chunk_tokens", "message"),
    [
        (5, 64, "num_stages must be in \\[1, 4\\]"),
        (0, 64, "num_stages"),
        (2, 0, "prefill_chunk_tokens must be positive"),
        (2, -8, "prefill_chunk_tokens must be positive"),
    ],
)
def test_bad_groups_are_refused(num_stages, chunk_tokens, message):
    with pytest.raises(ValueError, match=message):
        PipelineGroup(
            "tiny", num_stages, seed=0, block_size=BLOCK_SIZE, prefill_chunk_tokens=chunk_tokens
        )


def test_layers_split_contiguously_and_evenly():
    assert split_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert split_layers(5, 3) == [range(0, 2), range(2, 4), range(4, 5)]
    assert split_layers(4, 4) == [range(i, i + 1) for i in range(4)]


def test_a_dead_stage_is_a_clear_error_not_a_hang():
    group = PipelineGroup(
        "tiny", 2, seed=0, block_size=BLOCK_SIZE, prefill_chunk_tokens=CHUNK_TOKENS,
        device="cpu", timeout_s=10.0,
    )  # fmt: skip
    with group:
        os.kill(group.stage_pids[1], signal.SIGKILL)
        started_s = time.monotonic()
        with pytest.raises(PipelineError, match=r"stage 1 \(pid \d+\) died"):
            group.prefill(prompt(300, seed=2))
        assert time.monotonic() - started_s < 5.0
        with pytest.raises(PipelineError, match="closed"):
            group.prefill(prompt(300, seed=2))


def test_pipeline_benchmark_reports_both_wall_times():
    result = pipeline_benchmark(
        "tiny", context_tokens=512, num_stages=2, prefill_chunk_tokens=128, num_repeats=1
    )
    assert result["single_agent_s"] > 0 and result["pipelined_s"] > 0
    assert result["speedup"] == pytest.approx(result["single_agent_s"] / result["pipelined_s"])
