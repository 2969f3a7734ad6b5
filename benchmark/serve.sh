#!/usr/bin/env bash
# Serve a named benchmark configuration with `vllm serve` on 127.0.0.1, drive it, or stop it.
#
#   benchmark/serve.sh NAME           export if needed, start, wait for /health, write RUN_DIR/NAME.pid
#   benchmark/serve.sh --drive NAME   drive the served NAME at every concurrency level in CONCURRENCY (same PORT and
#                                     RUN_DIR): served.py's DRIVE_CASE (default `random`: `vllm bench serve`)
#   benchmark/serve.sh --stop NAME    stop the server whose PID is in RUN_DIR/NAME.pid
#
# Plugin configurations (an artifact exported with `optimum-cli export neuron`, served by the plugin):
#   ce-ods               context encoding (one sequence-length prefill graph) + on-device sampling
#   ce-host              context encoding + host sampling
#   chunked-host         chunked prefill (CHUNK_SIZE tokens per graph call) + host sampling
#   chunked-hybrid       chunked prefill + on-device sampling, serial prefill (ONP_PREFILL_MODE=serial)
#   chunked-interleaved  chunked-hybrid with ONP_PREFILL_MODE=interleaved
# Peers (the original model, vLLM's own CPU backend, plugin off):
#   vllm-cpu             with torch.compile (vLLM's default; slow start)
#   vllm-cpu-eager       with --enforce-eager
#   hf-generate          no server: --drive runs workloads/hf_generate.py (transformers `generate`) on the same prompts
# Driving: synthetic prompts, vLLM's random dataset, fixed SEED, INPUT_LEN / OUTPUT_LEN tokens (EOS ignored),
# NUM_PROMPTS per level. Writes RUN_DIR/NAME-c<N>.json (vllm bench's result, p50/p99 percentiles) and, for plugin
# configurations, RUN_DIR/NAME-c<N>.stats.jsonl (the runner's per-request prefill figures from ONP_STATS_FILE).
# Knobs (environment): see benchmark/common.sh. PORT (default 8200), RUN_DIR (pid, log, ONP_STATS_FILE).
set -euo pipefail
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"

stop_server() {
  local name=$1 file pid
  file=$(pid_file "$name")
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    # The server was started as the leader of its own process group: stop the API server and its
    # engine-core child together, by that group's id.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not stop in 30 s: killing it"
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
}

export_artifact() {
  local name=$1 out chunk ods _mode
  out=$(config_artifact "$name")
  if [ -f "$out/neuron_config.json" ]; then
    # A cached artifact from an older plugin (format_version) is exported again, not served into an error.
    if "$VENV_BIN/python" -c "import sys; from optimum_neuron_plugin.config import NeuronConfig; NeuronConfig.load(sys.argv[1])" "$out" 2>/dev/null; then
      log "$name: using $out"
      return 0
    fi
    log "$name: $out was exported by another plugin version: exporting again"
    rm -rf "$out"
  fi
  read -r chunk ods _mode <<<"$(config_settings "$name")"
  local source=$MODEL
  if [ "$EXPORT_SOURCE" = hf ]; then source=$(ensure_hf_model); fi
  local args=(--model "$source" --batch-size "$BATCH_SIZE" --sequence-length "$SEQUENCE_LENGTH"
    --prefill-chunk-size "$chunk" --tensor-parallel-size "$TP" --backend "$BACKEND" --cpu-compiler "$CPU_COMPILER")
  [ "$ods" = 1 ] || args+=(--no-on-device-sampling)
  [ "$chunk" = 0 ] || args+=(--prefill-batch-size "$PREFILL_BATCH_SIZE")
  [ "$chunk" = 0 ] || [ "$PREFILL_TAIL_SIZE" = 0 ] || args+=(--prefill-tail-size "$PREFILL_TAIL_SIZE")
  args+=(--decode-batch-sizes "$DECODE_BATCH_SIZES")
  [ -z "$CONTEXT_BUCKETS" ] || args+=(--context-buckets "$CONTEXT_BUCKETS")
  [ -z "$DECODE_BUCKETS" ] || args+=(--decode-buckets "$DECODE_BUCKETS")
  [ -z "$BLOCK_SIZE" ] || args+=(--block-size "$BLOCK_SIZE")
  [ -z "$NUM_BLOCKS" ] || args+=(--num-blocks "$NUM_BLOCKS")
  log "$name: exporting into $out (optimum-cli export neuron ${args[*]})"
  mkdir -p "$(dirname "$out")"
  "$VENV_BIN/optimum-cli" export neuron "${args[@]}" "$out" >"$RUN_DIR/$name.export.log" 2>&1 ||
    {
      tail -20 "$RUN_DIR/$name.export.log" >&2
      die "$name: export failed (log: $RUN_DIR/$name.export.log)"
    }
}

