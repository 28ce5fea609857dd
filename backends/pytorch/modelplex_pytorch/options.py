"""An instance's device and execution settings from its instance group and config `parameters`, named
as Triton's PyTorch backend names them, so its config.pbtxt files work unchanged."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch

from modelplex import InstanceContext, Unsupported, params

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ExecutionOptions:
    inference_mode: bool  # torch.inference_mode() around forward(); else torch.no_grad()
    optimized_execution: bool  # TorchScript's graph-executor optimisations (profiling, fusion)
    intra_op_threads: int | None
    inter_op_threads: int | None


def execution_options(parameters: dict[str, str]) -> ExecutionOptions:
    def flag(key: str, default: bool) -> bool:
        text = parameters.get(key, "").strip()
        return params.parse_bool(text, f"parameter '{key}'") if text else default

    def count(key: str) -> int | None:
        text = parameters.get(key, "").strip()
        return params.parse_int(text, f"parameter '{key}'", minimum=1) if text else None

    # Triton's name is INFERENCE_MODE (on by default since 23.x); ENABLE_INFERENCE_MODE is accepted too.
    inference_key = "INFERENCE_MODE" if "INFERENCE_MODE" in parameters else "ENABLE_INFERENCE_MODE"
    return ExecutionOptions(inference_mode=flag(inference_key, True),
                            optimized_execution=not flag("DISABLE_OPTIMIZED_EXECUTION", False),
                            intra_op_threads=count("INTRA_OP_THREAD_COUNT"),
                            inter_op_threads=count("INTER_OP_THREAD_COUNT"))


def instance_device(ictx: InstanceContext) -> torch.device | None:
    """KIND_GPU: `cuda:<device_id>` (a load error without CUDA); KIND_AUTO: CUDA when present, else the
    CPU; KIND_MODEL: None, the devices the file was saved with (as Triton); KIND_CPU: the CPU."""
    if ictx.kind == "MODEL":
        return None
    if ictx.kind == "GPU" or (ictx.kind == "AUTO" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise Unsupported(f"model '{ictx.model.name}' instance {ictx.name}: KIND_GPU needs CUDA, which this "
                              f"torch {torch.__version__} does not have (use KIND_CPU)")
        if ictx.device_id >= torch.cuda.device_count():
            raise Unsupported(f"model '{ictx.model.name}' instance {ictx.name}: GPU {ictx.device_id} does not "
                              f"exist ({torch.cuda.device_count()} visible)")
        return torch.device("cuda", ictx.device_id)
    return torch.device("cpu")


# torch's thread pools are process-wide: as in Triton, the first model that sets a count decides it,
# and a later different value is logged and ignored rather than resizing pools under running models.
_thread_counts: dict[str, int] = {}
_thread_lock = threading.Lock()


def apply_thread_counts(model: str, options: ExecutionOptions) -> None:
    with _thread_lock:
        for key, value, setter in (("INTRA_OP_THREAD_COUNT", options.intra_op_threads, torch.set_num_threads),
                                   ("INTER_OP_THREAD_COUNT", options.inter_op_threads,
                                    torch.set_num_interop_threads)):
            if value is None:
                continue
            if key in _thread_counts:
                if _thread_counts[key] != value:
                    log.warning("model '%s': %s %d ignored: torch's pool already has %d threads (set by the first "
                                "model that asked)", model, key, value, _thread_counts[key])
                continue
            try:
                setter(value)
            except RuntimeError as e:  # the inter-op pool is fixed once torch has used it
                log.warning("model '%s': %s %d not applied: %s", model, key, value, e)
            _thread_counts[key] = value
