"""The real SmolLM2-135M in our own model and workers, against transformers on the same file.

transformers (the independent implementation, a test dependency only) loads the same GGUF
file, dequantized as we do; our LlamaModel, PrefillWorker and DecodeWorker must give its
first-position logits and its greedy tokens, with and without reused or fetched prefix KV.
"""

import pytest
import torch

from agents.model import block_from_bytes, block_to_bytes, build_model
from agents.workers import BlockSource, DecodeRequest, DecodeWorker, PrefillWorker
from backend.tokenizer.model_tokenizer import ModelTokenizer
from tests.harness.reference_model import (
    MODEL,
    load_reference,
    load_reference_tokenizer,
    load_tokenizer,
    needs_real_model,
    reference_greedy,
)

pytestmark = needs_real_model
BLOCK_SIZE = 16
NUM_TOKENS = 32
# Our fp32 pass and transformers' fp32 pass differ only in the order of their sums.
LOGITS_ATOL = 1e-3
CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why 9 is not prime.",
]


@pytest.fixture(scope="module")
def tokenizer() -> ModelTokenizer:
    return load_tokenizer()


@pytest.fixture(scope="module")
def model():
    return build_model(MODEL, device="cpu")


@pytest.fixture(scope="module")
def reference():
    return load_reference()


@pytest.fixture(scope="module")
def reference_tokenizer():
    return load_reference_tokenizer()


def chat_prompt(tokenizer: ModelTokenizer, question: str) -> list[int]:
    return tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")


def our_greedy(model, prompt: list[int], num_tokens: int, source=None) -> list[int]:
    result = PrefillWorker(model, BLOCK_SIZE).prefill(prompt, source=source)
    outputs: dict[str, tuple[int, ...]] = {}
    worker = DecodeWorker(
        model, on_finish=lambda outcome: outputs.__setitem__("r", outcome.output_tokens)
    )
    first = int(result.logits.argmax())
    worker.submit(DecodeRequest("r", result.paged_kv(BLOCK_SIZE), first, num_tokens))
    worker.run_until_idle()
    return list(outputs["r"])


@pytest.mark.parametrize("question", CHATS)
def test_first_position_logits_agree_with_transformers(model, reference, tokenizer, question):
    prompt = chat_prompt(tokenizer, question)
    ours, _ = model.full_prefill(torch.tensor(prompt))
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0, -1]
    assert (ours - theirs).abs().max().item() < LOGITS_ATOL
    assert int(ours.argmax()) == int(theirs.argmax())


@pytest.mark.parametrize("question", CHATS)
def test_greedy_output_through_our_workers_equals_transformers(
    model, reference, tokenizer, question
):
    prompt = chat_prompt(tokenizer, question)
    assert our_greedy(model, prompt, NUM_TOKENS) == reference_greedy(reference, prompt, NUM_TOKENS)


def test_the_answer_is_the_real_one(model, tokenizer):
    prompt = chat_prompt(tokenizer, CHATS[0])
    text = tokenizer.decode(our_greedy(model, prompt, 12))
    assert text.startswith("The capital of France is Paris.")


