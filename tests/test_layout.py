"""Project layout rules: stages are leaves, params.yaml covers every stage, nothing private is tracked."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


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
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
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
    too_long = {p.name: n for p in (ROOT / "stages").glob("*.py") if (n := len(p.read_text().splitlines())) > 150}
    assert too_long == {}


def test_no_private_keys_are_tracked():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    suspicious = [f for f in files if f.endswith((".key", ".pem")) or "private" in f.lower()]
    assert suspicious == []
    marker = b"PRIVATE" + b" KEY-----"  # split so this file does not match itself
    for f in files:
        p = ROOT / f
        if p.is_file() and p.stat().st_size < 1_000_000:
            assert marker not in p.read_bytes(), f
