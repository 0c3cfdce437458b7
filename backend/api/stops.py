"""StopText: cuts generated text at the first stop sequence, as OpenAI's `stop` does.

The stop sequence and everything after it are not returned. Streamed, it holds back the
few trailing characters that could still be the start of a stop sequence, and releases
them once they cannot (or at the end). The agents have no early end for a request, so the
decode goes on to max_tokens; only the client's text stops.
"""

from collections.abc import Sequence


class StopText:
    """Feed text deltas in order; see the module docstring."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stop for stop in stops if stop)
        self.stopped = False
        self._held = ""

    def feed(self, delta: str) -> str:
        """The part of `delta` (with what was held back) that can be returned now."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        text = self._held + delta
        cuts = [i for stop in self.stops if (i := text.find(stop)) >= 0]
        if cuts:
            self.stopped, self._held = True, ""
            return text[: min(cuts)]
        hold = self._partial_stop_length(text)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """What is still held back, at the end of the text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def cut(self, text: str) -> str:
        """The whole text at once: feed plus flush."""
        return self.feed(text) + self.flush()

    def _partial_stop_length(self, text: str) -> int:
        """The longest suffix of `text` that begins some stop sequence."""
        longest = max(len(stop) for stop in self.stops) - 1
        for length in range(min(longest, len(text)), 0, -1):
            tail = text[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0
