"""A real byte-level BPE tokenizer, trained here on a small corpus so that nothing is downloaded.

With ~300 tokens (256 byte symbols plus a few merges) a Korean syllable (3 UTF-8 bytes) or an
emoji (4 bytes) is usually split over several tokens: exactly the case where a naive
token-by-token decode emits U+FFFD or drops characters.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello, world!",
    "Pipeline stages pass activations; tensor-parallel ranks all-reduce partial sums.",
    "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 정말 좋네요.",
    "한국어 토크나이저 테스트 문장입니다. 세계 여러분 안녕!",
    "Emoji time 😀 🚀 🎉 👍 ❤️ 🤖 and more 🙂.",
    "the user asked the assistant a question and the assistant answered the user",
]


def train_tokenizer(vocab_size: int = 300) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    # Like Llama: add_special_tokens=True prepends BOS.
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", bos_id)])
    return tok


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return train_tokenizer()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A HuggingFace-style model directory with only the tokenizer files."""
    path = tmp_path_factory.mktemp("model")
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": {"__type": "AddedToken", "content": "</s>", "special": True},  # as older repos write it
        "pad_token": "<pad>",
        "model_max_length": 256,
        "chat_template": CHAT_TEMPLATE,
    }))
    # A second EOS, as Llama 3's generation_config lists <|eot_id|> beside <|end_of_text|>.
    (path / "generation_config.json").write_text(json.dumps({
        "eos_token_id": [tokenizer.token_to_id("</s>"), tokenizer.token_to_id("<|end|>")]}))
    return path
