"""Presets and shape arithmetic: parameter counts, KV bytes per token and FLOPs."""

import pytest

from agents.model import PRESETS, get_preset
from backend.policy.cost_model import CostModel


def test_unknown_preset_lists_the_presets():
    with pytest.raises(ValueError) as error:
        get_preset("gpt-5")
    message = str(error.value)
    assert "gpt-5" in message
    for name in PRESETS:
        assert name in message


@pytest.mark.parametrize(
    ("name", "billions"),
    [("llama2-7b", 6.738), ("llama2-13b", 13.016), ("llama2-70b", 68.977)],
)
def test_parameter_counts_match_the_published_models(name, billions):
    assert get_preset(name).num_params / 1e9 == pytest.approx(billions, abs=1e-3)


def test_70b_kv_bytes_per_token_match_the_policy_reference():
    config = get_preset("llama2-70b")
    assert config.kv_bytes_per_token(2) == CostModel.reference_70b().kv_bytes_per_token
    assert config.kv_bytes_per_token(2) == 80 * 2 * 8 * 128 * 2


def test_block_bytes_is_block_size_times_kv_bytes_per_token():
    tiny = get_preset("tiny")
    assert tiny.kv_bytes_per_token(4) == 4 * 2 * 2 * 32 * 4
    assert tiny.block_bytes(16, 4) == 16 * tiny.kv_bytes_per_token(4)


def test_prefill_flops_fall_with_the_cached_prefix_and_count_one_token_at_least():
    config = get_preset("llama2-70b")
    full = config.prefill_flops(4096)
    half = config.prefill_flops(4096, cached_tokens=2048)
    assert half < full
    # ~2 FLOPs per weight per token dominate at short context.
    assert config.prefill_flops(1) == pytest.approx(2 * config.num_params, rel=0.01)
    # Everything cached still computes the last token.
    assert config.prefill_flops(4096, cached_tokens=4096) == config.prefill_flops(4096, 4095)


def test_decode_flops_grow_with_batch_and_context():
    config = get_preset("llama2-7b")
    base = config.decode_flops(1, 1000)
    assert config.decode_flops(2, 1000) > base
    assert config.decode_flops(1, 2000) - base == 4.0 * 32 * 128 * 32 * 1000


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads"):
        type(get_preset("tiny"))("bad", 2, 256, 8, 3, 512, 100)
