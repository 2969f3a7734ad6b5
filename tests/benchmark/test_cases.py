"""Every case of the two benchmark drivers, run on a tiny model, so that none can rot.

Graph cases: one `benchmark/graphs.py CASE... --tiny MODEL --artifact ARTIFACT --in-process` of every case (each
case's smoke arguments, one interpreter importing torch once), then each case's results checked.
Served cases: one `vllm serve` of the tiny artifact, every case of `benchmark/served.py` sent to it with a handful of
short requests. Each run must leave its results and a run.json naming the commit, the command and the host.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import graphs
import pytest
import served
from support.server import serve, server_env

from optimum_neuron_plugin.backends.program_cache import CACHE_ENV

from .conftest import BENCH, REPO

# What each graph case writes besides run.json.
GRAPH_OUTPUTS = {
    "calls": "graphs.json",
    "calls-long-context": "graphs.json",
    "prefill": "prefill.md",
    "prefill-profile": "profile.md",
    "attention": "attention-64.md",
    "attention-decoder": "decoder-64.md",
    "chunk-widths": "calls.md",
    "moe": "qwen3moe-e4-k2-h64.json",
    "device-logprobs": "device_logprobs.json",
    "logit-bias": "logit_bias.json",
    "lora": "lora.json",
    "token-bitmask": "token_bitmask.json",
    "sampling-tail": "sampling_tail.json",
    "prompt-logits-export": "export.json",
    "lora-export": "export.json",
    "warm-up": "warm_up.md",
    "program-load": "program_load.md",
    "roofline": "roofline.json",
    "decode-ab": "decode_ab.md",
    "prefill-vllm": "prefill_vllm.md",
    "speculative": "results.md",
    "fp8-accuracy": "results.json",
}


def assert_recorded(out, command_part: str) -> dict:
    run = json.loads((out / "run.json").read_text())
    assert run["commit"] and run["commit"] != "unknown"
    assert command_part in run["command"]
    assert run["host"]["cpu"] and run["host"]["cores"] >= 1
    return run


def test_every_case_has_a_smoke_check():
    assert set(GRAPH_OUTPUTS) == set(graphs.BY_NAME)


def test_lists_name_every_case():
    for driver, cases in (("graphs.py", graphs.CASES), ("served.py", served.CASES)):
        listing = subprocess.run(
            [sys.executable, str(BENCH / driver), "--list"], capture_output=True, text=True, check=True
        ).stdout
        for case in cases:
            assert f"\n{case.name} " in f"\n{listing}", (driver, case.name)
            assert case.measures in listing


def test_unknown_case_names_the_cases():
    done = subprocess.run([sys.executable, str(BENCH / "graphs.py"), "calls-typo"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown case 'calls-typo'" in done.stderr and "prefill-profile" in done.stderr


def test_arguments_after_the_separator_reach_the_case_script(tmp_path):
    """`graphs.py calls -- --context 1100`: the committed run's arguments, then the user's (the last value wins)."""
    argv, extra = graphs.split_extra(["calls", "--out", str(tmp_path), "--", "--context", "1100"])
    assert argv == ["calls", "--out", str(tmp_path)] and extra == ["--context", "1100"]
    cmd = graphs.command(graphs.BY_NAME["calls"], tmp_path, extra, None, None)
    assert cmd[-4:] == ["--context", "1100", "--out", str(tmp_path)]
    assert cmd.index("300") < cmd.index("1100"), "the case's own --context 300 comes first"


@pytest.fixture(scope="module")
def graph_runs(tiny_model, tiny_artifact, bench_cache, tmp_path_factory):
    """Every graph case's smoke run, all in one `graphs.py ... --in-process`: (results root, its output)."""
    root = tmp_path_factory.mktemp("graphs")
    # The cases' exports of the tiny models (artifacts and compiled programs) are cached across runs: a program is
    # keyed by the graph code that traced it (backends/program_cache.py), so a code change compiles it again.
    env = server_env(BENCH_ARTIFACTS=str(bench_cache / "graph-artifacts"), PYTHONPATH=str(REPO))
    env[CACHE_ENV] = str(bench_cache / "compile-cache")
    cmd = [sys.executable, str(BENCH / "graphs.py"), *graphs.BY_NAME, "--tiny", str(tiny_model)]
    cmd += ["--artifact", str(tiny_artifact), "--out", str(root), "--in-process"]
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
    return root, done


