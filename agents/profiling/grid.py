"""ProfileGrid: which prefill and decode shapes a profile measures, and how often each."""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ProfileGrid:
    """The measured shapes. Cached prefixes are fractions of the prompt rounded down to whole
    blocks; decode contexts are per request (a point records the batch's total context)."""

    input_tokens: tuple[int, ...]
    cached_fractions: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    context_per_request_tokens: tuple[int, ...]
    num_rounds: int  # passes over the whole grid; each cell keeps its fastest
    num_decode_steps: int
    num_pool_blocks: int
    link_num_blocks: int
    link_repeats: int

    def __post_init__(self) -> None:
        for name in ("input_tokens", "batch_sizes", "context_per_request_tokens"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"{name} must hold positive numbers, got {values}")
        if not self.cached_fractions or not all(0 <= f < 1 for f in self.cached_fractions):
            raise ValueError(f"cached_fractions must lie in [0, 1), got {self.cached_fractions}")
        for name in ("num_rounds", "num_decode_steps", "num_pool_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def prefill_cells(self, block_size: int) -> list[tuple[int, int]]:
        """(input_tokens, offered cached tokens) pairs, whole blocks, without repeats."""
        cells = {
            (inputs, int(inputs * fraction) // block_size * block_size)
            for inputs in self.input_tokens
            for fraction in self.cached_fractions
        }
        return sorted(cells)

    def decode_cells(self, capacity_tokens: int) -> list[tuple[int, int]]:
        """(batch_size, context per request) pairs whose KV fits `capacity_tokens`; a
        ValueError when fewer than three fit (the policy's decode fit needs three)."""
        cells = [
            (batch, context)
            for context in self.context_per_request_tokens
            for batch in self.batch_sizes
            if batch * context <= capacity_tokens
        ]
        if len(cells) < 3:
            raise ValueError(
                f"a decode KV capacity of {capacity_tokens} tokens leaves fewer than three "
                "decode shapes to measure"
            )
        return cells


# --quick: about 10 s for the tiny preset on two CPU cores; what the tests run.
QUICK_GRID = ProfileGrid(
    input_tokens=(256, 1024, 2048),
    cached_fractions=(0.0, 0.5, 0.9),
    batch_sizes=(1, 4, 16),
    context_per_request_tokens=(256, 4096),
    num_rounds=4,
    num_decode_steps=6,
    num_pool_blocks=32,
    link_num_blocks=16,
    link_repeats=3,
)

# The default: a few minutes for tiny on two CPU cores.
DEFAULT_GRID = ProfileGrid(
    input_tokens=(256, 512, 1024, 2048, 4096, 8192),
    cached_fractions=(0.0, 0.25, 0.5, 0.75, 0.9),
    batch_sizes=(1, 2, 4, 8, 16, 32),
    context_per_request_tokens=(256, 1024, 4096),
    num_rounds=3,
    num_decode_steps=8,
    num_pool_blocks=128,
    link_num_blocks=64,
    link_repeats=5,
)
