"""The global prefix index: updates from KV events and longest-prefix lookups."""

from backend.policy import PrefixIndex, Tier


def test_stored_evicted_demoted_and_dropped() -> None:
    index = PrefixIndex()
    index.on_stored("A", [1, 2, 3])
    index.on_stored("B", [1, 2], Tier.SSD)
    assert dict(index.holders(1)) == {"A": Tier.DRAM, "B": Tier.SSD}
    assert index.num_blocks("A") == 3 and len(index) == 3

    index.on_demoted("A", [3])
    assert index.tier_of("A", 3) is Tier.SSD
    index.on_stored("A", [3], Tier.DRAM)  # promoted back on use
    assert index.tier_of("A", 3) is Tier.DRAM

    index.on_evicted("A", [2])
    assert dict(index.holders(2)) == {"B": Tier.SSD}
    index.on_evicted("B", [2])
    assert index.holders(2) == {} and len(index) == 2

    assert index.drop_instance("A") == 2
    assert index.num_replicas(1) == 1 and index.holders(3) == {}
    assert index.drop_instance("nobody") == 0
    index.on_evicted("nobody", [1])  # late events from unknown instances are harmless


def test_prefix_blocks_is_the_longest_contiguous_prefix_per_instance() -> None:
    index = PrefixIndex()
    index.on_stored("A", [10, 11, 13])  # a gap at 12: A's prefix stops at 2 blocks
    index.on_stored("B", [10, 11, 12, 13])
    index.on_stored("C", [11, 12])  # no first block: nothing reusable
    keys = [10, 11, 12, 13, 14]
    assert index.prefix_blocks(keys, ["A", "B", "C", "D"]) == {"A": 2, "B": 4, "C": 0, "D": 0}
    assert index.prefix_blocks([], ["A"]) == {"A": 0}
    assert index.prefix_blocks([99], ["A", "B"]) == {"A": 0, "B": 0}
