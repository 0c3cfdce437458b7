"""The prefill and decode workers and the KV source/sink interfaces they load and store through."""

from agents.workers.decode import DecodeOutcome, DecodeRequest, DecodeWorker
from agents.workers.kv_io import BlockSink, BlockSource, KvSink, KvSource
from agents.workers.prefill import PrefillResult, PrefillTimings, PrefillWorker
from agents.workers.sampling import SamplingParams, TokenLogprob, sample, token_logprob

__all__ = [
    "BlockSink",
    "BlockSource",
    "DecodeOutcome",
    "DecodeRequest",
    "DecodeWorker",
    "KvSink",
    "KvSource",
    "PrefillResult",
    "PrefillTimings",
    "PrefillWorker",
    "SamplingParams",
    "TokenLogprob",
    "sample",
    "token_logprob",
]
