"""The built-in tokenizer: determinism across processes, prefixes, ranges, round trips."""

import json
import os
import random
import subprocess
import sys

import pytest

from backend.tokenizer import EOS_TOKEN_ID, SyntheticTokenizer, apply_chat_template

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.\n\nSecond paragraph:\tcode = f(x) + 1;",
    "  leading spaces, café, naïve, 日本語のテキスト, emoji 🚀 and numbers 1234567890",
    "",
]


def test_the_same_ids_in_a_process_with_another_hash_seed() -> None:
    script = (
        "import json, sys; from backend.tokenizer import SyntheticTokenizer; "
        "print(json.dumps([SyntheticTokenizer(32000).encode(t) for t in json.load(sys.stdin)]))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(TEXTS),
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    tokenizer = SyntheticTokenizer(32000)
    assert json.loads(result.stdout) == [tokenizer.encode(text) for text in TEXTS]


def test_known_ids_do_not_drift() -> None:
    # Pinned: a change here invalidates every cached block key and recorded trace.
    assert SyntheticTokenizer(32000).encode("Hello, world!") == [2843, 24671, 21398, 20629]
    assert SyntheticTokenizer(32000).encode("baba zu ") == [76, 75]


@pytest.mark.parametrize("vocab_size", [2, 100, 32_000, 128_256])
def test_ids_are_in_range(vocab_size: int) -> None:
    tokenizer = SyntheticTokenizer(vocab_size)
    ids = [token_id for text in TEXTS for token_id in tokenizer.encode(text)]
    assert ids
    assert all(1 <= token_id < vocab_size for token_id in ids)


def test_vocab_size_below_two_is_refused() -> None:
    with pytest.raises(ValueError, match="vocab_size must be at least 2, got 1"):
        SyntheticTokenizer(1)


def test_token_count_is_realistic_for_english() -> None:
    text = " ".join(["the serving system caches prefixes of prompts in blocks"] * 20)
    num_words = len(text.split())
    num_tokens = len(SyntheticTokenizer().encode(text))
    assert num_words <= num_tokens <= 2 * num_words


@pytest.mark.parametrize(
    ("prefix", "rest"),
    [
        ("You are a helpful assistant. ", "Tell me a story."),
        ("line one\n", "line two"),
        ("", "anything at all"),
        ("ends in a word", ", then punctuation"),
        ("日本語 ", "テキスト"),
    ],
)
def test_text_prefix_gives_token_prefix(prefix: str, rest: str) -> None:
    tokenizer = SyntheticTokenizer()
    assert tokenizer.encode(prefix + rest) == tokenizer.encode(prefix) + tokenizer.encode(rest)


def test_prefix_property_on_random_cuts_after_whitespace() -> None:
    rng = random.Random(7)
    words = ["alpha", "beta,", "gamma.", "(delta)", "x=1;", "éclair", "\n", "long" * 5]
    tokenizer = SyntheticTokenizer()
    for _ in range(200):
        head = " ".join(rng.choices(words, k=rng.randint(1, 10))) + rng.choice([" ", "\n", "\t"])
        tail = "".join(rng.choices(words, k=rng.randint(1, 10))).lstrip()
        assert tokenizer.encode(head + tail) == tokenizer.encode(head) + tokenizer.encode(tail)


def test_generated_ids_round_trip() -> None:
    tokenizer = SyntheticTokenizer(32000)
    ids = [*random.Random(3).choices(range(1, 32000), k=5000), 1, 31999]
    text = tokenizer.decode(ids)
    assert tokenizer.encode(text) == ids
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert text == "".join(tokenizer.decode([token_id]) for token_id in ids)


def test_decode_is_readable_words_and_eos_is_empty() -> None:
    tokenizer = SyntheticTokenizer(32000)
    assert tokenizer.decode([1, 2, 76, EOS_TOKEN_ID]) == "ba be baba "
    assert tokenizer.decode([31999]).strip().isalpha()


def test_decode_refuses_ids_outside_the_vocab() -> None:
    with pytest.raises(ValueError, match=r"token id 32000 is outside \[0, 32000\)"):
        SyntheticTokenizer(32000).decode([32000])


def test_chat_template_format() -> None:
    prompt = apply_chat_template([("system", "Be brief."), ("user", "Hi")])
    assert prompt == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    no_generation = apply_chat_template([("user", "Hi")], add_generation_prompt=False)
    assert no_generation == "<|user|>\nHi\n"


def test_chat_template_refuses_unknown_roles() -> None:
    with pytest.raises(ValueError, match="role must be one of system, user, assistant"):
        apply_chat_template([("tool", "x")])


def test_chats_sharing_a_system_prompt_share_a_token_prefix() -> None:
    tokenizer = SyntheticTokenizer()
    system = ("system", "You are a support agent for ACME. Answer politely.  ")
    shared = tokenizer.encode(apply_chat_template([system], add_generation_prompt=False))
    first = tokenizer.encode(apply_chat_template([system, ("user", "Where is my order?")]))
    second = tokenizer.encode(apply_chat_template([system, ("user", "Cancel it.")]))
    assert first[: len(shared)] == second[: len(shared)] == shared
