#!/usr/bin/env bash
# One retrieval hop, then two (`residency serve --hops 1|2`), through a router on the English
# sample's default plan (SmolLM2 on vLLM CPU): the 78 questions (`eval answers --strategy residency
# --max-tokens 64`), prefix cache reset before each run; prints per run the answer scores per
# question type (token F1 and key facts), the uncached prompt tokens per request and the TTFT p50
# (~25 min on 2 cores).
#
#   scripts/eval_hops_real.sh [OUT_DIR]      (default .benchmarks/hops)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks/hops}"; mkdir -p "$OUT"
PY=.venv/bin/python; R=(.venv/bin/residency)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=1 TOKENIZERS_PARALLELISM=false
MODEL_DIR=$("${R[@]}" model build smollm2 --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["path"])')
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_health() { until curl -sf "$1/health" >/dev/null; do sleep 2; done; }
setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
    --served-model-name SmolLM2-135M-Instruct --host 127.0.0.1 --port 8010 \
    --max-model-len 8192 --enforce-eager --enable-prefix-caching --enable-prompt-tokens-details \
    > $OUT/vllm.log 2>&1 &
pids+=($!)
VLLM=http://127.0.0.1:8010
wait_health $VLLM
"${R[@]}" plan --sample harbor-lights-en --server $VLLM --platform cpu -o $OUT/plan-en.json > $OUT/plan.txt
for mode in ${MODES:-1 2}; do
  flag="--hops $mode"
  curl -s -X POST $VLLM/reset_prefix_cache >/dev/null || true
  start=$(date +%s)
  setsid "${R[@]}" serve --plan $OUT/plan-en.json --upstream $VLLM --port 8110 --today 2026-01-15 \
      --log $OUT/log-$mode.jsonl $flag > $OUT/router-$mode.log 2>&1 &
  pids+=($!)
  wait_health http://127.0.0.1:8110
  "${R[@]}" eval answers --sample harbor-lights-en --generator $VLLM --router http://127.0.0.1:8110 \
      --plan $OUT/plan-en.json --strategy residency --max-tokens 64 \
      --records $OUT/answers-$mode.jsonl --json > $OUT/answers-$mode.json
  kill -TERM -- "-${pids[-1]}" 2>/dev/null || true
  while curl -sf http://127.0.0.1:8110/health >/dev/null; do sleep 1; done
  echo "$mode: $(( $(date +%s) - start )) s" >> $OUT/times.txt
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for mode in ("1", "2"):
    rows = [json.loads(x) for x in (out / f"log-{mode}.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["cached_tokens"] is not None]
    uncached = sum(r["prompt_tokens"] - r["cached_tokens"] for r in rows) / len(rows)
    ttft = sorted(r["ttft_ms"] for r in rows)[len(rows) // 2] / 1000
    print(f"hops {mode}: {uncached:,.0f} uncached prompt tokens / request, TTFT p50 {ttft:.2f} s")
    report = json.loads((out / f"answers-{mode}.json").read_text())
    print(json.dumps(report.get("results", report), ensure_ascii=False)[:3000])
PYEOF
