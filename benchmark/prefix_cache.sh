#!/usr/bin/env bash
# Prefix caching: our artifact with it on and off, and vLLM's CPU backend with it on, same host, same run.
#
#   benchmark/prefix_cache.sh
#
# Up to four servers run side by side: the plugin serving one artifact (CONFIG, default chunked-hybrid) with prefix
# caching on (the default) on PORT and off (--no-enable-prefix-caching) on PORT+1, PEER (default vllm-cpu: vLLM's own
# CPU backend on the same weights, prefix caching on) on PORT+2 and ALT (default chunked-interleaved: the same artifact
# served another way, prefix caching on) on PORT+3. Each round drives them in turn with two workloads:
#  shared  served.py shared-prefix (`vllm bench serve`'s random dataset): one PREFIX_LEN-token prefix shared by every prompt before
#          QUESTION_LEN random tokens, OUTPUT_LEN tokens out, NUM_PROMPTS prompts at concurrency CONCURRENCY;
#  multi   served.py multi-turn: CONVERSATIONS chat conversations of TURNS turns, CONCURRENCY at a time, each turn
#          resending the whole history (a FIRST_LEN-token first message, QUESTION_LEN-token questions after it).
# Writes RUN_DIR/summary.json and RUN_DIR/summary.md: TTFT p50 and output tok/s per server, workload and round, the
# ratios on/off, on/peer and on/alt; the runner's cached_tokens (ONP_STATS_FILE) of on and alt and the on server's
# vllm:prefix_cache_queries / _hits.
# Knobs (environment, besides common.sh's): PREFILL_TAIL_SIZE (64), PREFIX_LEN (1000), QUESTION_LEN (50), FIRST_LEN (500), CONVERSATIONS
# (8), TURNS (4), ROUNDS (1), CONFIG, PEER ("" = no peer), ALT ("" = none), WORKLOADS ("shared multi"),
# ALT_ENV (""): knob assignments for alt alone, e.g. "DECODE_BUCKETS=" serves alt from the artifact without them,
# BENCH_LOCK ("" = none): a lock file, e.g. /tmp/bench.lock on a shared host: the servers start (and the artifact
# exports) at nice 19 without it, then the drives run under `flock BENCH_LOCK` with the servers at normal priority.
set -euo pipefail
export SEQUENCE_LENGTH=${SEQUENCE_LENGTH:-2048} CHUNK_SIZE=${CHUNK_SIZE:-128} OUTPUT_LEN=${OUTPUT_LEN:-64}
export NUM_PROMPTS=${NUM_PROMPTS:-32} CONCURRENCY=${CONCURRENCY:-4}
# A hit leaves the question (~50-70 tokens here) to prefill: tail graphs of 64 tokens run it instead of a 128-token chunk.
export PREFILL_TAIL_SIZE=${PREFILL_TAIL_SIZE:-64}
# cached_tokens in every answer's usage (the multi-turn driver records it).
export VLLM_SERVE_ARGS=${VLLM_SERVE_ARGS:---enable-prompt-tokens-details}
given_run_dir=${RUN_DIR:-}  # common.sh defaults RUN_DIR to results/manual
# shellcheck source=benchmark/common.sh
source "$(dirname "$0")/common.sh"

CONFIG=${CONFIG:-chunked-hybrid}
PEER=${PEER-vllm-cpu}
ALT=${ALT-chunked-interleaved}
PREFIX_LEN=${PREFIX_LEN:-1000}
QUESTION_LEN=${QUESTION_LEN:-50}
FIRST_LEN=${FIRST_LEN:-500}
CONVERSATIONS=${CONVERSATIONS:-8}
TURNS=${TURNS:-4}
ROUNDS=${ROUNDS:-1}
WORKLOADS=${WORKLOADS:-shared multi}
RUN_DIR=${given_run_dir:-$RESULTS_ROOT/$(date +%Y%m%d-%H%M)-prefix-cache-on-vs-off-vs-${PEER:-none}}
BASE_PORT=$PORT
VARIANTS="on off${ALT:+ alt}${PEER:+ peer}"
mkdir -p "$RUN_DIR"
"$PYTHON" "$BENCH_DIR/tools/record.py" "$RUN_DIR" -- "$0" "$@" >/dev/null

