"""Text <-> token ids and chat templates: the built-in synthetic tokenizer of the dummy
models (no download; see `synthetic.py`) and a real model's own (`model_tokenizer.py`).

Both offer `encode`, `decode`, `stream_decoder()` (text of a token stream, never half a
character), `token_bytes(id)` (the bytes one token stands for, for log-probabilities),
`chat_prompt(messages)`, `vocab_size` and `eos_token_id`: the `Tokenizer` protocol the REST
API uses.
"""

from collections.abc import Iterable
from typing import Protocol

from backend.tokenizer.chat import ROLES, apply_chat_template
from backend.tokenizer.synthetic import EOS_TOKEN_ID, SyntheticTokenizer


class StreamDecoder(Protocol):
    def feed(self, token_id: int) -> str: ...


class Tokenizer(Protocol):
    vocab_size: int
    eos_token_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def stream_decoder(self) -> StreamDecoder: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def chat_prompt(self, messages: Iterable[tuple[str, str]]) -> str: ...


__all__ = [
    "EOS_TOKEN_ID",
    "ROLES",
    "StreamDecoder",
    "SyntheticTokenizer",
    "Tokenizer",
    "apply_chat_template",
]
