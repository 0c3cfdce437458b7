"""The host's CPU counters an agent sends with each heartbeat (agents/node/host_cpu.py)."""

import os
import time

import pytest

from agents.node.host_cpu import parse_proc_stat, read_host_cpu

# A 2-CPU host's /proc/stat (clock ticks of 10 ms): user nice system idle iowait irq
# softirq steal guest guest_nice.
PROC_STAT = """cpu  1000 200 300 5000 100 10 20 30 40 0
cpu0 500 100 150 2500 50 5 10 15 20 0
cpu1 500 100 150 2500 50 5 10 15 20 0
intr 12345
ctxt 6789
"""


def test_busy_is_every_counted_state_but_idle_and_iowait_and_guest_is_not_counted_twice() -> None:
    cpus, busy_s, total_s = parse_proc_stat(PROC_STAT, ticks_per_s=100.0)
    assert cpus == 2
    # user + nice + system + irq + softirq + steal = 1560 ticks; + idle + iowait = 6660.
    assert busy_s == pytest.approx(15.6)
    assert total_s == pytest.approx(66.6)
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        parse_proc_stat("intr 1\n", ticks_per_s=100.0)


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc/stat")
def test_this_hosts_counters_grow_with_work_and_name_the_host() -> None:
    first = read_host_cpu(1.0)
    assert first is not None
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:  # a fifth of a CPU second of work
        pass
    second = read_host_cpu(2.0)
    assert second is not None and second.host_id == first.host_id and first.host_id
    assert second.cpus == first.cpus == os.cpu_count()
    assert second.busy_s - first.busy_s >= 0.15
    assert 0 <= second.busy_s <= second.total_s
