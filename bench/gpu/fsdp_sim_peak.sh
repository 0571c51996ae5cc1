#!/usr/bin/env bash
# FSDP2 stage 3 in simulated worlds on one GPU: the 1.1B GPT of `measure.validate --part a` at
# micro-batch 1 x 512, Nd 8 and 64, measured peak (and each phase's) against the prediction and
# its peak moment. The JSON of each run lands in $OUT (or ./fsdp-sim-peak).
#
#   bash bench/gpu/fsdp_sim_peak.sh            # DEVICE=cpu checks the plumbing (no peak there)
set -eu
out=${OUT:-$PWD/fsdp-sim-peak}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
arch=${ARCH:-'{"layers": 24, "hidden": 1792, "heads": 14, "vocab_size": 50257, "max_seq_len": 1024}'}
seq=${SEQ:-512}
for nd in 8 64; do
  python -m measure --dp "$nd" --mode simulated --stages 3 --micro-batch-size 1 \
    --seq-len "$seq" --device "${DEVICE:-cuda}" --architecture "$arch" >"$out/nd$nd.json"
done
python - "$out" <<'EOF'
import json
import sys

def mib(b):
    return "n/a" if b is None else f"{b / 2**20:,.1f}"

for nd in (8, 64):
    r = json.load(open(f"{sys.argv[1]}/nd{nd}.json"))["runs"][0]
    m, p = r["measured"], r["predicted"]
    moment = next(n for n in p["notes"] if n.startswith("peak at "))[8:].split(";")[0]
    err = r["relative_error"]["peak"]
    print(
        f"Nd {nd}: peak measured {mib(m['peak'])} MiB, predicted {mib(p['peak'])} MiB "
        f"({moment}), error {'n/a' if err is None else format(err, '+.2%')}; "
        f"resident {mib(m['resident'])} / {mib(p['resident'])} MiB"
    )
    print("  measured phase peaks:", {k: mib(v) for k, v in m.get("phase_peaks", {}).items()})
    base = p["resident"] - p["components"]["held_outputs"]
    print(
        "  predicted moments:",
        {
            k.removeprefix("peak_candidate_"): mib(base + v)
            for k, v in p["components"].items()
            if k.startswith("peak_candidate_")
        },
    )
EOF
