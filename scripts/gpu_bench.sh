#!/usr/bin/env bash
# The policy benchmark on a real GPU: SGLang 0.5.23 with the market's plugin, one server per
# policy, the generated-shared-prefix workload with per-request bids driven through the
# project's engine client; the same table and JSON as the simulated benchmark, in under ten
# minutes on one H100/H200-class GPU.
#
# First, SGLang behind SGLang's model gateway (smg 1.13.0, as engines/router.py starts it) with
# the plugin running: benchmarks.smg_check sends bids through the gateway, streamed and not,
# and checks that SGLang took the body smg rebuilds and the plugin read each bid from it (the
# answers' meta_info and the round records); OUT_DIR/smg-check.json says what it saw. The
# benchmark runs only when it passes; SMG_CHECK_ONLY=1 stops after it.
#
#   scripts/gpu_bench.sh [OUT_DIR]          (default: gpu-bench-results)
#
# Needs: one NVIDIA GPU, Python 3.11+, and pip access to SGLang's wheels (it installs the
# project with its `sglang` extra into .venv-gpu unless SGLANG_PYTHON names a Python that has
# SGLang 0.5.23 and this project installed). The model is a Llama-shaped config with dummy
# weights (scripts/gpu/tiny-llama, or MODEL_DIR): no download, no tokenizer (token ids only).
# Knobs (environment): REQUESTS (512), RATE (requests/s, 12), GSP_GROUPS (16), OUTPUT_LEN (128),
# POLICIES, PORT (30000), MODEL_DIR.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUT=${1:-gpu-bench-results}
REQUESTS=${REQUESTS:-512}
RATE=${RATE:-12}
GSP_GROUPS=${GSP_GROUPS:-16}  # not GROUPS: bash sets that to the user's group ids
OUTPUT_LEN=${OUTPUT_LEN:-128}
PORT=${PORT:-30000}
MODEL_DIR=${MODEL_DIR:-scripts/gpu/tiny-llama}
POLICIES=${POLICIES:-"fcfs lpm dfs-weight highest-bid dfs-auction dfs-auction-density dfs-auction-kv dfs-auction-kv-split"}
mkdir -p "$OUT"

if [ -n "${SGLANG_PYTHON:-}" ]; then
    PY=$SGLANG_PYTHON
else
    PY=.venv-gpu/bin/python
    if [ ! -x "$PY" ]; then
        echo "==> installing the project with SGLang 0.5.23 into .venv-gpu"
        python3 -m venv .venv-gpu
        "$PY" -m pip install --quiet -e '.[sglang]'
    fi
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || {
    echo "gpu_bench: no NVIDIA GPU visible" >&2
    exit 1
}

server_pid=""
rounds=""
# start_sglang NAME SGLANG_POLICY: one server, the plugin's config and round records for NAME.
start_sglang() {
    local name=$1 sglang_policy=$2
    rounds="$OUT/rounds-$name.jsonl"
    rm -f "$rounds"
    printf '{"rounds_jsonl": "%s", "market": "gpu-bench"}\n' "$rounds" > "$OUT/plugin-$name.json"
    export MARKET_PLUGIN_CONFIG="$OUT/plugin-$name.json"
    echo "==> $name: starting SGLang"
    "$PY" -m sglang.launch_server --model-path "$MODEL_DIR" --load-format dummy \
        --skip-tokenizer-init --port "$PORT" --schedule-policy "$sglang_policy" \
        --disable-cuda-graph --mem-fraction-static 0.85 --log-level warning \
        > "$OUT/server-$name.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 180); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
        kill -0 "$server_pid" 2>/dev/null || { tail -n 40 "$OUT/server-$name.log"; exit 1; }
        sleep 1
    done
    echo "gpu_bench: SGLang did not become healthy in 180 s" >&2
    exit 1
}
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap stop_server EXIT

export MARKET_POLICY=dfs-auction-density
start_sglang smg-check fcfs
echo "==> smg-check: bids through SGLang's model gateway to SGLang"
if ! "$PY" -m benchmarks.smg_check --engine-url "http://127.0.0.1:$PORT" \
    --rounds-jsonl "$rounds" --json "$OUT/smg-check.json" --log "$OUT/smg.log"; then
    echo "gpu_bench: the bids did not arrive through smg: $OUT/smg-check.json, $OUT/smg.log," \
        "$OUT/server-smg-check.log" >&2
    exit 1
fi
stop_server
[ "${SMG_CHECK_ONLY:-0}" = 1 ] && exit 0

for policy in $POLICIES; do
    # SGLang's own policies run as SGLang runs them; the market's run inside the plugin
    # (highest-bid there is not limited to fcfs as SGLang's priority scheduling is).
    case "$policy" in
        fcfs|lpm|dfs-weight) export MARKET_POLICY=""; sglang_policy=$policy ;;
        *) export MARKET_POLICY=$policy; sglang_policy=fcfs ;;
    esac
    start_sglang "$policy" "$sglang_policy"
    echo "==> $policy: $REQUESTS requests at $RATE/s"
    "$PY" -m benchmarks.live --engine-url "http://127.0.0.1:$PORT" \
        --policy "$policy" --requests "$REQUESTS" --rate "$RATE" --groups "$GSP_GROUPS" \
        --output-len "$OUTPUT_LEN" --rounds-jsonl "$rounds" --json "$OUT/$policy.json" >/dev/null
    stop_server
done

runs=()
for policy in $POLICIES; do runs+=("$OUT/$policy.json"); done
"$PY" -m benchmarks.live --merge "${runs[@]}" --json "$OUT/table.json" \
    --html "$OUT/report.html" | tee "$OUT/table.txt"
