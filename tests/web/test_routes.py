"""GET / and its assets, without a browser: headers, types, and nothing loaded from elsewhere."""

from __future__ import annotations

import re
from typing import Any

import pytest

from app.api.routes.web import ASSETS, WEB_DIR


def test_page_carries_the_security_headers(client: Any) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_assets_are_served_with_their_type(client: Any, name: str) -> None:
    r = client.get(f"/web/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"].split(";")[0] == ASSETS[name].split(";")[0]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.content == (WEB_DIR / name).read_bytes()


@pytest.mark.parametrize("name", ["index.html", "../main.py", "%2e%2e%2fmain.py", "nope.js"])
def test_nothing_else_under_web(client: Any, name: str) -> None:
    assert client.get(f"/web/{name}").status_code == 404


def test_page_refers_only_to_its_own_origin() -> None:
    html = (WEB_DIR / "index.html").read_text()
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html)
    refs = re.findall(r"""(?:src|href)=["'](/web/[^"']+)""", html)
    assert {r.removeprefix("/web/") for r in refs} <= set(ASSETS)
    script = (WEB_DIR / "app.js").read_text()
    # The SVG namespace is a name, not a request; no other absolute URL appears.
    urls = set(re.findall(r"https?://[^\s\"'`)]+", script)) - {"http://www.w3.org/2000/svg"}
    assert urls == set()
    assert "innerHTML" not in script  # text goes in through textContent only
