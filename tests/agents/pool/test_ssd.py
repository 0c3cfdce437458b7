"""The SSD tier: demotion and promotion round trips, atomic files, a full or failing SSD."""

import logging
import shutil

import pytest

from agents.pool.ssd_files import SsdDir
from backend.policy import KvDemoted, KvEvicted, KvStored, Tier
from tests.agents.pool.helpers import BLOCK_BYTES, block_of, make_shard, ssd_files, store


def test_demoted_blocks_come_back_byte_exact_and_are_promoted(tmp_path):
    shard = make_shard(2, ssd_dir=tmp_path, ssd_blocks=4)
    store(shard, [1, 2], 0.0)
    result = store(shard, [3, 4], 1.0)
    assert result.events == [
        KvDemoted(1.0, "prefill-00", (1, 2)),
        KvStored(1.0, "prefill-00", (3, 4), Tier.DRAM),
    ]
    files = ssd_files(tmp_path)
    assert len(files) == 2
    assert sorted(path.read_bytes() for path in files) == sorted([block_of(1), block_of(2)])

    loaded = shard.load([1], 2.0)
    assert bytes(loaded.blocks[0]) == block_of(1)
    assert loaded.events == [
        KvDemoted(2.0, "prefill-00", (3,)),
        KvStored(2.0, "prefill-00", (1,), Tier.DRAM),
    ]
    assert shard.holdings() == {1: Tier.DRAM, 2: Tier.SSD, 3: Tier.SSD, 4: Tier.DRAM}
    assert len(ssd_files(tmp_path)) == 2  # 1's file removed, 3's written
    assert bytes(shard.load([1], 3.0).blocks[0]) == block_of(1)  # now from DRAM
    assert [bytes(b) for b in shard.load([2, 3], 4.0).blocks] == [block_of(2), block_of(3)]
    stats = shard.stats()
    assert (stats.num_demoted, stats.num_promoted, stats.num_ssd_hits) == (5, 3, 3)
    assert stats.num_stored - stats.num_evicted == stats.num_dram_blocks + stats.num_ssd_blocks


def test_storing_a_block_held_on_ssd_promotes_it(tmp_path):
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=4)
    store(shard, [1], 0.0)
    store(shard, [2], 1.0)
    assert shard.holdings() == {1: Tier.SSD, 2: Tier.DRAM}
    result = store(shard, [1], 2.0)
    assert result.events[-1] == KvStored(2.0, "prefill-00", (1,), Tier.DRAM)
    assert shard.holdings() == {1: Tier.DRAM, 2: Tier.SSD}
    assert [path.read_bytes() for path in ssd_files(tmp_path)] == [block_of(2)]
    assert shard.stats().num_stored == 2


def test_a_full_ssd_evicts_in_policy_order(tmp_path):
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=2)
    for now_s, key in enumerate([1, 2, 3]):
        store(shard, [key], float(now_s))
    result = store(shard, [4], 3.0)  # 3 goes to SSD, pushing out 1
    assert result.events[:2] == [
        KvEvicted(3.0, "prefill-00", (1,)),
        KvDemoted(3.0, "prefill-00", (3,)),
    ]
    assert shard.holdings() == {2: Tier.SSD, 3: Tier.SSD, 4: Tier.DRAM}
    assert len(ssd_files(tmp_path)) == 2


def test_an_ssd_full_of_pinned_blocks_drops_the_demoted_block_and_keeps_serving(tmp_path, caplog):
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=1)
    store(shard, [1], 0.0)
    store(shard, [2], 1.0)  # 1 to SSD
    shard.pin([1])
    with caplog.at_level(logging.WARNING):
        result = store(shard, [3], 2.0)
    assert result.events == [
        KvEvicted(2.0, "prefill-00", (2,)),
        KvStored(2.0, "prefill-00", (3,), Tier.DRAM),
    ]
    assert "SSD tier full of pinned blocks" in caplog.text
    assert [bytes(b) for b in shard.load([1, 3], 3.0).blocks] == [block_of(1), block_of(3)]


def test_a_failing_ssd_write_drops_the_block_with_an_event_and_keeps_serving(tmp_path, caplog):
    ssd = tmp_path / "ssd"
    shard = make_shard(1, ssd_dir=ssd, ssd_blocks=4)
    store(shard, [1], 0.0)
    shutil.rmtree(ssd)
    ssd.write_bytes(b"not a directory")  # every write now fails with an OSError
    with caplog.at_level(logging.WARNING):
        result = store(shard, [2], 1.0)
    assert result.events == [
        KvDemoted(1.0, "prefill-00", (1,)),
        KvEvicted(1.0, "prefill-00", (1,)),
        KvStored(1.0, "prefill-00", (2,), Tier.DRAM),
    ]
    assert "cannot write block 0x1 to SSD" in caplog.text
    assert shard.holdings() == {2: Tier.DRAM}
    assert bytes(shard.load([2], 2.0).blocks[0]) == block_of(2)
    stats = shard.stats()
    assert (stats.num_ssd_write_errors, stats.num_evicted, stats.num_ssd_blocks) == (1, 1, 0)


def test_leftovers_of_a_crash_are_removed_at_start(tmp_path):
    (tmp_path / "00000000000000ab-3.kv").write_bytes(b"an old block")
    (tmp_path / "00000000000000ab-4.kvtmp1234.tmp").write_bytes(b"half a blo")
    (tmp_path / "notes.txt").write_text("not ours")
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=2)
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]
    assert shard.holdings() == {}
    assert shard.prefix_length([0xAB]) == 0


def test_block_files_appear_whole_or_not_at_all(tmp_path):
    files = SsdDir(tmp_path)
    path = files.path_for(0xAB, 0)
    files.write(path, block_of(0xAB))
    assert path.read_bytes() == block_of(0xAB)
    with pytest.raises(TypeError):
        files.write(files.path_for(0xCD, 1), None)  # fails mid-write
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    shard = make_shard(1, ssd_dir=tmp_path, ssd_blocks=8)
    for now_s in range(6):
        store(shard, [now_s], float(now_s))
        assert not [p for p in tmp_path.iterdir() if p.suffix != ".kv"]
        assert all(p.stat().st_size == BLOCK_BYTES for p in tmp_path.iterdir())
