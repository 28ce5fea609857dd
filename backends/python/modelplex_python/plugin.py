"""Declares the Python backend (`backend: "python"`, a `model.py` per version) to modelplex."""
from __future__ import annotations

from modelplex import BackendSpec, InstanceContext, ModelContext, ModelInstance, hookimpl


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .instance import PythonInstance

    return PythonInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    from .config import auto_complete_config

    auto_complete_config(ctx)


@hookimpl
def modelplex_backends():
    # Model code runs in worker processes: no first imports here to keep apart (a slow initialize must not
    # hold up the other Python models' loads).
    return [BackendSpec(name="python", default_model_filename="model.py", create_instance=_create_instance,
                        auto_complete_config=_auto_complete_config, first_use_alone=False)]
