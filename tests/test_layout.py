"""Project layout rules: stages are leaves, params.yaml covers every stage, nothing private is tracked."""

from __future__ import annotations

import ast
import os
import re
import subprocess

import yaml
from layout import ROOT, closure, direct_imports, package_of

from clap import params as cparams


def _python_files(*dirs: str):
    for d in dirs:
        yield from (ROOT / d).rglob("*.py")


def test_stages_is_not_a_package():
    assert not (ROOT / "stages" / "__init__.py").exists()


def test_nothing_imports_a_stage():
    offenders = []
    for path in _python_files("clap", "schemas", "stages", "tests", "benchmarks"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "stages" or n.startswith("stages.") for n in names):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def _dvc_stages():
    return yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]


def test_every_params_section_named_in_dvc_yaml_exists():
    params = cparams.load(ROOT / "params.yaml")
    missing = []
    for name, stage in _dvc_stages().items():
        body = stage.get("do", stage)
        for p in body.get("params", []):
            key = p if isinstance(p, str) else next(iter(p))
            if key.split(".")[0] not in params:
                missing.append(f"{name}: {key}")
    assert missing == []


def test_every_stage_script_and_library_dep_exists():
    missing = []
    for name, stage in _dvc_stages().items():
        body = stage.get("do", stage)
        for dep in body.get("deps", []):
            if dep.startswith(("stages/", "clap/", "schemas/")) and not (ROOT / dep).exists():
                missing.append(f"{name}: {dep}")
    assert missing == []


def test_stage_scripts_are_thin():
    too_long = {
        p.name: n for p in (ROOT / "stages").glob("*.py") if (n := len(p.read_text().splitlines())) > 150
    }
    assert too_long == {}


MAX_FUNCTION_LINES = 80


def test_no_library_function_is_longer_than_80_lines():
    """A long function is where changes get hard: split it by its steps into named helpers. Counted
    from ``def`` to its last line, docstring included."""
    too_long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines"
        for path in sorted(_python_files("clap"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES
    ]
    assert too_long == [], f"longer than {MAX_FUNCTION_LINES} lines:\n" + "\n".join(too_long)


def test_no_private_keys_are_tracked():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    suspicious = [f for f in files if f.endswith((".key", ".pem")) or "private" in f.lower()]
    assert suspicious == []
    marker = b"PRIVATE" + b" KEY-----"  # split so this file does not match itself
    for f in files:
        p = ROOT / f
        if p.is_file() and p.stat().st_size < 1_000_000:
            assert marker not in p.read_bytes(), f


def _stage_script(body) -> str:
    return re.search(r"python (stages/\S+\.py)", body["cmd"]).group(1)


def test_stage_deps_cover_every_file_the_stage_imports():
    """A code change must re-run every stage whose code changed: deps cover the stage's whole import closure."""
    uncovered = []
    for name, stage in _dvc_stages().items():
        body = stage.get("do", stage)
        deps = [ROOT / d for d in body.get("deps", [])]
        for f in sorted(closure(ROOT / _stage_script(body))):
            if not any(f == d or d in f.parents for d in deps):
                uncovered.append(f"{name}: {f.relative_to(ROOT)}")
    assert uncovered == []


def test_stages_that_verify_the_incumbent_depend_on_all_release_state():
    """`clap trust` (a key added or revoked) must re-run every stage that verifies the production pointer:
    a stage given a releases/ path (stages take every path as an argument) verifies it with
    clap/release/registry.py, which reads the history, the approval ledger, the trusted and the revoked
    keys too, so it depends on the whole folder, not on the pointer alone."""
    readers = {}
    for name, stage in _dvc_stages().items():
        body = stage.get("do", stage)
        if "releases/" in body["cmd"]:
            assert ROOT / "clap" / "release" / "registry.py" in closure(ROOT / _stage_script(body)), name
            readers[name] = "releases" in body.get("deps", [])
    assert readers == {"warm_start": True, "eval": True}, readers


def test_no_import_cycle_between_packages():
    """The phases form a DAG (clap/cli.py, the entry point, may import any of them)."""
    edges: dict[str, set[str]] = {}
    for path in (ROOT / "clap").rglob("*.py"):
        src = package_of(path)
        for dst in map(package_of, (f for f in direct_imports(path) if f.is_relative_to(ROOT / "clap"))):
            if dst != src:
                edges.setdefault(src, set()).add(dst)
    assert "cli" not in set().union(*edges.values())
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"import cycle: {' -> '.join([*trail, node])}"
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, [*trail, node])
        state[node] = "done"

    for node in sorted(edges):
        visit(node, [])


