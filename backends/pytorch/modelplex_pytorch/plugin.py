"""Declares the PyTorch backend to modelplex. torch is imported only when a model of it loads."""
from __future__ import annotations

from modelplex import BackendSpec, InstanceContext, ModelContext, ModelInstance, hookimpl


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .instance import PyTorchInstance

    return PyTorchInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    from .autocomplete import auto_complete_config

    auto_complete_config(ctx)


@hookimpl
def modelplex_backends():
    return [BackendSpec(name="pytorch", platforms=("pytorch_libtorch",),
                        default_model_filename="model.pt", create_instance=_create_instance,
                        auto_complete_config=_auto_complete_config, merges_batches=True, calls_models=False)]
