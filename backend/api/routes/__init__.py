"""The REST API's serving routes (OpenAI-compatible and native) over a `ConductorRuntime`.

`include_routes(app, runtime)` mounts them; route functions only convert (through
`backend.api.schemas.convert`), submit and relay: the policy decides in the runtime.
"""

import time

from fastapi import FastAPI

from backend.api.routes import admin, calibration, live, native, observe, openai
from backend.api.routes.serving import (
    VOCAB_SIZE,
    Rejected,
    Served,
    on_invalid_request,
    on_rejected,
)
from backend.api.schemas.convert import ApiLimits, InvalidRequest
from backend.runtime import ConductorRuntime
from backend.settings.conductor import ConductorSettings
from backend.tokenizer import SyntheticTokenizer, Tokenizer


def served_tokenizer(served_model: str) -> Tokenizer:
    """The tokenizer of the model the API serves: a real model's own (by its registry name
    or path, agents.model.registry), else the synthetic one of the dummy presets."""
    from agents.model.registry import resolve_model
    from backend.tokenizer.model_tokenizer import ModelTokenizer

    try:
        source = resolve_model(served_model)
    except ValueError:
        return SyntheticTokenizer(VOCAB_SIZE)  # a name of the operator's choosing, dummies
    if source.checkpoint is None:
        assert source.config is not None
        return SyntheticTokenizer(source.config.vocab_size)
    return ModelTokenizer.from_checkpoint(source.checkpoint)


def default_limits(settings: ConductorSettings, vocab_size: int = VOCAB_SIZE) -> ApiLimits:
    """The API's limits as the settings give them (served_model, max_*_tokens)."""
    return ApiLimits(
        models=(settings.served_model,),
        max_input_tokens=settings.max_input_tokens,
        max_output_tokens=settings.max_output_tokens,
        vocab_size=vocab_size,
        block_size=settings.block_size,
    )


def include_routes(
    app: FastAPI, runtime: ConductorRuntime, *, limits: ApiLimits | None = None
) -> None:
    """Mount the serving routes on an app made by `create_app` (which set its metrics)."""
    settings = app.state.settings
    tokenizer = served_tokenizer(settings.served_model)
    if limits is not None and isinstance(tokenizer, SyntheticTokenizer):
        tokenizer = SyntheticTokenizer(limits.vocab_size)
    limits = limits or default_limits(settings, tokenizer.vocab_size)
    if limits.block_size != runtime.config.block_size:  # the API hands the runtime its keys
        raise ValueError(
            f"the API's block size {limits.block_size} != the runtime's {runtime.config.block_size}"
        )
    app.state.served = Served(
        runtime=runtime,
        limits=limits,
        tokenizer=tokenizer,
        metrics=app.state.metrics,
        default_ttft_slo_s=settings.ttft_slo_s,
        default_tbt_slo_s=settings.tbt_slo_s,
        submitted={},
        started_at=int(time.time()),
    )
    app.add_exception_handler(Rejected, on_rejected)
    app.add_exception_handler(InvalidRequest, on_invalid_request)
    app.include_router(openai.router)
    app.include_router(native.router)
    app.include_router(admin.router)
    app.include_router(observe.router)
    app.include_router(live.router)
    app.include_router(calibration.router)


__all__ = ["default_limits", "include_routes"]
