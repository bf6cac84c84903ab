"""``clap serve``: the application chain over HTTP with the production adapter.

What serves is what ``releases/production.json`` names: batch ``b`` means the adapter
``models/adapters/<b>`` on ``models/base`` with the knowledge base
``data/admitted/<b>/kb.parquet``, answered by the same :class:`clap.chain.chain.Chain` the replay
stage measured. Before anything loads, the adapter's weights (and config, when the pointer
records it) are hashed and compared with the pointer: a mismatch refuses to start. Then the
pointer itself must be backed by a signed, single-use approval bound to these hashes and to the
base model's (:func:`clap.release.registry.verify_pointer`): a hand-edited pointer, however right
its hashes, refuses to start.

With nothing released (``{"batch": null}``), params ``serve.unreleased`` decides: ``refuse``
(exit with a message) or ``base`` (serve the base model with the knowledge base of the
last batch in params ``batches``; ``/health`` then says ``"serving": "base"``).

Endpoints: ``GET /health`` (the release served: batch, adapter and base sha256, decision,
approval id) and ``POST /answer`` ``{"question": "..."}`` (the parsed answer, ``valid``, the
retrieved doc ids, latency). A malformed request gets a 422 with a readable ``error``.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations at
# runtime, and the request model is built inside create_app.
import dataclasses
import threading
from pathlib import Path
from typing import Annotated, Any

from clap import io, params
from clap.chain.chain import Chain, ChainParams, build_index, load_chain
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE, base_sha256
from clap.params import bad_param, check_keys
from clap.release.registry import verify_pointer

POINTER = Path("releases/production.json")
BASE_DIR = Path("models/base")
ADAPTERS = Path("models/adapters")
ADMITTED = Path("data/admitted")
UNRELEASED = ("refuse", "base")


@dataclasses.dataclass(frozen=True)
class ServeParams:
    """Params section ``serve``."""

    host: str
    port: int
    unreleased: str
    max_question_chars: int

    def __post_init__(self) -> None:
        check_keys(
            {
                "serve.unreleased": self.unreleased in UNRELEASED,
                "serve.max_question_chars": self.max_question_chars >= 1,
                "serve.port": 0 <= self.port <= 65535,
            },
            f"serve: unreleased one of {UNRELEASED}, max_question_chars >= 1, 0 <= port <= 65535",
        )


@dataclasses.dataclass(frozen=True)
class Served:
    """What the service serves (the body of ``/health``)."""

    serving: str
    batch: str | None
    kb_batch: str
    adapter_sha256: str | None
    base_sha256: str
    decision: str | None
    approval_id: str | None
    note: str


def _check_hash(path: Path, expected: Any, what: str) -> str:
    """sha256 of ``path``; refuses (ClapError) when it differs from the pointer's ``expected``."""
    if not path.exists():
        raise ClapError(
            f"refusing to serve: the released {what} {path} is missing (run `dvc checkout` or `dvc pull`)",
            file=path,
            rule="missing_adapter",
        )
    actual = io.sha256_file(path)
    if actual != expected:
        raise ClapError(
            f"refusing to serve: {path} has sha256 {actual}, but releases/production.json says {expected} "
            f"(the file was changed after release; restore it with `dvc checkout`)",
            file=path,
            rule="adapter_hash_mismatch",
        )
    return actual


def resolve_release(root: Path, p: ServeParams) -> tuple[Served, Path | None]:
    """What to serve and the adapter folder to load (None: the base), hash- and approval-verified.

    Raises:
        ClapError: the pointer is corrupt, the adapter does not match its sha256, the pointer
            is not backed by a trusted, single-use approval bound to the adapter and base being
            loaded, or nothing is released and ``serve.unreleased`` is ``refuse``.
    """
    root = Path(root)
    pointer = io.read_json(root / POINTER) if (root / POINTER).exists() else {"batch": None}
    if not isinstance(pointer, dict) or "batch" not in pointer:
        raise ClapError("production pointer has no 'batch' key", file=root / POINTER, rule="bad_pointer")
    base = base_sha256(root / BASE_DIR)
    batch = pointer["batch"]
    if batch is None:
        return _unreleased(root, p, base), None
    if not isinstance(pointer.get("adapter_sha256"), str):
        raise ClapError(
            "production pointer names a batch but no adapter_sha256",
            file=root / POINTER,
            column="adapter_sha256",
            rule="bad_pointer",
        )
    adapter_dir = root / ADAPTERS / str(batch)
    sha = _check_hash(adapter_dir / ADAPTER_FILE, pointer["adapter_sha256"], "adapter")
    if pointer.get("adapter_config_sha256"):
        _check_hash(adapter_dir / "adapter_config.json", pointer["adapter_config_sha256"], "adapter config")
    try:
        verified = verify_pointer(root, base_sha256=base)
    except ClapError as e:
        raise ClapError(f"refusing to serve: {e.args[0]}", file=e.file, rule=e.rule) from e
    if verified is None or verified.adapter_sha256 != sha:  # the pointer changed while being read
        raise ClapError(
            "refusing to serve: releases/production.json changed during verification", rule="bad_pointer"
        )
    served = Served(
        "adapter",
        verified.batch,
        verified.batch,
        sha,
        base,
        verified.decision,
        verified.approval_id,
        f"production release of batch {batch} (approval {verified.approval_id} by {verified.approver})",
    )
    return served, adapter_dir


