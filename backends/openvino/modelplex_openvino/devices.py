"""Which OpenVINO device a model instance runs on, and what the devices present here can do.

A device string is OpenVINO's: a physical device (`CPU`, `GPU`, `GPU.1`, `NPU`) or a virtual one over
a list (`AUTO`, `AUTO:GPU,CPU`, `HETERO:GPU,CPU`, `MULTI:GPU,CPU`, `BATCH:GPU`).
"""
from __future__ import annotations

import functools
import threading

from modelplex import InstanceContext, InvalidInput

VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")
REPORTED_PROPERTIES = ("FULL_DEVICE_NAME", "OPTIMIZATION_CAPABILITIES", "DEVICE_ARCHITECTURE", "DEVICE_TYPE")


_core_lock = threading.Lock()  # models load on several threads at once


def shared_core():
    """One `openvino.Core` per process: device plugins load once and compiled models share them."""
    with _core_lock:
        return _create_core()


@functools.cache
def _create_core():
    import openvino as ov

    # pyopenvino fills a function-local static on the first `Type.to_dtype()` (which every `infer`
    # with numpy inputs calls) and gives up the GIL inside it: two threads making that first call at
    # once deadlock, as two infer requests' first runs did. So it is made once here, before any run.
    ov.Type.f32.to_dtype()
    try:
        # Its import makes every Core created afterwards read tokenizer models (their ops are its extension).
        import openvino_tokenizers  # noqa: F401
    except ImportError:
        pass
    return ov.Core()


def describe_devices(core) -> list[dict]:
    """Each available device with the properties in `REPORTED_PROPERTIES` it answers (as strings)."""
    devices = []
    for name in core.available_devices:
        row = {"name": name}
        for key in REPORTED_PROPERTIES:
            try:
                value = core.get_property(name, key)
            except RuntimeError:  # a plugin may not implement every read-only property
                continue
            # Enum values (DEVICE_TYPE) print as `Type.INTEGRATED`; their name is what a client wants.
            row[key.lower()] = ([str(v) for v in value] if isinstance(value, (list, tuple))
                                else getattr(value, "name", str(value)))
        devices.append(row)
    return devices


def split_device(device: str) -> tuple[str, list[str]]:
    """`"HETERO:GPU,CPU"` -> `("HETERO", ["GPU", "CPU"])`; `"GPU.1"` -> `("", ["GPU.1"])`."""
    head, _, tail = device.partition(":")
    if head in VIRTUAL_DEVICES:
        return head, [d.strip() for d in tail.split(",") if d.strip()]
    return "", [device]


def is_present(device: str, available: list[str]) -> bool:
    """`GPU` means any GPU; `GPU.0` is also the only GPU when OpenVINO lists it as plain `GPU`."""
    if device in available:
        return True
    family, _, index = device.partition(".")
    return any(a.partition(".")[0] == family for a in available) if not index else (
        index == "0" and family in available)


def configured_device(ictx: InstanceContext) -> str:
    """The device string from `parameters { device | TARGET_DEVICE }` and the instance group's kind.

    KIND_CPU means `CPU` and KIND_GPU means `GPU.<gpus entry>`; a device parameter must agree with a
    CPU or GPU kind. Without either the model runs on `CPU`, as in Triton's OpenVINO backend.
    """
    parameters, where = ictx.model.parameters, f"model '{ictx.model.name}'"
    ours, triton = parameters.get("device", "").strip().upper(), parameters.get("TARGET_DEVICE", "").strip().upper()
    if ours and triton and ours != triton:
        raise InvalidInput(f"{where}: parameters 'device' ({ours}) and 'TARGET_DEVICE' ({triton}) disagree")
    asked = ours or triton
    if ictx.kind == "GPU":
        gpu = "GPU" if ictx.device_id == 0 else f"GPU.{ictx.device_id}"
        if not asked:
            return gpu
        _, listed = split_device(asked)
        if listed and not any(d.startswith("GPU") for d in listed):
            raise InvalidInput(f"{where}: instance_group kind KIND_GPU contradicts parameter device '{asked}'")
        return asked
    if ictx.kind == "CPU" and asked:
        _, listed = split_device(asked)
        if listed and "CPU" not in listed:
            raise InvalidInput(f"{where}: instance_group kind KIND_CPU contradicts parameter device '{asked}'")
    return asked or "CPU"


def select_device(device: str, available: list[str], model_name: str) -> str:
    """`device` checked against the devices present; `AUTO`'s candidate list keeps only present ones.

    AUTO is the one device meant to fall back: `AUTO:GPU,CPU` becomes `AUTO:CPU` without a GPU.
    Every other device named must exist, or the error names the devices that do.
    """
    virtual, listed = split_device(device)
    missing = [d for d in listed if not is_present(d, available)]
    if virtual == "AUTO" and listed and len(missing) < len(listed):
        return "AUTO:" + ",".join(d for d in listed if d not in missing)
    if missing or (virtual and virtual != "AUTO" and not listed):
        what = f"device '{missing[0]}'" if missing else f"device '{device}' (it needs a list of devices)"
        raise InvalidInput(f"model '{model_name}': {what} is not available; available OpenVINO devices: "
                           f"{', '.join(available) or 'none'}")
    return device
