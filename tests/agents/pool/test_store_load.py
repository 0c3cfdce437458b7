"""Round trips, bad input, missing blocks, checksums offered to callers and stats."""

import pytest

from agents.pool import KvPoolShard, MissingBlock, checksum
from backend.policy import KvStored, Tier
from tests.agents.pool.helpers import BLOCK_BYTES, block_of, make_shard, store


def test_store_then_load_returns_the_same_bytes_as_read_only_views():
    shard = make_shard(8)
    result = store(shard, [11, 12, 13], 0.0)
    assert result.is_complete
    assert result.events == [KvStored(0.0, "prefill-00", (11, 12, 13), Tier.DRAM)]
    loaded = shard.load([11, 12, 13], 1.0)
    assert [bytes(block) for block in loaded.blocks] == [block_of(k) for k in (11, 12, 13)]
    assert all(isinstance(block, memoryview) and block.readonly for block in loaded.blocks)
    assert loaded.events == []
    assert shard.holdings() == dict.fromkeys([11, 12, 13], Tier.DRAM)


def test_storing_held_blocks_again_copies_nothing_and_reports_them_held():
    shard = make_shard(8)
    store(shard, [1, 2], 0.0)
    again = store(shard, [1, 2, 3], 1.0)
    assert again.events == [KvStored(1.0, "prefill-00", (1, 2, 3), Tier.DRAM)]
    assert shard.stats().num_stored == 3


def test_store_accepts_any_contiguous_buffer():
    shard = make_shard(2)
    data = bytearray(block_of(5))
    shard.store([5], [memoryview(data)], 0.0)
    data[0] ^= 0xFF  # the shard copied the bytes: the caller's buffer is its own
    assert bytes(shard.load([5], 1.0).blocks[0]) == block_of(5)


@pytest.mark.parametrize(
    ("keys", "blocks", "message"),
    [
        ([1], [b"short"], "must be 256 bytes"),
        ([1, 2], [block_of(1)], "one block per key"),
        ([1, 1], [block_of(1), block_of(1)], "no key twice"),
    ],
)
def test_store_rejects_bad_blocks_with_a_clear_error(keys, blocks, message):
    shard = make_shard(4)
    with pytest.raises(ValueError, match=message):
        shard.store(keys, blocks, 0.0)
    assert shard.holdings() == {}


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="block_bytes"):
        KvPoolShard("x", block_bytes=0, dram_capacity_bytes=1024)
    with pytest.raises(ValueError, match="SSD tier needs both"):
        KvPoolShard("x", block_bytes=64, dram_capacity_bytes=1024, ssd_capacity_bytes=4096)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        KvPoolShard("x", block_bytes=64, dram_capacity_bytes=1024, eviction_policy="fifo")


def test_a_block_the_shard_does_not_hold_is_a_clear_missing_block():
    shard = make_shard(4)
    store(shard, [1, 2], 0.0)
    with pytest.raises(MissingBlock) as caught:
        shard.load([1, 2, 0xBEEF], 1.0)
    assert caught.value.key == 0xBEEF
    assert isinstance(caught.value, KeyError)
    assert str(caught.value) == "pool shard prefill-00 does not hold block 0xbeef"
    with pytest.raises(MissingBlock, match="0x63"):
        shard.checksum_of(99)
    stats = shard.stats()
    assert (stats.num_misses, stats.num_dram_hits, stats.num_pinned_keys) == (1, 0, 0)


def test_prefix_length_counts_leading_held_blocks():
    shard = make_shard(8)
    store(shard, [1, 2, 3], 0.0)
    assert shard.prefix_length([1, 2, 3, 4]) == 3
    assert shard.prefix_length([1, 9, 3]) == 1
    assert shard.prefix_length([9, 1]) == 0
    assert shard.prefix_length([]) == 0


def test_checksums_are_offered_for_checking_a_transfer():
    shard = make_shard(4)
    store(shard, [7], 0.0)
    assert shard.checksum_of(7) == checksum(block_of(7))
    assert shard.verify(7, block_of(7))
    damaged = bytearray(block_of(7))
    damaged[100] ^= 0x01
    assert not shard.verify(7, damaged)


def test_stats_add_up():
    shard = make_shard(2)
    store(shard, [1, 2], 0.0)
    store(shard, [3], 1.0)  # evicts 1 (no SSD tier)
    shard.load([2, 3], 2.0)
    shard.pin([3])
    stats = shard.stats()
    assert stats.num_dram_blocks == 2 and stats.dram_bytes == 2 * BLOCK_BYTES
    assert stats.dram_capacity_blocks == 2 and stats.ssd_capacity_blocks == 0
    assert (stats.num_stored, stats.num_evicted, stats.num_dram_hits) == (3, 1, 2)
    assert stats.num_stored - stats.num_evicted == stats.num_dram_blocks + stats.num_ssd_blocks
    assert stats.num_pinned_keys == 1
