"""An OpenVINO GenAI model folder (what `modelplex convert-openvino` writes): recognised, checked, described.

A version folder holding `openvino_model.xml` is an LLM served through `ContinuousBatchingPipeline`;
any other is a classic model. Missing files fail the load with the file named, before OpenVINO runs.
"""
from __future__ import annotations

import json
from pathlib import Path

from modelplex import InvalidInput

from .llm_export import DETOKENIZER_XML, MODEL_XML, TOKENIZER_XML


def is_llm_folder(version_path: Path) -> bool:
    return (version_path / MODEL_XML).is_file()


def check_llm_folder(version_path: Path, model_name: str) -> None:
    """Every IR of the folder has its .xml and .bin; InvalidInput names the first one missing."""
    for xml, role in ((MODEL_XML, "the model"), (TOKENIZER_XML, "the tokenizer"), (DETOKENIZER_XML, "the detokenizer")):
        for path in (version_path / xml, (version_path / xml).with_suffix(".bin")):
            if not path.is_file():
                raise InvalidInput(f"model '{model_name}': {path.name} ({role}) is missing from {version_path}; an "
                                   "OpenVINO GenAI folder holds the model, tokenizer and detokenizer IRs "
                                   "(`modelplex convert-openvino` writes them)")


def hf_config(version_path: Path) -> dict:
    """The HF `config.json` beside the IR ({} when absent: then adapters cannot be checked)."""
    path = version_path / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def base_model_shape(config: dict, model_name: str):
    """The shapes a LoRA adapter must fit (a Llama-family config.json)."""
    from modelplex_multilora import BaseModelShape

    try:
        heads = config["num_attention_heads"]
        return BaseModelShape.llama(config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
                                    heads, config.get("num_key_value_heads", heads),
                                    config.get("head_dim") or config["hidden_size"] // heads)
    except KeyError as e:
        raise InvalidInput(f"model '{model_name}': config.json lacks {e}, so LoRA adapters cannot be checked "
                           "against the model") from None
