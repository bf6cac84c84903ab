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

A release whose decision is ``canary`` is served beside the incumbent (the release in effect before
it, its adapter hash-checked the same way, or the base model when it is the first), on the canary's
knowledge base: a seeded share ``serve.canary.fraction`` of the requests goes to the canary and every
request is logged (:mod:`clap.release.canary`). With ``serve.canary.watch_every`` > 0 a watcher
(:class:`CanaryWatcher`) tests the log after every k-th request and acts on a decision itself:
rollback (the incumbent then answers everything) or promotion (the canary does), committed through
release control; otherwise ``clap canary`` tests it by hand. A canary whose analysis says
``promote`` (``reports/canary/<batch>.json``, about this adapter) serves all traffic; so does any
release when ``serve.canary.fraction`` is 0.

Endpoints: ``GET /health`` (the release served: batch, adapter and base sha256, decision,
approval id) and ``POST /answer`` ``{"question": "..."}`` (the parsed answer, ``valid``, the
retrieved doc ids, latency). A malformed request gets a 422 with a readable ``error``.
"""

# No ``from __future__ import annotations`` here: FastAPI reads the endpoint annotations at
# runtime, and the request model is built inside create_app.
import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from clap import io, params
from clap.chain.chain import Chain, ChainParams, build_index, load_chain
from clap.chain.grounding import answer_space
from clap.data.normalize import normalize_params
from clap.errors import ClapError
from clap.model.base import ADAPTER_FILE, base_sha256
from clap.params import bad_param, check_keys
from clap.release import canary as canary_mod
from clap.release.canary import CanaryParams, RequestLog
from clap.release.registry import (
    HISTORY,
    read_pointer_file,
    release_stack,
    verified_history,
    verify_pointer,
)
from clap.task.scoring import ScoringParams, reference_free_checks, scoring_params

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
    canary: CanaryParams

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


def _check_hash(path: Path, expected: Any, what: str, source: str = "releases/production.json") -> str:
    """sha256 of ``path``; refuses (ClapError) when it differs from ``expected``, the hash ``source`` records."""
    if not path.exists():
        raise ClapError(
            f"refusing to serve: the released {what} {path} is missing (run `dvc checkout` or `dvc pull`)",
            file=path,
            rule="missing_adapter",
        )
    actual = io.sha256_file(path)
    if actual != expected:
        raise ClapError(
            f"refusing to serve: the {what} {path} has sha256 {actual}, but {source} says {expected} "
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


class CanaryWatcher:
    """Runs the canary's sequential test as requests arrive and acts on its decision, once.

    After every ``serve.canary.watch_every``-th logged request the log so far is analysed
    (:func:`clap.release.canary.analyze`, the test `clap canary` runs); a ``rollback`` or ``promote``
    is written as the analysis report and acted on by ``act`` (release control: the rollback path or
    the committed promotion) in a thread of its own, so no request waits for git or DVC. From the
    decision on, every request goes to the arm that stays (the incumbent after a rollback, the canary
    after a promotion) and nothing more is logged. The decision and its e-values are printed to the
    serve log and recorded in the release history by ``act``.
    """

    def __init__(self, root: Path, pointer: dict[str, Any], act: Any, emit: Any = None):
        self.root, self.pointer, self.act = Path(root), pointer, act
        self.emit = emit if emit is not None else (lambda line: print(line, flush=True))
        self.decision: str | None = None  # rollback / promote once decided
        self.record: dict[str, Any] | None = None
        self.applied: Any = None
        self.error: str | None = None
        self.done = threading.Event()  # set once the action finished (or failed)
        self._lock = threading.Lock()

    def after(self, n: int, log: RequestLog, p: CanaryParams) -> None:
        """Request ``n`` was logged: test the log when it is a k-th request and nothing is decided yet."""
        if p.watch_every == 0 or (n + 1) % p.watch_every or self.decision is not None:
            return
        with self._lock:
            if self.decision is not None:
                return
            rows = log.rows()
            rec = canary_mod.analyze(rows, p)
            if rec["decision"] == "continue":
                return
            rec = {**canary_mod.report(self.pointer, log.path, rows, p), "actor": "clap serve"}
            self.decision, self.record = rec["decision"], rec
        canary_mod.write_report(self.root, rec)
        self.emit(
            f"canary {self.pointer['batch']}: {rec['decision']} at request {rec['decided_at_request']} of "
            f"{rec['requests']} ({rec['reason']}; harm e-value {rec['harm_e_value']:.3g}, non-inferiority "
            f"e-value {rec['non_inferiority_e_value']:.3g}): acting without a command"
        )
        threading.Thread(target=self._act, args=(rec,), daemon=True).start()

    def _act(self, rec: dict[str, Any]) -> None:
        try:
            self.applied = self.act(self.root, self.pointer, rec)
            commit = self.applied["release_commit"] if isinstance(self.applied, dict) else self.applied
            self.emit(f"canary {self.pointer['batch']}: {rec['decision']} committed ({str(commit)[:12]})")
        except Exception as e:  # noqa: BLE001 - reported in /health and the serve log; serving goes on
            self.error = str(e)
            self.emit(f"canary {self.pointer['batch']}: acting on {rec['decision']} failed: {e}")
        finally:
            self.done.set()

    def health(self) -> dict[str, Any]:
        return {
            "watch": "decided" if self.decision else "watching",
            "decision": self.decision,
            "applied": (
                self.applied.get("release_commit") if isinstance(self.applied, dict) else self.applied
            ),
            "error": self.error,
        }


@dataclasses.dataclass(frozen=True)
class CanaryRoute:
    """A canary in production: the incumbent it is compared with, the routing, the request log and,
    with ``serve.canary.watch_every`` > 0, the watcher that ends it."""

    incumbent: Chain
    incumbent_served: Served
    p: CanaryParams
    log: RequestLog
    scoring: ScoringParams
    watcher: CanaryWatcher | None = None

    def health(self) -> dict[str, Any]:
        """What ``/health`` says of the canary."""
        return {
            "fraction": self.p.fraction,
            "incumbent": dataclasses.asdict(self.incumbent_served),
            "log": str(self.log.path),
            "requests_logged": self.log.next_n,
            **({"watcher": self.watcher.health()} if self.watcher is not None else {}),
        }

    def pick(self, canary: Chain, canary_served: Served) -> tuple[int, str, Chain, Served]:
        """The next request's number (-1: not logged, the canary is decided), arm and the chain (and its
        release) that answers it."""
        decided = self.watcher.decision if self.watcher is not None else None
        if decided == "rollback":
            return -1, "production", self.incumbent, self.incumbent_served
        if decided == "promote":
            return -1, "production", canary, canary_served
        n = self.log.take()
        if canary_mod.routes_to_canary(self.p.seed, n, self.p.fraction):
            return n, "canary", canary, canary_served
        return n, "incumbent", self.incumbent, self.incumbent_served

    def record(self, n: int, arm: str, who: Served, result: Any) -> None:
        """Log request ``n``: its arm, release, latency and the chain's reference-free checks; then let
        the watcher test the log."""
        if n < 0:
            return
        checks = reference_free_checks(result.parsed, result.context, self.scoring)
        self.log.append(canary_mod.log_row(n, arm, who.batch, who.adapter_sha256, result.latency_ms, checks))
        if self.watcher is not None:
            self.watcher.after(n, self.log, self.p)


def incumbent_of(root: Path, served: Served) -> tuple[Served, Path | None]:
    """The release in effect before the canary ``served`` (history verified, its adapter hash-checked),
    or the base model when the canary is the first release; on the canary's knowledge base."""
    stack = release_stack(verified_history(root))
    at = [e.get("approval_id") for e in stack].index(served.approval_id) if served.approval_id else -1
    stack = stack[: at + 1]  # the releases above the pointer were rolled back by `git revert`
    if len(stack) < 2:
        note = f"incumbent of canary {served.batch}: the base model (no release before it)"
        return Served("base", None, served.kb_batch, None, served.base_sha256, None, None, note), None
    before = stack[-2]
    adapter_dir = root / ADAPTERS / str(before["batch"])
    source = f"its release event in {HISTORY}"
    sha = _check_hash(adapter_dir / ADAPTER_FILE, before["adapter_sha256"], "incumbent adapter", source)
    if before.get("adapter_config_sha256"):
        _check_hash(
            adapter_dir / "adapter_config.json",
            before["adapter_config_sha256"],
            "incumbent adapter config",
            source,
        )
    note = f"incumbent of canary {served.batch}: release of batch {before['batch']} (approval {before['approval_id']})"
    served_before = Served(
        "adapter",
        str(before["batch"]),
        served.kb_batch,
        sha,
        served.base_sha256,
        before.get("decision"),
        before.get("approval_id"),
        note,
    )
    return served_before, adapter_dir


