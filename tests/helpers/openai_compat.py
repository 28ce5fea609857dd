"""The model repository of the OpenAI/vLLM parity tests (tests/openai_compat): SmolLM2 twice on the
native engine. `smollm2_tools` has a Hermes-style chat template (written here) and `tool_call_parser:
hermes`, so tool prompts and parses are real; `vllm_folder` is a Triton vLLM-backend folder served
unchanged (`backend: "vllm"` only, plus `1/model.json`)."""
import json
from pathlib import Path

TOOLS_MODEL = "smollm2_tools"
VLLM_MODEL = "vllm_folder"
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You can call functions. The available tools: <tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Answer a call as <tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response id="{{ message.tool_call_id }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
TOOLS_CONFIG = f"""name: "{TOOLS_MODEL}"
backend: "native_gpu"
model_transaction_policy {{ decoupled: true }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "dtype" value {{ string_value: "float32" }} }}
parameters {{ key: "max_model_len" value {{ string_value: "1024" }} }}
parameters {{ key: "kv_cache_memory_bytes" value {{ string_value: "134217728" }} }}
parameters {{ key: "max_num_seqs" value {{ string_value: "8" }} }}
parameters {{ key: "tool_call_parser" value {{ string_value: "hermes" }} }}
parameters {{ key: "chat_template" value {{ string_value: "hermes.jinja" }} }}
"""
ENGINE_ARGS = {"max_model_len": 512, "gpu_memory_utilization": 0.5, "enable_prefix_caching": True,
               "max_num_seqs": 4, "dtype": "float32", "disable_log_requests": True, "swap_space": 4}




def build_compat_repo(repo: Path, gguf: Path) -> Path:
    tools = repo / TOOLS_MODEL
    (tools / "1").mkdir(parents=True)
    (tools / "1" / "model.gguf").symlink_to(gguf)
    (tools / "config.pbtxt").write_text(TOOLS_CONFIG)
    (tools / "hermes.jinja").write_text(HERMES_TEMPLATE)
    folder = repo / VLLM_MODEL
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text('backend: "vllm"\n')
    (folder / "1" / "model.json").write_text(json.dumps({"model": str(gguf), **ENGINE_ARGS}))
    return repo
