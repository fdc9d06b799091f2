#!/usr/bin/env bash
# Keep-warm off, then on, through a router on the English sample's default plan (SmolLM2 on vLLM CPU):
# the 78 questions (`eval answers --strategy residency --max-tokens 64`), prefix cache reset before
# each run; prints per run the requests that found their prefix short, the touches, the uncached
# prompt tokens per request and the TTFT p50 (~25 min on 2 cores).
#
#   scripts/eval_keepwarm_real.sh [OUT_DIR]      (default .benchmarks/keepwarm)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks/keepwarm}"; mkdir -p "$OUT"
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
for mode in ${MODES:-off on}; do
  flag=""; [ $mode = off ] && flag="--no-keep-warm"
  curl -s -X POST $VLLM/reset_prefix_cache >/dev/null || true
  start=$(date +%s)
  setsid "${R[@]}" serve --plan $OUT/plan-en.json --upstream $VLLM --port 8110 --today 2026-01-15 \
      --log $OUT/log-$mode.jsonl $flag > $OUT/router-$mode.log 2>&1 &
  pids+=($!)
  wait_health http://127.0.0.1:8110
  "${R[@]}" eval answers --sample harbor-lights-en --generator $VLLM --router http://127.0.0.1:8110 \
      --plan $OUT/plan-en.json --strategy residency --max-tokens 64 \
      --records $OUT/answers-$mode.jsonl --json > $OUT/answers-$mode.json
  sleep 2
  curl -s http://127.0.0.1:8110/metrics | grep -E "^residency_router_(prefix_evictions|keep_warm)" > $OUT/metrics-$mode.txt || true
  kill -TERM -- "-${pids[-1]}" 2>/dev/null || true
  while curl -sf http://127.0.0.1:8110/health >/dev/null; do sleep 1; done
  echo "$mode: $(( $(date +%s) - start )) s" >> $OUT/times.txt
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
plan = json.loads((out / "plan-en.json").read_text())
block = plan["capacity"]["block_size"]
tokens = {p["id"]: p["tokens"] for p in plan["prefixes"]}
for mode in ("off", "on"):
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