def canary_active(root: Path, served: Served, p: ServeParams) -> bool:
    """Whether ``served`` is a canary still under test: decision canary, routing on, not yet promoted."""
    if served.decision != "canary" or p.canary.fraction == 0:
        return False
    return not canary_mod.promoted(root, {"batch": served.batch, "adapter_sha256": served.adapter_sha256})


def load_service(
    root: Path | str, p: ServeParams, cp: ChainParams
) -> tuple[Chain, Served, CanaryRoute | None]:
    """Resolve and verify the release, then load its chain (model + knowledge base index), decoding
    as ``chain.decoding`` says with the answer space of the project's params ``normalize``; with a
    canary under test, the incumbent's chain too (on the same index)."""
    root = Path(root)
    served, adapter_dir = resolve_release(root, p)
    kb = io.read_parquet(root / ADMITTED / served.kb_batch / "kb.parquet")
    norm = normalize_params(root / "params.yaml")
    space = answer_space(norm, norm.answer)
    index = build_index(kb, cp)
    chain = load_chain(root / BASE_DIR, adapter_dir, index, cp, space)
    if not canary_active(root, served, p):
        return chain, served, None
    incumbent, incumbent_dir = incumbent_of(root, served)
    route = CanaryRoute(
        load_chain(root / BASE_DIR, incumbent_dir, index, cp, space),
        incumbent,
        p.canary,
        RequestLog(root / p.canary.log, str(served.adapter_sha256)),
        scoring_params(root / "params.yaml"),
        watcher_of(root) if p.canary.watch_every else None,
    )
    return chain, served, route