variant_dir() { echo "$RUN_DIR/$1"; }
variant_port() {
  case "$1" in
    on) echo "$BASE_PORT" ;;
    off) echo $((BASE_PORT + 1)) ;;
    peer) echo $((BASE_PORT + 2)) ;;
    alt) echo $((BASE_PORT + 3)) ;;
  esac
}
variant_config() {
  case "$1" in
    peer) echo "$PEER" ;;
    alt) echo "$ALT" ;;
    *) echo "$CONFIG" ;;
  esac
}
# The peer and alt cache prefixes too; off is the plugin with --no-enable-prefix-caching.
variant_caching() { if [ "$1" = off ]; then echo off; else echo on; fi; }

BENCH_LOCK=${BENCH_LOCK:-}
START_NICE=$([ -n "$BENCH_LOCK" ] && echo 19 || echo 0)

serve() {
  if running "$1"; then
    await_health "$1"
    return
  fi
  (
    with_variant_env "$1"
    RUN_DIR=$(variant_dir "$1") PORT=$(variant_port "$1") PREFIX_CACHING=$(variant_caching "$1") \
      nice -n "$START_NICE" "$BENCH_DIR/serve.sh" "$(variant_config "$1")"
  )
}

# alt's own knobs (ALT_ENV), in the calling (sub)shell.
ALT_ENV=${ALT_ENV:-}
with_variant_env() {
  if [ "$1" = alt ] && [ -n "$ALT_ENV" ]; then
    # shellcheck disable=SC2163,SC2086
    export $ALT_ENV
  fi
}

server_pid_file() { echo "$(variant_dir "$1")/$(variant_config "$1").pid"; }
running() { [ -f "$(server_pid_file "$1")" ] && kill -0 "$(cat "$(server_pid_file "$1")")" 2>/dev/null; }

# A server an interrupted run left starting or running in this RUN_DIR is reused.
await_health() {
  local waited=0
  log "$1: reusing the server of pid $(cat "$(server_pid_file "$1")")"
  until curl -sf "http://$HOST:$(variant_port "$1")/health" >/dev/null 2>&1; do
    [ "$waited" -lt "$SERVER_TIMEOUT" ] || die "$1: no /health answer in $SERVER_TIMEOUT s"
    sleep 2
    waited=$((waited + 2))
  done
}

# Every thread of every server (each leads its own process group) at priority $1.
renice_servers() {
  local variant
  for variant in $VARIANTS; do
    renice -n "$1" -g "$(cat "$(server_pid_file "$variant")")" >/dev/null
  done
}

stop_all() {
  for variant in $VARIANTS; do
    RUN_DIR=$(variant_dir "$variant") "$BENCH_DIR/serve.sh" --stop "$(variant_config "$variant")" || true
  done
}
trap stop_all EXIT

drive_shared() {
  local variant=$1 round=$2 config result
  config=$(variant_config "$variant")
  result=$variant-shared-r$round.json
  log "$variant ($config), round $round: $NUM_PROMPTS prompts of $PREFIX_LEN shared + $QUESTION_LEN tokens, $OUTPUT_LEN out"
  "$PYTHON" "$BENCH_DIR/served.py" shared-prefix --url "http://$HOST:$(variant_port "$variant")" \
    --model-dir "$(served_dir "$config")" --out "$RUN_DIR" --name "${result%.json}" --prefix-len "$PREFIX_LEN" \
    --question-len "$QUESTION_LEN" --output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" \
    --seed "$((SEED + round))" --temperature "$TEMPERATURE" --concurrency "$CONCURRENCY" \
    --num-warmups "$NUM_WARMUPS" 2>"$RUN_DIR/${result%.json}.driver.log" ||
    log "served.py shared-prefix failed (log: $RUN_DIR/${result%.json}.log)"
}

