"""Prefill with reused prefix blocks: same logits as a full prefill, new blocks under their keys."""

import os
import tempfile
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from agents.model import block_from_bytes, block_shape, block_to_bytes
from agents.workers import BlockSink, BlockSource, PrefillWorker
from backend.policy.blocks import block_keys
from tests.agents.model.helpers import BLOCK_SIZE, prompt


@pytest.fixture(scope="module")
def worker(tiny_model):
    return PrefillWorker(tiny_model, BLOCK_SIZE)


@pytest.mark.parametrize(("num_tokens", "reused_blocks"), [(100, 1), (100, 4), (100, 6), (37, 2)])
def test_reused_prefix_gives_full_prefill_logits(worker, tiny_model, num_tokens, reused_blocks):
    tokens = prompt(num_tokens, seed=num_tokens)
    earlier = worker.prefill(tokens)  # a full prefill computes the blocks the pool would hold
    reference, _ = tiny_model.full_prefill(torch.as_tensor(tokens, dtype=torch.int64))
    result = worker.prefill(tokens, source=BlockSource(earlier.new_blocks[:reused_blocks]))
    assert result.num_cached_tokens == reused_blocks * BLOCK_SIZE
    assert torch.allclose(result.logits, reference, atol=1e-4, rtol=0)
    assert torch.allclose(earlier.logits, reference, atol=1e-4, rtol=0)


def test_prefix_blocks_change_the_result(worker):
    """Guards the test above: wrong prefix KV must show in the logits."""
    tokens = prompt(64, seed=5)
    earlier = worker.prefill(tokens)
    wrong = [block + 0.5 for block in earlier.new_blocks[:2]]
    result = worker.prefill(tokens, source=BlockSource(wrong))
    assert not torch.allclose(result.logits, earlier.logits, atol=1e-2)


def test_a_fully_cached_prompt_still_computes_its_last_token(worker):
    tokens = prompt(4 * BLOCK_SIZE, seed=7)
    earlier = worker.prefill(tokens)
    result = worker.prefill(tokens, source=BlockSource(earlier.new_blocks))
    assert result.num_cached_tokens == 3 * BLOCK_SIZE
    assert len(result.new_blocks) == 1
    assert torch.allclose(result.logits, earlier.logits, atol=1e-4, rtol=0)


def test_new_full_blocks_come_with_their_chained_keys(worker):
    tokens = prompt(90, seed=9)
    full = worker.prefill(tokens)
    keys = block_keys(tokens, BLOCK_SIZE)
    assert full.new_block_keys == tuple(keys)
    assert len(full.new_blocks) == 90 // BLOCK_SIZE
    reused = worker.prefill(tokens, source=BlockSource(full.new_blocks[:2]))
    assert reused.new_block_keys == tuple(keys[2:])
    for mine, theirs in zip(reused.new_blocks, full.new_blocks[2:], strict=True):
        assert torch.allclose(mine, theirs, atol=1e-5)


def test_blocks_round_tripped_through_bytes_are_reusable(worker, tiny_model):
    tokens = prompt(80, seed=11)
    full = worker.prefill(tokens)
    stored = [bytes(block_to_bytes(block)) for block in full.new_blocks[:3]]  # as a pool holds them
    blocks = [
        block_from_bytes(data, tiny_model.config, BLOCK_SIZE, torch.float32) for data in stored
    ]
    result = worker.prefill(tokens, source=BlockSource(blocks))
    assert torch.allclose(result.logits, full.logits, atol=1e-4, rtol=0)


def test_threaded_source_and_sink_match_inline_ones_and_spill_the_block_bytes(worker, tiny_model):
    tokens = prompt(96, seed=13)
    full = worker.prefill(tokens)
    with ThreadPoolExecutor(2) as pool, tempfile.TemporaryFile() as spill:
        source = BlockSource(full.new_blocks[:2], executor=pool, delay_s_per_byte=1e-12)
        sink = BlockSink(
            tiny_model.config.num_layers, BLOCK_SIZE, executor=pool, spill_fd=spill.fileno()
        )
        result = worker.prefill(tokens, source=source, sink=sink)
        spilled = os.pread(spill.fileno(), 1 << 20, 0)
    assert torch.allclose(result.logits, full.logits, atol=1e-4, rtol=0)
    assert spilled == b"".join(bytes(block_to_bytes(block)) for block in result.new_blocks)


def test_a_source_of_partial_blocks_is_refused(worker, tiny_model):
    half_block = torch.zeros(block_shape(tiny_model.config, BLOCK_SIZE // 2))
    with pytest.raises(ValueError, match="whole blocks"):
        worker.prefill(prompt(64, seed=1), source=BlockSource([half_block]))


def test_prompts_must_be_non_empty(worker):
    with pytest.raises(ValueError, match="non-empty"):
        worker.prefill([])
