"""The same workers on CUDA in bf16: prefill with reuse and decode run there (GPU only)."""

import pytest
import torch

from agents.model import block_from_bytes, block_to_bytes, build_model
from agents.workers import BlockSource, DecodeRequest, DecodeWorker, PrefillWorker
from tests.agents.model.helpers import BLOCK_SIZE, prompt

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_bf16_prefill_with_reuse_and_decode_on_cuda():
    model = build_model("small", seed=0)
    assert model.device.type == "cuda"
    assert model.dtype in (torch.bfloat16, torch.float16)
    worker = PrefillWorker(model, BLOCK_SIZE)
    tokens = prompt(200, seed=1)
    full = worker.prefill(tokens)
    stored = [bytes(block_to_bytes(block)) for block in full.new_blocks[:8]]
    blocks = [block_from_bytes(data, model.config, BLOCK_SIZE, model.dtype) for data in stored]
    reused = worker.prefill(tokens, source=BlockSource(blocks, device=model.device))
    assert reused.num_cached_tokens == 8 * BLOCK_SIZE
    # bf16 rounds differently along the two paths: compare loosely, and the argmax.
    assert torch.allclose(reused.logits, full.logits, atol=0.1, rtol=0.05)
    outputs = []
    decode = DecodeWorker(model, on_finish=outputs.append)
    first = int(full.logits.argmax())
    decode.submit(DecodeRequest("r", full.paged_kv(BLOCK_SIZE), first, max_tokens=4))
    decode.run_until_idle()
    assert len(outputs[0].output_tokens) == 4
