"""Declares the OpenVINO backend, the devices it reports (`GET /v2/devices`) and `modelplex convert-openvino`.
OpenVINO is imported only when used.

A version folder holding `openvino_model.xml` (what `convert-openvino` writes) is an LLM served by
OpenVINO GenAI with the LLM tensor protocol (`modelplex.llm.tensor_protocol`); any other is a classic IR or
ONNX model.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from modelplex import BackendSpec, Command, DeviceReport, InstanceContext, ModelContext, ModelInstance, hookimpl


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .llm_folder import is_llm_folder

    if is_llm_folder(ictx.model.version_path):
        from .llm_instance import OpenVINOLLMInstance

        return OpenVINOLLMInstance(ictx)
    from .instance import OpenVINOInstance

    return OpenVINOInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    from .llm_folder import is_llm_folder

    if is_llm_folder(ctx.version_path):
        from modelplex import llm_protocol

        llm_protocol.declare_generate_tensors(ctx.config)
        return
    from .autocomplete import auto_complete_config

    auto_complete_config(ctx)


def _device_report() -> DeviceReport:
    """The OpenVINO devices present and what they are (FULL_DEVICE_NAME, OPTIMIZATION_CAPABILITIES...)."""
    import openvino as ov

    from .devices import describe_devices, shared_core

    return DeviceReport("openvino", ov.get_version(), describe_devices(shared_core()))


def _convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", type=Path, help="a Llama-family model: a .gguf file or an HF folder")
    parser.add_argument("output", type=Path, help="the folder to write (a model version folder, e.g. repo/m/1)")


def _convert(args: argparse.Namespace) -> int:
    from .llm_export import convert

    if not args.source.exists():
        print(f"convert-openvino: {args.source} does not exist")
        return 2
    convert(args.source, args.output)
    print(f"wrote {args.output}")
    return 0


@hookimpl
def modelplex_backends():
    from .instance import MAX_CONCURRENCY
    from .signature import DEFAULT_MODEL_FILENAME

    # No platform string: Triton has none for OpenVINO, only the backend name. An LLM instance says
    # how many requests it takes (its own max_concurrency).
    return [BackendSpec(name="openvino", default_model_filename=DEFAULT_MODEL_FILENAME,
                        create_instance=_create_instance,
                        auto_complete_config=_auto_complete_config, max_concurrency_per_instance=MAX_CONCURRENCY,
                        merges_batches=True, calls_models=False)]


@hookimpl
def modelplex_devices():
    return _device_report()


@hookimpl
def modelplex_commands():
    return [Command("convert-openvino", "convert a GGUF or HF LLM into an OpenVINO GenAI model folder "
                    "(IR, tokenizer and detokenizer), offline", _convert_arguments, _convert)]
