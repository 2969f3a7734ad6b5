#!/usr/bin/env bash
# Tensor or data parallel against one rank, in one run: the same configuration served at every size in SIZES,
# each driven by `vllm bench serve` at concurrency PARALLEL_CONCURRENCY (default 8); prints out tok/s per size
# and the ratio to the first size.
#
#   benchmark/parallel.sh            # data parallel: --data-parallel-size 1, then 2 (one artifact)
#   PARALLEL=tp SIZES="1 3" benchmark/parallel.sh   # tensor parallel: an artifact exported per size
#
# CONFIG (default chunked-hybrid) is the plugin configuration served; the knobs of benchmark/common.sh apply
# (NUM_PROMPTS defaults to 16 here). THREADS is the server's total: a server of M engines or N ranks splits it
# (ONP_CPU_THREADS unset), so every size runs on the same cores. Results:
# benchmark/results/<tp|dp>-<timestamp>/<tp|dp><size>/ (serve.sh and serve.sh --drive files) and parallel.md (the table).
set -euo pipefail
export NUM_PROMPTS=${NUM_PROMPTS:-16}
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"
CONFIG=${CONFIG:-chunked-hybrid}
PARALLEL=${PARALLEL:-dp}
SIZES=${SIZES:-1 2}
export CONCURRENCY=${PARALLEL_CONCURRENCY:-8}
OUT=${PARALLEL_RUN_DIR:-$RESULTS_ROOT/$PARALLEL-$(date +%Y%m%d-%H%M%S)}
[ "$(config_kind "$CONFIG")" = plugin ] || die "CONFIG=$CONFIG is not a plugin configuration"
case $PARALLEL in
  dp | tp) ;;
  *) die "PARALLEL=$PARALLEL: use dp (--data-parallel-size) or tp (--tensor-parallel-size)" ;;
esac

base_args=${VLLM_SERVE_ARGS:-}
current=""
trap '[ -z "$current" ] || RUN_DIR=$current "$BENCH_DIR/serve.sh" --stop "$CONFIG" || true' EXIT

mkdir -p "$OUT"
"$PYTHON" "$BENCH_DIR/tools/record.py" "$OUT" -- "$0" "$@" >/dev/null
for size in $SIZES; do
  current=$OUT/$PARALLEL$size
  export RUN_DIR=$current
  if [ "$PARALLEL" = dp ]; then
    export VLLM_SERVE_ARGS="--data-parallel-size $size $base_args"
  else
    export TP=$size # serve.sh exports (once) and serves an artifact of tp_degree $size
  fi
  mkdir -p "$RUN_DIR"
  log "$PARALLEL $size: $CONFIG, concurrency $CONCURRENCY, $NUM_PROMPTS prompts, $THREADS thread(s) in all"
  "$BENCH_DIR/serve.sh" "$CONFIG"
  "$BENCH_DIR/serve.sh" --drive "$CONFIG"
  "$BENCH_DIR/serve.sh" --stop "$CONFIG"
  current=""
done

"$PYTHON" - "$OUT" "$CONFIG" "$CONCURRENCY" "$PARALLEL" $SIZES <<'PY' | tee "$OUT/parallel.md"
import json, sys
from pathlib import Path

out, config, concurrency, kind, *sizes = sys.argv[1:]
label = {"dp": "data parallel", "tp": "tensor parallel"}[kind]
rows = []
for size in sizes:
    result = json.loads((Path(out) / f"{kind}{size}" / f"{config}-c{concurrency}.json").read_text())
    rows.append((size, result["output_throughput"], result["median_ttft_ms"], result["median_itl_ms"]))
base = rows[0][1]
print(f"| {label} | out tok/s (concurrency {concurrency}) | ratio | TTFT p50 ms | ITL p50 ms |")
print("|---|---|---|---|---|")
for size, tput, ttft, itl in rows:
    print(f"| {size} | {tput:.2f} | {tput / base:.2f}x | {ttft:.0f} | {itl:.0f} |")
PY
