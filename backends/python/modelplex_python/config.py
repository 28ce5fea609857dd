"""What a worker is started with (Triton's `initialize` args), and auto-complete run in a short-lived worker."""
from __future__ import annotations

from modelplex import InstanceContext, InvalidInput, ModelContext
from modelplex import model_config as mc

from .process import kill_and_close, start_worker
from .protocol import ChannelClosed

DEFAULT_INITIALIZE_TIMEOUT_SECS = 600.0
AUTO_COMPLETE_TIMEOUT_SECS = 120.0


def model_file(ctx: ModelContext) -> str:
    path = ctx.model_file
    if not path.is_file():
        raise InvalidInput(f"model '{ctx.name}': no {path.name} in {ctx.version_path}")
    return str(path)


def worker_init(ictx: InstanceContext) -> tuple[dict, float]:
    """The worker's first frame, and how long `initialize` may take (`initialize_timeout_secs`)."""
    ctx = ictx.model
    args = {
        "model_config": mc.to_json(ctx.config),
        "model_instance_kind": "CPU" if ictx.kind == "AUTO" else ictx.kind,  # no GPU is ever picked here
        "model_instance_name": ictx.name,
        "model_instance_device_id": str(ictx.device_id),
        "model_repository": str(ctx.model_path),
        "model_version": str(ctx.version),
        "model_name": ctx.name,
    }
    init = {"op": "init", "model_file": model_file(ctx), "args": args,
            "decoupled": ctx.config.model_transaction_policy.decoupled}
    return init, float(ctx.parameters.get("initialize_timeout_secs") or DEFAULT_INITIALIZE_TIMEOUT_SECS)


def auto_complete_config(ctx: ModelContext) -> None:
    """Let `TritonPythonModel.auto_complete_config` fill the config, in a worker of its own (user code
    never runs in the server process)."""
    path = model_file(ctx)
    with open(path, encoding="utf-8", errors="replace") as f:
        if "auto_complete_config" not in f.read():
            return  # spawning a process only to find no such method would slow every load
    proc, channel = start_worker(f"{ctx.name} (auto-complete)")
    try:
        channel.sock.settimeout(AUTO_COMPLETE_TIMEOUT_SECS)
        channel.send({"op": "auto_complete", "model_file": path, "config": mc.to_json(ctx.config)})
        header, _ = channel.receive()
    except (ChannelClosed, OSError) as e:
        raise InvalidInput(f"model '{ctx.name}': auto_complete_config did not answer: {e}") from None
    finally:
        kill_and_close(proc, channel)
    if header["op"] != "config":
        raise InvalidInput(f"model '{ctx.name}': auto_complete_config failed: {header.get('message')}")
    ctx.config.CopyFrom(mc.parse_json(header["config"]))

