"""Declares the OpenVINO backend and its `GET /v2/devices` route. OpenVINO is imported only when used."""
from __future__ import annotations

from fastapi import APIRouter
from modelplex import BackendSpec, InstanceContext, ModelContext, ModelInstance, hookimpl


def _create_instance(ictx: InstanceContext) -> ModelInstance:
    from .instance import OpenVINOInstance

    return OpenVINOInstance(ictx)


def _auto_complete_config(ctx: ModelContext) -> None:
    from .autocomplete import auto_complete_config

    auto_complete_config(ctx)


def devices_router() -> APIRouter:
    router = APIRouter()

    @router.get("/v2/devices")
    def devices() -> dict:
        """The OpenVINO devices present and what they are (FULL_DEVICE_NAME, OPTIMIZATION_CAPABILITIES...)."""
        import openvino as ov

        from .devices import describe_devices, shared_core

        return {"openvino_version": ov.get_version(), "devices": describe_devices(shared_core())}

    return router


@hookimpl
def modelplex_backends():
    from .instance import MAX_CONCURRENCY
    from .signature import DEFAULT_MODEL_FILENAME

    # No platform string: Triton has none for OpenVINO, only the backend name.
    return [BackendSpec(name="openvino", default_model_filename=DEFAULT_MODEL_FILENAME, create_instance=_create_instance,
                        auto_complete_config=_auto_complete_config, max_concurrency_per_instance=MAX_CONCURRENCY,
                        merges_batches=True)]


@hookimpl
def modelplex_http_routers(dataplane):
    return [devices_router()]
