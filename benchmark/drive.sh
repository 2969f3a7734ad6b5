#!/usr/bin/env bash
# Drive a configuration at every concurrency level in CONCURRENCY: served.py's `random` case (`vllm bench serve`).
#
#   benchmark/drive.sh NAME
#
# NAME is served already (benchmark/serve.sh NAME, same PORT and RUN_DIR), except hf-generate,
# which is no server: workloads/hf_generate.py runs transformers `generate` on the same prompts.
# Synthetic prompts: vLLM's random dataset, fixed SEED, INPUT_LEN / OUTPUT_LEN tokens (EOS ignored),
# NUM_PROMPTS per level. Writes RUN_DIR/NAME-c<N>.json (vllm bench's result, p50/p99 percentiles)
# and, for plugin configurations, RUN_DIR/NAME-c<N>.stats.jsonl (the runner's per-request
# prefill figures from ONP_STATS_FILE).
set -euo pipefail
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"

[ $# = 1 ] || die "usage: $0 NAME"
name=$1
kind=$(config_kind "$name")
mkdir -p "$RUN_DIR"
tokenizer=$(served_dir "$name")
[ -f "$tokenizer/tokenizer_config.json" ] || die "$name: no tokenizer in $tokenizer (serve it first: benchmark/serve.sh $name)"

if [ "$kind" = hf ]; then
  read -ra levels <<<"${CONCURRENCY//,/ }"
  # Options shared with vllm bench serve: hf_generate.py samples the very prompts the servers get.
  dataset_args=(--dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN"
    --num-prompts "$NUM_PROMPTS" --seed "$SEED" --tokenizer "$tokenizer" --temperature "$TEMPERATURE")
  model=$(ensure_hf_model)
  for c in "${levels[@]}"; do
    result=$RUN_DIR/$name-c$c.json
    log "$name: concurrency $c, $NUM_PROMPTS prompts, $INPUT_LEN in / $OUTPUT_LEN out tokens"
    "$PYTHON" "$BENCH_DIR/workloads/hf_generate.py" --model "$model" --concurrency "$c" --num-warmups "$NUM_WARMUPS" \
      --threads "$THREADS" --out "$result" -- "${dataset_args[@]}" >"$RUN_DIR/$name-c$c.log" 2>&1 ||
      {
        tail -30 "$RUN_DIR/$name-c$c.log" >&2
        die "$name: hf_generate.py failed at concurrency $c (log: $RUN_DIR/$name-c$c.log)"
      }
    tail -1 "$RUN_DIR/$name-c$c.log" >&2
  done
  exit 0
fi

stats_args=()
if [ "$kind" = plugin ]; then stats_args=(--stats-file "$RUN_DIR/$name.stats.jsonl"); fi
"$PYTHON" "$BENCH_DIR/served.py" "${DRIVE_CASE:-random}" --url "http://$HOST:$PORT" --model-dir "$tokenizer" \
  --out "$RUN_DIR" --name "$name" "${stats_args[@]}" --concurrency "$CONCURRENCY" --input-len "$INPUT_LEN" \
  --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" --num-warmups "$NUM_WARMUPS" --seed "$SEED" \
  --temperature "$TEMPERATURE" || die "$name: served.py ${DRIVE_CASE:-random} failed"
