"""Headless Debian chromium driven over the DevTools protocol (websockets): just what a page test needs."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import websockets

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--remote-debugging-port=0", "--window-size=1280,800"]


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


class Browser:
    """`async with Browser() as page: await page.goto(url); await page.evaluate("1 + 1")`."""

    def __init__(self, executable: str):
        self.executable = executable
        self.profile = Path(tempfile.mkdtemp(prefix="modelplex-chromium-"))
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Browser:
        self.proc = subprocess.Popen([self.executable, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().splitlines()[0])
        targets = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{port}/json/list")
        page = next(t for t in targets if t["type"] == "page")
        self.ws = await websockets.connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)

    async def send(self, method: str, **params) -> dict:
        call_id = next(self._ids)
        await self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # events arrive in between; this client only needs answers
            message = json.loads(await self.ws.recv())
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    async def goto(self, url: str) -> None:
        await self.send("Page.navigate", url=url)

    async def evaluate(self, expression: str):
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 15) -> object:
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = await self.evaluate(expression)
            except RuntimeError:
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout}s for {expression}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        data = (await self.send("Page.captureScreenshot", format="png"))["data"]
        path.write_bytes(base64.b64decode(data))


def _get_json(url: str):
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)
