"""A real model's own tokenizer: byte-level BPE from its checkpoint, through `tokenizers`.

Built from what the checkpoint carries (`read_tokenizer_spec`): a GGUF file's vocabulary,
merges, control tokens, pre-tokenizer name and chat template (metadata only: the weights
are not read), or a Hugging Face folder's `tokenizer.json` and `tokenizer_config.json`.
Hugging Face's `tokenizers` library does the BPE (the same Rust code transformers runs), so
ids match the model's training.

Streaming: one token of a byte-level BPE can hold part of a multi-byte character, so text
is decoded incrementally (`StreamDecoder`): each new token decodes the tokens since the last
complete character, and nothing is sent while the text ends in an incomplete one.
"""

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# llama.cpp's pre-tokenizer names whose rule splits digits one by one before the GPT-2
# regex (StarCoder's family, SmolLM2's); every other "gpt2"-model name uses the regex alone.
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_INCOMPLETE = "\ufffd"
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _byte_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in for each byte (GPT-2's table), inverted."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


_BYTE_OF_CHAR = _byte_alphabet()


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """A model's own tokenizer as its checkpoint describes it (byte-level BPE)."""

    tokens: list[str]
    merges: list[str]
    special_ids: list[int]  # control tokens: matched whole, never split or merged
    bos_id: int | None  # prepended to every encoding when the checkpoint says so
    eos_id: int
    chat_template: str | None
    pre: str | None = None  # GGUF's pre-tokenizer name (e.g. "smollm")
    tokenizer_json: Path | None = None  # a Hugging Face tokenizer.json instead of tokens


class TokenizerError(ValueError):
    """A checkpoint whose tokenizer cannot be read, with what and where."""


def read_tokenizer_spec(path: Path | str) -> TokenizerSpec:
    """The tokenizer of a `.gguf` file or of a Hugging Face folder."""
    path = Path(path)
    if path.is_dir():
        return _spec_of_folder(path)
    if path.suffix != ".gguf" or not path.is_file():
        raise TokenizerError(f"{path}: not a .gguf file or a checkpoint folder")
    from gguf import GGUFReader

    try:
        fields = GGUFReader(path).fields
    except Exception as error:  # the reader raises what its parser met: say which file
        raise TokenizerError(f"{path.name}: not a readable GGUF file: {error}") from None

    def value(key: str, default: object = KeyError) -> object:
        if key not in fields:
            if default is KeyError:
                raise TokenizerError(f"{path.name}: GGUF metadata lacks {key!r}")
            return default
        return fields[key].contents()

    if value("tokenizer.ggml.model") != "gpt2":
        raise TokenizerError(
            f"{path.name}: tokenizer {value('tokenizer.ggml.model')!r} is not supported "
            "(only byte-level BPE, 'gpt2')"
        )
    token_types = list(value("tokenizer.ggml.token_type"))  # type: ignore[call-overload]
    add_bos = bool(value("tokenizer.ggml.add_bos_token", False))
    return TokenizerSpec(
        tokens=list(value("tokenizer.ggml.tokens")),  # type: ignore[call-overload]
        merges=list(value("tokenizer.ggml.merges")),  # type: ignore[call-overload]
        special_ids=[i for i, kind in enumerate(token_types) if kind == 3],  # CONTROL
        bos_id=int(value("tokenizer.ggml.bos_token_id")) if add_bos else None,  # type: ignore[call-overload]
        eos_id=int(value("tokenizer.ggml.eos_token_id")),  # type: ignore[call-overload]
        chat_template=value("tokenizer.chat_template", None),  # type: ignore[arg-type]
        pre=value("tokenizer.ggml.pre", None),  # type: ignore[arg-type]
    )


def _spec_of_folder(folder: Path) -> TokenizerSpec:
    file = folder / "tokenizer.json"
    if not file.is_file():
        raise TokenizerError(f"{folder}: no tokenizer.json")
    described = json.loads(file.read_text())
    special = [t["id"] for t in described.get("added_tokens", []) if t.get("special")]
    config_file, settings_file = folder / "config.json", folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    eos = config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    if eos is None:
        raise TokenizerError(f"{config_file}: no eos_token_id")
    return TokenizerSpec(
        tokens=[],
        merges=[],
        special_ids=special,
        bos_id=None,
        eos_id=int(eos),
        chat_template=settings.get("chat_template"),
        tokenizer_json=file,
    )


class ModelTokenizer:
    """Text <-> a real model's token ids, its end-of-sequence id and chat template."""

    @classmethod
    def from_checkpoint(cls, path: Path | str) -> "ModelTokenizer":
        return cls(read_tokenizer_spec(path))

    def __init__(self, spec: TokenizerSpec) -> None:
        self.spec = spec
        if spec.tokenizer_json is not None:
            self._tokenizer = Tokenizer.from_file(str(spec.tokenizer_json))
        else:
            self._tokenizer = _byte_level_bpe(spec)
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.eos_token_id = spec.eos_id
        self.chat_template = spec.chat_template
        self._special = set(spec.special_ids)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; control tokens written in the text (a chat template's
        `<|im_start|>`) become their own ids."""
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if self.spec.bos_id is not None:
            ids.insert(0, self.spec.bos_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, control tokens left out."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def stream_decoder(self) -> "StreamDecoder":
        return StreamDecoder(self)

    def chat_prompt(self, messages: Iterable[tuple[str, str]]) -> str:
        """The prompt of (role, content) messages by the model's own chat template (Jinja,
        rendered sandboxed as transformers renders it), with the assistant's turn opened."""
        if self.chat_template is None:
            raise ValueError("this model has no chat template: send a prompt, not messages")
        template = _jinja().from_string(self.chat_template)
        return template.render(
            messages=[{"role": role, "content": content} for role, content in messages],
            add_generation_prompt=True,
            bos_token=self.spec.tokens[self.spec.bos_id] if self.spec.bos_id is not None else "",
            eos_token=self.spec.tokens[self.eos_token_id] if self.spec.tokens else "",
        )

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (part of a character, possibly); a control
        token's are its name (`<|im_end|>`)."""
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            raise ValueError(f"token id {token_id} is outside [0, {self.vocab_size})")
        if token_id in self._special:
            return piece.encode()
        if (match := _BYTE_FALLBACK.fullmatch(piece)) is not None:  # SentencePiece's <0x0A>
            return bytes([int(match.group(1), 16)])
        if all(char in _BYTE_OF_CHAR for char in piece):  # byte-level BPE's alphabet
            return bytes(_BYTE_OF_CHAR[char] for char in piece)
        return piece.replace("\u2581", " ").encode()  # SentencePiece's word boundary


class StreamDecoder:
    """Text of a growing token sequence, piece by piece, never half a character."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        self._tokenizer = tokenizer
        self._pending: list[int] = []  # tokens since the last complete character

    def feed(self, token_id: int) -> str:
        """The new text that `token_id` completes ('' while a character is still open)."""
        self._pending.append(token_id)
        text = self._tokenizer.decode(self._pending)
        if text.endswith(_INCOMPLETE) and len(self._pending) < 4:  # UTF-8: <= 4 bytes
            return ""
        self._pending = []
        return text


def _jinja():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def _byte_level_bpe(spec: TokenizerSpec) -> Tokenizer:
    vocab = {token: index for index, token in enumerate(spec.tokens)}
    merges = [tuple(merge.split(" ", 1)) for merge in spec.merges]
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if spec.pre in _DIGITS_FIRST:
        digits = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([digits, byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(spec.tokens[i], special=True, normalized=False) for i in spec.special_ids]
    )
    return tokenizer
