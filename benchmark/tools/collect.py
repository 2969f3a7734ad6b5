"""Collect a benchmark run into a CSV, a markdown table and PNG plots; print the table.

    .venv/bin/python benchmark/tools/collect.py RUN_DIR [--latest DIR]

Reads what matrix.sh (serve.sh, serve.sh --drive, interleave.py) left in RUN_DIR:
  run.json                  knobs and machine of the run
  NAME.meta.json            a served configuration's facts (chunk size, sampling, prefill mode, start time)
  NAME-c<N>.json            vllm bench serve's result (hf_generate.py writes the same keys)
  NAME-c<N>.stats.jsonl     the plugin runner's per-request prefill figures (ONP_STATS_FILE)
  interleave-NAME.json      the serial vs interleaved scenario
Writes into RUN_DIR: results.csv, results.md, interleave.csv, summary.json, ttft.png, itl.png,
throughput.png and interleave.png. With --latest, copies the results (not the server logs) there.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import sys
from pathlib import Path

PLUGIN_CONFIGS = ("ce-ods", "ce-host", "chunked-host", "chunked-hybrid", "chunked-interleaved")
PEER_CONFIGS = ("vllm-cpu", "vllm-cpu-eager", "hf-generate")
SERIAL, INTERLEAVED = "chunked-hybrid", "chunked-interleaved"

COLUMNS = [
    "config",
    "kind",
    "prefill",
    "mode",
    "sampling",
    "chunk_size",
    "concurrency",
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "ttft_p50_ms",
    "ttft_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2el_p50_ms",
    "e2el_p99_ms",
    "e2el_mean_ms",
    "chunk_calls_per_request",
    "prefill_steps_per_request",
    "prefill_ms_per_request",
    "interleaved_fraction",
    "server_start_s",
]

# (column, header, format) of the markdown table.
TABLE = [
    ("config", "Configuration", "{}"),
    ("prefill", "Prefill", "{}"),
    ("mode", "Mode", "{}"),
    ("sampling", "Sampling", "{}"),
    ("concurrency", "Conc.", "{}"),
    ("request_throughput", "req/s", "{:.2f}"),
    ("output_throughput", "out tok/s", "{:.1f}"),
    ("ttft_p50_ms", "TTFT p50 ms", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99 ms", "{:.0f}"),
    ("itl_p50_ms", "ITL p50 ms", "{:.1f}"),
    ("itl_p99_ms", "ITL p99 ms", "{:.1f}"),
    ("e2el_p50_ms", "E2E p50 ms", "{:.0f}"),
    ("e2el_p99_ms", "E2E p99 ms", "{:.0f}"),
    ("chunk_calls_per_request", "chunk calls/req", "{:.2f}"),
]

INTERLEAVE_METRICS = [
    ("decode ITL p50 while long prompts arrive (ms)", ("decode_itl_during", "p50_ms")),
    ("decode ITL p99 while long prompts arrive (ms)", ("decode_itl_during", "p99_ms")),
    ("decode ITL max while long prompts arrive (ms)", ("decode_itl_during", "max_ms")),
    ("TTFT p50 of a short request queued behind a long one (ms)", ("queued_short_ttft", "p50_ms")),
    ("TTFT p50 of the long prompts (ms)", ("long_ttft", "p50_ms")),
    ("decode ITL p50 before the long prompts (ms)", ("decode_itl_before", "p50_ms")),
    ("prefill chunk calls per long prompt", ("long_prefill_calls",)),
    ("prefill steps per long prompt", ("long_prefill_steps",)),
    ("prefill chunk calls per queued short prompt", ("short_prefill_calls",)),
]


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def config_order(run: dict, names: set[str]) -> list[str]:
    wanted = (run.get("configs") or "").split() + (run.get("peers") or "").split()
    known = list(PLUGIN_CONFIGS + PEER_CONFIGS)
    return sorted(
        names, key=lambda n: (wanted.index(n) if n in wanted else len(wanted), known.index(n) if n in known else 99, n)
    )


def describe(name: str, meta: dict, run: dict) -> dict:
    """The configuration's facts: kind, prefill graph, mode, sampling, chunk size."""
    sequence_length = meta.get("sequence_length") or run.get("sequence_length")
    if name == "hf-generate":
        return {"kind": "peer", "prefill": "HF", "mode": "static batch", "sampling": "host", "chunk_size": ""}
    if name.startswith("vllm-cpu"):
        mode = "eager" if name.endswith("eager") else "torch.compile"
        return {"kind": "peer", "prefill": "vLLM CPU", "mode": mode, "sampling": "host", "chunk_size": ""}
    chunk = meta.get("chunk_size")
    if chunk is None:  # no meta: derive from the name
        chunk = 0 if name.startswith("ce-") else run.get("chunk_size", "")
    prefill = f"chunk {chunk}" if chunk else f"CE {sequence_length or ''}".strip()
    together = meta.get("prefill_batch_size", 1)
    if chunk and together > 1:
        prefill += f", up to {together} prompts per call"
    ods = meta.get("on_device_sampling", name in ("ce-ods", "chunked-hybrid", "chunked-interleaved"))
    mode = meta.get("prefill_mode") or ("interleaved" if name == INTERLEAVED else "serial")
    return {
        "kind": "plugin",
        "prefill": prefill,
        "mode": mode,
        "sampling": "on-device" if ods else "host",
        "chunk_size": chunk,
    }