@pytest.mark.slow
@pytest.mark.parametrize("case", list(GRAPH_OUTPUTS))
def test_graph_case(case, graph_runs):
    root, done = graph_runs
    out = root / case
    failed = f"[graphs] {case} FAILED"
    assert failed not in done.stderr, done.stderr[: done.stderr.index(failed) + len(failed)][-5000:]
    assert (out / "run.json").is_file() and (out / GRAPH_OUTPUTS[case]).is_file(), done.stderr[-5000:]
    assert (out / GRAPH_OUTPUTS[case]).stat().st_size > 0
    run = assert_recorded(out, "graphs.py")
    assert case in shlex.split(run["command"])
    assert run["case"] == case and run["seconds"] > 0


@pytest.fixture(scope="module")
def tiny_server(tiny_artifact, tmp_path_factory):
    logs = tmp_path_factory.mktemp("served")
    stats = logs / "stats.jsonl"
    yield from serve(tiny_artifact, logs / "server.log", env={"ONP_STATS_FILE": str(stats)})


SERVED = {
    "random": (["--concurrency", "1 2", "--input-len", "40", "--output-len", "4", "--num-prompts", "3"],
               ["tiny-c1.json", "tiny-c2.json"]),
    "long-prompt": (["--input-len", "150", "--num-prompts", "1"], ["tiny-c1.json"]),
    "interleave": (["--", "--rounds", "1", "--long-len", "130", "--short-len", "8", "--decoders", "2"],
                   ["interleave-tiny.json"]),
    # The other side is the same server here ({url}): the case's shape, not a comparison.
    "paired-long-prompt": (["--", "--against-url", "{url}", "--against-name", "tiny-again", "--lengths", "150 60",
                            "--rounds", "3", "--settle", "0"], ["paired-tiny.json"]),
    "shared-prefix": (["--prefix-len", "64", "--question-len", "8", "--output-len", "4", "--num-prompts", "3",
                       "--concurrency", "2"], ["tiny.json"]),
    "multi-turn": (["--conversations", "2", "--turns", "2", "--first-len", "40", "--question-len", "8",
                    "--output-len", "4", "--concurrency", "2"], ["tiny.json"]),
    "mixed-chat": (["--concurrency", "2", "--num-prompts", "3", "--", "--prompt-min", "8", "--prompt-median", "20",
                    "--prompt-max", "60", "--output-min", "2", "--output-median", "4", "--output-max", "8",
                    "--vocab", "200"], ["tiny.json"]),
}  # fmt: skip


def test_every_served_case_has_a_smoke_check():
    assert set(SERVED) == set(served.BY_NAME)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SERVED))
def test_served_case(case, tiny_server, tiny_artifact, tmp_path, monkeypatch):
    """served.py's main in this process, `vllm bench serve` in it too: vLLM's client imported once for every case."""
    options, outputs = SERVED[case]
    options = [option.replace("{url}", tiny_server.url) for option in options]
    out = tmp_path / case
    stats = tiny_server.log.parent / "stats.jsonl"
    for name in [name for name in os.environ if name.startswith("VLLM_")]:
        monkeypatch.delenv(name)
    argv = [case, "--url", tiny_server.url, "--model-dir", str(tiny_artifact), "--in-process"]
    served.main([*argv, "--out", str(out), "--name", "tiny", "--stats-file", str(stats), *options])
    for name in outputs:
        result = json.loads((out / name).read_text())
        assert result, name
    if case == "paired-long-prompt":
        paired = json.loads((out / "paired-tiny.json").read_text())
        assert (paired["name"], paired["against"]) == ("tiny", "tiny-again")
        assert [r["prompt_tokens"] for r in paired["lengths"]] == [150, 60]
        for r in paired["lengths"]:
            assert r["rounds"] == 3 and len(r["ttft_ms"]) == len(r["against_ttft_ms"]) == 3
            assert all(ms > 0 for ms in r["ttft_ms"] + r["against_ttft_ms"])
            ratios = [a / b for a, b in zip(r["ttft_ms"], r["against_ttft_ms"], strict=True)]
            assert r["median_round_ratio"] == sorted(ratios)[1]
    if case == "mixed-chat":
        mixed = json.loads((out / "tiny.json").read_text())
        assert mixed["requests"] == 3 and mixed["clients"] == 2 and mixed["output_tok_s"] > 0
        assert all(8 <= r["prompt_tokens"] <= 60 and 2 <= r["completion_tokens"] <= 8 for r in mixed["records"])
        counted = mixed["server_counters"]  # the server's /metrics over the run
        assert counted["prompt_tokens"] == sum(r["prompt_tokens"] for r in mixed["records"])
        assert counted["num_preemptions"] == 0
    if case in ("random", "long-prompt"):
        for name in outputs:
            figures = json.loads((out / name).read_text())
            assert figures["failed"] == 0 and figures["median_ttft_ms"] > 0
            lines = (out / name.replace(".json", ".stats.jsonl")).read_text().splitlines()
            assert len(lines) == figures["completed"], "one runner stats line per measured request"
    assert_recorded(out, f"served.py {case}")
