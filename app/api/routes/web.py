"""GET /: the browser page, served from app/web with no CDN and no build step."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

router = APIRouter(tags=["web"], include_in_schema=False)

WEB_DIR = Path(__file__).resolve().parents[2] / "web"

# The only files the page needs; anything else under /web/ is a 404 (no directory listing,
# no path traversal to guard against).
ASSETS: dict[str, str] = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

# Everything the page loads comes from this origin; it may not be framed.
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": (
        "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


@router.get("/")
def index() -> FileResponse:
    """The calculator page."""
    return FileResponse(
        WEB_DIR / "index.html",
        media_type="text/html; charset=utf-8",
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )


@router.get("/web/{name}")
def asset(name: str) -> FileResponse:
    """A script, style sheet or icon of the page."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise HTTPException(status_code=404, detail="not found")
    return FileResponse(
        WEB_DIR / name,
        media_type=media_type,
        headers={**SECURITY_HEADERS, "Cache-Control": "no-cache"},
    )
