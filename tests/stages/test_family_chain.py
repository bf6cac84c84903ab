"""The tiny chain on a tiny random model of every base family (tests/families.py): the real stage scripts
base -> train -> eval -> gate in one folder (in-process through clap.stage.main), eval and the serving
chain on both engines, whose greedy answers at f32 must be identical. The Gemma bases are given as a
pretrained model ships (no chat template), so they prompt with params' ``base.plain_chat_template``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import run_stage, tiny_retrieval, write_tiny_admitted
from families import FAMILIES, make_tiny_family

from clap import io
from clap.release.lineage import resolve

ROOT = Path(__file__).resolve().parents[2]
PRETRAINED = ("gemma2", "gemma3")  # google publishes these without a chat template (gemma-3-270m)
ENGINES = ("openvino", "torch")
B = "b"

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models on a shared 2-core machine


def _source(family: str, out: Path) -> Path:
    """The family's tiny model as a user's folder; a pretrained one without a chat template."""
    src = make_tiny_family(family, out, seed=7)
    if family in PRETRAINED:
        (src / "chat_template.jinja").unlink()
        config = io.read_json(src / "tokenizer_config.json")
        config.pop("chat_template", None)
        io.write_json(src / "tokenizer_config.json", config)
    return src


def _params(root: Path, src: Path, engine: str) -> None:
    p = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    p["base"]["model"] = str(src)
    p["train"].update(max_steps=4, torch_threads=1, lr=1e-2, save_steps=2, checkpoint_root=str(root / "ckpt"))
    p["detector"].update(probe_draw=1)
    p["chain"].update(max_new_tokens=24)
    p["chain"]["engine"]["name"] = engine
    p["eval"].update(batch_size=8, free_diagnostic_items=2)
    (root / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False), encoding="utf-8")


def _ok(done) -> None:
    assert done.returncode == 0, done.stderr[-3000:]


# the fast tier runs the chain on the two families furthest from the default base (fused projections;
# no chat template, sliding layers, q/k norms); the heavy tier the rest. Every family's engine identity
# is also checked in the fast tier at the engine level (tests/unit/model/test_engine_families.py)
FAST = ("phi3", "gemma3")


@pytest.mark.parametrize(
    "family", [f if f in FAST else pytest.param(f, marks=pytest.mark.heavy) for f in FAMILIES]
)
def test_family_runs_the_tiny_chain_with_identical_answers_on_both_engines(family, tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    src = _source(family, tmp_path / "src")
    _params(root, src, "openvino")
    stage = lambda name, *args: run_stage(name, *args, cwd=root)  # noqa: E731

    _ok(stage("base", root / "models/base", root / "metrics/base.json"))
    base = io.read_json(root / "records/base.json")
    assert base["chat_template"] == ("params" if family in PRETRAINED else "tokenizer")

    admitted = write_tiny_admitted(root / "data/admitted" / B, n_sft=8, n_probe=4, seed=0, n_combos=4)
    start = root / "records/warm_start" / f"{B}.json"
    io.write_json(start, resolve(B, "fresh", root, root / "models/adapters").record())
    adapter = root / "models/adapters" / B
    train = (root / "metrics/train" / f"{B}.json", root / "plots/train" / f"{B}.csv")
    _ok(stage("train", admitted, root / "models/base", start, adapter, *train))
    trained = io.read_flat(train[0])
    assert trained["trained"] == 1 and trained["health"] == "ok"
    # what was adapted, read from the adapter the run wrote: the family's own layer names
    layers = {"phi3": "down_proj,gate_up_proj,o_proj,qkv_proj"}.get(
        family, "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"
    )
    assert trained["lora_targets"] == layers
    assert sorted(io.read_json(adapter / "adapter_config.json")["target_modules"]) == layers.split(",")

    answers = {}
    for engine in ENGINES:
        _params(root, src, engine)
        out = root / "data/eval" / engine
        metrics = root / "metrics/eval" / f"{engine}.json"
        _ok(
            stage(
                "eval",
                admitted,
                root / "models/base",
                adapter,
                root / "releases/production.json",
                out,
                metrics,
            )
        )
        assert io.read_flat(metrics)["generation_engine"] == f"{engine}-f32"
        assert io.read_flat(metrics)["engine_fallback"] == ""  # every family's graph builds
        items = io.read_parquet(out / "items.parquet").sort_values(["model", "item_id"])
        answers[engine] = items[["model", "item_id", "output"]].to_dict("records")
    assert answers["openvino"] == answers["torch"]

    io.write_metrics_and_record(root / "admit.json", None, {"admitted": 1})
    replay = {"n_cases": 0, "A_run": 0, "B_run": 0, "cases_sha256": "c" * 64}
    io.write_metrics_and_record(root / "replay.json", None, replay)
    gate = root / "metrics/gate" / f"{B}.json"
    _ok(
        stage(
            "gate",
            root / "data/eval/openvino",
            train[0],
            train[1],
            root / "admit.json",
            root / "replay.json",
            root / "reports/gate" / B,
            gate,
        )
    )
    assert io.read_flat(gate)["decision"] in {"promote", "canary", "hold", "reject"}

    served = _served_answers(root, adapter, admitted)
    assert served["openvino"] == served["torch"]


def _served_answers(root: Path, adapter: Path, admitted: Path) -> dict[str, list]:
    """What `clap serve`'s chain answers (one request at a time, retrieval on) on each engine."""
    from clap.chain.chain import ChainParams, build_index, load_chain
    from clap.chain.grounding import answer_space
    from clap.data.normalize import normalize_params
    from clap.model.engine import EngineParams

    norm = normalize_params(root / "params.yaml")
    space, kb = answer_space(norm, norm.answer), io.read_parquet(admitted / "kb.parquet")
    out = {}
    for engine in ENGINES:
        cp = ChainParams(
            top_k=1,
            max_new_tokens=24,
            decoding="constrained",
            engine=EngineParams(engine, "f32"),
            retrieval=tiny_retrieval(),
        )
        chain = load_chain(root / "models/base", adapter, build_index(kb, cp), cp, space)
        questions = ["oee on line L3, late shift?", "scrap rate on L1?"]
        out[engine] = [
            a.generation.token_ids for q in questions for a in chain.answer([q], rag=True, batch_size=1)
        ]
    return out