def stats_figures(path: Path) -> dict:
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not records:
        return {}
    n = len(records)
    return {
        "chunk_calls_per_request": sum(r.get("prefill_calls", 0) for r in records) / n,
        "prefill_steps_per_request": sum(r.get("prefill_steps", 0) for r in records) / n,
        "prefill_ms_per_request": 1000 * sum(r.get("prefill_seconds", 0) for r in records) / n,
        "interleaved_fraction": sum(bool(r.get("interleaved")) for r in records) / n,
    }


def collect_rows(run_dir: Path, run: dict) -> list[dict]:
    pattern = re.compile(r"^(?P<name>.+)-c(?P<c>\d+)\.json$")
    found: dict[str, list[tuple[int, Path]]] = {}
    for path in run_dir.glob("*-c*.json"):
        match = pattern.match(path.name)
        if match:
            found.setdefault(match["name"], []).append((int(match["c"]), path))
    rows = []
    for name in config_order(run, set(found)):
        meta = read_json(run_dir / f"{name}.meta.json")
        facts = describe(name, meta, run)
        for concurrency, path in sorted(found[name]):
            result = read_json(path)
            if not result:
                continue
            row = {"config": name, **facts, "concurrency": concurrency}
            row.update(
                completed=result.get("completed"),
                failed=result.get("failed"),
                request_throughput=result.get("request_throughput"),
                output_throughput=result.get("output_throughput"),
                ttft_p50_ms=result.get("p50_ttft_ms"),
                ttft_p99_ms=result.get("p99_ttft_ms"),
                itl_p50_ms=result.get("p50_itl_ms"),
                itl_p99_ms=result.get("p99_itl_ms"),
                e2el_p50_ms=result.get("p50_e2el_ms"),
                e2el_p99_ms=result.get("p99_e2el_ms"),
                e2el_mean_ms=result.get("mean_e2el_ms"),
                server_start_s=meta.get("start_seconds"),
            )
            row.update(stats_figures(run_dir / f"{name}-c{concurrency}.stats.jsonl"))
            rows.append({column: row.get(column) for column in COLUMNS})
    return rows


def lookup(data: dict, keys: tuple[str, ...]):
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def collect_interleave(run_dir: Path) -> list[dict]:
    serial = read_json(run_dir / f"interleave-{SERIAL}.json")
    interleaved = read_json(run_dir / f"interleave-{INTERLEAVED}.json")
    if not serial and not interleaved:
        return []
    rows = []
    for label, keys in INTERLEAVE_METRICS:
        a, b = lookup(serial, keys), lookup(interleaved, keys)
        ratio = b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None
        rows.append({"metric": label, "serial": a, "interleaved": b, "ratio_interleaved_over_serial": ratio})
    return rows


