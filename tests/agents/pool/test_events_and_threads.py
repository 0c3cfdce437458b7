"""The shard's KV events keep the Conductor's index exact, and concurrent calls stay sound."""

import random
import sys
import threading

import pytest

from agents.pool import CorruptBlock, MissingBlock
from backend.policy import PrefixIndex
from tests.agents.pool.helpers import block_of, make_shard, replay, ssd_files, store


def _prompts(rng: random.Random, num_prompts: int) -> list[list[int]]:
    """Prompts sharing prefixes: paths in a tree of branching 3 (a key names its path)."""
    prompts = []
    for _ in range(num_prompts):
        key, keys = 0, []
        for _ in range(rng.randint(1, 8)):
            key = key * 4 + rng.randint(1, 3)
            keys.append(key)
        prompts.append(keys)
    return prompts


def _corrupt_something(shard, rng: random.Random, ssd_dir) -> None:
    dram = shard._state.dram
    if dram.blocks and rng.random() < 0.5:
        slot, _ = dram.blocks[rng.choice(sorted(dram.blocks))]
        dram.arena.view(slot)[rng.randrange(256)] ^= 0x10
    elif ssd_dir is not None and ssd_files(ssd_dir):
        path = rng.choice(ssd_files(ssd_dir))
        data = bytearray(path.read_bytes())
        data[rng.randrange(len(data))] ^= 0x10
        path.write_bytes(data)


@pytest.mark.parametrize("policy", ["lru", "lfu", "length-aware"])
@pytest.mark.parametrize("has_ssd", [True, False])
def test_replayed_events_match_the_shard_after_a_random_workload(tmp_path, policy, has_ssd):
    rng = random.Random(7)
    ssd_dir = tmp_path if has_ssd else None
    shard = make_shard(12, ssd_dir=ssd_dir, ssd_blocks=10 if has_ssd else 0, policy=policy)
    index = PrefixIndex()
    prompts = _prompts(rng, 40)
    universe = {key for prompt in prompts for key in prompt}
    pinned: list[list[int]] = []
    num_corrupt_seen = 0
    for step in range(1500):
        prompt, roll, now_s = rng.choice(prompts), rng.random(), float(step)
        if roll < 0.4:
            cached = shard.prefix_length(prompt) if rng.random() < 0.5 else 0
            replay(index, store(shard, prompt[cached:], now_s, first_depth=cached).events)
        elif roll < 0.7:
            keys = prompt[: shard.prefix_length(prompt)]
            try:
                loaded = shard.load(keys, now_s)
            except CorruptBlock as corrupt:
                num_corrupt_seen += len(corrupt.keys)
                replay(index, corrupt.events)
            else:
                assert [bytes(block) for block in loaded.blocks] == [block_of(k) for k in keys]
                replay(index, loaded.events)
        elif roll < 0.8:
            pinned.append(prompt[: rng.randint(1, len(prompt))])
            shard.pin(pinned[-1])
        elif roll < 0.9 and pinned:
            shard.unpin(pinned.pop(rng.randrange(len(pinned))))
        elif roll < 0.97:
            replay(index, shard.evict(rng.sample(sorted(universe), 3), now_s))
        else:
            _corrupt_something(shard, rng, ssd_dir)
        if step % 100 == 0 or step == 1499:
            held = shard.holdings()
            assert {key: index.tier_of("prefill-00", key) for key in universe} == {
                key: held.get(key) for key in universe
            }
    stats = shard.stats()
    assert stats.num_stored - stats.num_evicted == stats.num_dram_blocks + stats.num_ssd_blocks
    assert stats.num_corrupt == num_corrupt_seen > 0
    assert stats.num_dram_hits + stats.num_ssd_hits > 0 and stats.num_evicted > 0
    if has_ssd:
        assert stats.num_demoted > 0 and stats.num_promoted > 0
        assert len(ssd_files(tmp_path)) == stats.num_ssd_blocks


def test_concurrent_stores_loads_and_evictions_keep_the_shard_sound(tmp_path):
    shard = make_shard(16, ssd_dir=tmp_path, ssd_blocks=16)
    prompts = _prompts(random.Random(3), 30)
    failures: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(250):
                prompt, roll = rng.choice(prompts), rng.random()
                if roll < 0.45:
                    store(shard, prompt, float(step))
                elif roll < 0.9:
                    keys = prompt[: shard.prefix_length(prompt)]
                    shard.pin(keys)
                    try:
                        blocks = shard.load(keys, float(step)).blocks
                        assert [bytes(b) for b in blocks] == [block_of(k) for k in keys]
                    except MissingBlock:
                        pass  # evicted between prefix_length and pin
                    finally:
                        shard.unpin(keys)
                else:
                    shard.evict(rng.sample(prompt, 1), float(step))
        except BaseException as error:  # reported below, with the thread's seed
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    switch_interval_s = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so calls really interleave
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch_interval_s)
    assert failures == []
    state = shard._state
    assert not state.pins and not state.dram.pending
    assert set(state.dram.cache._keys) == set(state.dram.blocks)
    assert set(state.ssd.cache._keys) == set(state.ssd.blocks)
    assert state.dram.arena.num_free + len(state.dram.blocks) == 16
    assert all(block.data is None for block in state.ssd.blocks.values())
    stats = shard.stats()
    assert stats.num_corrupt == 0
    assert stats.num_stored - stats.num_evicted == stats.num_dram_blocks + stats.num_ssd_blocks
    assert len(ssd_files(tmp_path)) == stats.num_ssd_blocks
    assert not [path for path in tmp_path.iterdir() if path.suffix != ".kv"]
