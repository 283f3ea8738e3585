"""The tokenizer of one model as a plain object: encode, chat template, decode, detokenizers.

It reads a HuggingFace model directory the way `transformers` does, without importing it:
`tokenizer.json` (the `tokenizers` pipeline), `tokenizer_config.json` (bos/eos tokens,
model_max_length, chat_template), `chat_template.jinja` (where newer checkpoints keep the
template) and `generation_config.json` (extra EOS ids, e.g. Llama 3's <|eot_id|>).
Bad input raises ValueError naming the field and what to send instead; the gRPC servicer turns
that into INVALID_ARGUMENT.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from .detokenizer import IncrementalDetokenizer

# transformers writes this sentinel (int(1e30)) when a tokenizer declares no length limit.
_NO_MAX_LENGTH = int(1e29)


@dataclass(frozen=True)
class TokenizerInfo:
    vocab_size: int  # including added tokens: valid ids are [0, vocab_size)
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    model_max_length: int  # 0 = not declared
    has_chat_template: bool


@dataclass(frozen=True)
class ChatPrompt:
    text: str
    token_ids: list[int]


class TokenizerService:
    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"{tokenizer_file} not found; point --model at a HuggingFace model directory that has "
                "a fast tokenizer (tokenizer.json)")
        self.model_dir = model_dir
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        config = _read_json(model_dir / "tokenizer_config.json")
        self.bos_token = _token_content(config.get("bos_token"))
        self.eos_token = _token_content(config.get("eos_token"))
        self.chat_template = _chat_template(model_dir, config)
        eos_ids = [self._token_id(self.eos_token)] + _as_list(
            _read_json(model_dir / "generation_config.json").get("eos_token_id"))
        max_length = int(config.get("model_max_length") or 0)
        self.info = TokenizerInfo(
            vocab_size=self.tokenizer.get_vocab_size(with_added_tokens=True),
            bos_token_id=self._token_id(self.bos_token),
            eos_token_ids=tuple(dict.fromkeys(i for i in eos_ids if i is not None)),
            model_max_length=0 if max_length >= _NO_MAX_LENGTH else max_length,
            has_chat_template=self.chat_template is not None,
        )
        self._template = None if self.chat_template is None else _compile_template(self.chat_template)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True) -> ChatPrompt:
        """Render messages ({"role", "content"}) and encode the text. The template places the
        special tokens (BOS, turn markers) itself, so none are added on encode, as in transformers."""
        if self._template is None:
            raise ValueError(
                f"the model at {self.model_dir} has no chat template (no chat_template in "
                "tokenizer_config.json, no chat_template.jinja); send a plain prompt instead")
        if not messages:
            raise ValueError("messages is empty; send at least one {role, content} message")
        for i, message in enumerate(messages):
            if not message.get("role"):
                raise ValueError(f"messages[{i}].role is empty; use e.g. 'system', 'user' or 'assistant'")
        try:
            text = self._template.render(
                messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except _TemplateError as e:
            raise ValueError(f"messages: the model's chat template rejected them: {e}") from e
        return ChatPrompt(text=text, token_ids=self.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.check_token_ids(token_ids, "token_ids")
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def new_detokenizer(self, *, stop: Sequence[str] = (), prefix_token_ids: Sequence[int] = (),
                        skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self.tokenizer, stop=stop, prefix_token_ids=prefix_token_ids,
                                      skip_special_tokens=skip_special_tokens)

    def check_token_ids(self, token_ids: Iterable[int], field: str) -> None:
        vocab_size = self.info.vocab_size
        for i, token_id in enumerate(token_ids):
            if not 0 <= token_id < vocab_size:
                raise ValueError(
                    f"{field}[{i}] = {token_id} is outside the tokenizer's vocabulary [0, {vocab_size}); "
                    "send ids this model's tokenizer produced")

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self.tokenizer.token_to_id(token)


class _TemplateError(Exception):
    """raise_exception() inside a chat template."""


def _compile_template(source: str) -> jinja2.Template:
    # The environment transformers renders chat templates in, so that templates behave the same.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str) -> None:
        raise _TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(f"chat_template does not compile (line {e.lineno}: {e.message}); "
                         "fix tokenizer_config.json or chat_template.jinja") from e


def _chat_template(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    return template or None


def _token_content(token: str | Mapping[str, Any] | None) -> str | None:
    if isinstance(token, Mapping):  # a serialised AddedToken
        return token.get("content")
    return token


def _as_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); fix or remove it") from e
