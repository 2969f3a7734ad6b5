#!/usr/bin/env bash
# Data parallel against one engine, in one run: the same artifact served with --data-parallel-size M for every
# M in DP_SIZES (default "1 2"), each driven by `vllm bench serve` at concurrency DP_CONCURRENCY (default 8);
# prints out tok/s per size and the ratio to the first.
#
#   benchmark/dp.sh
#
# CONFIG (default chunked-hybrid) is the plugin configuration served; the knobs of benchmark/common.sh apply
# (NUM_PROMPTS defaults to 16 here). THREADS is the server's total: a server of M engines splits it, one
# share per engine (ONP_CPU_THREADS unset), so every size runs on the same cores. Results:
# benchmark/results/dp-<timestamp>/dp<M>/ (serve.sh / drive.sh files) and dp.md (the table).
set -euo pipefail
export NUM_PROMPTS=${NUM_PROMPTS:-16}
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"
CONFIG=${CONFIG:-chunked-hybrid}
DP_SIZES=${DP_SIZES:-1 2}
export CONCURRENCY=${DP_CONCURRENCY:-8}
OUT=${DP_RUN_DIR:-$RESULTS_ROOT/dp-$(date +%Y%m%d-%H%M%S)}
[ "$(config_kind "$CONFIG")" = plugin ] || die "CONFIG=$CONFIG is not a plugin configuration"

base_args=${VLLM_SERVE_ARGS:-}
current=""
trap '[ -z "$current" ] || RUN_DIR=$current "$BENCH_DIR/serve.sh" --stop "$CONFIG" || true' EXIT

for m in $DP_SIZES; do
  current=$OUT/dp$m
  export RUN_DIR=$current VLLM_SERVE_ARGS="--data-parallel-size $m $base_args"
  mkdir -p "$RUN_DIR"
  log "data parallel $m: $CONFIG, concurrency $CONCURRENCY, $NUM_PROMPTS prompts, $THREADS thread(s) in all"
  "$BENCH_DIR/serve.sh" "$CONFIG"
  "$BENCH_DIR/drive.sh" "$CONFIG"
  "$BENCH_DIR/serve.sh" --stop "$CONFIG"
  current=""
done

"$PYTHON" - "$OUT" "$CONFIG" "$CONCURRENCY" $DP_SIZES <<'EOF' | tee "$OUT/dp.md"
import json, sys
from pathlib import Path

out, config, concurrency, *sizes = sys.argv[1:]
rows = []
for m in sizes:
    run = Path(out) / f"dp{m}"
    result = json.loads((run / f"{config}-c{concurrency}.json").read_text())
    rows.append((m, result["output_throughput"], result["median_ttft_ms"], result["median_itl_ms"]))
base = rows[0][1]
print(f"| data parallel | out tok/s (concurrency {concurrency}) | ratio | TTFT p50 ms | ITL p50 ms |")
print("|---|---|---|---|---|")
for m, tput, ttft, itl in rows:
    print(f"| {m} | {tput:.2f} | {tput / base:.2f}x | {ttft:.0f} | {itl:.0f} |")
EOF