def watcher_of(root: Path) -> CanaryWatcher:
    """The watcher of the canary in production, acting through release control
    (:func:`clap.release.control.act_on_canary`)."""
    from clap.release.control import act_on_canary

    return CanaryWatcher(root, read_pointer_file(root), act_on_canary)


def _error_text(errors: list[dict[str, Any]]) -> str:
    """Pydantic validation errors as one line: ``question: String should have at most 500 characters``."""
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(chain: Chain, served: Served, p: ServeParams, canary: CanaryRoute | None = None):
    """The FastAPI app serving ``chain``; requests are answered one at a time (one model at a time).

    Args:
        chain: the loaded chain (with its knowledge base index) of the release in production.
        served: what is served, reported by ``/health`` and every answer.
        p: serve params (the question length limit).
        canary: with a canary under test, the incumbent's chain, the routing and the request log:
            each request goes to one arm (:func:`clap.release.canary.routes_to_canary`) and is logged.
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
    lock = threading.Lock()  # one generate at a time

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
        body = {
            "status": "ok",
            **dataclasses.asdict(served),
            "kb_docs": len(index) if index is not None else 0,
            "top_k": chain.p.top_k,
        }
        if canary is not None:
            body["canary"] = canary.health()
        return body

    @app.post("/answer")
    def answer(body: request_model) -> dict[str, Any]:  # type: ignore[valid-type]
        n, arm, use, who = (-1, "production", chain, served) if canary is None else canary.pick(chain, served)
        with lock:
            result = use.answer([body.question], rag=True, batch_size=1)[0]
        if canary is not None:
            canary.record(n, arm, who, result)
        return {
            "answer": result.parsed.fields if result.valid else None,
            "valid": result.valid,
            "error": result.parsed.error,
            "output": result.generation.text,
            "doc_ids": result.retrieved.doc_ids,
            "latency_ms": round(result.latency_ms, 3),
            "retrieval_ms": round(result.retrieved.retrieval_ms, 3),
            "batch": who.batch,
            "adapter_sha256": who.adapter_sha256,
            "arm": arm,
        }

    return app


def serve(root: Path | str, host: str | None, port: int | None) -> None:
    """Verify the release, load the chain and serve it with uvicorn until interrupted."""
    import uvicorn

    root = Path(root)
    p = params.section("serve", ServeParams, root / "params.yaml")
    cp = params.section("chain", ChainParams, root / "params.yaml")
    chain, served, canary = load_service(root, p, cp)
    print(
        f"serving {served.serving} ({served.note}); base {served.base_sha256[:12]}"
        + (f", adapter {served.adapter_sha256[:12]}" if served.adapter_sha256 else ""),
        flush=True,
    )
    if canary is not None:
        print(
            f"canary: {canary.p.fraction:.0%} of requests to {served.batch}, the rest to the "
            f"{canary.incumbent_served.note}; requests logged to {canary.log.path} "
            + (
                f"and tested after every {canary.p.watch_every} (serve.canary.watch_every): a decision is acted on here"
                if canary.watcher is not None
                else "(`clap canary` tests them)"
            ),
            flush=True,
        )
    uvicorn.run(
        create_app(chain, served, p, canary),
        host=host or p.host,
        port=p.port if port is None else port,
        log_level="info",
    )


@contextlib.contextmanager
def serving(app, start_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a thread; yield its base URL.

    For a process that is its own client (tests, benchmarks, an embedding application). The server
    is always stopped on exit.

    Raises:
        ClapError: the server did not start within ``start_timeout_s`` or did not stop within 30 s.
    """
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ClapError(
                    f"the server did not start within {start_timeout_s:.0f} s", rule="serve_start"
                )
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
    if thread.is_alive():
        raise ClapError("the server did not stop within 30 s", rule="serve_stop")
