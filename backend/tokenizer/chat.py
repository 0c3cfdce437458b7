"""The chat template: how a list of (role, content) messages becomes one prompt string.

Format (documented for clients that want to predict token counts):

    <|system|>\\n{content}\\n<|user|>\\n{content}\\n<|assistant|>\\n

Each message is its role marker, a newline, its content and a newline; with
`add_generation_prompt` an open assistant marker follows for the model to continue. A
message therefore ends in whitespace and the next starts with "<|", a tokenizer piece
boundary, so two chats that share their first messages (a shared system prompt) share the
token ids of those messages exactly and hit the same cached blocks.
"""

from collections.abc import Iterable

ROLES = ("system", "user", "assistant")


def apply_chat_template(
    messages: Iterable[tuple[str, str]], *, add_generation_prompt: bool = True
) -> str:
    """The prompt for `messages`, given as (role, content) pairs with roles in ROLES."""
    parts: list[str] = []
    for role, content in messages:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        parts.append(f"<|{role}|>\n{content}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
