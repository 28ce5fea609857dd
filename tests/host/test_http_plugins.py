"""Routers from the `modelplex_http_routers` hook are mounted on the HTTP port and share its error table."""
from __future__ import annotations

import asyncio

import httpx
from fastapi import APIRouter

import modelplex
from modelplex.core.errors import NotFound
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.server.assembly import Server


class EchoPlugin:
    """A plugin as a third party would write it: a router built over the data plane it is given."""

    @modelplex.hookimpl
    def modelplex_http_routers(self, dataplane):
        router = APIRouter()

        @router.get("/v2/echo/{word}")
        async def echo(word: str):
            if word == "missing":
                raise NotFound("no such word")
            if word == "bug":
                raise RuntimeError("boom")
            return {"word": word, "server": dataplane.metadata()["name"]}

        return [router]


def test_plugin_router_is_mounted_beside_the_kserve_routes(tmp_path):
    async def scenario():
        settings = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", http_port=0, allow_grpc=False,
                                allow_metrics=False)
        server = Server(settings, create_plugin_manager(allow=set(), extra=[EchoPlugin()]))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                ok = await client.get("/v2/echo/hello")
                missing = await client.get("/v2/echo/missing")
                bug = await client.get("/v2/echo/bug")
                live = await client.get("/v2/health/live")
        finally:
            await server.stop()
        return ok, missing, bug, live

    ok, missing, bug, live = asyncio.run(scenario())
    assert (ok.status_code, ok.json()) == (200, {"word": "hello", "server": "modelplex"})
    assert (missing.status_code, missing.json()) == (404, {"error": "no such word"})
    assert (bug.status_code, bug.json()) == (500, {"error": "internal error: RuntimeError: boom"})
    assert live.status_code == 200  # still serving after the failure