def fmt(value, spec: str = "{}") -> str:
    if value is None or value == "":
        return "–"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


def markdown_table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in TABLE) + " |", "|" + "|".join("---" for _ in TABLE) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(row.get(c), f) for c, _, f in TABLE) + " |")
    return "\n".join(lines)


def interleave_table(rows: list[dict]) -> str:
    lines = ["| Metric | serial | interleaved | interleaved / serial |", "|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['metric']} | {fmt(row['serial'], '{:.1f}')} | {fmt(row['interleaved'], '{:.1f}')} "
            f"| {fmt(row['ratio_interleaved_over_serial'], '{:.2f}')} |"
        )
    return "\n".join(lines)


def run_header(run: dict, run_dir: Path) -> str:
    machine = run.get("machine", {})
    knobs = (
        f"model `{run.get('model_name', run.get('model', '?'))}`, backend {run.get('backend', '?')}, "
        f"batch {run.get('batch_size', '?')}, sequence length {run.get('sequence_length', '?')}, "
        f"chunk {run.get('chunk_size', '?')}, prefill batch {run.get('prefill_batch_size', 1)}, "
        f"decode graphs of {run.get('decode_batch_sizes', run.get('batch_size', '?'))} rows, TP {run.get('tp', '?')}, {run.get('threads', '?')} CPU thread(s) per "
        f"configuration; random prompts (seed {run.get('seed', '?')}): "
        f"{run.get('input_len', '?')} tokens in, {run.get('output_len', '?')} out, "
        f"{run.get('num_prompts', '?')} prompts per concurrency level"
    )
    lines = [f"# Benchmark run {run.get('started', run_dir.name)}", "", f"- Knobs: {knobs}."]
    if machine:
        lines.append(
            f"- Machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
            f"{machine.get('memory_gib', '?')} GiB; {machine.get('software', '')}; "
            f"load average {machine.get('load_start', '?')} at start, {run.get('load_end', '?')} at end."
        )
    if run.get("duration_s"):
        lines.append(f"- Wall time of the whole matrix: {run['duration_s'] / 60:.1f} min.")
    if run.get("note"):
        lines.append(f"- Note: {run['note']}.")
    if run.get("failures"):
        lines.append(f"- Failed configurations: {run['failures']} (see their logs in the run directory).")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: "" if row.get(c) is None else row.get(c) for c in columns})