def test_product_code_never_imports_the_demo_generator():
    """Only the demo itself and the CLI (`clap demo-data`) may import clap/demo."""
    demo = ROOT / "clap" / "demo"
    product = [
        p
        for d in ("clap", "schemas", "stages")
        for p in (ROOT / d).rglob("*.py")
        if not p.is_relative_to(demo) and p != ROOT / "clap" / "cli.py"
    ]
    offenders = [
        str(p.relative_to(ROOT)) for p in product if any(f.is_relative_to(demo) for f in direct_imports(p))
    ]
    assert offenders == []


def test_deciding_runs_no_model_code():
    """gate and summary decide on what eval and replay wrote: they import no model, chain or data code."""
    heavy = [ROOT / "clap" / pkg for pkg in ("model", "chain", "data")]
    offenders = [
        f"{name}: {f.relative_to(ROOT)}"
        for name in ("gate", "summary")
        for f in closure(ROOT / "stages" / f"{name}.py")
        if any(f.is_relative_to(h) for h in heavy)
    ]
    assert offenders == []


DETECTOR_PLOTS = {"train_loss_vs_probe": ["loss", "probe_loss"], "detector_log_e": ["log_e", "log_threshold"]}


def test_detector_plots_draw_every_configured_batch():
    """DVC takes no folder or glob as a named plot's source: each batch of params `batches` is listed in the
    top-level detector plots of dvc.yaml, with both columns (tests/e2e/test_dvc_plots.py renders them)."""
    batches = cparams.load(ROOT / "params.yaml")["batches"]
    plots = {
        k: v for entry in yaml.safe_load((ROOT / "dvc.yaml").read_text())["plots"] for k, v in entry.items()
    }
    want = {f"plots/train/{b}.csv" for b in batches}
    for plot_id, columns in DETECTOR_PLOTS.items():
        assert plots[plot_id]["x"] == "step"
        assert plots[plot_id]["y"] == {f: columns for f in sorted(want)}, plot_id


def test_make_tests_work_units_keep_a_file_on_one_worker(tmp_path):
    """`make test` runs `pytest -n 2 --dist loadgroup` with each file one work unit (tests/conftest.py), so a
    module's fixtures and the session's tiny `dvc repro` are built once. pytest 9 with pytest-xdist 3.8 drops
    the group marks silently and spreads a file over both workers: this runs the real conftest's grouping on
    a two-file suite and fails if any file's tests ran on two workers."""
    import shutil
    import sys

    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text("".join(f"def test_{i}():\n    pass\n\n\n" for i in range(8)))
    done = subprocess.run(  # xdist alone: loading every installed plugin in three processes is most of the time
        [sys.executable, "-m", "pytest", "-p", "xdist", "-n", "2", "--dist", "loadgroup", "-vv",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    workers: dict[str, set[str]] = {}
    for worker, file in re.findall(r"^\[(gw\d)\].*?(test_[ab]\.py)::", done.stdout, re.M):
        workers.setdefault(file, set()).add(worker)
    assert set(workers) == {"test_a.py", "test_b.py"}, done.stdout[-2000:]
    assert all(len(w) == 1 for w in workers.values()), workers


def test_ci_runs_both_test_tiers_and_they_split_the_suite():
    """`make test` leaves out the `heavy` end-to-end tier and `make test-heavy` runs exactly that tier; CI runs
    both, so no test is left out of CI. A heavy module is also `slow` (make test-fast skips it)."""
    make = (ROOT / "Makefile").read_text()
    recipes = dict(re.findall(r"^([\w-]+):[^\n]*\n\t([^\n]*)", make, re.M))
    pytest_cmd = re.search(r"^PYTEST := (.*)$", make, re.M).group(1)
    assert "-n 2 --dist loadgroup" in pytest_cmd
    assert recipes["test"] == '$(PYTEST) -m "not heavy"' and recipes["test-heavy"] == "$(PYTEST) -m heavy"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make test" in ci and "make test-heavy" in ci
    heavy = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        marks = re.findall(r"^pytestmark = (.*)$", path.read_text(), re.M)
        if any("mark.heavy" in m for m in marks):
            assert any("mark.slow" in m for m in marks), path
            heavy.append(path.name)
    assert heavy  # the tier is marked where the Makefile expects it
