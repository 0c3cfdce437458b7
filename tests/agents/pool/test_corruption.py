"""A block failing its checksum is dropped, reported by key, and can be stored again."""

import pytest

from agents.pool import CorruptBlock, MissingBlock, checksum
from backend.policy import KvEvicted, KvStored, Tier
from tests.agents.pool.helpers import block_of, make_shard, ssd_files, store


def _flip_dram_byte(shard, key: int, offset: int = 17) -> None:
    """Damage a block in DRAM the way a bad DIMM would: no API allows it."""
    slot, _ = shard._state.dram.blocks[key]
    shard._state.dram.arena.view(slot)[offset] ^= 0x40


def test_a_corrupt_dram_block_is_detected_dropped_and_reported(tmp_path):
    shard = make_shard(4, ssd_dir=tmp_path, ssd_blocks=4)
    store(shard, [1, 2, 3], 0.0)
    shard.pin([1, 2, 3])  # a request holding its prefix: still dropped
    _flip_dram_byte(shard, 2)
    with pytest.raises(CorruptBlock) as caught:
        shard.load([1, 2, 3], 1.0)
    assert caught.value.keys == (2,)
    assert "block(s) 0x2" in str(caught.value)
    assert caught.value.events == [KvEvicted(1.0, "prefill-00", (2,))]
    assert shard.holdings() == {1: Tier.DRAM, 3: Tier.DRAM}
    with pytest.raises(MissingBlock):
        shard.load([2], 2.0)
    shard.unpin([1, 2, 3])
    assert store(shard, [2], 3.0, first_depth=1).events == [
        KvStored(3.0, "prefill-00", (2,), Tier.DRAM)
    ]
    assert bytes(shard.load([2], 4.0).blocks[0]) == block_of(2)
    stats = shard.stats()
    assert (stats.num_corrupt, stats.num_evicted, stats.num_stored) == (1, 1, 4)
    assert stats.num_stored - stats.num_evicted == stats.num_dram_blocks + stats.num_ssd_blocks


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_corrupt_ssd_block_is_detected_dropped_and_reported(tmp_path, damage):
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=4)
    store(shard, [1], 0.0)
    store(shard, [2], 1.0)  # 1 to SSD
    (path,) = ssd_files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[200] ^= 0x01
        path.write_bytes(data)
    elif damage == "truncate":
        path.write_bytes(data[:100])
    else:
        path.unlink()
    with pytest.raises(CorruptBlock) as caught:
        shard.load([1], 2.0)
    assert caught.value.keys == (1,)
    assert caught.value.events == [KvEvicted(2.0, "prefill-00", (1,))]
    assert shard.holdings() == {2: Tier.DRAM}
    assert ssd_files(tmp_path) == []
    assert shard.stats().num_corrupt == 1


def test_a_block_damaged_in_transfer_is_refused_before_storing():
    shard = make_shard(4)
    good, bad = block_of(1), bytearray(block_of(2))
    sums = [checksum(good), checksum(bad)]
    bad[5] ^= 0x08
    with pytest.raises(CorruptBlock) as caught:
        shard.store([1, 2], [good, bad], 0.0, checksums=sums)
    assert caught.value.keys == (2,) and caught.value.events == []
    assert shard.holdings() == {}
    assert shard.store([1], [good], 1.0, checksums=sums[:1]).is_complete
