"""The writing a newcomer meets first stays short, indexed and true to the committed results."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

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


# --- The figures the docs quote are those of the committed result files -------------------------
#
# Each row: (doc, regex, expected). The regex runs on the doc with its whitespace collapsed to single
# spaces and captures the quoted figures; expected() computes them from the committed files (metrics/,
# certification records, benchmarks/results/, params.yaml), one value per group. A number agrees when it
# equals the value rounded to the decimals the doc shows; a set compares with the set of the groups.
# A re-run that changes a result fails the doc that quotes it: update the doc (or link, not quote).


def _json(rel: str) -> dict:
    return json.loads((ROOT / rel).read_text(encoding="utf-8"))


def _params() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))


def _gate(batch: str) -> dict:
    return _json(f"metrics/gate/{batch}.json")


def _metric(stage: str, batch: str) -> dict:
    return _json(f"metrics/{stage}/{batch}.json")


def _rule():
    from clap.judge.stats import Rule

    g = _params()["gate"]
    return Rule(g["alpha"], g["delta_star"], g["lcb_floor"]), g["delta_star"], g["planning_discordance"]


def _power_at_delta_star(n: int) -> float:
    from clap.judge.stats import rule_power

    rule, delta_star, discordance = _rule()
    return rule_power(n, delta_star, discordance, rule)


def _mde(n: int) -> float:
    from clap.judge.stats import rule_mde

    rule, _, discordance = _rule()
    return rule_mde(n, discordance, rule, _params()["gate"]["power"])


def _cert_run(fault: str) -> dict:
    return next(r for r in _json("reports/certification/runs.json")["runs"] if f".{fault}-" in r["run"])


def _mean_gap(batch: str) -> float:
    import csv

    with (ROOT / f"plots/train/{batch}.csv").open(encoding="utf-8") as f:
        gaps = [float(r["gap_increment"]) for r in csv.DictReader(f) if r["gap_increment"]]
    return sum(gaps) / len(gaps)


def _rejected_by(batch: str) -> set[str]:
    gate = _gate(batch)
    return {
        k.removeprefix("check_").removesuffix("_rate")
        for k, v in gate.items()
        if k.startswith("check_") and v == "reject"
    }


_TATQA_CERT = "profiles/tatqa/certification/record.json"
_SIZES = ("sft", "grpo", "eval", "probe", "replay")

FIGURES = [
    # docs/gate.md: the quality rule's power and MDE
    (
        "docs/gate.md",
        r"probability (\d\.\d+) at the demo's N = (\d+)",
        lambda: (_gate("2026-01")["rule_power_at_delta_star"], _params()["sizes"]["eval"]),
    ),
    (
        "docs/gate.md",
        r"(\d\.\d+) at TAT-QA's N = (\d+)",
        lambda: (
            _json(_TATQA_CERT)["positive_controls"][0]["rule_power_at_delta_star"],
            _json(_TATQA_CERT)["positive_controls"][0]["n_items"],
        ),
    ),
    (
        "docs/gate.md",
        r"(\d\.\d+) at N = 40, and not above about one half at any N \((\d\.\d+) at N = 300\)",
        lambda: (_power_at_delta_star(40), _power_at_delta_star(300)),
    ),
    (
        "docs/gate.md",
        r"80 % power at a true gain of (\d\.\d+) \((\d\.\d+) at N = 100, (\d\.\d+) at N = 40\)",
        lambda: (_mde(300), _gate("2026-01")["rule_mde_planned"], _mde(40)),
    ),
    (
        "docs/gate.md",
        r"`gate.planning_delta` \((\d\.\d+): (\d+) pairs\)",
        lambda: (_params()["gate"]["planning_delta"], _gate("2026-01")["rule_n_required_planned"]),
    ),
    (
        "docs/gate.md",
        r"at the demo's N = (\d+) one answer is (\d+) point",
        lambda: (_gate("2026-01")["n_items"], 100 / _gate("2026-01")["n_items"]),
    ),
    # params.yaml comments
    (
        "params.yaml",
        r"(\d\.\d+) at N = (\d+): the gate metrics' # rule_power_at_delta_star",
        lambda: (_gate("2026-01")["rule_power_at_delta_star"], _gate("2026-01")["n_items"]),
    ),
    (
        "params.yaml",
        r"N needed at discordance 0.2: (\d+)",
        lambda: (_gate("2026-01")["rule_n_required_planned"],),
    ),
    # docs/params-notes.md
    (
        "docs/params-notes.md",
        r"80 % power at a true gain of (\d\.\d+) \(N = 40\), (\d\.\d+) \(N = 100\), (\d\.\d+) \(N = 300\)",
        lambda: (_mde(40), _gate("2026-01")["rule_mde_planned"], _mde(300)),
    ),
    (
        "docs/params-notes.md",
        r"the rule promotes (\d+) % at N = 300",
        lambda: (100 * _power_at_delta_star(300),),
    ),
    (
        "docs/params-notes.md",
        r"(\d+) % at the demo's N = (\d+) \(`rule_power_at_delta_star` in `metrics/gate/<b>.json`\) and (\d+) % at N = 40",
        lambda: (
            100 * _gate("2026-01")["rule_power_at_delta_star"],
            _gate("2026-01")["n_items"],
            100 * _power_at_delta_star(40),
        ),
    ),
    # docs/profiles.md: the demo profile is params.yaml's
    (
        "docs/profiles.md",
        r"`sizes`: sft (\d+), grpo (\d+), eval (\d+), probe (\d+), replay (\d+)",
        lambda: tuple(_params()["sizes"][k] for k in _SIZES),
    ),
    (
        "docs/profiles.md",
        r"LoRA r (\d+) / alpha (\d+) on every attention and MLP projection, lr ([\d.e-]+), (\d+) epoch",
        lambda: tuple(_params()["train"][k] for k in ("lora_r", "lora_alpha", "lr", "epochs")),
    ),
    (
        "docs/profiles.md",
        r"batch (\d+) \((\d+) steps, one detector check per step\) in random order \(`length_grouping: (\w+)`",
        lambda: (
            _params()["train"]["batch_size"],
            _metric("train", "2026-01")["steps"],
            _params()["train"]["length_grouping"],
        ),
    ),
    (
        "docs/profiles.md",
        r"prompt ~(\d+) tokens, answer ~(\d+)",
        lambda: tuple(
            _metric("train", "2026-01")[k] / _metric("train", "2026-01")["examples"]
            for k in ("prompt_tokens", "completion_tokens")
        ),
    ),
    ("docs/profiles.md", r"`eval.batch_size` (\d+)", lambda: (_params()["eval"]["batch_size"],)),
    (
        "docs/profiles.md",
        r"`demo.distractors: \[(\d+), (\d+)\]`",
        lambda: tuple(_params()["demo"]["distractors"]),
    ),
    (
        "docs/profiles.md",
        r"2026-01 is promoted \(base pass (\d\.\d+) → candidate (\d\.\d+)\)",
        lambda: (_gate("2026-01")["baseline_pass_rate"], _gate("2026-01")["candidate_pass_rate"]),
    ),
    (
        "docs/profiles.md",
        r"2026-03 is rejected by the (\w+) rule \((\d\.\d+) → (\d\.\d+);",
        lambda: (
            _gate("2026-03")["rule"],
            _gate("2026-03")["baseline_pass_rate"],
            _gate("2026-03")["candidate_pass_rate"],
        ),
    ),
    # benchmarks/README.md: the committed demo
    (
        "benchmarks/README.md",
        r"with constrained decoding and (\d+) held-out items",
        lambda: (_gate("2026-01")["n_items"],),
    ),
    (
        "benchmarks/README.md",
        r"\(base pass (\d\.\d+) → candidate (\d\.\d+), McNemar b = (\d+), c = (\d+); inside",
        lambda: tuple(_gate("2026-01")[k] for k in ("baseline_pass_rate", "candidate_pass_rate", "b", "c")),
    ),
    (
        "benchmarks/README.md",
        r"base\+RAG and adapter\+RAG both get (\d\.\d+) of values right, the no-RAG conditions (\d\.\d+) and (\d\.\d+)\)",
        lambda: tuple(_metric("replay", "2026-01")[f"{k}_value_accuracy"] for k in "ACD"),
    ),
    (
        "benchmarks/README.md",
        r"adapter\+RAG both get (\d\.\d+) of values right",
        lambda: (_metric("replay", "2026-01")["B_value_accuracy"],),
    ),
    (
        "benchmarks/README.md",
        r"rejected\*\* by the gate's (\w+) rule: against the base it is worse \(pass (\d\.\d+) → (\d\.\d+), b = (\d+), c = (\d+)\) and (\d+) % of its answers",
        lambda: (
            _gate("2026-03")["rule"],
            *(_gate("2026-03")[k] for k in ("baseline_pass_rate", "candidate_pass_rate", "b", "c")),
            100 * _gate("2026-03")["hallucination_rate"],
        ),
    ),
    (
        "benchmarks/README.md",
        r"mean gap increment (-?\d\.\d+) nats, `plots/train/2026-03.csv`",
        lambda: (_mean_gap("2026-03"),),
    ),
    (
        "benchmarks/README.md",
        r"finished stable at runtime \(KL peak (\d\.\d+)\)",
        lambda: (_metric("grpo", "2026-01")["kl_peak"],),
    ),
    (
        "benchmarks/README.md",
        r"committed metrics record \(2026-01 promote, b = (\d+), c = (\d+); 2026-03 reject on (\w+):",
        lambda: (_gate("2026-01")["b"], _gate("2026-01")["c"], _gate("2026-03")["rule"]),
    ),
    (
        "benchmarks/README.md",
        r"detector is (\d\.\d+) of 2026-01's training runtime in the committed run \((\d+\.\d) of (\d+\.\d) s",
        lambda: (
            _metric("train", "2026-01")["detector_seconds"] / _metric("train", "2026-01")["train_runtime_s"],
            _metric("train", "2026-01")["detector_seconds"],
            _metric("train", "2026-01")["train_runtime_s"],
        ),
    ),
    (
        "benchmarks/README.md",
        r"median (\d\.\d+) over the pool runs",
        lambda: (_json("benchmarks/results/detector_pool.json")["detector_share_of_train_runtime_median"],),
    ),
    # docs/precision.md: today's committed demo beside the historical runs
    (
        "docs/precision.md",
        r"Today's committed fp32 demo, `metrics/gate/<b>.json`: 2026-01 promote, b = (\d+), c = (\d+); 2026-03 reject by `(\w+)`",
        lambda: (_gate("2026-01")["b"], _gate("2026-01")["c"], _gate("2026-03")["rule"]),
    ),
    # docs/calibration.md: today's certification controls
    (
        "docs/calibration.md",
        r"rejects `relabel`: alarm at step (\d+) of (\d+) \(log E (\d\.\d+) ≥ (\d\.\d+)\), rule `(\w+)`",
        lambda: tuple(
            _cert_run("relabel")[k]
            for k in (
                "detector_alarm_step",
                "planned_steps",
                "detector_max_log_e",
                "detector_log_threshold",
                "rule",
            )
        ),
    ),
    (
        "docs/calibration.md",
        r"alarms on `loss_on_prompt` \(step (\d+) of (\d+)\)",
        lambda: tuple(_cert_run("loss_on_prompt")[k] for k in ("detector_alarm_step", "planned_steps")),
    ),
    (
        "docs/calibration.md",
        r"relabel and omitted loss masking both stopped by the (\w+) \(`(\w+)`\), (\d+) of (\d+) clean runs promoted",
        lambda: (
            {c["caught_by"] for c in _json("certification/record.json")["negative_controls"]}.pop(),
            {c["rule"] for c in _json("certification/record.json")["negative_controls"]}.pop(),
            _json("certification/record.json")["summary"]["clean_release_rate"]
            * _json("certification/record.json")["summary"]["clean_runs"],
            _json("certification/record.json")["summary"]["clean_runs"],
        ),
    ),
    # docs/detector.md: which rules reject the wrong-column batch
    (
        "docs/detector.md",
        r"2026-03 is rejected by the (\w+) and (\w+) rules",
        lambda: _rejected_by("2026-03"),
    ),
]


def _agrees(quoted: str, value) -> bool:
    if isinstance(value, bool) or isinstance(value, str):
        return quoted.lower() == str(value).lower()
    if re.fullmatch(r"-?\d+", quoted):
        return int(quoted) == round(value)
    if re.fullmatch(r"-?\d+\.\d+", quoted):
        decimals = len(quoted.split(".")[1])
        return abs(float(quoted) - value) <= 0.5 * 10**-decimals + 1e-9
    return float(quoted) == float(value)


@pytest.mark.parametrize(
    ("doc", "pattern", "expected"), FIGURES, ids=[f"{d}:{p[:40]}" for d, p, _ in FIGURES]
)
def test_quoted_figures_are_the_committed_ones(doc, pattern, expected):
    text = " ".join((ROOT / doc).read_text(encoding="utf-8").split())
    found = re.search(pattern, text)
    assert found, f"{doc} no longer says /{pattern}/: update the row in FIGURES with the doc"
    want = expected()
    if isinstance(want, set):
        assert set(found.groups()) == want, (doc, found.groups(), want)
        return
    assert len(found.groups()) == len(want), (doc, pattern)
    for quoted, value in zip(found.groups(), want, strict=True):
        assert _agrees(quoted, value), f"{doc} quotes {quoted} where the committed files give {value}"


def _demo_cost_rows() -> list[list[str]]:
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    table = index.split("**What the demo costs.**", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def _minutes(cell: str) -> float:
    m, s = re.fullmatch(r"\**(\d+) min (\d+) s\**", cell).groups()
    return int(m) + int(s) / 60


def test_demo_cost_last_row_is_the_committed_run():
    """The cost table's last row is the run whose outputs are committed: its stage times are their wall_s."""
    last = _demo_cost_rows()[-1]
    for cell, stage in zip(last[4:7], ("train", "eval", "replay"), strict=True):
        shown = [int(x) for x in re.findall(r"\d+", cell)]
        assert shown == [round(_metric(stage, b)["wall_s"]) for b in ("2026-01", "2026-03")], (stage, cell)
    assert int(re.search(r"\d+", last[7]).group()) == round(_metric("grpo", "2026-01")["wall_s"])


