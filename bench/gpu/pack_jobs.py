"""Pack a round's jobs into one JSON file: ``[{"name", "args", "result"}]``.

Each job of ``real_models_round.sh`` or ``canonical_ds_round.sh`` leaves ``NAME.args`` (its
``python -m measure`` arguments, one per line) and ``NAME.json`` (what it printed) in one
folder; a job that printed no JSON gets ``"result": null``.

    python3 bench/gpu/pack_jobs.py FOLDER OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: Path, out: Path) -> None:
    runs = []
    for f in sorted(folder.glob("*.args")):
        printed = f.with_suffix(".json")
        text = printed.read_text().strip() if printed.exists() else ""
        try:
            result = json.loads(text) if text else None
        except ValueError:
            result = None
        runs.append({"name": f.stem, "args": f.read_text().split("\n")[:-1], "result": result})
    out.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
