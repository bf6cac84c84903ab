"""The repository's import graph, read with ``ast`` (nothing is imported): shared by the layout tests."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("clap", "schemas")


def module_file(module: str) -> Path | None:
    """The file of a dotted module of this repository (``clap.task.prompt`` -> clap/task/prompt.py), or None."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@cache
def direct_imports(path: Path) -> frozenset[Path]:
    """Repository files that importing ``path`` executes directly: every import statement, also inside
    functions (they run when called), with the ``__init__.py`` of each package on the way."""
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            modules.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{a.name}" for a in node.names)  # `from clap.task import prompt`
    files = set()
    for m in modules:
        if m.split(".")[0] not in PACKAGES:
            continue
        for name in (*_parents(m), m):
            f = module_file(name)
            if f is not None:
                files.add(f)
    files.discard(path)
    return frozenset(files)


def closure(path: Path) -> set[Path]:
    """Every repository file that running ``path`` may execute (transitively)."""
    seen: set[Path] = set()
    todo = [path]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo.extend(direct_imports(f))
    return seen


def package_of(path: Path) -> str:
    """The phase a clap file belongs to: its subpackage, ``core`` for clap/*.py, ``cli`` for the entry point."""
    rel = path.relative_to(ROOT / "clap")
    if len(rel.parts) == 1:
        return "cli" if rel.name == "cli.py" else "core"
    return rel.parts[0]
