"""`kvcentric profile`: measure a model preset's workers, pool tiers and link into a profile.

The profile (format kvcentric-profile/1) is what the policy (CostModel.from_profile) and the
twin (`--profile PATH`) read. torch is imported only when the command runs. Every bad input
ends as one `error: ...` line on stderr with exit code 2, before anything is measured.
"""

import os
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_stderr = Console(stderr=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _check_out(out: Path) -> None:
    """Fail now, not after minutes of measuring, when `out` cannot be written."""
    if out.is_dir():
        _fail(f"--out {out} is a directory")
    parent = out.parent
    if not parent.is_dir():
        _fail(f"--out {out}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        _fail(f"--out {out} is not writable")


def profile(
    preset: str = typer.Option(
        "tiny",
        "--model",
        "--preset",
        help="The model to profile: a real one (smollm2-135m), a checkpoint path or a dummy "
        "preset (tiny ... llama2-70b).",
    ),
    out: Path = typer.Option(..., "--out", help="Where to write the profile JSON."),
    block_size: int = typer.Option(64, "--block-size", min=1, help="Tokens per KV block."),
    quick: bool = typer.Option(False, "--quick", help="The small grid (seconds on tiny)."),
    ssd_dir: Path | None = typer.Option(
        None, "--ssd-dir", help="Where the SSD tier's files go (default: the temp directory)."
    ),
    name: str | None = typer.Option(None, "--name", help="Profile name (default PRESET-DEVICE)."),
    dram_capacity_bytes: int | None = typer.Option(
        None, "--dram-capacity-bytes", min=0, help="DRAM pool per instance (default: half RAM)."
    ),
    ssd_capacity_bytes: int | None = typer.Option(
        None, "--ssd-capacity-bytes", min=0, help="SSD tier per instance (default: half free)."
    ),
    decode_kv_capacity_tokens: int | None = typer.Option(
        None, "--decode-kv-capacity-tokens", min=1, help="Decode KV capacity (default: memory)."
    ),
) -> None:
    """Measure prefill (input x cached tokens), decode steps (batch x context), pool tier
    store/load per block and the TCP link between two processes; write the profile."""
    from agents.model.registry import resolve_model  # imports torch: only when it runs

    try:
        resolve_model(preset)
    except ValueError as error:
        _fail(str(error))
    _check_out(out)
    if ssd_dir is not None and not ssd_dir.is_dir():
        _fail(f"--ssd-dir {ssd_dir} is not a directory")

    from agents.profiling import DEFAULT_GRID, QUICK_GRID, run_profile, write_profile

    grid = QUICK_GRID if quick else DEFAULT_GRID
    if decode_kv_capacity_tokens is not None:
        try:
            grid.decode_cells(decode_kv_capacity_tokens)
        except ValueError as error:
            _fail(str(error))

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=_stderr) as progress:
        task = progress.add_task("profiling", total=None)

        def on_progress(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what)

        try:
            result = run_profile(
                preset,
                block_size=block_size,
                grid=grid,
                ssd_dir=ssd_dir,
                name=name,
                dram_capacity_bytes=dram_capacity_bytes,
                ssd_capacity_bytes=ssd_capacity_bytes,
                decode_kv_capacity_tokens=decode_kv_capacity_tokens,
                on_progress=on_progress,
            )
        except ValueError as error:  # a default capacity too small, found on the device
            progress.stop()
            _fail(str(error))
    try:
        write_profile(result, out)
    except OSError as error:
        _fail(f"cannot write --out {out}: {error.strerror or error}")
    link, storage = result["link"], result["storage"]
    typer.echo(
        f"wrote {out}: {len(result['prefill_points'])} prefill and "
        f"{len(result['decode_points'])} decode points; link "
        f"{link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, {link['latency_s'] * 1e6:.0f} us; "
        f"DRAM {storage['dram_read_bytes_per_s'] / 1e9:.2f} GB/s, "
        f"SSD {storage['ssd_read_bytes_per_s'] / 1e9:.2f} GB/s",
        err=True,
    )
