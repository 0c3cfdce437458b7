"""KV blocks: layout, zero-copy bytes in both directions, layer byte ranges, PagedKv."""

import numpy as np
import pytest
import torch

from agents.model import (
    PagedKv,
    block_from_bytes,
    block_shape,
    block_to_bytes,
    get_preset,
    layer_byte_range,
)

TINY = get_preset("tiny")


def random_block(dtype=torch.float32, block_size=16):
    return torch.randn(block_shape(TINY, block_size)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_block_bytes_round_trip_exactly(dtype):
    block = random_block(dtype)
    data = block_to_bytes(block)
    assert len(data) == TINY.block_bytes(16, block.element_size())
    back = block_from_bytes(bytes(data), TINY, 16, dtype)
    assert torch.equal(back, block)


def test_bytes_views_share_memory_with_the_tensor():
    block = random_block()
    data = block_to_bytes(block)
    block[0, 0, 0, 0, 0] = 123.0
    assert np.frombuffer(data, dtype=np.float32)[0] == 123.0
    buffer = bytearray(data)
    view = block_from_bytes(buffer, TINY, 16, torch.float32)
    view[0, 0, 0, 0, 1] = -7.0
    assert np.frombuffer(buffer, dtype=np.float32)[1] == -7.0


def test_a_layer_is_one_contiguous_byte_range_of_the_block():
    block = random_block()
    data = block_to_bytes(block)
    span = layer_byte_range(TINY, 16, 4, layer=2)
    assert bytes(data[span.start : span.stop]) == bytes(block_to_bytes(block[2].contiguous()))


def test_wrong_byte_count_is_refused():
    with pytest.raises(ValueError, match="bytes"):
        block_from_bytes(b"\0" * 10, TINY, 16, torch.float32)


def test_paged_kv_round_trips_layers_and_pads_the_last_block():
    layers = [
        (torch.randn(TINY.num_kv_heads, 37, TINY.head_dim), torch.randn(2, 37, 32))
        for _ in range(TINY.num_layers)
    ]
    paged = PagedKv.from_layers(layers, block_size=16)
    assert len(paged.blocks) == 3
    assert paged.blocks[0].shape == block_shape(TINY, 16)
    assert paged.blocks[0].is_contiguous()
    for index, (k, v) in enumerate(layers):
        got_k, got_v = paged.layer(index)
        assert torch.equal(got_k, k)
        assert torch.equal(got_v, v)
    assert torch.count_nonzero(paged.blocks[2][:, :, :, 5:]) == 0


def test_paged_kv_refuses_a_wrong_block_count():
    with pytest.raises(ValueError, match="blocks"):
        PagedKv((random_block(),), num_tokens=17, block_size=16)
