"""Chat templates from GGUF metadata and from an HF folder's tokenizer config, rendered by transformers'
Jinja; Gemma 2's template, which refuses system messages, gets them folded into the first user turn."""
import gguf
import pytest

from modelplex import InvalidInput
from modelplex_native_gpu.chat_template import render_chat
from modelplex_native_gpu.loader.tokenizer import load_tokenizer

# google/gemma-2-2b-it's chat template, as its tokenizer_config.json and its GGUFs carry it.
GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")
SYSTEM, QUESTION = "Answer in French.", "What is the capital of Italy?"


@pytest.fixture(scope="module")
def gemma_gguf(gguf_path, tmp_path_factory):
    """A gemma2 GGUF holding SmolLM2's byte-level vocabulary and Gemma 2's chat template (no tensors:
    only the tokenizer is read)."""
    source = gguf.GGUFReader(gguf_path).fields
    path = tmp_path_factory.mktemp("gemma_tok") / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma2")
    writer.add_tokenizer_model(source["tokenizer.ggml.model"].contents())
    writer.add_tokenizer_pre(source["tokenizer.ggml.pre"].contents())
    writer.add_token_list(source["tokenizer.ggml.tokens"].contents())
    writer.add_token_types(source["tokenizer.ggml.token_type"].contents())
    writer.add_token_merges(source["tokenizer.ggml.merges"].contents())
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(GEMMA2_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module", params=["gguf", "hf_folder"])
def tokenizer(request, gemma_gguf, tmp_path_factory):
    from_gguf = load_tokenizer(gemma_gguf)
    if request.param == "gguf":
        return from_gguf
    folder = tmp_path_factory.mktemp("gemma_hf")
    from_gguf.save_pretrained(folder)  # the template goes into the folder's tokenizer config
    return load_tokenizer(str(folder))


def test_template_comes_from_the_model_files(tokenizer):
    assert tokenizer.chat_template == GEMMA2_TEMPLATE


def test_gemma_system_prompt_folds_into_the_first_user_turn(tokenizer):
    bos = tokenizer.bos_token
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "Rome."}, {"role": "user", "content": "And of Spain?"}]
    assert render_chat(tokenizer, messages) == (
        f"{bos}<start_of_turn>user\n{SYSTEM}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model\nRome.<end_of_turn>\n"
        "<start_of_turn>user\nAnd of Spain?<end_of_turn>\n<start_of_turn>model\n")
    assert render_chat(tokenizer, messages[1:2]) == (
        f"{bos}<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n")


def test_what_folding_cannot_fix_is_still_refused(tokenizer):
    with pytest.raises(InvalidInput, match="roles must alternate"):
        render_chat(tokenizer, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    with pytest.raises(InvalidInput, match="System role not supported"):  # nothing to fold it into
        render_chat(tokenizer, [{"role": "system", "content": SYSTEM}])


def test_the_request_fields_of_the_openai_routes_apply_while_folding(tokenizer):
    """A ChatRequest (tools, chat_template_kwargs, add_generation_prompt) renders with the same folding."""
    from modelplex import llm_protocol

    bos = tokenizer.bos_token
    chat = llm_protocol.ChatRequest(
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        add_generation_prompt=False)
    assert render_chat(tokenizer, chat) == f"{bos}<start_of_turn>user\n{SYSTEM}\n\n{QUESTION}<end_of_turn>\n"
    with pytest.raises(InvalidInput, match="chat_template_kwargs") as refused:
        render_chat(tokenizer, llm_protocol.ChatRequest(messages=chat.messages, chat_template_kwargs={"tools": []}))
    assert refused.value.param == "chat_template_kwargs"


def test_a_request_template_replaces_the_models_and_its_errors_name_it(tokenizer):
    from modelplex import llm_protocol

    messages = [{"role": "user", "content": QUESTION}]
    own = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}{% endfor %}{{ suffix }}"
    chat = llm_protocol.ChatRequest(messages=messages, chat_template=own, chat_template_kwargs={"suffix": "!"})
    assert render_chat(tokenizer, chat) == f"[user] {QUESTION}!"
    broken = llm_protocol.ChatRequest(messages=messages, chat_template="{{ raise_exception('no') }}")
    with pytest.raises(InvalidInput, match="no") as refused:
        render_chat(tokenizer, broken)
    assert refused.value.param == "chat_template"
