"""RooflineTiming: the twin's analytic ground truth, from a model's FLOPs and HBM bytes.

Prefill  = max(FLOPs / effective FLOP/s, weights / effective HBM bandwidth) + pass overhead,
           FLOPs = 2 * params per new token + causal attention over the exact query-key pairs.
Decode   = max((weights + KV of the batch) / effective HBM bandwidth, FLOPs / effective
           FLOP/s) + pass overhead.
Overhead = num_layers * per_layer_overhead_s + per_pass_overhead_s (kernel launches, TP
           all-reduce latency, scheduling and sampling).
docs/twin-timing.md derives the paper profile's figures from these formulas.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from backend.policy.cost_model import ServingFit
from twin.host import HostCores
from twin.profile_fields import (
    InstanceCapacities,
    StorageSpeeds,
    integer,
    number,
    read_link,
    read_storage,
    section,
)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A decoder-only transformer's shape (LLaMA architecture, grouped-query attention)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    num_params: float
    bytes_per_param: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_param

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.bytes_per_param

    @property
    def linear_flops_per_token(self) -> float:
        return 2.0 * self.num_params

    @property
    def attention_flops_per_pair(self) -> float:
        """QK^T and PV of one query-key pair over all query heads and layers."""
        return 4.0 * self.num_heads * self.head_dim * self.num_layers

    @property
    def matrix_params(self) -> float:
        """Parameters of the layers' weight matrices (no embeddings): a floor for num_params."""
        kv_width = self.num_kv_heads * self.head_dim
        per_layer = (
            2 * self.hidden_size * self.num_heads * self.head_dim  # q and o projections
            + 2 * self.hidden_size * kv_width  # k and v projections
            + 3 * self.hidden_size * self.ffn_size  # SwiGLU gate, up and down
        )
        return float(self.num_layers * per_layer)


@dataclass(frozen=True, slots=True)
class Hardware:
    """One instance: its GPUs, the efficiencies it reaches and its fixed overheads."""

    num_gpus: int
    peak_flops_per_gpu: float
    hbm_bytes_per_s_per_gpu: float
    hbm_bytes_per_gpu: float
    activation_reserve_bytes: float
    prefill_mfu: float
    decode_hbm_efficiency: float
    per_layer_overhead_s: float
    per_pass_overhead_s: float

    @property
    def effective_flops_per_s(self) -> float:
        return self.num_gpus * self.peak_flops_per_gpu * self.prefill_mfu

    @property
    def effective_hbm_bytes_per_s(self) -> float:
        return self.num_gpus * self.hbm_bytes_per_s_per_gpu * self.decode_hbm_efficiency


