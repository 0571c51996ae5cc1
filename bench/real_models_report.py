# ruff: noqa: T201 (a script: its report goes to stdout)
"""Real Hugging Face models as users train them, from ``bench/gpu/real_models_round.sh``'s
results: each run predicted again with the current calculators from the request its job's
arguments make (``bench.accuracy.real_model_setups``, as the README's accuracy table predicts
them), beside what it measured and the error its own prediction had when it ran::

    python3 bench/real_models_report.py bench/results/real_models/h200x4.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.accuracy import real_model_setups  # noqa: E402
from calculators.conventions import Stage  # noqa: E402
from calculators.memory import estimate  # noqa: E402
from measure.compare import predicted_memory, relative_error  # noqa: E402

MIB = 2**20


def rows(path: Path) -> list[dict[str, Any]]:
    # a job that printed no result (it failed or ran out of time) is listed as such
    out: list[dict[str, Any]] = [
        {"name": entry["name"], "missing": True}
        for entry in json.loads(path.read_text())
        if entry["result"] is None
    ]
    for m in real_model_setups(path):
        run = m.run
        stage = Stage(run["stage"])
        predicted = predicted_memory(estimate(m.setup, [stage]).stages[0])
        measured = run["measured"]
        row: dict[str, Any] = {
            "name": m.name,
            "engine": run["engine"],
            "stage": run["stage"],
            "nd": run["world_size"],
        }
        for key in ("resident", "peak"):
            row[key] = measured.get(key), predicted.get(key)
            row[f"{key}_error"] = relative_error(predicted.get(key), measured.get(key))
            row[f"{key}_stored"] = run["relative_error"].get(key)
        out.append(row)
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.2f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=Path)
    a = parser.parse_args()
    table = [r for path in a.results for r in rows(path)]
    print(
        "| run | engine | stage | Nd | resident MiB measured / predicted | error (when run) "
        "| peak MiB measured / predicted | error (when run) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in table:
        if r.get("missing"):
            print(f"| {r['name']} | no result | | | | | | |")
            continue
        cells = [r["name"], r["engine"], r["stage"], r["nd"]]
        for key in ("resident", "peak"):
            m, p = r[key]
            cells.append(f"{m / MIB:,.1f} / {p / MIB:,.1f}")
            cells.append(f"{_pct(r[f'{key}_error'])} ({_pct(r[f'{key}_stored'])})")
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print()
    for engine in sorted({r["engine"] for r in table if not r.get("missing")}):
        for key in ("resident", "peak"):
            errors = [
                r[f"{key}_error"]
                for r in table
                if r.get("engine") == engine and r.get(f"{key}_error") is not None
            ]
            if errors:
                print(
                    f"{engine} {key}: {len(errors)} runs, median |error| "
                    f"{100 * statistics.median(abs(e) for e in errors):.2f} %, max |error| "
                    f"{100 * max(abs(e) for e in errors):.2f} %, lowest {_pct(min(errors))}"
                )


if __name__ == "__main__":
    main()
