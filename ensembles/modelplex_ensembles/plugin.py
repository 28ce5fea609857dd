"""Declares the ensemble backend (`platform: "ensemble"`) to modelplex."""
from __future__ import annotations

from modelplex import BackendSpec, InstanceContext, ModelContext, ModelDependency, ModelInstance, hookimpl

# One ensemble instance holds no per-request state and only awaits its steps, so the host may
# route this many requests through it at once (each step model still has its own limits).
MAX_CONCURRENT_REQUESTS = 1024


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .executor import EnsembleInstance

    return EnsembleInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    """An ensemble whose step streams (a decoupled model) streams too, as in Triton."""
    if ctx.dataplane is None:
        return
    for step in ctx.config.ensemble_scheduling.step:
        version = str(step.model_version) if step.model_version >= 0 else ""
        try:
            step_config = ctx.dataplane.model_config(step.model_name, version)
        except Exception:
            continue
        if step_config.model_transaction_policy.decoupled:
            ctx.config.model_transaction_policy.decoupled = True


def _steps(config) -> list[ModelDependency]:
    """An ensemble's step models: they load before it and stay while it is loaded."""
    return [ModelDependency(step.model_name, f"step {number}")
            for number, step in enumerate(config.ensemble_scheduling.step, 1)]


@hookimpl
def modelplex_backends():
    return [BackendSpec(name="ensemble", platforms=("ensemble",), create_instance=_create_instance,
                        auto_complete_config=_auto_complete_config, dependencies=_steps,
                        max_concurrency_per_instance=MAX_CONCURRENT_REQUESTS)]
