#!/usr/bin/env bash
# Seconds from `vllm serve ARTIFACT` to /health 200.
art=$1; port=$2; log=$3
cd /work/main
s=$(date +%s.%N)
ONP_BACKEND=cpu .venv/bin/vllm serve "$art" --port $port --host 127.0.0.1 > "$log" 2>&1 &
pid=$!
until curl -sf http://127.0.0.1:$port/health >/dev/null; do
  kill -0 $pid 2>/dev/null || { echo "died"; exit 1; }
  sleep 0.5
done
e=$(date +%s.%N)
echo "$art start $(echo "$e - $s" | bc) s"
kill -TERM -- $pid; wait $pid 2>/dev/null
