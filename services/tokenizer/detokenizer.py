"""Incremental detokenization: generated token ids in, text deltas out.

Contract: for one sequence, the concatenated deltas of `feed` and `finish` equal
`tokenizer.decode(all_ids)` exactly, unless a stop string matched, in which case they equal that
text cut just before the first occurrence of the stop string. No delta ever holds half a UTF-8
character: with byte-level BPE one character (Korean, emoji) spans several tokens, and a delta is
released only once the text decoded so far does not end in U+FFFD. Text that may still grow into
a stop string is held back until it either matches (stop) or can no longer (release). A match is
seen when the text through it has been read, i.e. at the first token after which the decoded
text ends on a whole character (a token may carry the stop's last bytes and the next
character's first ones; the match then waits for that character).

Cost is O(1) per token, not O(sequence): only a window of trailing tokens is decoded, the
prefix/read-offset technique of vLLM. `_prefix_offset.._read_offset` are tokens already emitted,
decoded again only as context (so that a SentencePiece "▁word" keeps its space, which decoding a
token alone would strip); `_read_offset..` are tokens not yet emitted. Both offsets always sit at
character boundaries, so decode(window) - decode(context) is exactly the new text.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what decode() yields for an incomplete UTF-8 sequence
# Prompt tokens kept as decoding context for the first generated token (vLLM uses 5-6).
NUM_PREFIX_CONTEXT_TOKENS = 6


class IncrementalDetokenizer:
    """Turns one sequence's generated token ids into text deltas, honouring stop strings.

    `feed` returns the new text (possibly "", while text is held back); `finish` flushes what is
    held back once no more tokens will come. After a stop string matched, `is_finished` is true,
    `matched_stop` names it, and further ids are ignored (tokens already in flight are harmless).
    """

    def __init__(self, tokenizer: Tokenizer, *, stop: Sequence[str] = (),
                 prefix_token_ids: Sequence[int] = (), skip_special_tokens: bool = True) -> None:
        for i, s in enumerate(stop):
            if not s:
                raise ValueError(f"stop[{i}] is an empty string; remove it (it would match before any text)")
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._stop = tuple(stop)
        self._token_ids: list[int] = []
        for token_id in prefix_token_ids[-NUM_PREFIX_CONTEXT_TOKENS:]:
            self._token_ids.append(self._checked(token_id, "prefix_token_ids"))
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._prefix_text: str | None = None  # decode(window[prefix:read]), cached per offset pair
        self._pending = ""  # decoded but held back: may still become a stop string
        self.num_tokens = 0  # generated ids consumed (through the one that completed a stop)
        self.matched_stop: str | None = None
        self.is_finished = False

    def feed(self, token_ids: int | Iterable[int]) -> str:
        """Consume the next generated id(s) and return the text that became final."""
        if isinstance(token_ids, int):
            token_ids = (token_ids,)
        deltas = []
        for token_id in token_ids:
            if self.is_finished:
                break
            # One token at a time, so that a stop match knows the token that completed it.
            self._token_ids.append(self._checked(token_id, "token_ids"))
            self.num_tokens += 1
            deltas.append(self._release(self._read_new_text(final=False), final=False))
        return "".join(deltas)

    def finish(self) -> str:
        """No more tokens: return everything still held back (an incomplete trailing character
        decodes to U+FFFD, exactly as the one-shot decode would have it)."""
        if self.is_finished:
            return ""
        text = self._release(self._read_new_text(final=True), final=True)
        self.is_finished = True
        return text

    def _checked(self, token_id: int, field: str) -> int:
        if not 0 <= token_id < self._vocab_size:
            raise ValueError(
                f"{field}: token id {token_id} is outside the tokenizer's vocabulary [0, {self._vocab_size}); "
                "send ids the model's tokenizer produced (a model vocabulary padded beyond the "
                "tokenizer's must not sample the padding ids)")
        return token_id

    def _decode(self, token_ids: list[int]) -> str:
        return self._tokenizer.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def _read_new_text(self, *, final: bool) -> str:
        """Text of the tokens after _read_offset, if it ends on a whole character (or `final`)."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._token_ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._token_ids[self._prefix_offset:])
        if len(new_text) <= len(self._prefix_text) or (new_text.endswith(REPLACEMENT_CHAR) and not final):
            return ""  # nothing new yet, or the last character is still incomplete
        delta = new_text[len(self._prefix_text):]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._token_ids)
        self._prefix_text = None
        # Emitted ids before the new context are never decoded again; drop them now and then so
        # that a long generation does not keep its whole id list.
        if self._prefix_offset > 1024:
            del self._token_ids[:self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return delta

    def _release(self, delta: str, *, final: bool) -> str:
        """Apply stop strings to new text: return what is final, keep what may become a stop."""
        if not self._stop:
            return delta
        self._pending += delta
        # A match can only start inside _pending: anything released earlier was, by construction,
        # not the start of any stop string's prefix.
        match = self._first_stop_match()
        if match is not None:
            start, stop = match
            text, self._pending = self._pending[:start], ""
            self.matched_stop, self.is_finished = stop, True
            return text
        keep = 0 if final else self._longest_stop_prefix_suffix()
        text = self._pending[:len(self._pending) - keep]
        self._pending = self._pending[len(self._pending) - keep:]
        return text

    def _first_stop_match(self) -> tuple[int, str] | None:
        best: tuple[int, int, str] | None = None  # (start, end, stop): the match that ends first wins ties
        for stop in self._stop:
            start = self._pending.find(stop)
            if start >= 0 and (best is None or (start, start + len(stop)) < best[:2]):
                best = (start, start + len(stop), stop)
        return None if best is None else (best[0], best[2])

    def _longest_stop_prefix_suffix(self) -> int:
        """Length of the longest end of _pending that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stop:
            for k in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:k]):
                    longest = k
                    break
        return longest
