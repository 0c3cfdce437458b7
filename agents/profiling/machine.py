"""What machine a profile was measured on, and the instance capacities it defaults to.

Defaults, each overridable from the command line: the DRAM pool takes half of physical
memory, the SSD tier half of the free space where its files live, and decode KV 90% of the
GPU's free memory on CUDA or a quarter of physical memory on CPU (where the pool and the
decode KV share the same memory).
"""

import datetime
import os
import platform
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from agents.model import LlamaModel

DRAM_POOL_SHARE = 0.5
SSD_POOL_SHARE = 0.5
CUDA_DECODE_SHARE = 0.9
CPU_DECODE_SHARE = 0.25


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(model: LlamaModel) -> dict[str, Any]:
    """CPU, cores, memory, torch, device and the date, for the profile's `measured` section."""
    device = model.device
    info: dict[str, Any] = {
        "cpu_model": cpu_model(),
        "num_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "physical_memory_bytes": physical_memory_bytes(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "dtype": str(model.dtype).removeprefix("torch."),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def default_capacities(
    model: LlamaModel, kv_bytes_per_token: int, ssd_dir: Path | None
) -> dict[str, int]:
    """The `instance` section's capacities by the rules in the module docstring."""
    memory = physical_memory_bytes()
    free_disk = shutil.disk_usage(ssd_dir or tempfile.gettempdir()).free
    if model.device.type == "cuda":
        free_device, _ = torch.cuda.mem_get_info(model.device)
        decode_bytes = CUDA_DECODE_SHARE * free_device
    else:
        decode_bytes = CPU_DECODE_SHARE * memory
    return {
        "dram_capacity_bytes": int(DRAM_POOL_SHARE * memory),
        "ssd_capacity_bytes": int(SSD_POOL_SHARE * free_disk),
        "decode_kv_capacity_tokens": int(decode_bytes // kv_bytes_per_token),
    }