@dataclass(frozen=True, slots=True)
class RooflineTiming:
    """Ground-truth durations of one LLaMA-shaped model on one kind of instance."""

    name: str
    shape: ModelShape
    hardware: Hardware
    link_bandwidth_bytes_per_s: float
    link_latency_s: float
    storage: StorageSpeeds
    dram_capacity_bytes: int
    ssd_capacity_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return self.shape.kv_bytes_per_token

    @property
    def serving(self) -> ServingFit:
        """An analytic model has no serving path of its own."""
        return ServingFit()

    @property
    def host_cores(self) -> HostCores | None:
        """An analytic model's instances each have their own machine."""
        return None

    def decode_share(self) -> Callable[[int], float] | None:
        return None

    def prefill_share(self, solo_s: float = 0.0) -> Callable[[int], float] | None:
        return None

    @property
    def measures_decode_pauses(self) -> bool:
        return False

    def decode_pause_s(self, num_busy: int) -> float | None:
        return None

    def dispatch_delay_s(self) -> float:
        return 0.0

    def answer_delay_s(self) -> float:
        return 0.0

    def first_token_delay_s(self) -> float:
        return 0.0

    def handover_delay_s(self) -> float:
        return 0.0

    @property
    def instance(self) -> InstanceCapacities:
        free_hbm_bytes = (
            self.hardware.num_gpus * self.hardware.hbm_bytes_per_gpu
            - self.shape.weight_bytes
            - self.hardware.activation_reserve_bytes
        )
        return InstanceCapacities(
            dram_capacity_bytes=self.dram_capacity_bytes,
            ssd_capacity_bytes=self.ssd_capacity_bytes,
            decode_kv_capacity_tokens=max(int(free_hbm_bytes // self.kv_bytes_per_token), 0),
        )

    @property
    def pass_overhead_s(self) -> float:
        hardware = self.hardware
        return self.shape.num_layers * hardware.per_layer_overhead_s + hardware.per_pass_overhead_s

    @property
    def weight_read_s(self) -> float:
        """Reading every weight once from HBM: the floor of any forward pass."""
        return self.shape.weight_bytes / self.hardware.effective_hbm_bytes_per_s

    def prefill_flops(self, input_tokens: int, cached_tokens: int) -> float:
        """FLOPs of the new tokens: positions cached..input-1, each attending to p+1 keys."""
        input_tokens = max(input_tokens, 1)
        cached_tokens = min(max(cached_tokens, 0), input_tokens - 1)  # >= 1 token computed
        new_tokens = input_tokens - cached_tokens
        pairs = (input_tokens * (input_tokens + 1) - cached_tokens * (cached_tokens + 1)) // 2
        return (
            new_tokens * self.shape.linear_flops_per_token
            + pairs * self.shape.attention_flops_per_pair
        )

    def prefill_s(self, input_tokens: int, cached_tokens: int) -> float:
        compute_s = self.prefill_flops(input_tokens, cached_tokens) / (
            self.hardware.effective_flops_per_s
        )
        return max(compute_s, self.weight_read_s) + self.pass_overhead_s

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        context_tokens = max(context_tokens, 0)
        memory_s = (
            self.shape.weight_bytes + context_tokens * self.kv_bytes_per_token
        ) / self.hardware.effective_hbm_bytes_per_s
        flops = (
            batch_size * self.shape.linear_flops_per_token
            + context_tokens * self.shape.attention_flops_per_pair
        )
        compute_s = flops / self.hardware.effective_flops_per_s
        return max(memory_s, compute_s) + self.pass_overhead_s

    def transfer_s(self, num_bytes: int) -> float:
        if num_bytes <= 0:
            return 0.0
        return self.link_latency_s + num_bytes / self.link_bandwidth_bytes_per_s

    def load_s(self, num_bytes: int, tier: str) -> float:
        return self.storage.load_s(num_bytes, tier)

    @classmethod
    def from_profile(cls, data: Mapping[str, Any]) -> "RooflineTiming":
        """Build from a profile dict with a `roofline` section; errors name the field."""
        roofline = section(data, "roofline")
        model = section(roofline, "model", "roofline.")
        hardware = section(roofline, "hardware", "roofline.")
        shape = ModelShape(
            **{name: integer(model, name, "roofline.model.") for name in _SHAPE_INTEGERS},
            num_params=number(model, "num_params", "roofline.model."),
        )
        if shape.num_params < shape.matrix_params:
            raise ValueError(
                f"'roofline.model.num_params' {shape.num_params:.4g} is below the "
                f"{shape.matrix_params:.4g} parameters of the layers' weight matrices"
            )
        numbers = {
            name: number(hardware, name, "roofline.hardware.", allow_zero=name in _MAY_BE_ZERO)
            for name in _HARDWARE_NUMBERS
        }
        for name in ("prefill_mfu", "decode_hbm_efficiency"):
            if numbers[name] > 1:
                raise ValueError(f"'roofline.hardware.{name}' must be at most 1")
        hw = Hardware(num_gpus=integer(hardware, "num_gpus", "roofline.hardware."), **numbers)
        if "kv_bytes_per_token" in data and data["kv_bytes_per_token"] != shape.kv_bytes_per_token:
            raise ValueError(
                f"'kv_bytes_per_token' {data['kv_bytes_per_token']!r} disagrees with the model "
                f"shape's {shape.kv_bytes_per_token}"
            )
        bandwidth, latency = read_link(data)
        instance = section(data, "instance")
        return cls(
            name=str(data.get("name", "roofline")),
            shape=shape,
            hardware=hw,
            link_bandwidth_bytes_per_s=bandwidth,
            link_latency_s=latency,
            storage=read_storage(data),
            dram_capacity_bytes=integer(
                instance, "dram_capacity_bytes", "instance.", allow_zero=True
            ),
            ssd_capacity_bytes=integer(
                instance, "ssd_capacity_bytes", "instance.", allow_zero=True
            ),
        )


_SHAPE_INTEGERS = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_dim",
    "ffn_size",
    "bytes_per_param",
)
_HARDWARE_NUMBERS = (
    "peak_flops_per_gpu",
    "hbm_bytes_per_s_per_gpu",
    "hbm_bytes_per_gpu",
    "activation_reserve_bytes",
    "prefill_mfu",
    "decode_hbm_efficiency",
    "per_layer_overhead_s",
    "per_pass_overhead_s",
)
_MAY_BE_ZERO = frozenset(
    {"activation_reserve_bytes", "per_layer_overhead_s", "per_pass_overhead_s"}
)
