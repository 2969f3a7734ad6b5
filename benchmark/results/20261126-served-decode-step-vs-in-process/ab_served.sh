#!/usr/bin/env bash
# usage: ARTIFACT=DIR TOKENIZER=HF_DIR ab_served.sh: ours (ARTIFACT) on 8300 and vLLM CPU (TOKENIZER, the same weights)
# on 8302 side by side, the same drive alternated between them for 3 rounds.
set -euo pipefail
ROOT=$(git rev-parse --show-toplevel); ART=$ARTIFACT; HF=$TOKENIZER; OUT=${OUT:-ab}; mkdir -p $OUT
env -u OMP_NUM_THREADS ONP_BACKEND=cpu ONP_PREFILL_MODE=serial OMP_NUM_THREADS=2 setsid $ROOT/.venv/bin/vllm serve $ART --no-enable-prefix-caching --host 127.0.0.1 --port 8300 --seed 0 > $OUT/ours.server.log 2>&1 &
p1=$!
env ONP_BACKEND=off VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-1 setsid $ROOT/.venv/bin/vllm serve $HF --max-model-len 2048 --max-num-seqs 4 --dtype float32 --no-enable-prefix-caching --host 127.0.0.1 --port 8302 --seed 0 > $OUT/vllm.server.log 2>&1 &
p2=$!
trap 'kill -TERM -- -$p1 -$p2 2>/dev/null || true' EXIT
for port in 8300 8302; do until curl -sf http://127.0.0.1:$port/health >/dev/null 2>&1; do sleep 2; done; done
echo "both up $(date +%T)"
for round in 1 2 3; do
  for name in ours vllm; do
    port=8300; model=$ART; [ $name = vllm ] && { port=8302; model=$HF; }
    flock /tmp/bench.lock $ROOT/.venv/bin/vllm bench serve --backend vllm --base-url http://127.0.0.1:$port --model $model --tokenizer $HF \
      --dataset-name random --random-input-len 1000 --random-output-len 64 --num-prompts 24 --max-concurrency 4 --ignore-eos \
      --seed 0 --temperature 0 --num-warmups 4 --save-result --result-dir $OUT --result-filename $name-r$round.json > $OUT/$name-r$round.log 2>&1
    python3 -c "
import json; r=json.load(open('$OUT/$name-r$round.json'))
print('$name r$round', 'ttft_p50 %.0f itl_p50 %.1f tpot_p50 %.1f output_tok/s %.1f' % (r['median_ttft_ms'], r['median_itl_ms'], r['median_tpot_ms'], r['output_throughput']))"
  done
done
