"""The package's shape rules: private names of vLLM, argparse and torch live only in their compat modules, behind a
function named for what it does, so a version bump is checked in one file each; no folder grows past 15 modules."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "optimum_neuron_plugin"
VLLM_HOME = "optimum_neuron_plugin/vllm/compat.py"  # vLLM's and argparse's private names
TORCH_HOME = "optimum_neuron_plugin/torch_compat.py"
MAX_MODULES = 15

# Private uses found in the package (issue 61), as code writes them. A name that starts or ends with an identifier
# character matches only as a whole name: `Sampler.` is not `NeuronSampler.`.
NAMED = {
    VLLM_HOME: (
        "_reserve_prefill_lookahead",
        "_get_local_prefix_cache_hit",
        "_free_request",
        "_preempt_request",
        "kv_cache_manager.",
        "_block_hasher",
        "Sampler.",
        "build_logitsprocs",
        "apply_grammar_bitmask",
        "NgramProposer",
        "._actions",
        ".__class__ =",
        "fields(SchedulerOutput",
    ),
    TORCH_HOME: (
        "_LazyGraphModule",
        "_PyTreeCodeGen",
        "_codegen",
        "torch._",
        "torch.ops.mkldnn",
        "_c10d_functional",
        "testing._internal",
        "torch.fx._",
    ),
}
# The general rule: a module of these libraries or a name imported from one, or an attribute of one, that starts
# with an underscore (dunders such as torch.__version__ are public).
LIBRARIES = {"vllm": VLLM_HOME, "argparse": VLLM_HOME, "torch": TORCH_HOME}


def _pattern(name: str) -> re.Pattern[str]:
    text = r"\s*".join(map(re.escape, name.split(" ")))
    before = r"(?<!\w)" if re.match(r"\w", name) else ""
    after = r"(?!_)" if name.endswith("._") else r"(?!\w)" if re.search(r"\w$", name) else ""
    return re.compile(before + text + after + (r"(?!=)" if name.endswith("=") else ""))


PATTERNS = [(name, _pattern(name), home) for home, names in NAMED.items() for name in names]


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _code_lines(source: str, tree: ast.Module) -> list[str]:
    """The source's lines with comments and docstrings blanked (a name they mention is not a use)."""
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for row in range(first.lineno, first.end_lineno + 1):
                    lines[row - 1] = ""
    return lines


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def _general_uses(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, name, home) of each private module, import or attribute of the libraries, by the AST."""
    roots = dict(LIBRARIES)  # names bound to a library module in this file (`import torch as t`)
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                library = alias.name.split(".")[0]
                if library in LIBRARIES:
                    roots[alias.asname or library] = LIBRARIES[library]
                    if any(map(_private, alias.name.split("."))):
                        uses.append((node.lineno, f"import {alias.name}", LIBRARIES[library]))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            home = LIBRARIES.get(node.module.split(".")[0])
            if home is None:
                continue
            if any(map(_private, node.module.split("."))):
                uses.append((node.lineno, f"from {node.module} import", home))
            else:
                uses += [
                    (node.lineno, f"from {node.module} import {a.name}", home) for a in node.names if _private(a.name)
                ]
    for node in ast.walk(tree):
        dotted = _dotted(node) if isinstance(node, ast.Attribute) else None
        if dotted and dotted[0] in roots:
            first = next((i for i, part in enumerate(dotted) if i and _private(part)), None)
            if first is not None:  # named up to its first private part: torch._dynamo.config.patch is torch._dynamo
                uses.append((node.lineno, ".".join(dotted[: first + 1]), roots[dotted[0]]))
    return uses


def private_uses(path: Path, relative: str) -> list[str]:
    """Each line of the file that uses a private name: `file:line: name, ... must go to <home>`."""
    source = path.read_text()
    tree = ast.parse(source)
    found: dict[tuple[int, str], set[str]] = {}
    for line, name, home in _general_uses(tree):
        found.setdefault((line, home), set()).add(name)
    for row, text in enumerate(_code_lines(source, tree), start=1):
        for name, pattern, home in PATTERNS:
            if pattern.search(text):
                found.setdefault((row, home), set()).add(name)
    return [
        f"{relative}:{line}: {', '.join(f'`{name}`' for name in sorted(names))}: private; move it into {home}, "
        f"behind a function named for what it does, and call that"
        for (line, home), names in sorted(found.items())
    ]


def package_private_uses(package: Path) -> list[str]:
    uses = []
    for path in sorted(package.rglob("*.py")):
        relative = f"{package.name}/{path.relative_to(package).as_posix()}"
        if relative not in (VLLM_HOME, TORCH_HOME):
            uses += private_uses(path, relative)
    return uses


def crowded_folders(package: Path) -> list[str]:
    folders = [package, *(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    counts = {folder: len(list(folder.glob("*.py"))) for folder in folders}
    return [
        f"{folder.relative_to(package.parent).as_posix()}/ holds {n} modules (at most {MAX_MODULES}): split it into "
        f"sub-packages by concept"
        for folder, n in sorted(counts.items())
        if n > MAX_MODULES
    ]


def test_private_names_live_only_in_the_compat_modules():
    uses = package_private_uses(PACKAGE)
    assert not uses, "\n".join(uses)


def test_no_folder_holds_more_than_15_modules():
    crowded = crowded_folders(PACKAGE)
    assert not crowded, "\n".join(crowded)


PRIVATE = '''\
"""Mentions of _free_request and torch._dynamo in a docstring are not uses."""
import argparse
import torch as t
from torch._dynamo import config
from vllm.v1.core.sched.scheduler import _helper

def f(scheduler, parser, request, action):
    scheduler._free_request(request)  # and a comment naming torch._C
    for a in parser._actions:
        a.__class__ = type(a)
    request._block_hasher = None
    return t.ops.mkldnn._reorder_linear_weight, argparse._SubParsersAction, t.__version__
'''
PUBLIC = '''\
"""vLLM's Scheduler._free_request, torch._dynamo and parser._actions, named in a docstring."""
import torch

