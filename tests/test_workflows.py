"""The GitHub workflows are valid as written: each parses, every step runs a shell script bash accepts,
every ``${{ }}`` expression names a context the runner has, every ``steps.<id>`` it reads is a step
before it, and the DVC remote a runner pulls from is configured in the workflow, not a folder beside
a developer's clone. (actionlint is not installable offline here: its PyPI package fetches a binary
from GitHub at build time.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
CONTEXTS = {"github", "env", "vars", "secrets", "steps", "runner", "job", "matrix", "inputs", "needs"}
EXPRESSION = re.compile(r"\$\{\{(.*?)\}\}", re.S)


def _steps(workflow: dict) -> list[tuple[str, list[dict]]]:
    return [(name, job.get("steps", [])) for name, job in workflow["jobs"].items()]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_parses_with_a_trigger_and_jobs(path):
    workflow = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert workflow.get(True) or workflow.get("on"), "no trigger (`on:`)"  # YAML 1.1 reads `on` as True
    assert workflow["jobs"] and all(steps for _, steps in _steps(workflow))


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_run_step_is_valid_bash(path, tmp_path):
    for job, steps in _steps(yaml.safe_load(path.read_text(encoding="utf-8"))):
        for step in steps:
            if "run" not in step:
                continue
            script = tmp_path / "step.sh"
            script.write_text(
                EXPRESSION.sub("x", step["run"]), encoding="utf-8"
            )  # the runner substitutes them
            done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
            assert done.returncode == 0, f"{path.name} {job} {step.get('name')}: {done.stderr}"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_expressions_name_known_contexts_and_earlier_steps(path):
    text = path.read_text(encoding="utf-8")
    for job, steps in _steps(yaml.safe_load(text)):
        seen: set[str] = set()
        for step in steps:
            for expr in EXPRESSION.findall(yaml.safe_dump(step)):
                names = set(re.findall(r"(?<![\w.'])([a-z_]+)(?=\.)", expr))
                assert names <= CONTEXTS, f"{job} {step.get('name')}: unknown context in {expr!r}"
                for used in re.findall(r"steps\.([\w-]+)\.", expr):
                    assert used in seen, f"{job} {step.get('name')}: reads steps.{used} before it runs"
            if "id" in step:
                seen.add(step["id"])


def test_the_pr_workflow_pulls_from_a_configured_remote():
    """A runner has no folder beside its clone: the remote comes from a repository variable, in
    .dvc/config.local, and the pull runs only when one is set (otherwise dvc repro rebuilds)."""
    steps = dict(_steps(yaml.safe_load((ROOT / ".github/workflows/pr.yml").read_text(encoding="utf-8"))))
    steps = steps["reproduce"]
    configure = next(s for s in steps if "dvc remote add" in s.get("run", ""))
    pull = next(s for s in steps if "dvc pull" in s.get("run", ""))
    assert steps.index(configure) < steps.index(pull)
    assert "--local" in configure["run"] and "vars.CLAP_DVC_REMOTE" in configure["env"]["CLAP_DVC_REMOTE"]
    assert "vars.CLAP_DVC_REMOTE" in pull["if"]
    assert "clap-dvc-remote" not in yaml.safe_dump(steps)
