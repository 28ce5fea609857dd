"""Logging: every line written while a request runs carries its id (JSON or text), and Triton's
`/v2/logging` settings change what is written at run time."""
from __future__ import annotations

import asyncio
import io
import json
import logging

import httpx
import pytest
from helpers.serverproc import ServerProcess

import modelplex
from modelplex import BackendSpec, InferResponse, InferTensor, ModelInstance
from modelplex.core.plugins import create_plugin_manager
from modelplex.core.settings import ServerConfig
from modelplex.observability.logs import LOG_SETTINGS
from modelplex.server.assembly import Server

CHATTY_CONFIG = """
name: "chatty"
backend: "chatty"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
log = logging.getLogger("chatty")


class Chatty(ModelInstance):
    """Writes one line per level while it executes (from the request's own task)."""

    def __init__(self, ictx):
        pass

    async def execute(self, requests):
        log.debug("debug line")
        log.info("info line")
        log.warning("warning line")
        return [InferResponse("", "", [InferTensor("X", "INT32", [1], r.inputs[0].data)]) for r in requests]


class ChattyPlugin:
    @modelplex.hookimpl
    def modelplex_backends(self):
        return [BackendSpec(name="chatty", create_instance=Chatty)]


@pytest.fixture
def captured():
    stream = io.StringIO()
    saved = logging.getLogger().handlers[:], logging.getLogger().level
    LOG_SETTINGS.install("json", 0, stream)
    yield stream
    LOG_SETTINGS.update({"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0,
                         "log_format": "text"})
    root = logging.getLogger()
    root.handlers[:], _ = saved[0], root.setLevel(saved[1])


def test_request_ids_on_every_line_and_runtime_settings(tmp_path, captured):
    (tmp_path / "chatty" / "1").mkdir(parents=True)
    (tmp_path / "chatty" / "config.pbtxt").write_text(CHATTY_CONFIG)
    body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [1], "data": [7]}]}

    async def main():
        settings = ServerConfig(model_repositories=[tmp_path], host="127.0.0.1", http_port=0, allow_grpc=False,
                                allow_metrics=False)
        server = Server(settings, create_plugin_manager(allow=set(), extra=[ChattyPlugin()]))
        await server.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.ports['http']}") as client:
                async def infer(request_id=""):
                    captured.seek(0)
                    captured.truncate()
                    r = await client.post("/v2/models/chatty/infer", json=body | ({"id": request_id} if request_id else {}))
                    assert r.status_code == 200, r.text
                    return captured.getvalue().splitlines()

                def chatty(lines):  # the model's lines, not the HTTP client's own
                    return [l for l in map(json.loads, lines) if l["logger"] == "chatty"]

                async def change(settings):
                    r = await client.post("/v2/logging", json=settings)
                    return r.status_code, r.json()

                lines = chatty(await infer("req-1"))
                assert [(l["level"], l["message"], l["request_id"]) for l in lines] == [
                    ("INFO", "info line", "req-1"), ("WARNING", "warning line", "req-1")]
                first, second = chatty(await infer()), chatty(await infer())
                assert {l["request_id"] for l in first} != {l["request_id"] for l in second}
                assert all(l["request_id"].startswith("#") for l in first + second)
                status, now = await change({"log_info": False, "log_verbose_level": 1})
                assert status == 200 and now == {"log_file": "", "log_info": False, "log_warning": True,
                                                 "log_error": True, "log_verbose_level": 1, "log_format": "json"}
                assert [l["message"] for l in chatty(await infer("r2"))] == ["debug line", "warning line"]
                assert (await change({"log_format": "text"}))[0] == 200
                assert any(line.endswith("WARNING chatty [r3]: warning line") for line in await infer("r3"))
                assert await change({"log_verbose_level": -1}) == (400, {
                    "error": "log setting 'log_verbose_level' must be a non-negative integer, got -1"})
                status, error = await change({"log_colour": "red"})
                assert status == 400 and error["error"].startswith("unknown log setting 'log_colour'")
                assert (await client.get("/v2/logging")).json()["log_format"] == "text"  # the 400s changed nothing
        finally:
            await server.stop()

    asyncio.run(main())


def test_serve_log_format_json_writes_json_lines(example_repo):
    with ServerProcess([example_repo], "--log-format", "json", "--model-control-mode", "explicit") as s:
        pass
    lines = [json.loads(line) for line in s.log().splitlines() if line.startswith("{")]
    assert any(l["message"].startswith("modelplex ready") for l in lines), s.log()
    assert all(set(l) >= {"time", "level", "logger", "request_id", "message"} for l in lines)
