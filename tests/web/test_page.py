"""The page in real headless Chromium: charts, units, numbers equal to the API's, same origin only.

Needs Debian's chromium (``apt-get install -y chromium``) and Playwright's Python package
(``pip install playwright``; its bundled browsers are never downloaded: the test drives
/usr/bin/chromium through ``executable_path``). Without either it skips with the reason.
Set ZEROCALC_SCREENSHOT=docs/screenshot.png to write the README's screenshot.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.web.server import serve

CHROMIUM = os.environ.get("ZEROCALC_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SWEEP_ND = [2**i for i in range(11)]  # 1 .. 1024, as the page draws them
BOTH_UNITS = re.compile(r"^[\d,]+\.\d\d GB \([\d,]+\.\d\d GiB\)$")

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
if shutil.which(CHROMIUM) is None:
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """uvicorn serving app.main:app on a free localhost port."""
    with serve({**os.environ, "ZEROCALC_DATA_DIR": str(tmp_path_factory.mktemp("data"))}) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


class Visit:
    """A page with every request it made recorded."""

    def __init__(self, browser: Any, base_url: str) -> None:
        self.base_url = base_url
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.console_errors: list[str] = []
        self.failed: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("response", lambda r: self.failed.append(r.url) if r.status >= 400 else None)
        self.page.on(
            "console", lambda m: self.console_errors.append(m.text) if m.type == "error" else None
        )

    def open(self, query: str = "") -> Any:
        response = self.page.goto(f"{self.base_url}/{query}")
        self.settle()
        return response

    def settle(self) -> None:
        """Wait until the last change has been answered (no timer pending, nothing in flight)."""
        self.page.wait_for_function(
            "() => document.body.dataset.ready !== undefined"
            " && !document.body.dataset.busy && !document.body.dataset.pending",
            timeout=20_000,
        )

    def change(self, action: Any) -> None:
        before = self.page.evaluate("() => document.body.dataset.ready")
        action(self.page)
        self.page.wait_for_function(
            "prev => document.body.dataset.ready !== prev", arg=before, timeout=20_000
        )
        self.settle()


@pytest.fixture
def visit(browser: Any, base_url: str) -> Iterator[Visit]:
    v = Visit(browser, base_url)
    yield v
    v.context.close()


def api_memory(base_url: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{base_url}/v1/memory", json=body, timeout=10)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def table_cells(page: Any) -> list[dict[str, str]]:
    cells: list[dict[str, str]] = page.eval_on_selector_all(
        "#memory-table td[data-bytes]",
        """tds => tds.map(td => ({key: td.parentElement.dataset.key, stage: td.dataset.stage,
                                  bytes: td.dataset.bytes, text: td.textContent}))""",
    )
    return cells


def assert_page_equals_api(page: Any, resp: dict[str, Any]) -> None:
    by_stage = {str(s["stage"]): s for s in resp["stages"]}
    cells = [c for c in table_cells(page) if c["stage"] is not None]
    assert cells, "no numbers in the memory table"
    seen = set()
    for c in cells:
        stage = by_stage[c["stage"]]
        assert int(c["bytes"]) == stage["per_device"][c["key"]], c
        assert c["text"] == stage["per_device_readable"][c["key"]], c
        seen.add((c["stage"], c["key"]))
    expected = {
        (str(s["stage"]), k)
        for s in resp["stages"]
        for k, v in s["per_device"].items()
        if v is not None
    }
    assert seen == expected
    stages_shown = page.eval_on_selector_all(
        "#memory-table thead th", "ths => ths.slice(1).map(th => th.textContent)"
    )
    assert stages_shown == [f"stage {s['stage']}" for s in resp["stages"]]
    # The stacked bars carry the same integers.
    bars = page.eval_on_selector_all(
        "#bars-chart svg rect[data-component]",
        """rs => rs.map(r => ({stage: r.parentElement.dataset.stage,
                              key: r.dataset.component, bytes: r.dataset.bytes}))""",
    )
    assert bars
    for b in bars:
        assert int(b["bytes"]) == by_stage[b["stage"]]["per_device"][b["key"]], b
    fits = [s["fits"] for s in resp["stages"]]
    if any(f is not None for f in fits):
        shown = page.eval_on_selector_all(
            '#memory-table tr[data-key="fits"] td', "tds => tds.map(td => td.textContent)"
        )
        assert shown == ["yes" if f else "no" for f in fits]


def test_page_loads_with_charts_and_labelled_sizes(visit: Visit) -> None:
    response = visit.open()
    assert response.status == 200
    headers = response.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["x-frame-options"] == "DENY"
    assert headers["referrer-policy"]
    page = visit.page
    assert page.title().startswith("zerocalc")
    # Charts: stacked bars per stage with the device line, the Nd sweep with 4 stage lines.
    assert page.locator("#bars-chart svg rect[data-component]").count() >= 4 * 3
    assert page.locator("#bars-chart svg line.device-line").count() == 1
    assert page.locator("#sweep-chart svg g.series").count() == 4
    assert page.locator("#sweep-chart svg circle").count() == 4 * len(SWEEP_ND)
    # Every size names its unit: 'X GB (Y GiB)' in the table, GB or GiB on the axes.
    texts = page.eval_on_selector_all("td[data-bytes]", "tds => tds.map(t => t.textContent)")
    assert texts and all(BOTH_UNITS.match(t) for t in texts), texts
    axis = page.eval_on_selector_all("svg text.axis", "ts => ts.map(t => t.textContent)")
    assert any("GB per device" in t for t in axis)
    # No script error, no CSP violation; the only answer >= 400 a page may get is a service
    # without POST /v1/communication.
    assert [e for e in visit.console_errors if not e.startswith("Failed to load resource")] == []
    assert [u for u in visit.failed if not u.endswith("/v1/communication")] == []


def test_numbers_equal_the_api_for_the_default_inputs(visit: Visit) -> None:
    visit.open()
    resp = api_memory(
        visit.base_url,
        {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "precision": "mixed_bf16",
            "device_memory": 80_000_000_000,
        },
    )
    assert_page_equals_api(visit.page, resp)


def test_changed_inputs_give_the_apis_numbers_and_land_in_the_url(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        page.select_option("select[name=preset]", "mistral-7b")
        page.fill("input[name=dp]", "16")
        page.select_option("select[name=precision]", "mixed_fp16")
        page.uncheck('input[name=stage][value="0"]')
        page.fill("input[name=device_memory]", "40")
        page.select_option("select[name=device_unit]", "GiB")

    visit.change(edit)
    body = {
        "model": {"preset": "mistral-7b"},
        "dp": 16,
        "stages": [1, 2, 3],
        "precision": "mixed_fp16",
        "device_memory": 40 * 2**30,
    }
    resp = api_memory(visit.base_url, body)
    assert_page_equals_api(visit.page, resp)
    # The Nd sweep: each point is /v1/memory at that Nd.
    points = visit.page.eval_on_selector_all(
        "#sweep-chart svg circle",
        """cs => cs.map(c => ({stage: c.parentElement.dataset.stage, nd: c.dataset.nd,
                              bytes: c.dataset.bytes}))""",
    )
    assert len(points) == 3 * len(SWEEP_ND)
    for nd in SWEEP_ND:
        answer = api_memory(visit.base_url, {**body, "dp": nd})
        at = {s["stage"]: s["per_device"] for s in answer["stages"]}
        for p in (p for p in points if int(p["nd"]) == nd):
            per = at[int(p["stage"])]
            assert int(p["bytes"]) == (per["peak"] if per["peak"] is not None else per["resident"])

    # The state is in the URL; opening it in a fresh page restores form and numbers.
    url = visit.page.url
    assert "dp=16" in url and "preset=mistral-7b" in url and "stages=1%2C2%2C3" in url
    other = Visit(visit.page.context.browser, visit.base_url)
    try:
        other.page.goto(url)
        other.settle()
        assert other.page.input_value("input[name=dp]") == "16"
        assert other.page.input_value("select[name=device_unit]") == "GiB"
        assert not other.page.is_checked('input[name=stage][value="0"]')
        assert_page_equals_api(other.page, resp)
    finally:
        other.context.close()


def test_architecture_with_batch_matches_the_api(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        page.select_option("select[name=source]", "architecture")
        for name, value in {
            "layers": "12",
            "hidden": "1024",
            "heads": "16",
            "vocab_size": "32000",
            "ffn_hidden": "4096",
            "max_seq_len": "512",
            "kv_heads": "",
        }.items():
            page.fill(f"input[name={name}]", value)
        page.select_option("select[name=norm]", "layernorm")
        page.select_option("select[name=position_embedding]", "learned")
        page.select_option("select[name=activation]", "gelu")
        page.check("input[name=bias]")
        page.uncheck("input[name=tied_embeddings]")
        page.uncheck("input[name=gated_mlp]")
        page.check("input[name=use_batch]")
        page.fill("input[name=micro_batch_size]", "8")
        page.fill("input[name=seq_len]", "512")
        page.fill("input[name=device_memory]", "")

    visit.change(edit)
    resp = api_memory(
        visit.base_url,
        {
            "model": {
                "architecture": {
                    "layers": 12,
                    "hidden": 1024,
                    "heads": 16,
                    "vocab_size": 32000,
                    "ffn_hidden": 4096,
                    "max_seq_len": 512,
                }
            },
            "dp": 8,
            "precision": "mixed_bf16",
            "batch": {"micro_batch_size": 8, "seq_len": 512},
        },
    )
    assert resp["params"] == 217_217_024  # the GPT block as PyTorch counts it (API.md)
    assert_page_equals_api(visit.page, resp)
    assert "217,217,024" in visit.page.inner_text("#convention")


def test_a_preset_opened_as_architecture_keeps_its_parameter_count(visit: Visit) -> None:
    presets = httpx.get(f"{visit.base_url}/v1/presets", timeout=10).json()
    visit.open()
    for preset in presets:
        visit.change(
            lambda page, name=preset["name"]: (
                page.select_option("select[name=source]", "preset"),
                page.select_option("select[name=preset]", name),
            )
        )
        visit.change(lambda page: page.select_option("select[name=source]", "architecture"))
        shown = visit.page.inner_text("#convention")
        assert f"Ψ = {preset['params']:,} parameters" in shown, (preset["name"], shown)


MISTRAL_7B = {  # the config.json body of mistralai/Mistral-7B-v0.1 (the fields that count)
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": False,
}


def test_pasted_hf_config_matches_the_api(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        page.select_option("select[name=source]", "hf_config")
        page.fill("textarea[name=hf_config]", json.dumps(MISTRAL_7B, indent=2))
        page.fill("input[name=dp]", "16")

    visit.change(edit)
    resp = api_memory(
        visit.base_url,
        {
            "model": {"hf_config": MISTRAL_7B},
            "dp": 16,
            "precision": "mixed_bf16",
            "device_memory": 80_000_000_000,
        },
    )
    assert_page_equals_api(visit.page, resp)
    # Not JSON: the page says so before asking the service.
    visit.change(lambda page: page.fill("textarea[name=hf_config]", "{not json"))
    assert "hf_config" in visit.page.inner_text("#error")
    assert visit.page.get_attribute("textarea[name=hf_config]", "aria-invalid") == "true"


def _mistral_with_a_batch(page: Any) -> None:
    """The page's form: Mistral-7B's config.json pasted, a batch asked for."""
    page.select_option("select[name=source]", "hf_config")
    page.fill("textarea[name=hf_config]", json.dumps(MISTRAL_7B, indent=2))
    page.check("input[name=use_batch]")


def test_a_padded_batch_matches_the_api(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        _mistral_with_a_batch(page)
        page.fill("input[name=micro_batch_size]", "2")
        page.fill("input[name=seq_len]", "2048")  # under Mistral's 4,096-token window
        page.check("input[name=padded]")

    visit.change(edit)
    body = {
        "model": {"hf_config": MISTRAL_7B},
        "dp": 8,
        "precision": "mixed_bf16",
        "device_memory": 80_000_000_000,
        "batch": {"micro_batch_size": 2, "seq_len": 2048, "padded": True},
    }
    resp = api_memory(visit.base_url, body)
    unpadded = api_memory(visit.base_url, {**body, "batch": {**body["batch"], "padded": False}})
    assert resp["stages"][0]["per_device"]["peak"] > unpadded["stages"][0]["per_device"]["peak"]
    assert_page_equals_api(visit.page, resp)


def test_checkpoint_offload_matches_the_api_and_shows_the_host_bytes(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        _mistral_with_a_batch(page)
        page.fill("input[name=seq_len]", "4096")
        page.select_option("select[name=activation_checkpointing]", "full")
        page.check("input[name=checkpoint_offload]")

    visit.change(edit)
    body = {
        "model": {"hf_config": MISTRAL_7B},
        "dp": 8,
        "precision": "mixed_bf16",
        "device_memory": 80_000_000_000,
        "batch": {
            "micro_batch_size": 1,
            "seq_len": 4096,
            "activation_checkpointing": "full",
            "checkpoint_offload": True,
        },
    }
    resp = api_memory(visit.base_url, body)
    assert resp["stages"][0]["cpu"]["activations"] > 0
    assert_page_equals_api(visit.page, resp)
    assert visit.page.locator("tr[data-key='cpu.total']").count() == 1


def test_every_n_layers_matches_the_api(visit: Visit) -> None:
    visit.open()

    def edit(page: Any) -> None:
        _mistral_with_a_batch(page)
        page.fill("input[name=seq_len]", "2048")
        page.select_option("select[name=activation_checkpointing]", "full")
        page.fill("input[name=checkpoint_every_n_layers]", "4")

    visit.change(edit)
    batch = {"micro_batch_size": 1, "seq_len": 2048, "activation_checkpointing": "full"}
    body = {
        "model": {"hf_config": MISTRAL_7B},
        "dp": 8,
        "precision": "mixed_bf16",
        "device_memory": 80_000_000_000,
        "batch": {**batch, "checkpoint_every_n_layers": 4},
    }
    resp = api_memory(visit.base_url, body)
    full = api_memory(visit.base_url, {**body, "batch": batch})
    acts = resp["stages"][0]["per_device"]["activations"]
    assert acts > full["stages"][0]["per_device"]["activations"]
    assert_page_equals_api(visit.page, resp)


def test_bad_input_names_the_field(visit: Visit) -> None:
    visit.open()
    visit.change(lambda page: page.fill("input[name=tp]", "0"))
    error = visit.page.locator("#error")
    assert error.is_visible()
    assert "tp" in error.inner_text()
    assert visit.page.get_attribute("input[name=tp]", "aria-invalid") == "true"
    visit.change(lambda page: page.fill("input[name=tp]", "1"))
    assert not error.is_visible()


def test_communication_panel_follows_the_endpoint(visit: Visit) -> None:
    visit.open()
    r = httpx.post(
        f"{visit.base_url}/v1/communication",
        json={
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "stages": [0, 1, 2, 3],
            "precision": "mixed_bf16",
            "engine": "paper",
        },
        timeout=10,
    )
    page = visit.page
    if r.status_code == 200:
        assert page.locator("#comm-body").is_visible()
        cells = page.eval_on_selector_all(
            "#comm-table tbody tr",
            "trs => trs.map(tr => ({stage: tr.dataset.stage,"
            " bytes: tr.querySelector('td[data-bytes]').dataset.bytes}))",
        )
        sent = {str(s["stage"]): s["sent_bytes_per_rank"] for s in r.json()["stages"]}
        assert {c["stage"]: int(c["bytes"]) for c in cells} == sent
        assert page.locator("#comm-chart svg rect[data-bytes]").count() == len(sent)
    else:
        assert page.locator("#comm-note").is_visible()
        assert not page.locator("#comm-body").is_visible()


def test_measure_panel_polls_and_shows_predicted_vs_measured(visit: Visit) -> None:
    """The panel's client logic, against a job whose answers this test scripts.

    The real endpoint needs a training run; here Playwright answers /v1/measure so the test
    checks what the page does with each answer (202, running with progress, succeeded).
    """
    page = visit.page
    posted: list[dict[str, Any]] = []
    polls = {"n": 0}
    run = {
        "stage": 2,
        "measured": {"resident": 1_000_000_000, "peak": 2_000_000_000},
        "predicted": {"resident": 1_100_000_000, "peak": 1_900_000_000},
        "relative_error": {"resident": 0.1, "peak": -0.05},
        "communication": {
            "measured_sent_bytes_per_rank": 400_000_000,
            "predicted_sent_bytes_per_rank": 420_000_000,
            "relative_error": 0.05,
        },
    }

    def job(status: str, fraction: float, result: dict[str, Any] | None) -> str:
        return json.dumps(
            {
                "id": "j1",
                "status": status,
                "error": None,
                "result": result,
                "progress": {"fraction": fraction, "message": f"{status} stage 2"},
            }
        )

    def handle(route: Any) -> None:
        req = route.request
        if req.method == "POST":
            posted.append(json.loads(req.post_data))
            route.fulfill(
                status=202,
                content_type="application/json",
                headers={"Location": "/v1/measure/j1"},
                body=json.dumps({"id": "j1", "status": "queued"}),
            )
            return
        polls["n"] += 1
        done = polls["n"] >= 2
        body = job("succeeded", 1.0, {"runs": [run]}) if done else job("running", 0.5, None)
        route.fulfill(status=200, content_type="application/json", body=body)

    page.route(re.compile(r".*/v1/measure(/.*)?$"), handle)
    visit.open()

    def edit(p: Any) -> None:
        p.check("input[name=use_batch]")
        p.uncheck('input[name=stage][value="0"]')
        p.uncheck('input[name=stage][value="1"]')
        p.uncheck('input[name=stage][value="3"]')

    visit.change(edit)
    page.select_option("#measure-mode", "simulated")
    page.select_option("#measure-device", "cpu")
    page.click("#measure-start")
    page.wait_for_selector("#measure-status:has-text('running')", timeout=10_000)
    assert page.locator("#measure-progress-wrap").is_visible()
    page.wait_for_selector("#measure-result:not([hidden])", timeout=10_000)
    assert posted == [
        {
            "model": {"preset": "llama3-8b"},
            "dp": 8,
            "tp": 1,
            "pp": 1,
            "stages": [2],
            "precision": "mixed_bf16",
            "optimizer": "adam",
            "gradients": "paper",
            "offload": {"optimizer": "none", "params": "none"},
            "engine": "torch",
            "batch": {
                "micro_batch_size": 1,
                "seq_len": 2048,
                "activation_checkpointing": "none",
                "grad_accumulation_steps": 1,
            },
            "mode": "simulated",
            "device": "cpu",
        }
    ]
    rows = page.eval_on_selector_all(
        "#measure-table tbody tr",
        "trs => trs.map(tr => [...tr.children].map(c => c.dataset.bytes || c.textContent))",
    )
    assert rows == [
        ["stage 2", "resident", "1000000000", "1100000000", "+10.00 %"],
        ["stage 2", "peak", "2000000000", "1900000000", "-5.00 %"],
        ["stage 2", "sent bytes per rank", "400000000", "420000000", "+5.00 %"],
    ]
    assert page.locator("#measure-chart svg rect[data-bytes]").count() == 4  # 2 figures × 2
    assert "job=j1" in page.url


def test_measure_panel_runs_a_real_measurement(visit: Visit) -> None:
    """A tiny GPT trained for real (simulated world of 2 ranks on the CPU) from the page."""
    pytest.importorskip("torch", reason="a measurement trains with torch")
    page = visit.page
    visit.open(
        "?source=architecture&layers=2&hidden=64&heads=4&vocab_size=1000&max_seq_len=64"
        "&ffn_hidden=&kv_heads=&norm=layernorm&position_embedding=learned&activation=gelu"
        "&bias=1&tied_embeddings=0&gated_mlp=0&dp=2&stages=0%2C3&use_batch=1"
        "&micro_batch_size=2&seq_len=32&mode=simulated&device=cpu&measure_engine=torch"
    )
    page.click("#measure-start")
    page.wait_for_selector("#measure-result:not([hidden])", timeout=180_000)
    job_id = re.search(r"job=([0-9a-zA-Z_-]+)", page.url)
    assert job_id, page.url
    job = httpx.get(f"{visit.base_url}/v1/measure/{job_id.group(1)}", timeout=10).json()
    assert job["status"] == "succeeded"
    shown = page.eval_on_selector_all(
        "#measure-table tbody tr",
        """trs => trs.map(tr => ({stage: tr.dataset.stage, key: tr.dataset.key,
              cells: [...tr.querySelectorAll('td')].slice(1, 3).map(td => td.dataset.bytes)}))""",
    )
    runs = {str(r["stage"]): r for r in job["result"]["runs"]}
    assert {row["stage"] for row in shown} == {"0", "3"}
    for row in shown:
        if row["key"] == "communication":
            continue
        run = runs[row["stage"]]
        for cell, side in zip(row["cells"], ("measured", "predicted"), strict=True):
            value = run[side].get(row["key"])
            assert (None if cell is None else int(cell)) == value, row


def test_plan_panel_ranks_like_the_api(visit: Visit) -> None:
    """The Plan panel draws the API's ranking: the same configurations, tokens/s and step-time
    parts, a stacked bar per candidate."""
    visit.open("?plan_engine=deepspeed")
    page = visit.page
    assert page.locator("#plan-gpu option[value=h200]").count() == 1  # filled from /v1/gpus
    page.click("#plan-start")
    page.wait_for_selector("#plan-result:not([hidden])", timeout=30_000)
    body = {
        "model": {"preset": "llama3-8b"},
        "gpu": "h100-sxm",
        "gpus": 8,
        "global_batch_size": 256,
        "seq_len": 4096,
        "engine": "deepspeed",
        "precision": "mixed_bf16",
        "optimizer": "adam",
    }
    r = httpx.post(f"{visit.base_url}/v1/plan", json=body, timeout=30)
    assert r.status_code == 200, r.text
    want = r.json()["candidates"][:12]
    rows = page.eval_on_selector_all(
        "#plan-table tbody tr",
        "trs => trs.map(tr => ({rank: tr.dataset.rank,"
        " tokens: tr.querySelector('td[data-tokens]').dataset.tokens,"
        " seconds: tr.querySelector('td[data-seconds]').dataset.seconds}))",
    )
    assert [int(x["rank"]) for x in rows] == [c["rank"] for c in want]
    for got, c in zip(rows, want, strict=True):
        assert float(got["tokens"]) == pytest.approx(c["tokens_per_second"])
        assert float(got["seconds"]) == pytest.approx(c["step_time_seconds"])
    # one stacked bar per candidate; its parts are the API's split
    bars = page.eval_on_selector_all(
        "#plan-chart svg g.step",
        "gs => gs.map(g => ({rank: g.dataset.rank, parts: [...g.querySelectorAll('rect')]"
        ".map(r => [r.dataset.part, Number(r.dataset.seconds)])}))",
    )
    assert len(bars) == len(want)
    for bar, c in zip(bars, want, strict=True):
        assert int(bar["rank"]) == c["rank"]
        for part, secs in bar["parts"]:
            assert secs == pytest.approx(c["step_time"][part])
        assert sum(secs for _, secs in bar["parts"]) == pytest.approx(c["step_time_seconds"])
    assert "efficiency" in page.locator("#plan-calibration").inner_text().lower()
    assert "configurations evaluated" in page.locator("#plan-table caption").inner_text()


def test_plan_panel_names_a_refused_field(visit: Visit) -> None:
    visit.open("?plan_global_batch=7")
    visit.page.click("#plan-start")
    visit.page.wait_for_selector("#plan-note:not([hidden])", timeout=30_000)
    assert "global_batch_size" in visit.page.locator("#plan-note").inner_text()


def test_no_request_leaves_the_origin(visit: Visit) -> None:
    visit.open()
    visit.change(lambda page: page.fill("input[name=dp]", "32"))
    assert visit.requests
    outside = [u for u in visit.requests if not u.startswith(visit.base_url + "/")]
    assert outside == []
    # The assets are this service's: no CDN in the markup either.
    html = httpx.get(visit.base_url + "/").text
    assert not re.search(r"(src|href)=\"(https?:)?//", html)


def test_screenshot(visit: Visit, tmp_path: Path) -> None:
    """The page renders whole to a PNG; ZEROCALC_SCREENSHOT=docs/screenshot.png renews the
    README's picture (GPT-2 XL under the torch engine: activations, buffers and peak)."""
    target = Path(os.environ.get("ZEROCALC_SCREENSHOT") or tmp_path / "page.png")
    visit.open(
        "?preset=gpt2-xl&dp=8&engine=torch&precision=mixed_bf16&use_batch=1"
        "&micro_batch_size=4&seq_len=1024"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    visit.page.screenshot(path=str(target), full_page=True)
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 10_000


def _plan_offload_cells(visit: Visit, query: str) -> list[tuple[str, str | None]]:
    """The Plan panel's rows for ``query``: each configuration and its offload cell's title."""
    visit.open(query)
    visit.page.click("#plan-start")
    visit.page.wait_for_selector("#plan-result:not([hidden])", timeout=30_000)
    return [
        (config, title)
        for config, title in visit.page.eval_on_selector_all(
            "#plan-table tbody tr",
            "trs => trs.map(tr => [tr.querySelector('td.config').textContent,"
            " tr.querySelectorAll('td')[5].getAttribute('title')])",
        )
    ]


def test_plan_panel_says_where_an_offloaded_optimizer_steps(visit: Visit) -> None:
    """Llama 3 8B on one H100 fits only with FSDP2's CPU offload: each such row's offload cell
    names the host optimizer's figure and threads, as the API's assumptions give them."""
    cells = _plan_offload_cells(visit, "?plan_gpus=1&plan_global_batch=8")
    assert cells, "the panel should list the candidates that fit"
    for config, title in cells:
        assert "offload" in config
        assert title is not None and title.startswith("optimizer on the host at ")
        assert "on all thread(s) per rank" in title and "every core" in title


def test_plan_panel_names_checkpoint_offload_and_its_copies(visit: Visit) -> None:
    """Llama 3 8B at 32,768 tokens on 8 × H100 fits only with full checkpointing: the rows that
    keep the layers' inputs in host memory say so, and their offload cell gives the copies'
    time beside the host optimizer's."""
    query = "?plan_gpu=h100-sxm&plan_gpus=8&plan_global_batch=16&plan_seq_len=32768"
    cells = _plan_offload_cells(visit, query)
    moved = [title for config, title in cells if "ckpt full (inputs on host)" in config]
    kept = [title for config, title in cells if "inputs on host" not in config]
    assert moved and kept
    assert all("layer inputs to the host and back: " in (title or "") for title in moved)
    assert not any("layer inputs" in (title or "") for title in kept)
