"""The status page in a real headless chromium against a real server: `simple` READY, click unload,
see UNAVAILABLE, and a screenshot saved under tests/artifacts/."""
from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from helpers.cdp import Browser, chromium_path
from helpers.serverproc import ServerProcess

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
STATE_OF = "document.querySelector('tr[data-model=\"{}\"] td.state')?.textContent"


def test_served_at_root_and_ui(server):
    base = f"http://{server.http_url}"
    html = httpx.get(f"{base}/ui")
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert '<script src="/ui/app.js">' in html.text
    assert httpx.get(f"{base}/ui/app.js").headers["content-type"].startswith("text/javascript")
    root = httpx.get(f"{base}/", follow_redirects=True)
    assert root.status_code == 200 and root.text == html.text


def test_unload_from_the_page(example_repo):
    executable = chromium_path()
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "status_page.png"
    shot.unlink(missing_ok=True)

    async def main(url):
        async with Browser(executable) as page:
            await page.goto(url)
            assert await page.wait_for(STATE_OF.format("simple") + " === 'READY'")
            # Traffic shows up as a request count on the next refresh.
            async with httpx.AsyncClient() as client:
                body = {"inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}
                                   for n in ("INPUT0", "INPUT1")]}
                for _ in range(3):
                    assert (await client.post(f"{url}v2/models/simple/infer", json=body)).status_code == 200
            await page.wait_for("document.querySelector('tr[data-model=\"simple\"] td:nth-child(9)')"
                                "?.textContent === '3'")
            await page.evaluate("document.querySelector('button[data-model=\"simple\"][data-action=\"unload\"]').click()")
            assert await page.wait_for(STATE_OF.format("simple") + " === 'UNAVAILABLE'")
            assert await page.evaluate("document.querySelector('button[data-model=\"simple\"]').dataset.action") == "load"
            await page.screenshot(shot)

    with ServerProcess([example_repo], "--model-control-mode", "explicit", "--load-model", "simple") as s:
        asyncio.run(main(f"http://{s.http_url}/"))
        ready = httpx.get(f"http://{s.http_url}/v2/models/simple/ready").status_code
    assert ready == 400  # the click really unloaded it on the server
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
