#!/usr/bin/env bash
# One retrieval hop, then two (`residency serve --hops 1|2`), through a router on the English
# sample's default plan (SmolLM2 on vLLM CPU): the 78 questions (`eval answers --strategy residency
# --max-tokens 64`), prefix cache reset before each run; prints per run the answer scores per
# question type (token F1 and key facts), the uncached prompt tokens per request and the TTFT p50
# (~25 min on 2 cores). MODES="1" runs one of them, LIMIT=N only the first N questions.
#
#   scripts/eval_hops_real.sh [OUT_DIR]      (default .benchmarks/hops)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks/hops}"; mkdir -p "$OUT"
# shellcheck source=scripts/lib/real_vllm.sh
source scripts/lib/real_vllm.sh
start_vllm 8010 "$OUT/vllm.log"
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu -o "$OUT/plan-en.json" \
    > "$OUT/plan.txt"
read -ra modes <<< "${MODES:-1 2}"
for mode in "${modes[@]}"; do
  router_run "$OUT" "$OUT/plan-en.json" "$mode" --hops "$mode"
done
"$PY" - "$OUT" "${modes[@]}" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for mode in sys.argv[2:]:
    rows = [json.loads(x) for x in (out / f"log-{mode}.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["cached_tokens"] is not None]
    uncached = sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows) / len(rows)
    ttft = sorted(r["ttft_ms"] for r in rows)[len(rows) // 2] / 1000
    print(f"hops {mode}: {uncached:,.0f} uncached prompt tokens / request, TTFT p50 {ttft:.2f} s")
    report = json.loads((out / f"answers-{mode}.json").read_text())
    print(json.dumps(report.get("results", report), ensure_ascii=False)[:3000])
PYEOF