drive_multi() {
  local variant=$1 round=$2 config result
  config=$(variant_config "$variant")
  result=$variant-multi-r$round.json
  log "$variant ($config), round $round: $CONVERSATIONS conversations of $TURNS turns, $OUTPUT_LEN out"
  "$PYTHON" "$BENCH_DIR/served.py" multi-turn --url "http://$HOST:$(variant_port "$variant")" \
    --model-dir "$(served_dir "$config")" --out "$RUN_DIR" --name "${result%.json}" \
    --conversations "$CONVERSATIONS" --turns "$TURNS" --concurrency "$CONCURRENCY" --first-len "$FIRST_LEN" \
    --question-len "$QUESTION_LEN" --output-len "$OUTPUT_LEN" --seed "$((SEED + round))" \
    >"$RUN_DIR/${result%.json}.log" 2>&1 || log "served.py multi-turn failed (log: $RUN_DIR/${result%.json}.log)"
}

# The servers start side by side (vLLM's CPU backend compiles for minutes); off and alt serve on's artifact. The
# peer's Hugging Face directory is converted first, once, not by two servers at the same time.
[ -z "$PEER" ] || ensure_hf_model >/dev/null
pids=()
if [ -n "$PEER" ]; then
  serve peer &
  pids+=($!)
fi
# on exports the artifact if it is missing, alone.
if [ -f "$(served_dir "$CONFIG")/neuron_config.json" ]; then
  serve on &
  pids+=($!)
else
  serve on
fi
serve off &
pids+=($!)
if [ -n "$ALT" ]; then
  serve alt &
  pids+=($!)
fi
for pid in "${pids[@]}"; do wait "$pid" || die "a server did not start (logs: $RUN_DIR/*/*.server.log)"; done
if [ -n "$BENCH_LOCK" ]; then
  exec {lock_fd}>"$BENCH_LOCK"
  log "servers ready; waiting for $BENCH_LOCK"
  flock "$lock_fd"
  renice_servers 0
  log "holding $BENCH_LOCK: driving at normal priority"
fi
for round in $(seq "$ROUNDS"); do
  for workload in $WORKLOADS; do
    for variant in $VARIANTS; do (with_variant_env "$variant" && "drive_$workload" "$variant" "$round"); done
  done
done
# The counters the summary reads (the whole scrape is ~100 KB of histograms).
{ curl -sf "http://$HOST:$(variant_port on)/metrics" || true; } |
  grep -E '^vllm:(prefix_cache|prompt_tokens|generation_tokens|request_success)' >"$RUN_DIR/on.metrics.txt" || true
if [ -n "$BENCH_LOCK" ]; then flock -u "$lock_fd"; fi
stop_all
trap - EXIT

"$PYTHON" - "$RUN_DIR" "$ROUNDS" "$CONFIG" "${PEER:-}" "$WORKLOADS" "${ALT:-}" "$ALT_ENV" <<'EOF'
import json, re, statistics, sys
from pathlib import Path

run, rounds, config, peer, workloads, alt = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].split(), sys.argv[6]
alt_env = sys.argv[7]
variants = ["on", "off"] + (["alt"] * bool(alt)) + (["peer"] * bool(peer))
meta = json.loads((run / "on" / f"{config}.meta.json").read_text())


def figures(variant: str, workload: str, r: int) -> dict:
    """TTFT p50 (ms) and output tok/s of one drive."""
    d = json.loads((run / f"{variant}-{workload}-r{r}.json").read_text())
    if workload == "shared":
        return {"ttft_p50_ms": d["p50_ttft_ms"], "ttft_p99_ms": d["p99_ttft_ms"], "tpot_p50_ms": d["p50_tpot_ms"],
                "itl_p50_ms": d["p50_itl_ms"],
                "output_throughput": d["output_throughput"], "completed": d["completed"]}
    return {"ttft_p50_ms": d["ttft_ms"]["p50"], "ttft_p99_ms": d["ttft_ms"]["p99"],
            "ttft_p50_ms_later_turns": d["ttft_ms_later_turns"]["p50"],
            "output_throughput": d["output_throughput"], "completed": d["completed"],
            "prompt_tokens": d["prompt_tokens"], "cached_tokens": d["cached_tokens"]}


