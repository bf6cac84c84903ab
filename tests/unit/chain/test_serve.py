"""clap serve: release resolution and hash refusal, and the HTTP API over a real loopback server."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
from conftest import make_tiny_adapter, tiny_retrieval, write_tiny_admitted

from clap import cli, io, params
from clap.chain.chain import ChainParams
from clap.chain.serve import ServeParams, create_app, load_service, resolve_release, serving
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE, base_sha256
from clap.model.engine import EngineParams
from clap.release.canary import CanaryParams

from ..release.release_fixtures import sign_release

REPO = Path(__file__).resolve().parents[3]
CP = ChainParams(
    top_k=2,
    max_new_tokens=6,
    decoding="free",
    engine=EngineParams("torch", "f32"),
    retrieval=tiny_retrieval(),
)
NO_CANARY = CanaryParams(
    fraction=0.0, seed=0, log="logs/canary.jsonl", alpha=0.05, max_ratio=1.5, max_requests=100, watch_every=0
)
SP = ServeParams(host="127.0.0.1", port=0, unreleased="refuse", max_question_chars=200, canary=NO_CANARY)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _release(root: Path, batch: str | None, key_dir: Path | None = None) -> None:
    """Release ``batch`` as clap release records it: pointer, history with the signed approval, ledger."""
    if batch is None:
        io.write_json(root / "releases/production.json", {"batch": None})
        return
    sign_release(root, batch, key_dir or root.parent / f"{root.name}-keys", base_sha256(root / "models/base"))


@pytest.fixture(scope="module")
def repo(tiny_base, tmp_path_factory) -> Path:
    """A repository root with a tiny base, a released tiny adapter, two admitted batches and params.yaml."""
    root = tmp_path_factory.mktemp("serve")
    shutil.copytree(tiny_base, root / "models/base")
    for batch, seed in (("2026-01", 1), ("2026-02", 2)):
        write_tiny_admitted(root / "data/admitted" / batch, n_sft=2, n_probe=2, seed=seed)
        make_tiny_adapter(root / "models/base", root / "models/adapters" / batch, seed=seed)
    io.atomic_write_text(root / "params.yaml", (REPO / "params.yaml").read_text(encoding="utf-8"))
    _release(root, "2026-01")  # keys beside root: {root.name}-keys
    return root


@pytest.fixture(scope="module")
def url(repo):
    chain, served, canary = load_service(repo, SP, CP)
    assert canary is None  # a promote release: all traffic
    with serving(create_app(chain, served, SP)) as base_url:
        yield base_url


def test_health_names_the_release(url, repo):
    r = httpx.get(f"{url}/health", timeout=30)
    assert r.status_code == 200
    h = r.json()
    assert (h["serving"], h["batch"], h["kb_batch"], h["decision"], h["approval_id"]) == (
        "adapter",
        "2026-01",
        "2026-01",
        "promote",
        io.read_json(repo / "releases/production.json")["approval_id"],
    )
    assert h["adapter_sha256"] == io.sha256_file(repo / "models/adapters/2026-01" / ADAPTER_FILE)
    assert h["base_sha256"] == io.sha256_file(repo / "models/base/model.safetensors") and h["kb_docs"] == 16


def test_answer_returns_the_chain_result(url, repo):
    r = httpx.post(f"{url}/answer", json={"question": "  oee on line L3, late shift?  "}, timeout=120)
    assert r.status_code == 200
    body = r.json()
    assert body["doc_ids"][0] == "KB-oee-L3-B" and len(body["doc_ids"]) <= 2
    assert body["valid"] is (body["answer"] is not None) and isinstance(body["output"], str)
    assert body["valid"] or body["error"]
    assert body["latency_ms"] >= body["retrieval_ms"] > 0 and body["batch"] == "2026-01"


@pytest.mark.parametrize(
    "payload, needle",
    [
        ({"question": ""}, "at least 1 character"),
        ({"question": "   "}, "at least 1 character"),
        ({}, "question: Field required"),
        ({"question": 42}, "valid string"),
        ({"question": ["oee?"]}, "valid string"),
        ({"question": "x" * 201}, "at most 200 characters"),
        ({"question": "oee?", "top_k": 50}, "top_k: Extra inputs are not permitted"),
        (["oee?"], "valid dictionary"),
    ],
)
def test_bad_requests_get_a_clear_422(url, payload, needle):
    r = httpx.post(f"{url}/answer", json=payload, timeout=30)
    assert r.status_code == 422 and needle in r.json()["error"]


def test_malformed_json_and_wrong_method_are_4xx(url):
    r = httpx.post(
        f"{url}/answer", content=b'{"question": ', headers={"content-type": "application/json"}, timeout=30
    )
    assert r.status_code == 422 and "JSON decode error" in r.json()["error"]
    assert httpx.get(f"{url}/answer", timeout=30).status_code == 405


def _must_not_serve(*args, **kwargs):
    raise AssertionError("the server started despite a tampered adapter")


def test_tampered_adapter_refuses_to_start(repo, tmp_path, monkeypatch, capsys):
    root = tmp_path / "repo"
    shutil.copytree(repo, root)
    weights = root / "models/adapters/2026-01" / ADAPTER_FILE
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ClapError, match="refusing to serve.*sha256"):
        resolve_release(root, SP)
    monkeypatch.chdir(root)
    monkeypatch.setattr("uvicorn.run", _must_not_serve)
    assert cli.main(["serve", "--port", "0"]) == 2
    assert "refusing to serve" in capsys.readouterr().err


def test_tampered_config_and_missing_adapter_refuse(repo, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(repo, root)
    config = root / "models/adapters/2026-01/adapter_config.json"
    config.write_text(config.read_text().replace('"lora_alpha": 4', '"lora_alpha": 400'))
    with pytest.raises(ClapError, match="adapter_config.json has sha256"):
        resolve_release(root, SP)
    shutil.rmtree(root / "models/adapters/2026-01")
    with pytest.raises(ClapError, match="missing"):
        resolve_release(root, SP)


def test_nothing_released_refuses_or_serves_base(repo, tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(repo, root)
    _release(root, None)
    with pytest.raises(ClapError, match="nothing is released"):
        resolve_release(root, SP)
    served, adapter_dir = resolve_release(root, ServeParams("127.0.0.1", 0, "base", 200, NO_CANARY))
    assert (
        adapter_dir is None
        and served.serving == "base"
        and served.batch is None
        and served.adapter_sha256 is None
    )
    assert served.kb_batch == str(params.raw_section("batches", root / "params.yaml")[-1])
    assert "BASE model" in served.note


def test_params_refuse_nonsense():
    with pytest.raises(ClapError, match="unreleased") as e:
        ServeParams(host="127.0.0.1", port=8000, unreleased="maybe", max_question_chars=10, canary=NO_CANARY)
    assert (e.value.rule, e.value.column) == ("bad_params", "serve.unreleased")
    with pytest.raises(ClapError) as e:
        ServeParams(host="127.0.0.1", port=70000, unreleased="base", max_question_chars=10, canary=NO_CANARY)
    assert e.value.column == "serve.port"


def test_a_canary_is_served_beside_its_verified_incumbent_and_logged(repo, tmp_path):
    from clap.release import canary as C

    from ..release.release_fixtures import sign_release

    root = tmp_path / "repo"
    shutil.copytree(repo, root)
    # the fixture's approver, alone in force, approves the canary
    keys = repo.parent / f"{repo.name}-keys"
    sign_release(root, "2026-02", keys, base_sha256(root / "models/base"), decision="canary")
    p = C.CanaryParams(
        fraction=0.5,
        seed=3,
        log="logs/canary.jsonl",
        alpha=0.05,
        max_ratio=1.5,
        max_requests=100,
        watch_every=0,
    )
    sp = ServeParams("127.0.0.1", 0, "refuse", 200, p)
    chain, served, route = load_service(root, sp, CP)
    assert (served.batch, served.decision, route.incumbent_served.batch) == ("2026-02", "canary", "2026-01")
    assert route.incumbent.index is chain.index  # both arms retrieve from the canary's knowledge base
    shas = {b: io.sha256_file(root / "models/adapters" / b / ADAPTER_FILE) for b in ("2026-01", "2026-02")}
    with serving(create_app(chain, served, sp, route)) as base_url:
        assert httpx.get(f"{base_url}/health", timeout=30).json()["canary"]["incumbent"]["batch"] == "2026-01"
        bodies = [
            httpx.post(f"{base_url}/answer", json={"question": "oee on line L3?"}, timeout=120).json()
            for _ in range(6)
        ]
    rows = C.read_log(root / p.log, shas["2026-02"])
    expected = ["canary" if C.routes_to_canary(3, n, 0.5) else "incumbent" for n in range(6)]
    assert [b["arm"] for b in bodies] == [r["arm"] for r in rows] == expected
    assert {"canary", "incumbent"} == set(expected)
    assert all(r["adapter_sha256"] == shas[r["batch"]] for r in rows)
    assert all(
        r["failed"] == (not (r["parse_ok"] and r["evidence_verbatim"] and r["value_in_evidence"]))
        for r in rows
    )

    io.write_json(
        root / "reports/canary/2026-02.json", {"decision": "promote", "adapter_sha256": shas["2026-02"]}
    )
    assert load_service(root, sp, CP)[2] is None  # promoted: the canary takes all traffic
    (root / "reports/canary/2026-02.json").unlink()
    weights = root / "models/adapters/2026-01" / ADAPTER_FILE
    weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ClapError, match="refusing to serve.*incumbent adapter"):
        load_service(root, sp, CP)
