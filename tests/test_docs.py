"""The writing a newcomer meets first stays short, indexed and true to the committed results."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_short():
    assert len(README.splitlines()) <= 200


def test_benchmarks_readme_lists_every_result():
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    for path in sorted((ROOT / "benchmarks" / "results").iterdir()):
        stem = path.name.split(".")[0]
        assert re.search(rf"\b{re.escape(stem)}\b", index), (
            f"benchmarks/README.md does not list results/{path.name}"
        )
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name != "machine.py":
            assert f"`{script.name}" in index, f"benchmarks/README.md does not list {script.name}"


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to missing {target}"


def test_readme_decisions_are_the_committed_ones():
    """The decisions README states are those metrics/gate records (and the scenario is certified)."""
    for batch, word in re.findall(r"\*\*(\d{4}-\d{2}) \([^)]*\): (\w+)\*\*", README):
        gate = json.loads((ROOT / "metrics" / "gate" / f"{batch}.json").read_text())
        assert gate["decision"] == word, (batch, gate["decision"], word)
        assert gate["certified"] == 1


def _clap_commands(lines: list[str]) -> set[str]:
    """The `clap ...` commands in shell lines, as typed: comments, `T=$(...)` wrappers and ports dropped."""
    out = set()
    for line in lines:
        line = line.split("  #", 1)[0].replace("python -m clap.cli ", "clap ")
        for part in re.split(r"\s*(?:&&|;)\s*", line):
            part = re.sub(r"^\w+=\$\((.*)\)$", r"\1", part.strip())
            if part.startswith("clap "):
                out.add(re.sub(r"--port \d+", "--port N", part.rstrip(" &")))
    return out


def test_readme_release_walkthrough_is_what_the_benchmark_ran():
    """Every `clap` command README's release block shows was run by benchmarks/release_walkthrough.py."""
    section = README.split("## Release", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    ran = json.loads((ROOT / "benchmarks/results/release_walkthrough.json").read_text(encoding="utf-8"))
    shown = _clap_commands(block)
    assert len(shown) >= 10
    assert shown <= _clap_commands([c["command"] for c in ran["commands"]]), sorted(
        shown - _clap_commands([c["command"] for c in ran["commands"]])
    )
    assert ran["problems"] == []
