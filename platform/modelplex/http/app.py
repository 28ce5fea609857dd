"""Builds the HTTP front door: Triton's KServe v2 routes, plugin routers, and the fast infer path."""
from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import HTMLResponse, JSONResponse

from ..core.settings import ServerConfig
from ..dataplane import DataPlane
from .adapter_routes import create_adapter_router
from .docs_page import DOCS_HTML
from .errors import install_error_handlers
from .generate import create_generate_router
from .infer import INFER_PATH, InferEndpoint
from .observability import create_observability_router
from .openapi import openapi_document
from .routes import create_router
from .shm_routes import create_shm_router
from .tracing import traced, traced_route_model


class FrontDoor:
    """The ASGI app uvicorn serves: infer paths go straight to `InferEndpoint`, everything else to
    the FastAPI app. A sampled request (infer, generate, OpenAI) runs inside its server span."""

    def __init__(self, app: FastAPI, infer: InferEndpoint, tracing):
        self.app, self.infer, self.tracing = app, infer, tracing

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                if scope["method"] != "POST":
                    await self.infer.refuse_method(scope, send)
                elif self.tracing.enabled and self.tracing.sample(match[1]):
                    await self.infer.traced(self.tracing, scope, receive, send, match[1], match[2])
                else:
                    await self.infer(scope, receive, send, match[1], match[2])
                return
            if self.tracing.enabled and scope["method"] == "POST":
                model = traced_route_model(scope["path"])
                if model is not None and self.tracing.sample(model):
                    await traced(self.tracing, scope, send, model,
                                 lambda traced_send: self.app(scope, receive, traced_send))
                    return
        await self.app(scope, receive, send)


def create_http_app(dataplane: DataPlane, settings: ServerConfig, routers: list[APIRouter] = ()) -> FrontDoor:
    """The KServe v2 routes (and Triton's extensions) over `dataplane`, with `routers` mounted beside
    them (the server assembly's: the OpenAI routes, the status page, plugins' routers)."""
    app = FastAPI(title="modelplex", openapi_url=None, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.include_router(create_adapter_router(dataplane))  # before create_router's `{name:path}/load`
    app.include_router(create_router(dataplane, settings))
    app.include_router(create_observability_router(dataplane))
    app.include_router(create_generate_router(dataplane))
    app.include_router(create_shm_router(dataplane))
    for router in routers:
        app.include_router(router)
    document = openapi_document(app)  # once: the routes are all mounted by now

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi():
        return JSONResponse(document)

    @app.get("/docs", include_in_schema=False)
    async def docs():
        return HTMLResponse(DOCS_HTML)

    return FrontDoor(app, InferEndpoint(dataplane, settings), dataplane.tracing)
