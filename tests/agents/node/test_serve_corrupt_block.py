"""A block that fails its checksum in the holder's own shard, asked for over the data plane:
the requester is told which keys are corrupt, and the holder reports the drop as a KV event
for the Conductor. In process: nothing outside the shard can damage its memory."""

import pytest

from agents.node import AgentSettings, NodeAgent
from agents.transport import CorruptBlocksError, make_transport
from backend.policy import KvEvicted
from backend.policy.blocks import block_keys
from backend.policy.effects import CachePlan

SECRET = "test-secret-0123456789"


@pytest.fixture
def holder():
    settings = AgentSettings("prefill", "127.0.0.1:0", "127.0.0.1:0", SECRET, block_size=16)
    agent = NodeAgent(settings, "holder")
    yield agent
    agent.close()


def test_a_corrupt_shard_block_is_reported_to_the_requester_and_the_conductor(holder) -> None:
    tokens = list(range(1, 3 * 16 + 1))
    keys = block_keys(tokens, 16)
    holder.prefill("r1", tokens, CachePlan((), None, 0, len(tokens)), None)
    holder.take_events()
    slot, _ = holder.shard._state.dram.blocks[keys[1]]  # damage it as a bad DIMM would
    holder.shard._state.dram.arena.view(slot)[5] ^= 0x40

    requester = make_transport("tcp", secret=SECRET)
    try:
        with pytest.raises(CorruptBlocksError) as caught:
            requester.fetch(holder.data_address, keys)
    finally:
        requester.close()
    assert caught.value.keys == (keys[1],)
    evicted = [e for e in holder.take_events() if isinstance(e, KvEvicted)]
    assert [(e.instance_id, e.keys) for e in evicted] == [("holder", (keys[1],))]
    assert holder.shard.holdings().keys() == {keys[0], keys[2]}
