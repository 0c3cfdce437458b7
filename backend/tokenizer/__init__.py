"""The built-in tokenizer: text <-> token ids with no download, and the chat template.

The served model has dummy weights, so what matters is a deterministic mapping with a
realistic token count whose prefixes line up for prompt caching; see `synthetic.py`.
"""

from backend.tokenizer.chat import ROLES, apply_chat_template
from backend.tokenizer.synthetic import EOS_TOKEN_ID, SyntheticTokenizer

__all__ = ["EOS_TOKEN_ID", "ROLES", "SyntheticTokenizer", "apply_chat_template"]
