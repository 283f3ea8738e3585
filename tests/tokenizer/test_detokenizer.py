import random

import pytest

from shardline.tokenizer import IncrementalDetokenizer

KOREAN_EMOJI = "안녕하세요 😀 세계! 오늘 🚀 날씨가 좋네요 🎉👍 shardline ❤️ 끝"


def stream(detokenizer, token_ids, chunk_sizes=None):
    deltas, i = [], 0
    while i < len(token_ids):
        n = chunk_sizes.pop(0) if chunk_sizes else 1
        deltas.append(detokenizer.feed(token_ids[i:i + n]))
        i += n
    deltas.append(detokenizer.finish())
    return deltas


def test_precondition_characters_span_several_tokens(tokenizer):
    ids = tokenizer.encode(KOREAN_EMOJI, add_special_tokens=False).ids
    broken = [i for i in ids if "\ufffd" in tokenizer.decode([i])]
    assert len(broken) > 5, "the fixture must split characters over tokens or the test proves nothing"


def test_token_by_token_deltas_equal_one_shot_decode_and_never_break_a_character(tokenizer):
    ids = tokenizer.encode(KOREAN_EMOJI, add_special_tokens=False).ids
    deltas = stream(IncrementalDetokenizer(tokenizer), ids)
    assert all("\ufffd" not in d for d in deltas), f"a delta held half a character: {deltas}"
    assert "".join(deltas) == tokenizer.decode(ids) == KOREAN_EMOJI


def test_several_ids_per_feed_give_the_same_text(tokenizer):
    ids = tokenizer.encode(KOREAN_EMOJI * 3, add_special_tokens=False).ids
    sizes = [random.Random(0).randint(1, 5) for _ in range(len(ids))]
    deltas = stream(IncrementalDetokenizer(tokenizer), ids, sizes)
    assert "".join(deltas) == KOREAN_EMOJI * 3
    assert all("\ufffd" not in d for d in deltas)


def test_decoding_window_stays_small_on_a_long_sequence(tokenizer):
    class CountingTokenizer:
        def __init__(self, inner):
            self.inner, self.windows = inner, []

        def get_vocab_size(self, with_added_tokens=True):
            return self.inner.get_vocab_size(with_added_tokens=with_added_tokens)

        def decode(self, ids, skip_special_tokens=True):
            self.windows.append(len(ids))
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    ids = tokenizer.encode(KOREAN_EMOJI * 20, add_special_tokens=False).ids
    counting = CountingTokenizer(tokenizer)
    assert "".join(stream(IncrementalDetokenizer(counting), ids)) == KOREAN_EMOJI * 20
    assert len(ids) > 500
    assert max(counting.windows) <= 12, "each token must decode a short trailing window, not the sequence"
    assert len(counting.windows) <= 2 * len(ids) + 2


def test_special_tokens_are_skipped_like_one_shot_decode(tokenizer):
    eos = tokenizer.token_to_id("</s>")
    ids = tokenizer.encode("안녕 😀", add_special_tokens=True).ids + [eos]
    assert "".join(stream(IncrementalDetokenizer(tokenizer), ids)) == tokenizer.decode(ids) == "안녕 😀"
    kept = "".join(stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), ids))
    assert kept == tokenizer.decode(ids, skip_special_tokens=False) == "<s>안녕 😀</s>"


def test_incomplete_trailing_character_is_flushed_like_one_shot_decode(tokenizer):
    emoji_ids = tokenizer.encode("🤖", add_special_tokens=False).ids
    assert len(emoji_ids) > 1
    ids = tokenizer.encode("ok ", add_special_tokens=False).ids + emoji_ids[:-1]
    detokenizer = IncrementalDetokenizer(tokenizer)
    held = detokenizer.feed(ids)
    assert held == "ok ", "the half emoji must be held back while more tokens may complete it"
    assert held + detokenizer.finish() == tokenizer.decode(ids)


def test_prefix_tokens_are_context_only(tokenizer):
    prompt = tokenizer.encode("Hello, world! 안녕", add_special_tokens=False).ids
    generated = tokenizer.encode("하세요 😀", add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, prefix_token_ids=prompt)
    text = "".join(stream(detokenizer, generated))
    assert text == tokenizer.decode(prompt + generated)[len(tokenizer.decode(prompt)):]
    assert detokenizer.num_tokens == len(generated)


def test_stop_string_is_held_back_then_truncated(tokenizer):
    text = "Hello, world! 안녕하세요"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["world"])
    emitted = ""
    for n, token_id in enumerate(ids, start=1):
        emitted += detokenizer.feed(token_id)
        assert "w" not in emitted, f"'{emitted}' released text that could still become the stop string"
        if detokenizer.is_finished:
            break
    assert emitted == "Hello, "
    assert detokenizer.matched_stop == "world"
    assert tokenizer.decode(ids[:n]).endswith("world") and not tokenizer.decode(ids[:n - 1]).endswith("world")
    assert detokenizer.num_tokens == n, "num_tokens counts through the token that completed the stop"
    assert detokenizer.feed(ids[n:]) == "" and detokenizer.num_tokens == n, "ids after a stop are ignored"
    assert detokenizer.finish() == ""


def test_stop_string_spanning_multibyte_tokens(tokenizer):
    text = "오늘 날씨가 좋네요 🎉👍 끝"
    stop = "요 🎉"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, stop=[stop])
    deltas = stream(detokenizer, ids)
    assert "".join(deltas) == text[:text.index(stop)] == "오늘 날씨가 좋네"
    assert detokenizer.matched_stop == stop
    assert all("\ufffd" not in d for d in deltas)


def test_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode("the quick brown fox jumps", add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["fox", "quick", "the lazy"])
    assert "".join(stream(detokenizer, ids)) == "the "
    assert detokenizer.matched_stop == "quick"


def test_held_back_text_is_released_once_it_cannot_match(tokenizer):
    text = "Hello, world! How are you"
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["world!!", "you?"])
    deltas = stream(detokenizer, ids)
    assert "".join(deltas[:-1]) == "Hello, world! How are ", "'you' may still become 'you?'"
    assert deltas[-1] == "you", "finish releases what no longer can match"
    assert detokenizer.matched_stop is None


def test_stop_match_inside_one_multi_id_feed_counts_the_completing_token(tokenizer):
    ids = tokenizer.encode("안녕하세요 세계", add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["하세"])
    assert detokenizer.feed(ids) == "안녕"
    # Text is read once it decodes without a trailing partial character, so the match is seen
    # at the first token after which the text holds the stop and ends on a whole character.
    readable = [n for n in range(1, len(ids) + 1) if not tokenizer.decode(ids[:n]).endswith("\ufffd")]
    first = next(n for n in readable if "하세" in tokenizer.decode(ids[:n]))
    assert detokenizer.num_tokens == first < len(ids)


def test_bad_input_names_the_field(tokenizer):
    vocab_size = tokenizer.get_vocab_size()
    with pytest.raises(ValueError, match=rf"token_ids: token id {vocab_size} is outside"):
        IncrementalDetokenizer(tokenizer).feed([5, vocab_size])
    with pytest.raises(ValueError, match=r"token_ids: token id -1"):
        IncrementalDetokenizer(tokenizer).feed(-1)
    with pytest.raises(ValueError, match=r"stop\[1\] is an empty string"):
        IncrementalDetokenizer(tokenizer, stop=["x", ""])
