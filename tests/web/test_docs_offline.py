"""/docs and /redoc on a host without internet, in real headless Chromium.

Chromium resolves no name but loopback (``--host-resolver-rules``) and every request to another
host is aborted and recorded, so a page that needed a CDN (scripts, styles, fonts, a favicon, the
validator badge) would show blank and the test would name what it wanted. Swagger UI must list
every operation of /openapi.json, and "Try it out" → Execute on each documented example must
answer 2xx (/v1/measure goes to the tests' stand-in runner).

Needs Debian's chromium and Playwright's Python package, as tests/web/test_page.py does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.web.server import serve

CHROMIUM = os.environ.get("ZEROCALC_CHROMIUM", "/usr/bin/chromium")
OFFLINE_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    '--host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"',
]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """uvicorn on loopback, measure jobs sent to the stand-in runner."""
    env = {
        **os.environ,
        "ZEROCALC_DATA_DIR": str(tmp_path_factory.mktemp("data")),
        "ZEROCALC_MEASURE_RUNNER": "tests.api.fake_runner:succeed",
    }
    env.pop("ZEROCALC_API_KEY", None)
    with serve(env) as url:
        yield url


@pytest.fixture(scope="module")
def offline_page() -> Iterator[tuple[Any, list[str]]]:
    """A Chromium page that reaches loopback only; the list collects what else it asked for."""
    blocked: list[str] = []

    def only_loopback(route: Any) -> None:
        host = urlsplit(route.request.url).hostname or ""
        if route.request.url.startswith(("data:", "blob:")) or host in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort("internetdisconnected")

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=OFFLINE_FLAGS)
        context = browser.new_context()
        context.route("**/*", only_loopback)
        page = context.new_page()
        page.set_default_timeout(30_000)
        try:
            yield page, blocked
        finally:
            browser.close()


def operations(base_url: str) -> dict[tuple[str, str], dict[str, Any]]:
    doc = httpx.get(f"{base_url}/openapi.json").json()
    return {(m, path): op for path, ops in doc["paths"].items() for m, op in ops.items()}


def test_swagger_ui_lists_every_operation_offline(
    base_url: str, offline_page: tuple[Any, list[str]]
) -> None:
    page, blocked = offline_page
    page.goto(f"{base_url}/docs")
    page.wait_for_selector(".opblock")
    shown = {
        (
            block.get_attribute("class").split("opblock-")[1].split()[0],
            block.query_selector(".opblock-summary-path").get_attribute("data-path"),
        )
        for block in page.query_selector_all(".opblock")
    }
    assert shown == set(operations(base_url)), shown
    icon = page.eval_on_selector("link[rel~='icon']", "e => e.href")
    assert httpx.get(icon).status_code == 200
    assert blocked == [], f"the page asked for other hosts: {blocked}"


def test_every_example_executes_with_2xx_in_swagger_ui(
    base_url: str, offline_page: tuple[Any, list[str]]
) -> None:
    page, blocked = offline_page
    page.goto(f"{base_url}/docs")
    page.wait_for_selector(".opblock")
    executed = []
    for (method, path), op in operations(base_url).items():
        examples = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        names = list(examples.get("examples", {}))
        if method != "post":
            continue
        assert names, f"POST {path} has no example"
        block = page.locator(f".opblock-post:has(.opblock-summary-path[data-path='{path}'])")
        block.locator(".opblock-summary").first.click()
        try_out = block.locator("button.try-out__btn")
        if "cancel" not in (try_out.get_attribute("class") or ""):  # tryItOutEnabled opens it
            try_out.click()
        for name in names:
            block.locator("select.examples-select-element").first.select_option(name)
            block.locator("button.execute").click()
            status = block.locator(".live-responses-table tbody td.response-col_status").first
            status.wait_for()
            code = status.inner_text().strip()
            executed.append((path, name, code))
            block.locator("button.btn-clear").click()
        block.locator(".opblock-summary").first.click()
    failed = [e for e in executed if not e[2].startswith("2")]
    assert executed and failed == [], failed
    assert blocked == [], f"the page asked for other hosts: {blocked}"


def test_redoc_renders_offline(base_url: str, offline_page: tuple[Any, list[str]]) -> None:
    page, blocked = offline_page
    page.goto(f"{base_url}/redoc")
    page.wait_for_selector("[data-section-id^='operation/']")
    sections = page.query_selector_all("[data-section-id^='operation/']")
    assert len(sections) >= len(operations(base_url))
    assert blocked == [], f"the page asked for other hosts: {blocked}"
