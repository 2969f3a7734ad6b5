#!/usr/bin/env bash
# Drive a configuration with `vllm bench serve` at every concurrency level in CONCURRENCY.
#
#   benchmark/drive.sh NAME
#
# NAME is served already (benchmark/serve.sh NAME, same PORT and RUN_DIR), except hf-generate,
# which is no server: hf_generate.py runs transformers `generate` on the same prompts.
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

# Options shared by vllm bench serve and hf_generate.py (which samples the same prompts with them).
dataset_args=(--dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN"
  --num-prompts "$NUM_PROMPTS" --seed "$SEED" --tokenizer "$tokenizer" --temperature "$TEMPERATURE")

line_count() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }

# The runner appends a stats line when a request finishes, just after its last token went out:
# wait (briefly) for all of them, then keep this level's lines.
slice_stats() {
  local stats=$1 before=$2 out=$3 expected=$4
  for _ in $(seq 50); do
    [ "$(($(line_count "$stats") - before))" -ge "$expected" ] && break
    sleep 0.2
  done
  tail -n "+$((before + 1))" "$stats" | tail -n "$NUM_PROMPTS" >"$out"
}

read -ra levels <<<"${CONCURRENCY//,/ }"
for i in "${!levels[@]}"; do
  c=${levels[$i]}
  result=$RUN_DIR/$name-c$c.json
  log "$name: concurrency $c ($((i + 1))/${#levels[@]}), $NUM_PROMPTS prompts, $INPUT_LEN in / $OUTPUT_LEN out tokens"
  if [ "$kind" = hf ]; then
    model=$(ensure_hf_model)
    "$PYTHON" "$BENCH_DIR/hf_generate.py" --model "$model" --concurrency "$c" --num-warmups "$NUM_WARMUPS" --threads "$THREADS" \
      --out "$result" -- "${dataset_args[@]}" >"$RUN_DIR/$name-c$c.log" 2>&1 ||
      {
        tail -30 "$RUN_DIR/$name-c$c.log" >&2
        die "$name: hf_generate.py failed at concurrency $c (log: $RUN_DIR/$name-c$c.log)"
      }
    tail -1 "$RUN_DIR/$name-c$c.log" >&2
    continue
  fi
  stats=$RUN_DIR/$name.stats.jsonl
  before=$(line_count "$stats")
  "$VENV_BIN/vllm" bench serve --backend openai --endpoint /v1/completions --base-url "http://$HOST:$PORT" \
    --model "$(served_dir "$name")" "${dataset_args[@]}" --ignore-eos --max-concurrency "$c" \
    --num-warmups "$NUM_WARMUPS" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
    --save-result --result-dir "$RUN_DIR" --result-filename "$(basename "$result")" \
    --metadata "config=$name" "concurrency=$c" --disable-tqdm >"$RUN_DIR/$name-c$c.log" 2>&1 ||
    {
      tail -30 "$RUN_DIR/$name-c$c.log" >&2
      die "$name: vllm bench serve failed at concurrency $c (log: $RUN_DIR/$name-c$c.log)"
    }
  # vllm bench exits 0 even when requests fail.
  "$PYTHON" - "$result" "$NUM_PROMPTS" <<'EOF' || die "$name: requests failed at concurrency $c (log: $RUN_DIR/$name-c$c.log)"
import json, sys
result = json.load(open(sys.argv[1]))
sys.exit(0 if result.get("completed") == int(sys.argv[2]) and not result.get("failed") else 1)
EOF
  # The summary block vllm bench prints, for the progress view.
  sed -n '/Serving Benchmark Result/,/^=\{20,\}/p' "$RUN_DIR/$name-c$c.log" |
    grep -E 'Successful|throughput \(tok|Request throughput|P50 TTFT|P99 TTFT|P50 ITL|P99 ITL' >&2 || true
  if [ "$kind" = plugin ]; then
    slice_stats "$stats" "$before" "$RUN_DIR/$name-c$c.stats.jsonl" "$((NUM_PROMPTS + NUM_WARMUPS))"
  fi
done
