"""Triton's `config.pbtxt`: parse, validate, print as Triton's JSON.

We use the `ModelConfig` message that the pinned `tritonclient` wheel ships (generated from
Triton's own `model_config.proto`): it is byte-for-byte the schema Triton clients speak, and it
needs no code generation step at build time.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from google.protobuf import descriptor, json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb

from ..core.errors import InvalidInput
from . import config_rules

ModelConfig = pb.ModelConfig
_INT64_TYPES = {descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
                descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
                descriptor.FieldDescriptor.TYPE_SFIXED64}


def parse_pbtxt(text: str, source: str = "config.pbtxt") -> pb.ModelConfig:
    config = pb.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise InvalidInput(f"{source}: {e}") from None
    return config


MAX_CONFIG_BYTES = 16 << 20


def load_config_file(path: Path) -> pb.ModelConfig:
    """The model's config.pbtxt, or an empty config when the file is absent (auto-complete fills it).
    Only a regular file (symlinks followed) is read: opening a FIFO or a device would wait forever."""
    try:  # O_NONBLOCK: opening a FIFO returns at once (then refused), instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return pb.ModelConfig()
    except OSError as e:
        raise InvalidInput(f"{path} cannot be read: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InvalidInput(f"{path} is not a regular file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise InvalidInput(f"{path} is {info.st_size} bytes; a config may have at most {MAX_CONFIG_BYTES}")
        text = f.read(MAX_CONFIG_BYTES + 1).decode("utf-8", errors="replace")
    return parse_pbtxt(text, str(path))


def parse_json(text: str) -> pb.ModelConfig:
    """A config given as Triton's JSON (the load API's `config` parameter)."""
    config = pb.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, ValueError) as e:
        raise InvalidInput(f"invalid model config JSON: {e}") from None
    return config


def to_dict(config: pb.ModelConfig) -> dict:
    """Triton's config JSON: proto field names, every field printed, 64-bit integers as numbers."""
    data = json_format.MessageToDict(config, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)
    return _fix_int64(config.DESCRIPTOR, data)


def _fix_int64(desc: descriptor.Descriptor, data: dict) -> dict:
    for field in desc.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for v in value.values():
                        _fix_int64(value_field.message_type, v)
            elif field.is_repeated:
                for v in value:
                    _fix_int64(field.message_type, v)
            else:
                _fix_int64(field.message_type, value)
        elif field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return data


def to_json(config: pb.ModelConfig) -> str:
    return json.dumps(to_dict(config))


def parameters_of(config: pb.ModelConfig) -> dict[str, str]:
    return {key: p.string_value for key, p in config.parameters.items()}


def validate(config: pb.ModelConfig) -> None:
    """Checks a complete config for what would make serving it fail later."""
    if config.max_batch_size < 0:
        raise InvalidInput(f"model '{config.name}': max_batch_size must be >= 0")
    check_model_filename(config)
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen = set()
        for t in tensors:
            if not t.name:
                raise InvalidInput(f"model '{config.name}': an {kind} has no name")
            if t.name in seen:
                raise InvalidInput(f"model '{config.name}': {kind} '{t.name}' is declared twice")
            seen.add(t.name)
            if t.data_type == pb.TYPE_INVALID:
                raise InvalidInput(f"model '{config.name}': {kind} '{t.name}' has no data_type")
            if any(d < -1 or d == 0 for d in t.dims) and not config.platform == "ensemble":
                raise InvalidInput(f"model '{config.name}': {kind} '{t.name}' has invalid dims {list(t.dims)}")
            if t.HasField("reshape") and _known_size(t.reshape.shape) != _known_size(t.dims):
                raise InvalidInput(f"model '{config.name}': {kind} '{t.name}' reshape {list(t.reshape.shape)} "
                                   f"does not match dims {list(t.dims)}")
    policy = config.version_policy
    if policy.WhichOneof("policy_choice") == "latest" and policy.latest.num_versions < 1:
        raise InvalidInput(f"model '{config.name}': version_policy latest needs num_versions >= 1")
    config_rules.check(config)  # the rules Triton applies to every backend


def check_model_filename(config: pb.ModelConfig) -> None:
    """`default_model_filename` names a file inside the version folder: a relative path without `..`
    (a config given through the load API must not make a backend open any file of the server)."""
    name = config.default_model_filename
    if not name:
        return
    parts = name.replace("\\", "/").split("/")
    if "\x00" in name or os.path.isabs(name) or name.startswith(("/", "\\")) or ".." in parts:
        raise InvalidInput(f"model '{config.name}': default_model_filename {name!r} is outside the model's "
                           "version folder (it must be a relative path without '..')")


def _known_size(dims) -> int | None:
    if any(d < 0 for d in dims):
        return None
    size = 1
    for d in dims:
        size *= d
    return size


def select_versions(config: pb.ModelConfig, available: list[int]) -> list[int]:
    """Apply `version_policy` (default: latest 1) to the numeric version folders present."""
    available = sorted(available)
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        return sorted(v for v in set(policy.specific.versions) if v in available)
    n = policy.latest.num_versions if choice == "latest" else 1
    return available[-n:]
