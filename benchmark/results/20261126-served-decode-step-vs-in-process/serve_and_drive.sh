#!/usr/bin/env bash
# usage: ARTIFACT=DIR TOKENIZER=HF_DIR serve_and_drive.sh NAME [ENV=VALUE ...]: serves ARTIFACT with the plugin and
# those variables, drives it (random dataset, 1000 in / 64 out, concurrency 4), writes OUT/NAME.json and prints its medians
set -euo pipefail
name=$1; shift
ROOT=$(git rev-parse --show-toplevel); ART=$ARTIFACT; HF=$TOKENIZER; OUT=${OUT:-out}; mkdir -p $OUT
PORT=8300
env -u OMP_NUM_THREADS ONP_BACKEND=cpu ONP_PREFILL_MODE=serial OMP_NUM_THREADS=2 "$@" setsid $ROOT/.venv/bin/vllm serve $ART --no-enable-prefix-caching --host 127.0.0.1 --port $PORT --seed 0 > $OUT/$name.server.log 2>&1 &
pid=$!
until curl -sf http://127.0.0.1:$PORT/health >/dev/null 2>&1; do kill -0 $pid || { tail $OUT/$name.server.log; exit 1; }; sleep 1; done
flock /tmp/bench.lock $ROOT/.venv/bin/vllm bench serve --backend vllm --base-url http://127.0.0.1:$PORT --model $ART --tokenizer $HF \
  --dataset-name random --random-input-len 1000 --random-output-len 64 --num-prompts 24 --max-concurrency 4 --ignore-eos \
  --seed 0 --temperature 0 --num-warmups 4 --save-result --result-dir $OUT --result-filename $name.json > $OUT/$name.bench.log 2>&1
kill -TERM -- -$pid; wait $pid || true
python3 - $OUT/$name.json <<'P'
import json,sys; r=json.load(open(sys.argv[1]))
print(sys.argv[1], "ttft_p50 %.0f itl_p50 %.1f tpot_p50 %.1f tok/s %.1f" % (r["median_ttft_ms"], r["median_itl_ms"], r["median_tpot_ms"], r["output_throughput"]))
P