rows, ratios = [], {}
# A drive that failed (see its log) leaves its workload out.
workloads = [w for w in workloads if all((run / f"{v}-{w}-r{r}.json").exists()
                                         for v in variants for r in range(1, rounds + 1))]
for workload in workloads:
    for r in range(1, rounds + 1):
        got = {v: figures(v, workload, r) for v in variants}
        rows.append({"workload": workload, "round": r, **got})
        for other in variants[1:]:
            for k in ("ttft_p50_ms", "output_throughput"):
                ratios.setdefault(f"{workload}/{k}/on_{other}", []).append(got["on"][k] / got[other][k])
metrics = (run / "on.metrics.txt").read_text() if (run / "on.metrics.txt").exists() else ""
counter = lambda name: sum(float(v) for v in re.findall(rf"^vllm:{name}_total\{{[^}}]*\}} (\S+)", metrics, re.M))


def runner(variant: str) -> dict:
    """The runner's requests (ONP_STATS_FILE) of a plugin server: hits, cached tokens, prefill calls per hit / miss."""
    served = (alt if variant == "alt" else config)
    stats = [json.loads(line) for line in (run / variant / f"{served}.stats.jsonl").read_text().splitlines()]
    hits = [s for s in stats if s["cached_tokens"] > 0]
    misses = [s for s in stats if not s["cached_tokens"]]
    return {"requests": len(stats), "hits": len(hits),
            "cached_tokens": sum(s["cached_tokens"] for s in stats),
            "prompt_tokens": sum(s["prompt_tokens"] for s in stats),
            "prefill_calls_per_hit_median": statistics.median(s["prefill_calls"] for s in hits) if hits else None,
            "prefill_calls_per_miss_median": statistics.median(s["prefill_calls"] for s in misses) if misses else None}


summary = {
    "servers": {"on": f"{config}, prefix caching on", "off": f"{config}, --no-enable-prefix-caching",
                **({"alt": f"{alt}{' ' + alt_env if alt_env else ''}, prefix caching on"} if alt else {}),
                **({"peer": f"{peer}, prefix caching on"} if peer else {})},
    "artifact": {k: meta.get(k, 0) for k in ("batch_size", "sequence_length", "chunk_size", "prefill_batch_size", "prefill_tail_size",
                                      "prefill_mode", "context_buckets", "decode_buckets")},
    "rounds": rows,
    "ratios": {k: [round(v, 3) for v in vs] for k, vs in ratios.items()},
    "ratios_median": {k: round(statistics.median(vs), 3) for k, vs in ratios.items()},
    "runner_on": runner("on"),
    **({"runner_alt": runner("alt")} if alt else {}),
    "vllm_metrics_on": {"prefix_cache_queries": counter("prefix_cache_queries"),
                        "prefix_cache_hits": counter("prefix_cache_hits")},
}
(run / "summary.json").write_text(json.dumps(summary, indent=1))
lines = ["| workload | round | server | TTFT p50 (ms) | output tok/s | TTFT on/server | tok/s on/server |",
         "|---|---|---|---|---|---|---|"]
for row in rows:
    for v in variants:
        f, on = row[v], row["on"]
        lines.append(f"| {row['workload']} | {row['round']} | {summary['servers'][v]} | {f['ttft_p50_ms']:.0f} | "
                     f"{f['output_throughput']:.1f} | {on['ttft_p50_ms'] / f['ttft_p50_ms']:.2f}x | "
                     f"{on['output_throughput'] / f['output_throughput']:.2f}x |")
(run / "summary.md").write_text("\n".join(lines) + "\n\n```json\n" + json.dumps(summary, indent=1) + "\n```\n")
print("\n".join(lines))
print(json.dumps(summary["ratios_median"]), json.dumps(summary["runner_on"]), json.dumps(summary.get("runner_alt")),
      json.dumps(summary["vllm_metrics_on"]))
EOF