def plot(rows: list[dict], interleave: list[dict], run_dir: Path, title: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    names = list(dict.fromkeys(r["config"] for r in rows))
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(names)}
    levels = sorted({r["concurrency"] for r in rows})

    def series(name: str, column: str):
        points = [(r["concurrency"], r[column]) for r in rows if r["config"] == name and r[column] is not None]
        return [p[0] for p in points], [p[1] for p in points]

    for metric, label in (("ttft", "TTFT"), ("itl", "ITL")):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
        for ax, p in zip(axes, ("p50", "p99"), strict=True):
            for name in names:
                x, y = series(name, f"{metric}_{p}_ms")
                if x:
                    style = "--" if name in PEER_CONFIGS else "-"
                    ax.plot(x, y, style, marker="o", label=name, color=colors[name])
            ax.set_title(f"{label} {p}")
            ax.set_xlabel("concurrency (max concurrent requests)")
            ax.set_ylabel("ms")
            ax.set_xticks(levels)
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=8)
        fig.suptitle(f"{label} against concurrency — {title}", fontsize=10)
        fig.tight_layout()
        path = run_dir / f"{metric}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in names:
        x, y = series(name, "output_throughput")
        if x:
            ax.plot(x, y, "--" if name in PEER_CONFIGS else "-", marker="o", label=name, color=colors[name])
    ax.set_title(f"Output tokens/s against concurrency — {title}", fontsize=9)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tokens/s")
    ax.set_xticks(levels)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = run_dir / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)

    bars = [r for r in interleave[:4] if r["serial"] is not None and r["interleaved"] is not None]
    if bars:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        xs = range(len(bars))
        ax.bar([x - 0.2 for x in xs], [r["serial"] for r in bars], 0.4, label="serial (chunked-hybrid)")
        ax.bar([x + 0.2 for x in xs], [r["interleaved"] for r in bars], 0.4, label="interleaved")
        for x, r in zip(xs, bars, strict=True):
            if r["ratio_interleaved_over_serial"] is not None:
                top = max(r["serial"], r["interleaved"])
                ax.annotate(f"x{r['ratio_interleaved_over_serial']:.2f}", (x, top), ha="center", va="bottom")
        short = ["decode ITL p50", "decode ITL p99", "decode ITL max", "queued short TTFT p50"]
        ax.set_xticks(list(xs), short[: len(bars)], fontsize=8)
        ax.set_ylabel("ms")
        ax.set_title("Long prompts arriving while short requests decode: serial vs interleaved", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = run_dir / "interleave.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def copy_latest(run_dir: Path, latest: Path) -> None:
    """The committed copy: the tables, summary.json, run.json, the configurations' facts and the plots; not the raw
    per-level results, stats lines, server logs or PID files (results/ stays small)."""
    if latest.resolve() == run_dir.resolve():
        return
    if latest.exists():
        shutil.rmtree(latest)
    latest.mkdir(parents=True)
    for path in sorted(run_dir.iterdir()):
        summary = path.suffix in (".csv", ".md", ".png") or path.name in ("run.json", "summary.json")
        if path.is_file() and (summary or path.name.endswith(".meta.json")):
            shutil.copy2(path, latest / path.name)
    (latest / "SOURCE").write_text(f"{run_dir.name}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--latest", type=Path, help="copy the results into this directory too")
    args = parser.parse_args()
    run_dir = args.run_dir
    run = read_json(run_dir / "run.json")
    rows = collect_rows(run_dir, run)
    if not rows:
        sys.exit(f"collect: no results (NAME-c<N>.json) in {run_dir}")
    interleave = collect_interleave(run_dir)

    write_csv(run_dir / "results.csv", rows, COLUMNS)
    if interleave:
        write_csv(run_dir / "interleave.csv", interleave, list(interleave[0]))
    title = f"{run.get('model_name', '')} b{run.get('batch_size', '?')} s{run.get('sequence_length', '?')}"
    plots = plot(rows, interleave, run_dir, title)

    parts = [run_header(run, run_dir), "", "## Configurations x concurrency", "", markdown_table(rows)]
    parts += [
        "",
        "TTFT, ITL and E2E are client-side (vllm bench serve; hf-generate times its own batches). "
        "Prefill: `CE S` = one context-encoding graph of the whole sequence length, `chunk C` = chunked "
        "prefill graphs of C tokens (up to P prompts per call: --prefill-batch-size P). chunk calls/req = "
        "prefill graph calls per request, from the plugin runner's ONP_STATS_FILE.",
    ]
    if interleave:
        parts += [
            "",
            "## Serial vs interleaved prefill (long prompts arriving while short requests decode)",
            "",
            interleave_table(interleave),
        ]
        facts = read_json(run_dir / f"interleave-{INTERLEAVED}.json") or read_json(
            run_dir / f"interleave-{SERIAL}.json"
        )
        if facts:
            parts += [
                "",
                f"{facts.get('decoders')} requests decode while {facts.get('rounds')} long prompts of "
                f"{facts.get('long_len')} tokens (chunk {facts.get('chunk_size')}) arrive one after another, each "
                f"followed {facts.get('short_delay', 0.05)} s later by a {facts.get('short_len')}-token request.",
            ]
    parts += ["", "Plots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots), ""]
    (run_dir / "results.md").write_text("\n".join(parts))
    summary = {"run": run, "rows": rows, "interleave": interleave}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))

    print(markdown_table(rows))
    if interleave:
        print()
        print(interleave_table(interleave))
    print(f"\n[collect] {run_dir}/results.md, results.csv, " + ", ".join(p.name for p in plots))
    if args.latest:
        copy_latest(run_dir, args.latest)
        print(f"[collect] copied to {args.latest}")


if __name__ == "__main__":
    main()