class NeuronSampler:
    """Not vLLM's Sampler._x."""

def f(request, action):
    # torch._C, request._block_hasher, action.__class__ = X: comments
    if action.__class__ == NeuronSampler:
        return NeuronSampler.sample, torch.__version__, torch.ops.aten.add, request.block_hashes
'''


def test_the_checker_names_each_private_use_with_its_line_and_home(tmp_path):
    (tmp_path / "private.py").write_text(PRIVATE)
    uses = private_uses(tmp_path / "private.py", "pkg/private.py")
    flagged = {(use.split(":")[1], name) for use in uses for name in use.split("`")[1::2]}
    assert flagged >= {
        ("4", "from torch._dynamo import"),
        ("5", "from vllm.v1.core.sched.scheduler import _helper"),
        ("8", "_free_request"),
        ("9", "._actions"),
        ("10", ".__class__ ="),
        ("11", "_block_hasher"),
        ("12", "t.ops.mkldnn._reorder_linear_weight"),
        ("12", "argparse._SubParsersAction"),
    }
    assert not any(":1:" in use or ":3:" in use or "__version__" in use for use in uses)
    assert f"pkg/private.py:8: `_free_request`: private; move it into {VLLM_HOME}, behind a function" in uses[2]
    assert f"pkg/private.py:4: `from torch._dynamo import`, `torch._`: private; move it into {TORCH_HOME}" in uses[0]


def test_the_checker_passes_public_code_and_the_compat_modules(tmp_path):
    (tmp_path / "public.py").write_text(PUBLIC)
    assert private_uses(tmp_path / "public.py", "pkg/public.py") == []
    package = tmp_path / "optimum_neuron_plugin"
    (package / "vllm").mkdir(parents=True)
    (package / "vllm" / "compat.py").write_text(PRIVATE)
    (package / "torch_compat.py").write_text("import torch._dynamo\n")
    (package / "public.py").write_text(PUBLIC)
    assert package_private_uses(package) == []
    (package / "vllm" / "user_args.py").write_text("def f(parser):\n    return parser._actions\n")
    assert package_private_uses(package) == [
        f"optimum_neuron_plugin/vllm/user_args.py:2: `._actions`: private; move it into {VLLM_HOME}, "
        "behind a function named for what it does, and call that"
    ]


def test_the_checker_flags_every_listed_name(tmp_path):
    names = [name for listed in NAMED.values() for name in listed]
    lines = []
    for name in names:  # each name as code writes it: `Sampler.` as Sampler.x, `.__class__ =` as x.__class__ = y
        text = ("x" if name.startswith(".") else "") + name + ("x" if name.endswith(".") or name.endswith("._") else "")
        lines.append(text + (" y" if name.endswith("=") else ")" if "(" in name else ""))
    (tmp_path / "listed.py").write_text("\n".join(lines) + "\n")
    uses = private_uses(tmp_path / "listed.py", "listed.py")
    for row, name in enumerate(names, start=1):
        assert any(use.startswith(f"listed.py:{row}: ") and f"`{name}`" in use for use in uses), (name, uses)


def test_a_folder_of_16_modules_is_named(tmp_path):
    package = tmp_path / "optimum_neuron_plugin"
    (package / "runtime").mkdir(parents=True)
    for i in range(16):
        (package / "runtime" / f"m{i}.py").write_text("")
    (package / "__init__.py").write_text("")
    assert crowded_folders(package) == [
        "optimum_neuron_plugin/runtime/ holds 16 modules (at most 15): split it into sub-packages by concept"
    ]
    (package / "runtime" / "m15.py").unlink()
    assert crowded_folders(package) == []
