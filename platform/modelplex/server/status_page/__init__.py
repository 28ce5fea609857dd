"""The status page at `/` and `/ui`: static HTML and a small script reading the server's own APIs."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import RedirectResponse, Response

HERE = Path(__file__).parent
# Read once: the files are part of the package and never change while the server runs.
PAGES = {"index.html": ("text/html; charset=utf-8", (HERE / "index.html").read_bytes()),
         "app.js": ("text/javascript; charset=utf-8", (HERE / "app.js").read_bytes())}


def create_status_router() -> APIRouter:
    router = APIRouter()

    def page(name: str) -> Response:
        media_type, body = PAGES[name]
        return Response(body, media_type=media_type, headers={"Cache-Control": "no-cache"})

    @router.get("/")
    async def root():
        return RedirectResponse("/ui/")

    @router.get("/ui")
    @router.get("/ui/")
    async def index():
        return page("index.html")

    @router.get("/ui/app.js")
    async def script():
        return page("app.js")

    return router
