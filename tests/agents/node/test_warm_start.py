"""A young agent's first requests at steady speed: the allocator it sets and its warm-up."""

import subprocess
import sys

import pytest

from agents.node import AgentSettings, NodeAgent

SECRET = "s" * 32


def test_the_agent_process_takes_the_steady_allocator_settings() -> None:
    # In a process of its own: the setting holds for the whole process, as in an agent.
    code = "from agents.node.allocator import steady_allocator; print(steady_allocator())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    expected = "True" if sys.platform == "linux" else "False"
    assert done.stdout.strip() == expected, done.stderr


def test_a_prefill_agent_warms_up_without_storing_or_announcing_anything() -> None:
    settings = AgentSettings("prefill", "127.0.0.1:0", "127.0.0.1:0", SECRET, block_size=16)
    agent = NodeAgent(settings, "warm")
    try:
        assert agent.warm_up(300) > 0  # prompts of 64, 128, 256 and 300 tokens
        assert agent.stats().num_stored == 0
        assert agent.take_events() == []
    finally:
        agent.close()


def test_a_negative_warm_up_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="warm-up tokens must be >= 0"):
        AgentSettings("prefill", "127.0.0.1:0", "127.0.0.1:0", SECRET, warmup_tokens=-1)
