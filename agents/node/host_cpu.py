"""The host's CPU counters, read with each heartbeat for the Conductor's calibration.

Linux counts, since boot and over all CPUs, the time spent in each state (the first line of
/proc/stat, in clock ticks). The Conductor takes the busy seconds between two heartbeats of
one host, less what the agents' compute threads measured, as what the rest of the host
spent (the Conductor, clients, the agents' other threads): measured on a 2-CPU host at
speed 7, 0.31-0.43 cores over a warm-up and 0.35-0.48 over the busier window after it
(0.05 more on average), which the agents' work there lacked. Agents on one machine report
one `host_id` (its boot id), so the Conductor counts the machine once.
"""

import os
from pathlib import Path

from backend.policy.calibration import HostCpuSample

PROC_STAT = Path("/proc/stat")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice;
# guest time is counted in user already.
IDLE_FIELDS = (3, 4)
COUNTED_FIELDS = 8


def parse_proc_stat(text: str, ticks_per_s: float) -> tuple[int, float, float]:
    """(cpus, busy seconds, total seconds) of a /proc/stat text; ValueError if it has no
    cpu lines."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("cpu "):
        raise ValueError("/proc/stat has no aggregate cpu line")
    ticks = [int(field) for field in lines[0].split()[1 : 1 + COUNTED_FIELDS]]
    total = sum(ticks)
    idle = sum(ticks[i] for i in IDLE_FIELDS if i < len(ticks))
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return max(cpus, 1), (total - idle) / ticks_per_s, total / ticks_per_s


def read_host_cpu(time_s: float) -> HostCpuSample | None:
    """This host's counters now, or None where they cannot be read (not Linux)."""
    try:
        text = PROC_STAT.read_text()
        host_id = BOOT_ID.read_text().strip() if BOOT_ID.exists() else os.uname().nodename
        cpus, busy_s, total_s = parse_proc_stat(text, float(os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError):
        return None
    return HostCpuSample(time_s, host_id, cpus, busy_s, total_s)
