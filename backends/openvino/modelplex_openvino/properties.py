"""Turns a model's `parameters` into the OpenVINO properties its compiled model gets.

`PERFORMANCE_HINT` (LATENCY, THROUGHPUT, CUMULATIVE_THROUGHPUT), `NUM_STREAMS` (a number, AUTO, NUMA),
`INFERENCE_PRECISION_HINT` (f32, bf16, f16) or Triton's `HINT_BF16: YES`, `INFERENCE_NUM_THREADS`,
`COMPILATION_NUM_THREADS`, and `cache_dir` / `CACHE_DIR` (relative to the model's folder). Triton's
older spellings (`CPU_THROUGHPUT_STREAMS`, `CPU_THREADS_NUM`, `ENFORCE_BF16`) work too, so its
config.pbtxt files load unchanged. Values are checked here so a typo fails the load with the
parameter named, not with an OpenVINO stack trace.
"""
from __future__ import annotations

from pathlib import Path

from modelplex import InvalidInput, ModelContext

from .devices import split_device

PERFORMANCE_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
# Spellings of the inference precision -> OpenVINO's name, and the OPTIMIZATION_CAPABILITIES entry
# a device lists when it computes in that precision.
PRECISIONS = {"f32": "f32", "fp32": "f32", "bf16": "bf16", "f16": "f16", "fp16": "f16"}
CAPABILITY = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
# OpenVINO property -> the parameter names that set it, preferred first.
INTEGER_PARAMETERS = {"INFERENCE_NUM_THREADS": ("INFERENCE_NUM_THREADS", "CPU_THREADS_NUM"),
                      "COMPILATION_NUM_THREADS": ("COMPILATION_NUM_THREADS",)}
STREAMS_PARAMETERS = ("NUM_STREAMS", "CPU_THROUGHPUT_STREAMS")


def _first(parameters: dict[str, str], names: tuple[str, ...]) -> tuple[str, str]:
    """(name, value) of the first of `names` that is set, or ("", "")."""
    for name in names:
        value = parameters.get(name, "").strip()
        if value:
            return name, value
    return "", ""


def is_yes(parameters: dict[str, str], name: str) -> bool:
    """Triton's OpenVINO backend flags: YES (any case) turns them on; anything else leaves them off."""
    return parameters.get(name, "").strip().lower() in ("yes", "true", "1")


def inference_precision(parameters: dict[str, str]) -> str:
    """`INFERENCE_PRECISION_HINT` as OpenVINO spells it (f32/bf16/f16), `HINT_BF16: YES` meaning bf16; "" if unset."""
    text = parameters.get("INFERENCE_PRECISION_HINT", "").strip().lower()
    bf16_flag = is_yes(parameters, "HINT_BF16") or is_yes(parameters, "ENFORCE_BF16")
    if not text:
        return "bf16" if bf16_flag else ""
    precision = PRECISIONS.get(text)
    if precision is None:
        raise InvalidInput(f"parameter 'INFERENCE_PRECISION_HINT' must be one of f32, bf16, f16, got {text!r}")
    if bf16_flag and precision != "bf16":
        raise InvalidInput(f"parameter 'HINT_BF16' asks for bf16 but 'INFERENCE_PRECISION_HINT' is {text!r}")
    return precision


def compile_properties(ctx: ModelContext) -> dict[str, str]:
    """The properties for `Core.compile_model` (all strings, as OpenVINO parses them per device)."""
    parameters, properties = ctx.parameters, {}
    hint = parameters.get("PERFORMANCE_HINT", "").strip().upper()
    if hint:
        if hint not in PERFORMANCE_HINTS:
            raise InvalidInput(f"parameter 'PERFORMANCE_HINT' must be one of {', '.join(PERFORMANCE_HINTS)}, "
                               f"got {hint!r}")
        properties["PERFORMANCE_HINT"] = hint
    name, streams = _first(parameters, STREAMS_PARAMETERS)
    if streams:
        if streams.upper() not in ("AUTO", "NUMA") and not (streams.isascii() and streams.isdigit()):
            raise InvalidInput(f"parameter '{name}' must be AUTO, NUMA or a number of streams, got {streams!r}")
        properties["NUM_STREAMS"] = streams.upper()
    for key, names in INTEGER_PARAMETERS.items():
        name, value = _first(parameters, names)
        if value:
            if not (value.isascii() and value.isdigit()):
                raise InvalidInput(f"parameter '{name}' must be a non-negative integer, got {value!r}")
            properties[key] = value
    if precision := inference_precision(parameters):
        properties["INFERENCE_PRECISION_HINT"] = precision
    name, cache_dir = _first(parameters, ("cache_dir", "CACHE_DIR"))
    if cache_dir:
        # A relative cache folder lives in the model's folder, so a repository carries its own cache.
        path = Path(cache_dir) if Path(cache_dir).is_absolute() else ctx.model_path / cache_dir
        properties["CACHE_DIR"] = str(path)
    return properties


def check_precision(precision: str, device: str, core, model_name: str) -> None:
    """Refuse a precision a named physical device cannot compute in (OpenVINO would silently pick another:
    f16 on a CPU without AVX512-FP16 runs in bf16). `AUTO` without a list is left to OpenVINO."""
    if not precision:
        return
    _, listed = split_device(device)
    for name in listed:
        capabilities = [str(c) for c in core.get_property(name, "OPTIMIZATION_CAPABILITIES")]
        if CAPABILITY[precision] not in capabilities:
            raise InvalidInput(f"model '{model_name}': device {name} cannot infer in {precision} "
                               f"(its OPTIMIZATION_CAPABILITIES: {', '.join(capabilities)})")
