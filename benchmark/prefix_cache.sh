#!/usr/bin/env bash
# Prefix caching on and off, same artifact, same run: a shared system prompt workload.
#
#   benchmark/prefix_cache.sh
#
# Two servers of one artifact (CONFIG, default chunked-hybrid) run side by side: prefix caching on (the default)
# on PORT and off (--no-enable-prefix-caching) on PORT+1. `vllm bench serve` drives them in turn, ROUNDS times
# (on, off, on, off, ...): vLLM's random dataset with one shared PREFIX_LEN-token prefix before QUESTION_LEN random
# tokens per prompt, OUTPUT_LEN tokens out, NUM_PROMPTS prompts at concurrency CONCURRENCY. Writes RUN_DIR/summary.json
# and RUN_DIR/summary.md: TTFT p50 / output tok/s per round and the on/off ratios; the runner's cached_tokens
# (ONP_STATS_FILE) and the on server's vllm:prefix_cache_queries / _hits.
# Knobs (environment, besides common.sh's): PREFIX_LEN (1000), QUESTION_LEN (50), ROUNDS (2), CONFIG.
set -euo pipefail
export SEQUENCE_LENGTH=${SEQUENCE_LENGTH:-2048} CHUNK_SIZE=${CHUNK_SIZE:-128} OUTPUT_LEN=${OUTPUT_LEN:-64}
export NUM_PROMPTS=${NUM_PROMPTS:-32} CONCURRENCY=${CONCURRENCY:-4}
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"

CONFIG=${CONFIG:-chunked-hybrid}
PREFIX_LEN=${PREFIX_LEN:-1000}
QUESTION_LEN=${QUESTION_LEN:-50}
ROUNDS=${ROUNDS:-2}
RUN_DIR=${RUN_DIR:-$RESULTS_ROOT/prefix-$(date +%Y%m%d-%H%M%S)}
BASE_PORT=$PORT
mkdir -p "$RUN_DIR"

variant_dir() { echo "$RUN_DIR/$1"; }
variant_port() { if [ "$1" = on ]; then echo "$BASE_PORT"; else echo $((BASE_PORT + 1)); fi; }

serve() {
  RUN_DIR=$(variant_dir "$1") PORT=$(variant_port "$1") PREFIX_CACHING=$1 "$BENCH_DIR/serve.sh" "$CONFIG"
}

stop_all() {
  for variant in on off; do
    RUN_DIR=$(variant_dir "$variant") "$BENCH_DIR/serve.sh" --stop "$CONFIG" || true
  done
}
trap stop_all EXIT

drive() {
  local variant=$1 round=$2 dir result
  dir=$(variant_dir "$variant")
  result=$variant-r$round.json
  log "$variant, round $round: $NUM_PROMPTS prompts of $PREFIX_LEN shared + $QUESTION_LEN tokens, $OUTPUT_LEN out"
  "$VENV_BIN/vllm" bench serve --backend openai --endpoint /v1/completions \
    --base-url "http://$HOST:$(variant_port "$variant")" --model "$(served_dir "$CONFIG")" \
    --tokenizer "$(served_dir "$CONFIG")" --dataset-name random --random-prefix-len "$PREFIX_LEN" \
    --random-input-len "$QUESTION_LEN" --random-output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
    --seed "$((SEED + round))" --temperature "$TEMPERATURE" --ignore-eos --max-concurrency "$CONCURRENCY" \
    --num-warmups "$NUM_WARMUPS" --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99 \
    --save-result --result-dir "$RUN_DIR" --result-filename "$result" --disable-tqdm \
    >"$RUN_DIR/$variant-r$round.log" 2>&1 || die "vllm bench serve failed (log: $RUN_DIR/$variant-r$round.log)"
}

serve on
serve off
for round in $(seq "$ROUNDS"); do
  drive on "$round"
  drive off "$round"
done
curl -sf "http://$HOST:$(variant_port on)/metrics" >"$RUN_DIR/on.metrics.txt" || true
stop_all
trap - EXIT

"$PYTHON" - "$RUN_DIR" "$ROUNDS" "$PREFIX_LEN" "$QUESTION_LEN" "$CONFIG" <<'EOF'
import json, re, statistics, sys
from pathlib import Path

run, rounds, prefix, question, config = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
meta = json.loads((run / "on" / f"{config}.meta.json").read_text())
rows, ratios = [], {"ttft_p50": [], "output_throughput": []}
for r in range(1, rounds + 1):
    on, off = (json.loads((run / f"{v}-r{r}.json").read_text()) for v in ("on", "off"))
    for name in ratios:
        key = "p50_ttft_ms" if name == "ttft_p50" else name
        ratios[name].append(on[key] / off[key])
    rows.append({"round": r, **{f"{v}_{k}": d[k] for v, d in (("on", on), ("off", off))
                                for k in ("p50_ttft_ms", "p50_tpot_ms", "output_throughput", "completed")}})
stats = [json.loads(line) for line in (run / "on" / f"{config}.stats.jsonl").read_text().splitlines()]
metrics = (run / "on.metrics.txt").read_text() if (run / "on.metrics.txt").exists() else ""
counter = lambda name: sum(float(v) for v in re.findall(rf"^vllm:{name}_total\{{[^}}]*\}} (\S+)", metrics, re.M))
summary = {
    "workload": {"config": config, "prefix_len": int(prefix), "question_len": int(question), **{
        k: meta[k] for k in ("batch_size", "sequence_length", "chunk_size", "prefill_batch_size", "prefill_mode")}},
    "rounds": rows,
    "ratio_on_off": {k: [round(v, 3) for v in vs] for k, vs in ratios.items()},
    "ratio_on_off_median": {k: round(statistics.median(vs), 3) for k, vs in ratios.items()},
    "runner_cached_tokens": {"requests": len(stats), "hits": sum(s["cached_tokens"] > 0 for s in stats),
                             "cached_tokens": sum(s["cached_tokens"] for s in stats),
                             "prompt_tokens": sum(s["prompt_tokens"] for s in stats)},
    "vllm_metrics": {"prefix_cache_queries": counter("prefix_cache_queries"),
                     "prefix_cache_hits": counter("prefix_cache_hits")},
}
(run / "summary.json").write_text(json.dumps(summary, indent=1))
lines = ["| round | TTFT p50 on (ms) | off (ms) | on/off | out tok/s on | off | on/off |", "|---|---|---|---|---|---|---|"]
for row, t, o in zip(rows, ratios["ttft_p50"], ratios["output_throughput"]):
    lines.append(f"| {row['round']} | {row['on_p50_ttft_ms']:.0f} | {row['off_p50_ttft_ms']:.0f} | {t:.2f}x | "
                 f"{row['on_output_throughput']:.1f} | {row['off_output_throughput']:.1f} | {o:.2f}x |")
(run / "summary.md").write_text("\n".join(lines) + "\n\n```json\n" + json.dumps(summary, indent=1) + "\n```\n")
print("\n".join(lines))
print(json.dumps(summary["ratio_on_off_median"]), json.dumps(summary["runner_cached_tokens"]),
      json.dumps(summary["vllm_metrics"]))
EOF