write_meta() {
  local name=$1 kind=$2 dir=$3 chunk=$4 ods=$5 mode=$6 seconds=$7
  "$PYTHON" - "$RUN_DIR/$name.meta.json" <<EOF
import json, sys
json.dump({"name": "$name", "kind": "$kind", "served_dir": "$dir", "chunk_size": $chunk,
           "on_device_sampling": $([ "$ods" = 1 ] && echo True || echo False), "prefill_mode": "$mode",
           "batch_size": $BATCH_SIZE, "sequence_length": $SEQUENCE_LENGTH, "tp": $TP,
           "prefill_batch_size": $([ "$chunk" = 0 ] && echo 1 || echo "$PREFILL_BATCH_SIZE"),
           "prefill_tail_size": $([ "$chunk" = 0 ] && echo 0 || echo "$PREFILL_TAIL_SIZE"),
           "decode_batch_sizes": "$DECODE_BATCH_SIZES", "context_buckets": "$CONTEXT_BUCKETS",
           "decode_buckets": "$DECODE_BUCKETS",
           "port": $PORT, "start_seconds": $seconds}, open(sys.argv[1], "w"), indent=1)
EOF
}

start_server() {
  local name=$1 kind dir chunk=0 ods=0 mode=none
  kind=$(config_kind "$name")
  [ "$kind" != hf ] || die "$name is not a server: drive it directly with $0 --drive $name"
  mkdir -p "$RUN_DIR"
  if [ -f "$(pid_file "$name")" ] && kill -0 "$(cat "$(pid_file "$name")")" 2>/dev/null; then
    die "$name is already running (pid $(cat "$(pid_file "$name")")); stop it with $0 --stop $name"
  fi
  if curl -sf "http://$HOST:$PORT/health" >/dev/null 2>&1; then
    die "port $PORT is already in use by another server: set PORT"
  fi
  local cmd=("$VENV_BIN/vllm" serve)
  local envs=()
  if [ "$kind" = plugin ]; then
    export_artifact "$name"
    dir=$(config_artifact "$name")
    read -r chunk ods mode <<<"$(config_settings "$name")"
    envs+=(ONP_PREFILL_MODE="$mode" ONP_STATS_FILE="$RUN_DIR/$name.stats.jsonl" OMP_NUM_THREADS="$THREADS")
    if [ "$mode" = interleaved ] && [ -n "$PREFILL_TARGET_ITL_MS" ]; then
      envs+=(ONP_PREFILL_TARGET_ITL_MS="$PREFILL_TARGET_ITL_MS")
    fi
    # The CPU reference backend must be asked for; on a Neuron host the plugin activates by itself.
    if [ "$BACKEND" = cpu ]; then envs+=(ONP_BACKEND=cpu); fi
    : >"$RUN_DIR/$name.stats.jsonl"
    cmd+=("$dir")
  else
    dir=$(ensure_hf_model)
    # Plugin off: vLLM's own CPU backend runs the original model.
    envs+=(ONP_BACKEND=off VLLM_CPU_OMP_THREADS_BIND="$VLLM_CPU_OMP_THREADS_BIND")
    # vLLM CPU's VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes (vllm/platforms/cpu.py): an explicit
    # --kv-cache-memory-bytes in VLLM_SERVE_ARGS is served with the variable unset (start_server's `env -u`).
    if [[ " ${VLLM_SERVE_ARGS:-} " != *" --kv-cache-memory-bytes"* ]]; then
      envs+=(VLLM_CPU_KVCACHE_SPACE="$VLLM_CPU_KVCACHE_SPACE")
    fi
    cmd+=("$dir" --max-model-len "$SEQUENCE_LENGTH" --max-num-seqs "$BATCH_SIZE" --dtype "$VLLM_CPU_DTYPE")
    if [ "$name" = vllm-cpu-eager ]; then cmd+=(--enforce-eager); fi
  fi
  # PREFIX_CACHING=off (default): vllm bench replays its first prompt as the warm-up and the same seeded prompts at
  # every concurrency level, which a prefix cache would turn into skipped prefill.
  [ "$PREFIX_CACHING" = on ] || cmd+=(--no-enable-prefix-caching)
  local extra=()
  read -ra extra <<<"${VLLM_SERVE_ARGS:-}"
  cmd+=(--host "$HOST" --port "$PORT" --seed "$SEED" "${extra[@]}")
  local logfile=$RUN_DIR/$name.server.log
  log "$name: ${envs[*]} ${cmd[*]} (log: $logfile)"
  local start
  start=$(date +%s)
  # setsid: the server leads its own process group, which stop_server signals as a whole.
  env -u ONP_BACKEND -u ONP_PREFILL_MODE -u ONP_STATS_FILE -u ONP_PREFILL_TARGET_ITL_MS -u VLLM_CPU_KVCACHE_SPACE "${envs[@]}" setsid "${cmd[@]}" >"$logfile" 2>&1 &
  local pid=$!
  echo "$pid" >"$(pid_file "$name")"
  local waited=0
  until curl -sf "http://$HOST:$PORT/health" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      tail -30 "$logfile" >&2
      rm -f "$(pid_file "$name")"
      die "$name: server exited before answering /health (log: $logfile)"
    fi
    if [ "$waited" -ge "$SERVER_TIMEOUT" ]; then
      tail -30 "$logfile" >&2
      stop_server "$name"
      die "$name: no /health answer in $SERVER_TIMEOUT s (log: $logfile)"
    fi
    if [ $((waited % 30)) = 29 ]; then log "$name: waiting for /health (${waited}s)"; fi
    sleep 1
    waited=$((waited + 1))
  done
  local seconds=$(($(date +%s) - start))
  write_meta "$name" "$kind" "$dir" "$chunk" "$ods" "$mode" "$seconds"
  log "$name: ready on http://$HOST:$PORT after ${seconds}s (pid $pid)"
}