def test_a_reused_and_a_fetched_prefix_give_the_same_tokens(model, reference, tokenizer):
    """The prefix KV of an earlier prefill, as the local pool holds it (tensors) and as
    another agent sends it (bytes), in the layer-wise prefill, then decode."""
    system = "<|im_start|>system\nYou are a careful assistant who answers briefly.<|im_end|>\n"
    first = tokenizer.encode(system + "<|im_start|>user\nName a planet.<|im_end|>\n")
    prompt = tokenizer.encode(
        system + "<|im_start|>user\nName a colour of the rainbow.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    shared = next(i for i, (a, b) in enumerate(zip(first, prompt, strict=False)) if a != b)
    blocks = PrefillWorker(model, BLOCK_SIZE).prefill(first).new_blocks[: shared // BLOCK_SIZE]
    assert blocks, "the two prompts must share at least one block"
    fetched = [
        block_from_bytes(bytes(block_to_bytes(b)), model.config, BLOCK_SIZE, model.dtype)
        for b in blocks
    ]
    expected = reference_greedy(reference, prompt, NUM_TOKENS)
    assert our_greedy(model, prompt, NUM_TOKENS, source=BlockSource(blocks)) == expected
    assert our_greedy(model, prompt, NUM_TOKENS, source=BlockSource(fetched)) == expected


@pytest.mark.parametrize(
    "text",
    [
        "What is the capital of France?",
        "Numbers 12345 and 3.14159, émigré café, 東京, emoji 🙂!",
        "<|im_start|>user\nhi<|im_end|>\n",
        "  leading spaces\tand\ttabs\n\nnew lines",
    ],
)
def test_our_tokenizer_gives_transformers_ids(tokenizer, reference_tokenizer, text):
    assert tokenizer.encode(text) == reference_tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(tokenizer.encode(text)) == reference_tokenizer.decode(
        reference_tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True
    )


def test_streamed_text_never_splits_a_character(tokenizer):
    text = "Tokyo is 東京; a smile 🙂 and café."
    ids = tokenizer.encode(text)
    decoder = tokenizer.stream_decoder()
    pieces = [decoder.feed(token) for token in ids]
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)
    assert any(piece == "" for piece in pieces)  # some tokens hold part of a character


def test_chunked_pipeline_prefill_gives_the_same_tokens(model, reference, tokenizer):
    """Two stage processes of 15 layers each, the prompt in chunks of 32 tokens flowing
    through them; its KV then decodes in one worker."""
    from agents.model import PagedKv
    from agents.workers.pipeline import PipelineGroup

    prompt = chat_prompt(
        tokenizer,
        "Here is a short story. A lighthouse keeper on a small island kept a log of every "
        "ship that passed. One winter night a ship came without lights, and he rang the "
        "bell until dawn. Tell me, in one sentence, why he rang the bell.",
    )
    assert len(prompt) > 32, "several chunks"
    with PipelineGroup(
        MODEL, 2, block_size=BLOCK_SIZE, prefill_chunk_tokens=32, device="cpu"
    ) as group:
        result = group.prefill(prompt)
    assert result.is_pipelined and result.num_chunks > 1
    expected = reference_greedy(reference, prompt, NUM_TOKENS)
    assert int(result.logits.argmax()) == expected[0]
    outputs: dict[str, tuple[int, ...]] = {}
    worker = DecodeWorker(
        model, on_finish=lambda outcome: outputs.__setitem__("r", outcome.output_tokens)
    )
    kv = PagedKv.from_layers(list(result.layers), BLOCK_SIZE)
    worker.submit(DecodeRequest("r", kv, expected[0], NUM_TOKENS))
    worker.run_until_idle()
    assert list(outputs["r"]) == expected


def test_the_benchmark_against_transformers_reports_every_cell():
    """Untimed: `kvcentric bench against-transformers` measures both on the same inputs."""
    from agents.bench.against_transformers import against_transformers_benchmark

    result = against_transformers_benchmark(
        MODEL, prefill_tokens=(32,), batch_sizes=(1, 2), context_tokens=16, num_repeats=1
    )
    assert [p["tokens"] for p in result["prefill"]] == [32]
    assert [d["batch_size"] for d in result["decode"]] == [1, 2]
    for cell in result["prefill"] + result["decode"]:
        assert cell["ours_s"] > 0 and cell["transformers_s"] > 0
        assert cell["ratio"] == pytest.approx(cell["transformers_s"] / cell["ours_s"])
    assert result["model_param_bytes"] > 500 << 20  # 135M fp32 weights, the head shared


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_real_model_in_bf16_on_cuda_agrees_with_fp32(model, reference, tokenizer):
    """On a GPU the checkpoint loads in bf16 (fp16 where bf16 is missing): the first-position
    distribution stays close to transformers' fp32 one, and the answer is the real one."""
    gpu = build_model(MODEL)
    assert gpu.device.type == "cuda" and gpu.dtype in (torch.bfloat16, torch.float16)
    prompt = chat_prompt(tokenizer, CHATS[0])
    ours, _ = gpu.full_prefill(torch.tensor(prompt))
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0, -1]
    ours_p, theirs_p = torch.softmax(ours.cpu(), -1), torch.softmax(theirs, -1)
    assert (ours_p - theirs_p).abs().sum().item() < 0.1  # total variation, bf16 rounding
    answer = tokenizer.decode(our_greedy(gpu, prompt, 16))
    assert "Paris" in answer
