"""Turns a model's config (parameters, `optimization`, instance kind) into an ONNX Runtime session.

Names and values follow Triton's onnxruntime backend, so its config.pbtxt files work unchanged.
"""
from __future__ import annotations

from modelplex import InstanceContext, InvalidInput, Unsupported, params

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"
OPENVINO, TENSORRT = "OpenVINOExecutionProvider", "TensorrtExecutionProvider"
# `parameters { key: "execution_provider" }` values; Triton spells accelerators in lower case too.
PROVIDER_NAMES = {"cpu": CPU, "cuda": CUDA, "openvino": OPENVINO, "tensorrt": TENSORRT}


def _int_parameter(parameters: dict[str, str], key: str, default: int, allowed=None) -> int:
    text = parameters.get(key, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"parameter '{key}' must be an integer, got {text!r}") from None
    if value < 0 or (allowed is not None and value not in allowed):
        raise InvalidInput(f"parameter '{key}' must be {' or '.join(map(str, allowed)) if allowed else '>= 0'}, "
                           f"got {value}")
    return value


def _bool_parameter(parameters: dict[str, str], key: str) -> bool | None:
    text = parameters.get(key, "").strip()
    return params.parse_bool(text, f"parameter '{key}'") if text else None


def session_options(config, parameters: dict[str, str]):
    """`SessionOptions` from Triton's parameter names and `optimization { graph { level } }`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    level = config.optimization.graph.level
    # Triton's numbering: -1 basic, 1 basic + extended, 2 none; anything else (0, absent) all.
    options.graph_optimization_level = {
        -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    mode = _int_parameter(parameters, "execution_mode", 0, allowed=(0, 1))
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = _int_parameter(parameters, "intra_op_thread_count", 0)
    options.inter_op_num_threads = _int_parameter(parameters, "inter_op_thread_count", 0)
    if (arena := _bool_parameter(parameters, "enable_mem_arena")) is not None:
        options.enable_cpu_mem_arena = arena
    if (pattern := _bool_parameter(parameters, "enable_mem_pattern")) is not None:
        options.enable_mem_pattern = pattern
    # The server's threads (event loop, other instances) share the cores: ORT's pool should sleep
    # between runs instead of spinning, unless the config says otherwise.
    options.add_session_config_entry("session.intra_op.allow_spinning",
                                     parameters.get("session.intra_op.allow_spinning", "0"))
    if "session.use_device_allocator_for_initializers" in parameters:
        options.add_session_config_entry("session.use_device_allocator_for_initializers",
                                         parameters["session.use_device_allocator_for_initializers"])
    return options


def _accelerators(config, kind: str) -> list:
    accelerators = config.optimization.execution_accelerators
    return list(getattr(accelerators, f"{kind}_execution_accelerator"))


def execution_providers(ictx: InstanceContext, available: list[str]) -> list[tuple[str, dict]]:
    """The providers for one instance, most preferred first, always ending with the CPU provider.

    KIND_GPU (or `execution_provider: cuda`) needs CUDA and fails without it; KIND_AUTO uses CUDA
    when present. `openvino` comes from `execution_provider` or a `cpu_execution_accelerator`.
    """
    asked = ictx.model.parameters.get("execution_provider", "").strip().lower()
    if asked and asked not in PROVIDER_NAMES:
        raise InvalidInput(f"parameter 'execution_provider' must be one of {', '.join(PROVIDER_NAMES)}, "
                           f"got {asked!r}")
    wants_gpu = ictx.kind == "GPU" or asked in ("cuda", "tensorrt")
    use_gpu = wants_gpu or (ictx.kind == "AUTO" and not asked and CUDA in available)
    providers = _gpu_providers(ictx, asked, available) if use_gpu else []
    cpu_accelerators = _accelerators(ictx.model.config, "cpu")
    for ea in cpu_accelerators:
        if ea.name.lower() != "openvino":
            raise InvalidInput(f"model '{ictx.model.name}': unknown cpu_execution_accelerator '{ea.name}'")
    if asked == "openvino" or cpu_accelerators:
        _require(OPENVINO, available, ictx, "the openvino accelerator")
        options = dict(cpu_accelerators[0].parameters) if cpu_accelerators else {}
        providers.append((OPENVINO, {"device_type": "CPU"} | options))
    providers.append((CPU, {}))
    return providers


def _gpu_providers(ictx: InstanceContext, asked: str, available: list[str]) -> list[tuple[str, dict]]:
    """CUDA on the instance's device, behind TensorRT when a `gpu_execution_accelerator` asks for it."""
    _require(CUDA, available, ictx, "KIND_GPU" if ictx.kind == "GPU" else f"execution_provider '{asked}'")
    device = {"device_id": str(ictx.device_id)}
    cuda, tensorrt = dict(device), None
    for ea in _accelerators(ictx.model.config, "gpu"):
        if ea.name.lower() == "tensorrt":
            tensorrt = device | dict(ea.parameters)
        elif ea.name.lower() == "cuda":
            cuda.update(ea.parameters)
        else:
            raise InvalidInput(f"model '{ictx.model.name}': unknown gpu_execution_accelerator '{ea.name}'")
    if asked == "tensorrt" and tensorrt is None:
        tensorrt = dict(device)
    if tensorrt is None:
        return [(CUDA, cuda)]
    _require(TENSORRT, available, ictx, "the tensorrt accelerator")
    return [(TENSORRT, tensorrt), (CUDA, cuda)]


def _require(provider: str, available: list[str], ictx: InstanceContext, why: str) -> None:
    if provider not in available:
        raise Unsupported(f"model '{ictx.model.name}' instance {ictx.name}: {why} needs onnxruntime's {provider}, "
                          f"which this onnxruntime build lacks (available: {', '.join(available)})")


def create_session(ictx: InstanceContext):
    """One `InferenceSession` for one instance of the model."""
    import onnxruntime as ort

    model_file = ictx.model.model_file
    if not model_file.is_file():
        raise InvalidInput(f"model '{ictx.model.name}': {model_file} is not a file")
    providers = execution_providers(ictx, ort.get_available_providers())
    options = session_options(ictx.model.config, ictx.model.parameters)
    try:
        return ort.InferenceSession(str(model_file), options, providers=[name for name, _ in providers],
                                    provider_options=[opts for _, opts in providers])
    except Exception as e:  # ORT raises its own exception types for a broken or unsupported model
        raise InvalidInput(f"model '{ictx.model.name}': onnxruntime cannot load {model_file.name}: {e}") from e
