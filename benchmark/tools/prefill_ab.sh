#!/bin/bash
# benchmark/graph_cases/prefill.py's measurements of two source trees alternated: per prompt length, the chunked prefill of
# tree A's artifact, then tree B's, then HF eager's forward, each in a fresh process (best of REPEATS), ROUNDS
# times. On a shared host, ratios of neighbouring measurements are what counts.
#
#   benchmark/tools/prefill_ab.sh OUT.jsonl A_TREE A_ARTIFACT B_TREE B_ARTIFACT [LENGTHS=2048,4096] [REPEATS=2] [ROUNDS=1]
#
# Each tree runs with its own code on PYTHONPATH (artifacts from benchmark/graph_cases/prefill.py of that tree).
set -euo pipefail
out=$1 a_tree=$2 a_artifact=$3 b_tree=$4 b_artifact=$5
lengths=${6:-2048,4096} repeats=${7:-2} rounds=${8:-1}
python=${PYTHON:-/work/main/.venv/bin/python}
gguf=$(cd "$b_tree" && PYTHONPATH=$b_tree $python -c "import sys; sys.path.insert(0, 'benchmark/graph_cases'); import common; print(common.default_model())")
for round in $(seq 1 "$rounds"); do
  for length in ${lengths//,/ }; do
    for side in a b hf; do
      case $side in
        a) tree=$a_tree target=$a_artifact ;;
        b) tree=$b_tree target=$b_artifact ;;
        hf) tree=$b_tree target=hf:$gguf ;;
      esac
      figures=$(cd "$tree" && PYTHONPATH=$tree $python benchmark/graph_cases/prefill.py --measure "$target" "$length" --repeats "$repeats" | tail -n 1)
      echo "{\"round\": $round, \"side\": \"$side\", \"prompt\": $length, \"at\": \"$(date -u +%H:%M:%S)\", \"figures\": $figures}" | tee -a "$out"
    done
  done
done