def test_params_demo_time_covers_the_latest_runs():
    """params.yaml's demo duration spans the two latest fresh-clone `make demo` rows on AMD EPYC."""
    text = " ".join((ROOT / "params.yaml").read_text(encoding="utf-8").split())
    lo, hi = map(int, re.search(r"about (\d+)-(\d+) min on 2 cores of an AMD EPYC", text).groups())
    kind, latest = "", []
    for row in _demo_cost_rows():
        kind = kind if row[1].startswith("same kind") else row[1]
        if "AMD EPYC" in kind and "`make demo`, fresh clone" in row[2]:
            latest.append(_minutes(row[3]))
    assert len(latest) >= 2 and all(lo <= m < hi + 1 for m in latest[-2:]), (lo, hi, latest)


def test_readme_cuda_run_has_the_committed_gate_numbers():
    """README: the CUDA run got the same gate numbers and decision as the committed CPU run of 2026-01."""
    assert "same gate numbers and decision as on CPU" in README
    cuda = _json("benchmarks/results/cuda_end_to_end.json")["cuda"]
    gate = _gate("2026-01")
    for key, value in cuda.items():
        if key.startswith("gate_"):
            assert value == gate[key.removeprefix("gate_")], (key, value, gate[key.removeprefix("gate_")])


def test_readme_summary_and_ci_claims():
    """What README says the summary and pull requests do is what the code and the workflow do."""
    summary = (ROOT / "clap/judge/summary.py").read_text(encoding="utf-8")
    assert "UNCERTIFIED" in summary and "the summary marks an uncertified one" in README
    workflow = (ROOT / ".github/workflows/pr.yml").read_text(encoding="utf-8")
    for command in ("clap registry-check", "dvc repro", "clap pr-check"):
        assert command in workflow
    assert "branches: [main]" in workflow and "on pull requests to main" in README
    assert "design notes" not in README
