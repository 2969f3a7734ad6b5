#!/usr/bin/env bash
# Run the whole benchmark matrix: every configuration in CONFIGS and PEERS at every concurrency
# level in CONCURRENCY (served.py random), the serial vs interleaved scenario (served.py interleave),
# then tools/collect.py.
#
#   benchmark/matrix.sh
#
# Each server is started by serve.sh, driven by serve.sh --drive and stopped by its PID (also on exit or
# interrupt). Results: benchmark/results/<timestamp>/ (raw JSON per run, results.csv, results.md,
# PNG plots, run.json: commit, command, host, knobs), the summary copied to benchmark/results/latest/ (LATEST= to skip, LATEST=DIR elsewhere).
# Knobs (environment, defaults in benchmark/common.sh): MODEL BATCH_SIZE SEQUENCE_LENGTH CHUNK_SIZE
# TP BACKEND CONCURRENCY INPUT_LEN OUTPUT_LEN NUM_PROMPTS NUM_WARMUPS SEED CONFIGS PEERS PORT
# RESULTS_ROOT ARTIFACTS RUN_DIR; INTERLEAVE=0 skips the serial vs interleaved scenario (run when
# CONFIGS has chunked-hybrid or chunked-interleaved; INTERLEAVE_* tune it, see workloads/interleave.py).
set -euo pipefail
requested_run_dir=${RUN_DIR:-}
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"
RUN_DIR=${requested_run_dir:-$RESULTS_ROOT/$(date +%Y%m%d-%H%M%S)}
export RUN_DIR
LATEST=${LATEST-$RESULTS_ROOT/latest}
INTERLEAVE=${INTERLEAVE:-1}

read -ra names <<<"$CONFIGS $PEERS"
[ "${#names[@]}" -gt 0 ] || die "nothing to run: CONFIGS and PEERS are empty"
for name in "${names[@]}"; do config_kind "$name" >/dev/null; done
mkdir -p "$RUN_DIR"

current=""
child=""
cleanup() {
  # The step still running (its own process group, see run_step), then the server.
  if [ -n "$child" ]; then kill -TERM -- "-$child" 2>/dev/null || true; fi
  if [ -n "$current" ]; then "$BENCH_DIR/serve.sh" --stop "$current" || true; fi
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

# Runs a step in its own process group and waits for it: `wait` returns as soon as a signal
# arrives (a foreground command would delay the trap until it ends), and cleanup can stop the
# step's whole group.
run_step() {
  setsid "$@" &
  child=$!
  local status=0
  wait "$child" || status=$?
  child=""
  return "$status"
}

"$PYTHON" - "$RUN_DIR/run.json" <<'EOF'
import json, os, platform, sys, time
from importlib import metadata

def version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"

cpu = platform.processor() or "?"
try:
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
except OSError:
    pass
memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
env = os.environ
model = env["MODEL"]
run = {
    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    "model": model,
    "model_name": os.path.basename(model.rstrip("/")),
    "backend": env["BACKEND"],
    "batch_size": int(env["BATCH_SIZE"]),
    "sequence_length": int(env["SEQUENCE_LENGTH"]),
    "chunk_size": int(env["CHUNK_SIZE"]),
    "prefill_batch_size": int(env["PREFILL_BATCH_SIZE"]),
    "prefill_tail_size": int(env["PREFILL_TAIL_SIZE"]),
    "prefill_target_itl_ms": env["PREFILL_TARGET_ITL_MS"] or "default",
    "decode_batch_sizes": env["DECODE_BATCH_SIZES"],
    "tp": int(env["TP"]),
    "threads": int(env["THREADS"]),
    "concurrency": env["CONCURRENCY"],
    "input_len": int(env["INPUT_LEN"]),
    "output_len": int(env["OUTPUT_LEN"]),
    "num_prompts": int(env["NUM_PROMPTS"]),
    "num_warmups": int(env["NUM_WARMUPS"]),
    "seed": int(env["SEED"]),
    "configs": env["CONFIGS"],
    "peers": env["PEERS"],
    "machine": {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(memory, 1),
        "software": f"vllm {version('vllm')}, torch {version('torch')}, transformers {version('transformers')}",
        "load_start": open("/proc/loadavg").read().split()[0],
    },
}
json.dump(run, open(sys.argv[1], "w"), indent=1)
EOF
"$PYTHON" "$BENCH_DIR/tools/record.py" "$RUN_DIR" -- "$0" "$@" >/dev/null

interleave_wanted() {
  [ "$INTERLEAVE" = 1 ] && { [ "$1" = chunked-hybrid ] || [ "$1" = chunked-interleaved ]; }
}

run_one() {
  local name=$1
  if [ "$(config_kind "$name")" = hf ]; then
    run_step "$BENCH_DIR/serve.sh" --drive "$name"
    return
  fi
  current=$name
  run_step "$BENCH_DIR/serve.sh" "$name" || {
    current=""
    return 1
  }
  local ok=1
  run_step "$BENCH_DIR/serve.sh" --drive "$name" || ok=0
  if [ "$ok" = 1 ] && interleave_wanted "$name"; then
    log "$name: serial vs interleaved scenario"
    run_step "$PYTHON" "$BENCH_DIR/served.py" interleave --name "$name" --url "http://$HOST:$PORT" \
      --model-dir "$(served_dir "$name")" --out "$RUN_DIR" \
      --stats-file "$RUN_DIR/$name.stats.jsonl" 2>"$RUN_DIR/interleave-$name.log" || ok=0
    tail -1 "$RUN_DIR/interleave-$name.log" >&2
  fi
  "$BENCH_DIR/serve.sh" --stop "$name"
  current=""
  [ "$ok" = 1 ]
}

started=$(date +%s)
log "run directory $RUN_DIR; ${#names[@]} configurations: ${names[*]}; concurrency ${CONCURRENCY}"
failures=()
for i in "${!names[@]}"; do
  name=${names[$i]}
  t0=$(date +%s)
  log "=== ($((i + 1))/${#names[@]}) $name ==="
  if run_one "$name"; then
    log "=== $name done in $(($(date +%s) - t0)) s (total $(($(date +%s) - started)) s) ==="
  else
    failures+=("$name")
    log "=== $name FAILED after $(($(date +%s) - t0)) s: see $RUN_DIR/$name.*log ==="
  fi
done

"$PYTHON" - "$RUN_DIR/run.json" "$(($(date +%s) - started))" "${failures[*]:-}" <<'EOF'
import json, sys
path, duration, failures = sys.argv[1], int(sys.argv[2]), sys.argv[3]
run = json.load(open(path))
run.update(duration_s=duration, failures=failures, load_end=open("/proc/loadavg").read().split()[0])
json.dump(run, open(path, "w"), indent=1)
EOF

collect_args=("$RUN_DIR")
if [ -n "$LATEST" ]; then collect_args+=(--latest "$LATEST"); fi
"$PYTHON" "$BENCH_DIR/tools/collect.py" "${collect_args[@]}"
if [ "${#failures[@]}" -gt 0 ]; then
  die "failed configurations: ${failures[*]}"
fi
log "done in $(($(date +%s) - started)) s: $RUN_DIR"
