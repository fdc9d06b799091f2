#!/usr/bin/env bash
# Keep-warm off, then on, through a router on the English sample's default plan (SmolLM2 on vLLM CPU):
# the 78 questions (`eval answers --strategy residency --max-tokens 64`), prefix cache reset before
# each run; prints per run the requests that found their prefix short, the touches, the uncached
# prompt tokens per request and the TTFT p50 (~25 min on 2 cores). MODES="on" runs one of them,
# LIMIT=N only the first N questions.
#
#   scripts/eval_keepwarm_real.sh [OUT_DIR]      (default .benchmarks/keepwarm)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks/keepwarm}"; mkdir -p "$OUT"
# shellcheck source=scripts/lib/real_vllm.sh
source scripts/lib/real_vllm.sh
start_vllm 8010 "$OUT/vllm.log"
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu -o "$OUT/plan-en.json" \
    > "$OUT/plan.txt"
read -ra modes <<< "${MODES:-off on}"
for mode in "${modes[@]}"; do
  if [ "$mode" = off ]; then
    router_run "$OUT" "$OUT/plan-en.json" off --no-keep-warm
  else
    router_run "$OUT" "$OUT/plan-en.json" "$mode"
  fi
done
"$PY" - "$OUT" "${modes[@]}" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
plan = json.loads((out / "plan-en.json").read_text())
block = plan["capacity"]["block_size"]
tokens = {p["id"]: p["tokens"] for p in plan["prefixes"]}
for mode in sys.argv[2:]:
    rows = [json.loads(x) for x in (out / f"log-{mode}.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["cached_tokens"] is not None]
    short = sum(r["cached_tokens"] < tokens[r["prefix"]] - block for r in rows)
    uncached = sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows) / len(rows)
    ttft = sorted(r["ttft_ms"] for r in rows)[len(rows) // 2] / 1000
    touches = sum(float(x.rsplit(" ", 1)[1]) for x in (out / f"metrics-{mode}.txt").read_text().splitlines()
                  if x.startswith("residency_router_keep_warm_touches_total"))
    print(f"keep-warm {mode}: {short} of {len(rows)} requests found their prefix short, "
          f"{touches:.0f} touches, {uncached:,.0f} uncached prompt tokens / request, TTFT p50 {ttft:.2f} s")
PYEOF
