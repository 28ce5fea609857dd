"""The hooks a modelplex plugin may implement (entry-point group `modelplex`)."""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("modelplex")
hookimpl = pluggy.HookimplMarker("modelplex")


@hookspec
def modelplex_backends():
    """Return a list of `modelplex.BackendSpec` this plugin provides.

    Example: ``return [BackendSpec(name="onnx", create_instance=OnnxInstance.create)]``
    """


@hookspec
def modelplex_http_routers(dataplane):
    """Return a list of FastAPI `APIRouter`s to mount on the HTTP port, built over `dataplane`.

    Example: ``return [make_adapter_router(dataplane)]``
    """
