#!/bin/bash
# load + warm-up CPU seconds of the SmolLM2 artifact, before (60a6808) and after (7854106), alternated
for round in 1 2; do
  for side in before main; do
    dir=/work/wt-$side; [ $side = main ] && dir=/work/main
    echo "== $side round $round ($(git -C $dir rev-parse --short HEAD))"
    cd $dir && OMP_NUM_THREADS=1 PYTHONPATH=$dir .venv/bin/python /tmp/prof/load3.py /work/bench/smollm2-b4-s1024-c128 2>&1 | grep "load cpu"
  done
done
