"""A download-free tokenizer: ASCII pre-tokenizer, byte chunks hashed into a synthetic vocab.

Encoding, in three steps, none of which depends on the process or the Python version:

1. Pre-tokenize into pieces: a run of ASCII word characters `[A-Za-z0-9_]`, or a run of
   any other non-whitespace characters, each with the ASCII whitespace that follows it
   attached; leading whitespace is a piece of its own. (ASCII classes, not `\\w`, so a new
   Unicode database cannot move a boundary.)
2. A piece that is a vocabulary word (below) gets that word's id.
3. Any other piece is cut into chunks of at most 6 UTF-8 bytes, and each chunk gets
   `1 + xxh3_64(chunk) % (vocab_size - 1)`. Six bytes make an English word with its space
   about 1.2 tokens and a CJK character about half a token, close to real BPE counts.

Vocabulary: id 0 is the end-of-sequence token (decodes to nothing); every other id k is a
pronounceable word, consonant-vowel syllables spelling k - 1 in bijective base 75, plus one
space ("ba ", "be ", ..., "baba ", ...). Decoding concatenates the words, so
`decode(ids) == "".join(decode([i]) for i in ids)` (streaming can decode token by token),
and `encode(decode(ids)) == ids` for any ids without the end-of-sequence token, so the
text of generated tokens round-trips. Text that is not made of vocabulary words does not
decode back to itself: hashing is one-way, and the model's weights are dummies anyway.

Prefix property: `encode(a + b) == encode(a) + encode(b)` whenever `a` is empty or ends in
whitespace and `b` does not start with whitespace (more generally, whenever the cut falls
between two pieces). The chat template ends every message with a newline and starts the
next with a role marker, so chats that share their first messages share a token prefix.
"""

import re
from collections.abc import Iterable

import xxhash

from backend.tokenizer.chat import apply_chat_template

EOS_TOKEN_ID = 0
CHUNK_BYTES = 6
MAX_CACHED_PIECES = 65_536
_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = tuple(c + v for c in _CONSONANTS for v in _VOWELS)
_SYLLABLE_INDEX = {syllable: index for index, syllable in enumerate(_SYLLABLES)}
_ASCII_SPACE = " \t\n\r\f\v"
_PIECE = re.compile(
    rf"[A-Za-z0-9_]+[{_ASCII_SPACE}]*"
    rf"|[^A-Za-z0-9_{_ASCII_SPACE}]+[{_ASCII_SPACE}]*"
    rf"|[{_ASCII_SPACE}]+"
)
_VOCAB_WORD = re.compile(rf"(?:[{_CONSONANTS}][{_VOWELS}])+ ")


class SyntheticTokenizer:
    """Deterministic text <-> ids over `vocab_size` ids (match the model preset's vocab)."""

    def __init__(self, vocab_size: int = 32_000) -> None:
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be at least 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self.eos_token_id = EOS_TOKEN_ID
        self._num_words = vocab_size - 1
        self._max_word_chars = len(_spell(self._num_words - 1)) + 1
        # Pieces repeat (words of a language): their ids, for the most recent MAX_CACHED.
        self._piece_ids: dict[str, tuple[int, ...]] = {}

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, each in [1, vocab_size); never the end-of-sequence id."""
        ids: list[int] = []
        cache = self._piece_ids
        for piece in _PIECE.findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                piece_ids = self._encode_piece(piece)
                if len(cache) >= MAX_CACHED_PIECES:
                    cache.clear()  # rare; cheaper than tracking recency on every hit
                cache[piece] = piece_ids
            ids.extend(piece_ids)
        return ids

    def _encode_piece(self, piece: str) -> tuple[int, ...]:
        word_id = self._word_id(piece)
        if word_id is not None:
            return (word_id,)
        raw = piece.encode("utf-8")
        return tuple(
            1 + xxhash.xxh3_64_intdigest(raw[start : start + CHUNK_BYTES]) % self._num_words
            for start in range(0, len(raw), CHUNK_BYTES)
        )

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`: one vocabulary word per id, the end-of-sequence id as ''."""
        return "".join(self.token_text(token_id) for token_id in ids)

    def token_text(self, token_id: int) -> str:
        """The text of one id (what a stream sends for it)."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")
        if token_id == EOS_TOKEN_ID:
            return ""
        return _spell(token_id - 1) + " "

    def token_bytes(self, token_id: int) -> bytes:
        return self.token_text(token_id).encode()

    def stream_decoder(self) -> "_TokenByToken":
        """Streamed text: every id is a whole word, so each token's text goes out at once."""
        return _TokenByToken(self)

    def chat_prompt(self, messages: Iterable[tuple[str, str]]) -> str:
        """The prompt of (role, content) messages, by the built-in template (chat.py)."""
        return apply_chat_template(messages)

    def _word_id(self, piece: str) -> int | None:
        if len(piece) > self._max_word_chars or not _VOCAB_WORD.fullmatch(piece):
            return None
        index = _unspell(piece[:-1])
        return index + 1 if index < self._num_words else None


class _TokenByToken:
    def __init__(self, tokenizer: SyntheticTokenizer) -> None:
        self.feed = tokenizer.token_text


def _spell(index: int) -> str:
    # Bijective base 75: every non-negative index has exactly one spelling and vice versa.
    syllables: list[str] = []
    index += 1
    while index:
        index, digit = divmod(index - 1, len(_SYLLABLES))
        syllables.append(_SYLLABLES[digit])
    return "".join(reversed(syllables))


def _unspell(word: str) -> int:
    value = 0
    for start in range(0, len(word), 2):
        value = value * len(_SYLLABLES) + _SYLLABLE_INDEX[word[start : start + 2]] + 1
    return value - 1
