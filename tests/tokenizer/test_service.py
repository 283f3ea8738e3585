import json

import pytest

from shardline.tokenizer import TokenizerService

MESSAGES = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "안녕! 😀"}]


@pytest.fixture(scope="module")
def service(model_dir):
    return TokenizerService(model_dir)


def test_info_reads_bos_eos_and_generation_config(service, tokenizer):
    info = service.info
    assert info.vocab_size == tokenizer.get_vocab_size()
    assert info.bos_token_id == tokenizer.token_to_id("<s>")
    assert info.eos_token_ids == (tokenizer.token_to_id("</s>"), tokenizer.token_to_id("<|end|>")), \
        "generation_config's extra EOS ids must stop generation too"
    assert info.model_max_length == 256 and info.has_chat_template


def test_encode_decode_round_trip(service, tokenizer):
    text = "Hello, 세계 🚀"
    with_bos = service.encode(text)
    assert with_bos[0] == service.info.bos_token_id
    assert service.encode(text, add_special_tokens=False) == with_bos[1:]
    assert service.decode(with_bos) == text
    assert service.decode(with_bos, skip_special_tokens=False) == "<s>" + text


def test_chat_template_matches_transformers(service, model_dir):
    prompt = service.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert prompt.text == ("<s><|system|>\nYou are helpful.</s>\n<|user|>\n안녕! 😀</s>\n<|assistant|>\n")
    assert prompt.token_ids == service.encode(prompt.text, add_special_tokens=False)
    assert prompt.token_ids.count(service.info.bos_token_id) == 1, "BOS comes from the template only"
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    assert hf.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == prompt.text
    assert hf(prompt.text, add_special_tokens=False)["input_ids"] == prompt.token_ids


def test_chat_template_errors_are_value_errors(service):
    with pytest.raises(ValueError, match=r"rejected them: unknown role robot"):
        service.apply_chat_template([{"role": "robot", "content": "x"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\.role is empty"):
        service.apply_chat_template([{"role": "", "content": "x"}])
    with pytest.raises(ValueError, match="messages is empty"):
        service.apply_chat_template([])


def test_chat_template_jinja_file_wins_and_missing_template_is_explained(tmp_path, model_dir):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((model_dir / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert TokenizerService(tmp_path).apply_chat_template(MESSAGES).text == "[You are helpful.][안녕! 😀]"
    (tmp_path / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    service = TokenizerService(tmp_path)
    assert not service.info.has_chat_template
    with pytest.raises(ValueError, match="no chat template.*send a plain prompt"):
        service.apply_chat_template(MESSAGES)


def test_out_of_vocab_id_names_the_position(service):
    bad = service.info.vocab_size
    with pytest.raises(ValueError, match=rf"token_ids\[1\] = {bad} is outside the tokenizer's vocabulary"):
        service.decode([5, bad])


def test_missing_tokenizer_json_says_what_to_point_at(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json not found; point --model"):
        TokenizerService(tmp_path)
