#!/usr/bin/env bash
# Time to first token of long prompts through the servers, in one run: each configuration in CONFIGS (plugin
# configurations and vLLM CPU) served at SEQUENCE_LENGTH, then one prompt of each length in TTFT_LENGTHS at
# a time (OUTPUT_LEN 1, served.py's long-prompt case); prints TTFT p50 per configuration and its ratio to the last configuration.
#
#   benchmark/ttft.sh     # chunked-hybrid, ce-ods, vllm-cpu; 2048- and 4000-token prompts; sequence length 4096
#
#   TTFT_PAIRED=1 TTFT_CONFIGS="chunked-hybrid vllm-cpu" benchmark/ttft.sh
#                         # the two configurations served at once (PORT, PORT + 1) taking turns request by request,
#                         # TTFT_ROUNDS (4) rounds per length (served.py paired-long-prompt): on a shared host the
#                         # rounds' ratios compare both under the same load
#
# benchmark/graphs.py prefill measures the same prefill as graph calls (no server) against HF eager. Knobs: those of
# benchmark/common.sh; defaults here: SEQUENCE_LENGTH 4096, CHUNK_SIZE 512, BATCH_SIZE 1, NUM_PROMPTS 2.
# Results: benchmark/results/ttft-<timestamp>/len<L>/ (serve.sh --drive files) and ttft.md (the table); paired:
# paired-<first>.json and ttft.md.
set -euo pipefail
export SEQUENCE_LENGTH=${SEQUENCE_LENGTH:-4096} CHUNK_SIZE=${CHUNK_SIZE:-512} BATCH_SIZE=${BATCH_SIZE:-1}
export NUM_PROMPTS=${NUM_PROMPTS:-2} OUTPUT_LEN=1 CONCURRENCY=1 DRIVE_CASE=long-prompt
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"
TTFT_CONFIGS=${TTFT_CONFIGS:-chunked-hybrid ce-ods vllm-cpu}
TTFT_LENGTHS=${TTFT_LENGTHS:-2048 4000}
OUT=${TTFT_RUN_DIR:-$RESULTS_ROOT/ttft-$(date +%Y%m%d-%H%M%S)}
for length in $TTFT_LENGTHS; do
  [ "$length" -lt "$SEQUENCE_LENGTH" ] || die "TTFT_LENGTHS: $length leaves no room for a token in SEQUENCE_LENGTH=$SEQUENCE_LENGTH"
done

current=""
trap '[ -z "$current" ] || RUN_DIR=$OUT "$BENCH_DIR/serve.sh" --stop "$current" || true' EXIT
mkdir -p "$OUT"
"$PYTHON" "$BENCH_DIR/tools/record.py" "$OUT" -- "$0" "$@" >/dev/null

if [ "${TTFT_PAIRED:-0}" = 1 ]; then
  read -ra pair <<<"$TTFT_CONFIGS"
  [ "${#pair[@]}" = 2 ] || die "TTFT_PAIRED=1 takes two TTFT_CONFIGS (this side, the other side), got: $TTFT_CONFIGS"
  current="${pair[*]}"
  trap 'for name in $current; do RUN_DIR=$OUT "$BENCH_DIR/serve.sh" --stop "$name" || true; done' EXIT
  RUN_DIR=$OUT PORT=$PORT "$BENCH_DIR/serve.sh" "${pair[0]}"
  RUN_DIR=$OUT PORT=$((PORT + 1)) "$BENCH_DIR/serve.sh" "${pair[1]}"
  "$PYTHON" "$BENCH_DIR/served.py" paired-long-prompt --url "http://$HOST:$PORT" --model-dir "$(served_dir "${pair[0]}")" \
    --out "$OUT" --name "${pair[0]}" --seed "$SEED" -- --against-url "http://$HOST:$((PORT + 1))" \
    --against-name "${pair[1]}" --lengths "$TTFT_LENGTHS" --rounds "${TTFT_ROUNDS:-4}" ||
    die "served.py paired-long-prompt failed"
  "$PYTHON" - "$OUT/paired-${pair[0]}.json" <<'PY' | tee "$OUT/ttft.md"
import json, sys

run = json.loads(open(sys.argv[1]).read())
ours, theirs = run["name"], run["against"]
print(f"| prompt tokens | rounds | {ours} TTFT p50 ms | {theirs} TTFT p50 ms | {ours} / {theirs}, median of the rounds |")
print("|---:|---:|---:|---:|---:|")
for r in run["lengths"]:
    print(f"| {r['prompt_tokens']} | {r['rounds']} | {r['median_ttft_ms']:.0f} | {r['against_median_ttft_ms']:.0f} | "
          f"{r['median_round_ratio']:.2f} |")
PY
  exit 0
fi
for name in $TTFT_CONFIGS; do
  current=$name
  RUN_DIR=$OUT "$BENCH_DIR/serve.sh" "$name"
  for length in $TTFT_LENGTHS; do
    RUN_DIR=$OUT INPUT_LEN=$length "$BENCH_DIR/serve.sh" --drive "$name"
    mkdir -p "$OUT/len$length"
    mv "$OUT/$name-c1".* "$OUT/len$length/"
  done
  RUN_DIR=$OUT "$BENCH_DIR/serve.sh" --stop "$name"
  current=""
done

"$PYTHON" - "$OUT" $TTFT_LENGTHS -- $TTFT_CONFIGS <<'PY' | tee "$OUT/ttft.md"
import json, sys
from pathlib import Path

out, rest = Path(sys.argv[1]), sys.argv[2:]
split = rest.index("--")
lengths, names = rest[:split], rest[split + 1 :]
print("| prompt tokens | " + " | ".join(f"{n} TTFT p50 ms" for n in names) + " | " +
      " | ".join(f"{n} / {names[-1]}" for n in names[:-1]) + " |")
print("|---:|" + "---:|" * (2 * len(names) - 1))
for length in lengths:
    ttft = [json.loads((out / f"len{length}" / f"{n}-c1.json").read_text())["median_ttft_ms"] for n in names]
    cells = [f"{t:.0f}" for t in ttft] + [f"{t / ttft[-1]:.2f}" for t in ttft[:-1]]
    print(f"| {length} | " + " | ".join(cells) + " |")
PY
