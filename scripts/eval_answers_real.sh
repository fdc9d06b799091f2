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
# LIMIT=N asks only the first N questions (a smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.benchmarks}"
VLLM_PORT="${VLLM_PORT:-8000}"
ROUTER_PORT="${ROUTER_PORT:-8100}"
mkdir -p "$OUT"
# shellcheck source=scripts/lib/real_vllm.sh
source scripts/lib/real_vllm.sh
start_vllm "$VLLM_PORT" "$OUT/vllm-answers.log" \
    --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}'
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu -o "$OUT/plan-en.json"
start_router "$ROUTER_PORT" "$OUT/router-answers.log" --plan "$OUT/plan-en.json" \
    --today 2026-01-15 --log "$OUT/router-log-en.jsonl"
"${R[@]}" eval answers --sample harbor-lights-en --generator "$VLLM" --judge "$VLLM" \
    --router "$ROUTER" --plan "$OUT/plan-en.json" --strategy residency --strategy echo \
    --strategy rag --strategy whole --rag-k 3 --rag-k 5 --max-tokens 64 ${LIMIT:+--limit "$LIMIT"} \
    --records "$OUT/answers-en.jsonl" --json > "$OUT/answers-en.json"
stop_router  # the first router is gone before the second starts
"${R[@]}" plan --sample harbor-lights-en --server "$VLLM" --platform cpu --prefixes 1 \
    -o "$OUT/plan-en-single.json"
start_router "$ROUTER_PORT" "$OUT/router-answers-single.log" --plan "$OUT/plan-en-single.json" \
    --today 2026-01-15
"${R[@]}" eval answers --sample harbor-lights-en --generator "$VLLM" --router "$ROUTER" \
    --plan "$OUT/plan-en-single.json" --strategy residency --max-tokens 64 \
    ${LIMIT:+--limit "$LIMIT"} --records "$OUT/answers-en-single.jsonl" --json \
    > "$OUT/answers-en-single.json"
"${R[@]}" eval prune --sample harbor-lights-en --pruner-url "$VLLM" --chunks 5 --max-questions "${LIMIT:-65}" \
    --timeout 60 --json > "$OUT/prune-en.json"
echo "answers: $OUT/answers-en.json (single prefix: answers-en-single.json); pruner: $OUT/prune-en.json"
