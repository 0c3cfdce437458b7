"""Block keys exactly as backend/policy/blocks.py defines them, and PolicyConfig validation."""

import math
import struct

import numpy as np
import pytest
import xxhash

from backend.policy import PolicyConfig, block_keys


def reference_keys(tokens: list[int], block_size: int) -> list[int]:
    """The definition, written out the slow and obvious way."""
    keys, previous = [], 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        data = struct.pack("<Q", previous) + struct.pack(f"<{block_size}i", *block)
        previous = xxhash.xxh3_64_intdigest(data)
        keys.append(previous)
    return keys


def test_keys_match_the_definition_for_every_input_type() -> None:
    tokens = [int(t) for t in np.random.default_rng(3).integers(-5, 32000, 1000)]
    expected = reference_keys(tokens, 64)
    assert len(expected) == 15  # only full blocks: 1000 // 64
    assert block_keys(tokens, 64) == expected
    assert block_keys(np.array(tokens, dtype=np.int32), 64) == expected
    assert block_keys(np.array(tokens, dtype=np.int64), 64) == expected
    assert block_keys(np.array(tokens, dtype="<i4").tobytes(), 64) == expected


def test_keys_chain_so_equal_keys_mean_equal_prefixes() -> None:
    a = list(range(256))
    b = [*range(128), *range(1000, 1128)]
    keys_a, keys_b = block_keys(a, 64), block_keys(b, 64)
    assert keys_a[:2] == keys_b[:2] and keys_a[2] != keys_b[2]
    # the same block after a different prefix gets a different key
    c = [*range(1000, 1064), *range(64, 128)]
    assert block_keys(c, 64)[1] != keys_a[1]
    # hashing in pieces with parent_key continues the chain
    assert block_keys(a[128:], 64, parent_key=keys_a[1]) == keys_a[2:]


def test_short_prompts_have_no_keys_and_bad_input_is_refused() -> None:
    assert block_keys(list(range(511)), 512) == []
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1, 2], 0)
    with pytest.raises(ValueError, match="int32"):
        block_keys(b"\x00\x01\x02", 1)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"block_size": 0}, "block_size"),
        ({"prefill_scheduler": "fastest"}, "unknown prefill_scheduler"),
        ({"rejection_policy": "maybe"}, "unknown rejection_policy"),
        ({"eviction_policy": "fifo"}, "unknown eviction_policy"),
        ({"kvcache_balancing_threshold": 0.5}, r"\[1, inf\]"),
        ({"kvcache_balancing_threshold": math.nan}, r"\[1, inf\]"),
        ({"ttft_slo_s": 0.0}, "ttft_slo_s"),
        ({"tbt_slo_s": -1.0}, "tbt_slo_s"),
        ({"decode_time_s": math.inf}, "decode_time_s"),
        ({"decode_time_window": 0}, "decode_time_window"),
    ],
)
def test_config_validation(changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**changes)


def test_threshold_inf_is_allowed_and_cache_aware_always_uses_it() -> None:
    assert PolicyConfig(kvcache_balancing_threshold=math.inf).effective_threshold == math.inf
    assert PolicyConfig(prefill_scheduler="cache-aware").effective_threshold == math.inf
    assert PolicyConfig(kvcache_balancing_threshold=1.5).effective_threshold == 1.5
