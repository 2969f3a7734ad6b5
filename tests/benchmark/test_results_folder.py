"""What benchmark/ commits: result folders that hold results (no scripts: a result that needs one is a case of a
driver), under a size limit, and few top-level files. Measured on git's index, so local untracked runs do not count."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import PurePosixPath

from .conftest import REPO

RESULTS_LIMIT_BYTES = 1_500_000
TOP_LEVEL_FILES_MAX = 8  # besides README.md
SCRIPT_SUFFIXES = (".py", ".sh", ".diff", ".patch")  # a patch is code to apply, not a result
EXECUTABLE_MODE = "100755"


@dataclass(frozen=True)
class Tracked:
    path: PurePosixPath  # relative to the repository
    mode: str  # git's file mode, e.g. 100644
    size: int  # bytes of the committed (staged) content


def tracked(under: str) -> list[Tracked]:
    """The files git tracks under `under` (the index: staged content, not the working tree's untracked files)."""
    listing = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-s", "-z", "--", under], capture_output=True, text=True, check=True
    ).stdout
    entries = [line.split(maxsplit=3) for line in listing.split("\0") if line]  # mode, object, stage, path
    objects = "\n".join(obj for _, obj, _, _ in entries) + "\n"
    sizes = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "--batch-check=%(objectsize)"],
        input=objects, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return [
        Tracked(PurePosixPath(path), mode, int(size)) for (mode, _, _, path), size in zip(entries, sizes, strict=True)
    ]


def scripts(files: list[Tracked]) -> list[str]:
    return [str(f.path) for f in files if f.path.suffix in SCRIPT_SUFFIXES or f.mode == EXECUTABLE_MODE]


def test_results_hold_no_scripts():
    found = scripts(tracked("benchmark/results"))
    assert not found, (
        f"scripts committed under benchmark/results/: {found}. A result that needs a script to reproduce it is a "
        "case of benchmark/graphs.py (graph_cases/) or benchmark/served.py; its folder's summary names the case "
        "and command"
    )


def test_results_stay_under_the_size_limit():
    files = tracked("benchmark/results")
    total = sum(f.size for f in files)
    largest = sorted(files, key=lambda f: -f.size)[:5]
    assert total <= RESULTS_LIMIT_BYTES, (
        f"benchmark/results/ commits {total:,} bytes, over {RESULTS_LIMIT_BYTES:,}: keep summaries, drop raw "
        f"per-request dumps and logs no doc cites; the largest: {[(str(f.path), f.size) for f in largest]}"
    )


def test_benchmark_has_few_top_level_files():
    top = sorted(str(f.path.name) for f in tracked("benchmark") if len(f.path.parts) == 2)
    others = [name for name in top if name != "README.md"]
    assert len(others) <= TOP_LEVEL_FILES_MAX, (
        f"benchmark/ has {len(others)} top-level files besides README.md, more than {TOP_LEVEL_FILES_MAX}: {others}; "
        "move helpers into tools/, workloads/ or graph_cases/"
    )


def test_the_checks_see_what_they_look_for():
    """The listing sees the drivers, their sizes and modes: the checks above cannot pass on an empty listing."""
    bench = {str(f.path): f for f in tracked("benchmark")}
    assert bench["benchmark/graphs.py"].size > 1000
    assert scripts([bench["benchmark/graphs.py"], bench["benchmark/README.md"]]) == ["benchmark/graphs.py"]
    assert bench["benchmark/matrix.sh"].mode == EXECUTABLE_MODE
    assert tracked("benchmark/results"), "no committed results found: the listing is broken"


def test_result_links_reach_committed_files():
    """A summary's relative link names a committed file (plots that collect.py draws locally are not committed)."""
    files = tracked("benchmark/results")
    committed = {f.path for f in tracked(".")}
    dangling = []
    for summary in (f.path for f in files if f.path.suffix == ".md"):
        for target in re.findall(r"\]\(([^)#\s]+)\)", (REPO / summary).read_text()):
            if "://" not in target and PurePosixPath(os.path.normpath(summary.parent / target)) not in committed:
                dangling.append(f"{summary} -> {target}")
    assert not dangling, f"links to files not committed: {dangling}; commit the file or drop the link"
