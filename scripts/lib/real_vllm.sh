# shellcheck shell=bash
# Sourced by scripts/eval_*_real.sh from the repository root: SmolLM2-135M-Instruct on vLLM's CPU
# build and `residency serve`, each started in its own process group and all stopped on exit,
# whatever happens.
PY=.venv/bin/python
R=(.venv/bin/residency)
# --dtype by the CPU (residency.cpu_dtype: bfloat16 with AMX-BF16 or AVX512-BF16, float32
# elsewhere; DTYPE=... overrides), and a KV space that holds the same 46,592 tokens in either.
DTYPE=${DTYPE:-$("$PY" -c 'from residency.cpu_dtype import choose_cpu_dtype; print(choose_cpu_dtype().dtype)')}
if [[ $DTYPE == float32 ]]; then KV_GIB=2; else KV_GIB=1; fi
echo "vLLM --dtype $DTYPE, VLLM_CPU_KVCACHE_SPACE=$KV_GIB" >&2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
    VLLM_CPU_KVCACHE_SPACE=$KV_GIB TOKENIZERS_PARALLELISM=false
MODEL_DIR=$("${R[@]}" model build smollm2 --json \
    | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["path"])')
pids=()
cleanup() { for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_health() { until curl -sf "$1/health" >/dev/null; do sleep 2; done; }

# start_vllm PORT LOG [vLLM flags]: max_model_len 8192, prefix caching, cached-token counts in
# every usage, dev mode for /reset_prefix_cache (bound to 127.0.0.1); sets VLLM to its URL once
# /health answers.
start_vllm() {
    local port=$1 log=$2
    shift 2
    VLLM_SERVER_DEV_MODE=1 setsid "$PY" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
        --served-model-name SmolLM2-135M-Instruct --host 127.0.0.1 --port "$port" \
        --max-model-len 8192 --enforce-eager --enable-prefix-caching \
        --enable-prompt-tokens-details --dtype "$DTYPE" \
        "$@" > "$log" 2>&1 &
    pids+=($!)
    VLLM="http://127.0.0.1:$port"
    wait_health "$VLLM"
}

# start_router PORT LOG [serve flags]: `residency serve --upstream $VLLM`; sets ROUTER to its URL
# once /health answers.
start_router() {
    local port=$1 log=$2
    shift 2
    setsid "${R[@]}" serve --upstream "$VLLM" --port "$port" "$@" > "$log" 2>&1 &
    pids+=($!)
    ROUTER="http://127.0.0.1:$port"
    wait_health "$ROUTER"
}

# stop_router: stops the router started last and waits until its port no longer answers.
stop_router() {
    kill -TERM -- "-${pids[-1]}" 2>/dev/null || true
    while curl -sf "$ROUTER/health" >/dev/null; do sleep 1; done
}

# reset_prefix_cache: empties vLLM's prefix cache, or stops the script. Without dev mode vLLM
# answers 404; while blocks are still held it answers {"success": false}: retried for 10 s.
reset_prefix_cache() {
    local body="" _
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        body=$(curl -sf -X POST "$VLLM/reset_prefix_cache") || break
        [[ $body == *true* ]] && return 0
        sleep 1
    done
    echo "reset_prefix_cache: $VLLM did not empty its prefix cache (${body:-no answer})" >&2
    exit 1
}

# router_run OUT PLAN MODE [serve flags]: the prefix cache reset, a router on PLAN, the English
# sample's questions through it (`eval answers --strategy residency --max-tokens 64`, LIMIT
# questions if set); leaves OUT/{log,answers,router,metrics}-MODE.* and a line in OUT/times.txt.
router_run() {
    local out=$1 plan=$2 mode=$3 start
    shift 3
    reset_prefix_cache
    start=$(date +%s)
    start_router 8110 "$out/router-$mode.log" --plan "$plan" --today 2026-01-15 \
        --log "$out/log-$mode.jsonl" "$@"
    "${R[@]}" eval answers --sample harbor-lights-en --generator "$VLLM" --router "$ROUTER" \
        --plan "$plan" --strategy residency --max-tokens 64 ${LIMIT:+--limit "$LIMIT"} \
        --records "$out/answers-$mode.jsonl" --json > "$out/answers-$mode.json"
    sleep 2  # the last keep-warm tick's counters
    curl -s "$ROUTER/metrics" | grep -E "^residency_router_" > "$out/metrics-$mode.txt" || true
    stop_router
    echo "$mode: $(( $(date +%s) - start )) s" >> "$out/times.txt"
}