def _unreleased(root: Path, p: ServeParams, base: str) -> Served:
    if p.unreleased == "refuse":
        raise ClapError(
            "refusing to serve: nothing is released (releases/production.json has batch null); release a batch "
            "with `clap release`, or set params serve.unreleased: base to serve the base model",
            file=root / POINTER,
            rule="nothing_released",
        )
    batches = params.raw_section("batches", root / "params.yaml")
    if not batches:
        raise bad_param(
            "batches",
            "params batches is empty: no knowledge base to serve the base model with",
            root / "params.yaml",
        )
    kb_batch = str(batches[-1])
    return Served(
        "base",
        None,
        kb_batch,
        None,
        base,
        None,
        None,
        f"nothing released: serving the BASE model (no adapter) with the knowledge base of batch {kb_batch}",
    )


def load_service(root: Path | str, p: ServeParams, cp: ChainParams) -> tuple[Chain, Served]:
    """Resolve and verify the release, then load its chain (model + knowledge base index), decoding
    as ``chain.decoding`` says with the answer space of the project's params ``normalize``."""
    root = Path(root)
    served, adapter_dir = resolve_release(root, p)
    kb = io.read_parquet(root / ADMITTED / served.kb_batch / "kb.parquet")
    p = normalize_params(root / "params.yaml")
    space = answer_space(p, p.answer)
    return load_chain(root / BASE_DIR, adapter_dir, build_index(kb, cp), cp, space), served


def _error_text(errors: list[dict[str, Any]]) -> str:
    """Pydantic validation errors as one line: ``question: String should have at most 500 characters``."""
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(chain: Chain, served: Served, p: ServeParams):
    """The FastAPI app serving ``chain``; requests are answered one at a time (one model).

    Args:
        chain: the loaded chain (with its knowledge base index).
        served: what is served, reported by ``/health`` and every answer.
        p: serve params (the question length limit).
    """
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import ConfigDict, StringConstraints, create_model

    question = Annotated[
        str,
        StringConstraints(strict=True, strip_whitespace=True, min_length=1, max_length=p.max_question_chars),
    ]
    request_model = create_model(
        "AnswerRequest", __config__=ConfigDict(extra="forbid"), question=(question, ...)
    )
    app = FastAPI(
        title="clap",
        description="answers from the released adapter and its knowledge base (the application chain)",
    )
    lock = threading.Lock()  # one model, one generate at a time

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        return JSONResponse(
            status_code=422,
            content={
                "error": _error_text(errors),
                "detail": [{"loc": list(e.get("loc", ())), "msg": e.get("msg")} for e in errors],
            },
        )

    @app.get("/health")
    def health() -> dict[str, Any]:
        index = chain.index
        return {
            "status": "ok",
            **dataclasses.asdict(served),
            "kb_docs": len(index) if index is not None else 0,
            "top_k": chain.p.top_k,
        }

    @app.post("/answer")
    def answer(body: request_model) -> dict[str, Any]:  # type: ignore[valid-type]
        with lock:
            result = chain.answer([body.question], rag=True, batch_size=1)[0]
        return {
            "answer": result.parsed.fields if result.valid else None,
            "valid": result.valid,
            "error": result.parsed.error,
            "output": result.generation.text,
            "doc_ids": result.retrieved.doc_ids,
            "latency_ms": round(result.latency_ms, 3),
            "retrieval_ms": round(result.retrieved.retrieval_ms, 3),
            "batch": served.batch,
            "adapter_sha256": served.adapter_sha256,
        }

    return app


def serve(root: Path | str, host: str | None, port: int | None) -> None:
    """Verify the release, load the chain and serve it with uvicorn until interrupted."""
    import uvicorn

    root = Path(root)
    p = params.section("serve", ServeParams, root / "params.yaml")
    cp = params.section("chain", ChainParams, root / "params.yaml")
    chain, served = load_service(root, p, cp)
    print(
        f"serving {served.serving} ({served.note}); base {served.base_sha256[:12]}"
        + (f", adapter {served.adapter_sha256[:12]}" if served.adapter_sha256 else ""),
        flush=True,
    )
    uvicorn.run(
        create_app(chain, served, p),
        host=host or p.host,
        port=p.port if port is None else port,
        log_level="info",
    )