drive_hf_generate() {
  local name=$1 tokenizer=$2 model levels c result
  read -ra levels <<<"${CONCURRENCY//,/ }"
  # Options shared with vllm bench serve: hf_generate.py samples the very prompts the servers get.
  local dataset_args=(--dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN"
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
}

drive() {
  local name=$1 kind tokenizer
  kind=$(config_kind "$name")
  mkdir -p "$RUN_DIR"
  tokenizer=$(served_dir "$name")
  [ -f "$tokenizer/tokenizer_config.json" ] || die "$name: no tokenizer in $tokenizer (serve it first: $0 $name)"
  if [ "$kind" = hf ]; then
    drive_hf_generate "$name" "$tokenizer"
    return
  fi
  local stats_args=()
  if [ "$kind" = plugin ]; then stats_args=(--stats-file "$RUN_DIR/$name.stats.jsonl"); fi
  "$PYTHON" "$BENCH_DIR/served.py" "${DRIVE_CASE:-random}" --url "http://$HOST:$PORT" --model-dir "$tokenizer" \
    --out "$RUN_DIR" --name "$name" "${stats_args[@]}" --concurrency "$CONCURRENCY" --input-len "$INPUT_LEN" \
    --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" --num-warmups "$NUM_WARMUPS" --seed "$SEED" \
    --temperature "$TEMPERATURE" || die "$name: served.py ${DRIVE_CASE:-random} failed"
}

case "${1:-}" in
  --stop)
    [ $# = 2 ] || die "usage: $0 --stop NAME"
    stop_server "$2"
    ;;
  --drive)
    [ $# = 2 ] || die "usage: $0 --drive NAME"
    drive "$2"
    ;;
  "" | -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    ;;
  *)
    [ $# = 1 ] || die "usage: $0 NAME | $0 --drive NAME | $0 --stop NAME"
    start_server "$1"
    ;;
esac
