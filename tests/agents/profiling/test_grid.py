"""ProfileGrid: cached prefixes in whole blocks without duplicates, decode cells that fit."""

import pytest

from agents.profiling import DEFAULT_GRID, QUICK_GRID


def test_cached_prefixes_are_whole_blocks_and_deduplicated():
    cells = DEFAULT_GRID.prefill_cells(64)
    assert all(cached % 64 == 0 and cached < inputs for inputs, cached in cells)
    assert len(cells) == len(set(cells)) == 29  # 256 x 0.75 and 256 x 0.9 both give 192
    assert (8192, 7360) in cells


@pytest.mark.parametrize(
    ("capacity_tokens", "num_cells"), [(10**9, 6), (16 * 256, 4), (4 * 4096, 5), (4 * 256, 2)]
)
def test_decode_cells_are_those_whose_kv_fits(capacity_tokens, num_cells):
    if num_cells < 3:
        with pytest.raises(ValueError, match="fewer than three decode shapes"):
            QUICK_GRID.decode_cells(capacity_tokens)
        return
    cells = QUICK_GRID.decode_cells(capacity_tokens)
    assert len(cells) == num_cells
    assert all(batch * context <= capacity_tokens for batch, context in cells)
