#!/usr/bin/env bash
# The policy benchmark on a real GPU: SGLang 0.5.23 with the market's plugin, one server per
# policy, the generated-shared-prefix workload with per-request bids driven through the
# project's engine client; the same table and JSON as the simulated benchmark, in under ten
# minutes on one H100/H200-class GPU.
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
stop_server() {
    if [ -n "$server_pid" ]; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
        server_pid=""
    fi
}
trap stop_server EXIT

for policy in $POLICIES; do
    rounds="$OUT/rounds-$policy.jsonl"
    rm -f "$rounds"
    # SGLang's own policies run as SGLang runs them; the market's run inside the plugin
    # (highest-bid there is not limited to fcfs as SGLang's priority scheduling is).
    case "$policy" in
        fcfs|lpm|dfs-weight) export MARKET_POLICY=""; sglang_policy=$policy ;;
        *) export MARKET_POLICY=$policy; sglang_policy=fcfs ;;
    esac
    printf '{"rounds_jsonl": "%s", "market": "gpu-bench"}\n' "$rounds" > "$OUT/plugin-$policy.json"
    export MARKET_PLUGIN_CONFIG="$OUT/plugin-$policy.json"
    echo "==> $policy: starting SGLang"
    "$PY" -m sglang.launch_server --model-path "$MODEL_DIR" --load-format dummy \
        --skip-tokenizer-init --port "$PORT" --schedule-policy "$sglang_policy" \
        --disable-cuda-graph --mem-fraction-static 0.85 --log-level warning \
        > "$OUT/server-$policy.log" 2>&1 &
    server_pid=$!
    for _ in $(seq 180); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
        kill -0 "$server_pid" 2>/dev/null || { tail -n 40 "$OUT/server-$policy.log"; exit 1; }
        sleep 1
    done
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
