#!/usr/bin/env bash
# docs/results.md's answer-quality figures: SmolLM2-135M-Instruct on vLLM's CPU build, English sample.
#
#   scripts/eval_answers_real.sh [OUT_DIR]      (default .benchmarks; ~35 min on 2 cores)
#
# Starts vLLM (max_model_len 8192, prefix caching, compact structured output for the judge and
# the pruner) and `residency serve`, plans the sample against the server (the planner's count of
# prefixes), then runs `eval answers` (residency first, while the prefixes the router warmed at
# boot are still cached — the baselines' prompts would evict them; then echo, rag top-3 / top-5,
# whole; the same server as LLM judge), then the same questions through a single-prefix plan's
# router (`--prefixes 1`, started after the first router stops, so the two never share the KV
# cache), and `eval prune` (the same model as grader); stops every server whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks}"
VLLM_PORT="${VLLM_PORT:-8000}"
ROUTER_PORT="${ROUTER_PORT:-8100}"
PY=.venv/bin/python
R=(.venv/bin/residency)
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=1 \
    TOKENIZERS_PARALLELISM=false
MODEL_DIR=$("${R[@]}" model build smollm2 --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["path"])')
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_health() { until curl -sf "$1/health" >/dev/null; do sleep 2; done; }

setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
    --served-model-name SmolLM2-135M-Instruct --host 127.0.0.1 --port "$VLLM_PORT" \
    --max-model-len 8192 --enforce-eager --enable-prefix-caching --enable-prompt-tokens-details \
    --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}' \
    > "$OUT/vllm-answers.log" 2>&1 &
pids+=($!)
VLLM="http://127.0.0.1:$VLLM_PORT"
wait_health "$VLLM"
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu -o "$OUT/plan-en.json"
setsid "${R[@]}" serve --plan "$OUT/plan-en.json" --upstream "$VLLM" --port "$ROUTER_PORT" \
    --today 2026-01-15 --log "$OUT/router-log-en.jsonl" > "$OUT/router-answers.log" 2>&1 &
pids+=($!)
ROUTER="http://127.0.0.1:$ROUTER_PORT"
wait_health "$ROUTER"
"${R[@]}" eval answers --sample harbor-lights-en --generator "$VLLM" --judge "$VLLM" \
    --router "$ROUTER" --plan "$OUT/plan-en.json" --strategy residency --strategy echo \
    --strategy rag --strategy whole --k 3 --k 5 --max-tokens 64 --records "$OUT/answers-en.jsonl" \
    --json > "$OUT/answers-en.json"
kill -TERM -- "-${pids[-1]}" 2>/dev/null || true
while curl -sf "$ROUTER/health" >/dev/null; do sleep 1; done  # the first router is gone
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu --prefixes 1 \
    -o "$OUT/plan-en-single.json"
setsid "${R[@]}" serve --plan "$OUT/plan-en-single.json" --upstream "$VLLM" --port "$ROUTER_PORT" \
    --today 2026-01-15 > "$OUT/router-answers-single.log" 2>&1 &
pids+=($!)
wait_health "$ROUTER"
"${R[@]}" eval answers --sample harbor-lights-en --generator "$VLLM" --router "$ROUTER" \
    --plan "$OUT/plan-en-single.json" --strategy residency --max-tokens 64 \
    --records "$OUT/answers-en-single.jsonl" --json > "$OUT/answers-en-single.json"
"${R[@]}" eval prune --sample harbor-lights-en --pruner-url "$VLLM" --k 5 --limit 65 \
    --timeout 60 --json > "$OUT/prune-en.json"
echo "answers: $OUT/answers-en.json (single prefix: answers-en-single.json); pruner: $OUT/prune-en.json"
