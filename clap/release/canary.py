"""Canary releases: a seeded share of the traffic, a log, and an anytime-valid test that ends the canary.

A release whose gate decision is ``canary`` is served beside the *incumbent* (the release in effect
before it, or the base model when it is the first): ``clap serve`` sends the n-th request to the
canary when a seeded uniform draw for n is below ``serve.canary.fraction`` and appends one row per
request to the canary log (``serve.canary.log``): the arm, its batch and adapter sha256, the latency,
and the application chain's reference-free checks (:func:`clap.task.scoring.reference_free_checks`:
the answer parses, its evidence quote is verbatim in the retrieved context, its value is in the
quote). A request *fails* when any check fails.

``clap serve`` watches its own log: after every ``serve.canary.watch_every``-th logged request it
runs the test below on the log so far and acts on a decision itself, through release control
(:func:`clap.release.canary_action.act_on_canary`: a rollback through ``clap rollback``'s path, a
promotion committed with its analysis), with no one running a command; ``clap canary`` runs the
same test by hand. This module only analyses (it imports no release control).

``clap canary`` reads the log of the canary in production and tests it sequentially. Take the
failed requests in order and let X = 1 when a failure came from the canary. Requests are routed at
random with the known share f, so for any traffic (drifting or not) a failed request is a canary
request with probability f * r / (f * r + 1 - f), where r = canary failure rate / incumbent failure
rate on that request. Two e-processes (mixtures of betting martingales over a fixed grid of stakes)
are run on X:

- **harm**: null "the canary fails no more often (r <= 1)", P(X = 1) <= f; it grows when canary
  failures come more often than f. Crossing 1/alpha: **rollback** (the canary is worse);
- **non-inferiority**: null "the canary fails at least max_ratio times as often (r >= max_ratio)",
  P(X = 1) >= q = f * max_ratio / (f * max_ratio + 1 - f); it grows when canary failures come less
  often than q. Crossing 1/alpha: **promote** (the canary is not worse by max_ratio).

By Ville's inequality each null, if true, crosses with probability at most alpha however long the log
runs and however often it is looked at (tests/unit/release/test_canary.py simulates both through
:func:`analyze`). The first crossing decides. When ``max_requests`` requests are logged without one,
the canary could not show it is not worse: rollback (inconclusive). Otherwise the verdict is
``continue``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from clap import io
from clap.errors import ClapError
from clap.params import check_keys

ARMS = ("incumbent", "canary")
DECISIONS = ("continue", "promote", "rollback")
STAKES = tuple(k / 10 for k in range(1, 10))  # fractions of the largest stake that keeps a factor >= 0
REPORTS = Path("reports/canary")
LOG_COLUMNS = (
    "n",
    "at",
    "arm",
    "batch",
    "adapter_sha256",
    "latency_ms",
    "parse_ok",
    "evidence_verbatim",
    "value_in_evidence",
    "failed",
)


@dataclasses.dataclass(frozen=True)
class CanaryParams:
    """Params section ``serve.canary``: the routing and the pre-registered test that ends a canary."""

    fraction: float  # share of requests routed to the canary; 0: serve the canary to all traffic
    seed: int  # seeds the per-request draws (request n's arm is a function of seed and n)
    log: str  # the request log, relative to the project root (JSON Lines, appended)
    alpha: float  # each test's error bound (Ville): a null crosses 1/alpha with probability <= alpha
    max_ratio: float  # promote needs evidence the canary's failure rate is < max_ratio x the incumbent's
    max_requests: int  # logged requests after which a canary without a decision is rolled back
    watch_every: (
        int  # clap serve tests the log after every k-th logged request and acts; 0: only `clap canary`
    )

    def __post_init__(self) -> None:
        check_keys(
            {
                "serve.canary.fraction": 0 <= self.fraction < 1,
                "serve.canary.alpha": 0 < self.alpha < 1,
                "serve.canary.max_ratio": self.max_ratio > 1,
                "serve.canary.max_requests": self.max_requests >= 1,
                "serve.canary.watch_every": isinstance(self.watch_every, int) and self.watch_every >= 0,
                "serve.canary.log": bool(str(self.log).strip()),
            },
            "serve.canary: 0 <= fraction < 1, 0 < alpha < 1, max_ratio > 1, max_requests >= 1, "
            "watch_every >= 0, a log path",
        )


def routes_to_canary(seed: int, n: int, fraction: float) -> bool:
    """Whether request ``n`` (0-based, counted per canary) goes to the canary: a uniform draw from the
    sha256 of (seed, n) below ``fraction``; independent of the request, reproducible from the log."""
    digest = hashlib.sha256(f"{seed}:{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


class RequestLog:
    """The canary log of one canary adapter: numbers requests and appends rows, thread-safe."""

    def __init__(self, path: Path, canary_sha256: str):
        self.path, self.canary_sha256 = Path(path), canary_sha256
        self._lock = threading.Lock()
        self.next_n = len(read_log(self.path, canary_sha256)) if self.path.exists() else 0

    def take(self) -> int:
        """The next request number."""
        with self._lock:
            n, self.next_n = self.next_n, self.next_n + 1
            return n

    def append(self, row: Mapping[str, Any]) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({**row, "canary_sha256": self.canary_sha256}, sort_keys=True) + "\n")

    def rows(self) -> list[dict[str, Any]]:
        """This canary's rows as :func:`read_log` reads them, never a half-written line (under the lock)."""
        with self._lock:
            return read_log(self.path, self.canary_sha256)


def log_row(
    n: int,
    arm: str,
    batch: str | None,
    adapter_sha256: str | None,
    latency_ms: float,
    checks: Mapping[str, bool],
) -> dict[str, Any]:
    """One request as the canary log keeps it (no question text: the log may leave the service)."""
    return {
        "n": n,
        "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "arm": arm,
        "batch": batch,
        "adapter_sha256": adapter_sha256,
        "latency_ms": round(float(latency_ms), 3),
        "parse_ok": bool(checks["parse_ok"]),
        "evidence_verbatim": bool(checks["evidence_verbatim"]),
        "value_in_evidence": bool(checks["value_in_evidence"]),
        "failed": not checks["ok"],
    }


def read_log(path: Path, canary_sha256: str) -> list[dict[str, Any]]:
    """The rows of ``path`` logged while ``canary_sha256`` was the canary, in request order.

    Raises:
        ClapError: a line that is not a JSON object with every log column, or request numbers that
            are not 0, 1, 2, ... (a lost or duplicated row would bias the test).
    """
    rows = []
    for i, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ClapError(f"not JSON: {e.msg}", file=path, row=i, rule="bad_canary_log") from e
        missing = [c for c in (*LOG_COLUMNS, "canary_sha256") if not isinstance(row, dict) or c not in row]
        if missing:
            raise ClapError(f"missing {missing}", file=path, row=i, column=missing[0], rule="bad_canary_log")
        if row["canary_sha256"] == canary_sha256:
            if row["arm"] not in ARMS:
                raise ClapError(
                    f"arm {row['arm']!r} is not one of {ARMS}",
                    file=path,
                    row=i,
                    column="arm",
                    rule="bad_canary_log",
                )
            rows.append(row)
    rows.sort(key=lambda r: r["n"])
    if [r["n"] for r in rows] != list(range(len(rows))):
        raise ClapError(
            f"the requests of canary {canary_sha256[:12]} are not numbered 0..{len(rows) - 1}: rows lost or duplicated",
            file=path,
            column="n",
            rule="bad_canary_log",
        )
    return rows


def e_process(x: Sequence[int], p0: float, upper: bool) -> np.ndarray:
    """The e-value after each observation of a mixture of betting martingales testing a Bernoulli mean.

    ``upper``: the null is P(X = 1) <= p0 (bets that X exceeds p0); else P(X = 1) >= p0. Each
    component multiplies 1 + lambda (X - p0) (or 1 + lambda (p0 - X)) with a fixed stake lambda,
    a fraction (:data:`STAKES`) of the largest stake that keeps every factor >= 0; under the null
    each is a nonnegative supermartingale, so their average is too.
    """
    if not 0 < p0 < 1:
        raise ValueError(f"p0 must be in (0, 1), got {p0}")
    x = np.asarray(x, dtype=float)
    sign, top = (1.0, 1 / p0) if upper else (-1.0, 1 / (1 - p0))
    stakes = np.asarray(STAKES)[:, None] * top
    log_wealth = np.cumsum(np.log1p(stakes * sign * (x[None, :] - p0)), axis=1)
    return np.exp(log_wealth).mean(axis=0) if len(x) else np.zeros(0)


def non_inferiority_share(fraction: float, max_ratio: float) -> float:
    """P(a failed request is a canary request) when the canary fails ``max_ratio`` times as often."""
    return fraction * max_ratio / (fraction * max_ratio + 1 - fraction)


def analyze(rows: Sequence[Mapping[str, Any]], p: CanaryParams) -> dict[str, Any]:
    """The sequential test over the log rows of one canary (request order), and its verdict."""
    if not 0 < p.fraction < 1:
        raise ClapError(
            "serve.canary.fraction is 0: no request was routed at random, nothing to test", rule="no_canary"
        )
    failures = [r for r in rows if r["failed"]]
    x = [int(r["arm"] == "canary") for r in failures]
    q = non_inferiority_share(p.fraction, p.max_ratio)
    harm, ni = e_process(x, p.fraction, upper=True), e_process(x, q, upper=False)
    threshold = 1 / p.alpha
    decision, reason, at = "continue", "no test has crossed 1/alpha yet", None
    crossed = np.flatnonzero((harm >= threshold) | (ni >= threshold))
    if len(crossed):
        i = int(crossed[0])
        at = int(failures[i]["n"])
        if harm[i] >= threshold:
            decision, reason = (
                "rollback",
                f"harm e-value {harm[i]:.1f} >= 1/alpha = {threshold:g}: the canary fails more often",
            )
        else:
            decision, reason = (
                "promote",
                (
                    f"non-inferiority e-value {ni[i]:.1f} >= 1/alpha = {threshold:g}: the canary fails less than "
                    f"{p.max_ratio:g}x as often as the incumbent"
                ),
            )
    elif len(rows) >= p.max_requests:
        decision, reason = (
            "rollback",
            f"{len(rows)} requests (max_requests {p.max_requests}) without a decision: inconclusive",
        )
    return {
        "decision": decision,
        "reason": reason,
        "decided_at_request": at,
        "requests": len(rows),
        "failures": len(failures),
        "harm_e_value": float(harm[-1]) if len(harm) else 1.0,
        "non_inferiority_e_value": float(ni[-1]) if len(ni) else 1.0,
        "harm_e_max": float(harm.max()) if len(harm) else 1.0,
        "non_inferiority_e_max": float(ni.max()) if len(ni) else 1.0,
        "null_canary_share_of_failures": {"harm": p.fraction, "non_inferiority": q},
        "arms": {arm: _arm_summary([r for r in rows if r["arm"] == arm]) for arm in ARMS},
    }


def _arm_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    latency = np.asarray([r["latency_ms"] for r in rows], dtype=float)
    n = len(rows)
    rate = {
        c: (sum(bool(r[c]) for r in rows) / n if n else None)
        for c in ("failed", "parse_ok", "evidence_verbatim", "value_in_evidence")
    }
    return {
        "requests": n,
        "failure_rate": rate["failed"],
        "parse_rate": rate["parse_ok"],
        "evidence_verbatim_rate": rate["evidence_verbatim"],
        "value_in_evidence_rate": rate["value_in_evidence"],
        "latency_p50_ms": float(np.percentile(latency, 50)) if n else None,
        "latency_p95_ms": float(np.percentile(latency, 95)) if n else None,
        "batches": sorted({"base" if r["batch"] is None else str(r["batch"]) for r in rows}),
    }


def report(
    pointer: Mapping[str, Any], log: Path, rows: Sequence[Mapping[str, Any]], p: CanaryParams
) -> dict[str, Any]:
    """The canary's analysis record: what was tested (the release, the log's sha256, the params) and the verdict."""
    return {
        "batch": pointer["batch"],
        "adapter_sha256": pointer["adapter_sha256"],
        "approval_id": pointer.get("approval_id"),
        "log": p.log,
        "log_sha256": io.sha256_file(log),
        "params": dataclasses.asdict(p),
        **analyze(rows, p),
    }


def render(rec: Mapping[str, Any]) -> str:
    """The analysis record as a short markdown report (reviewed in the pull request that ends the canary)."""
    lines = [
        f"# canary {rec['batch']}: {rec['decision']}",
        "",
        f"{rec['reason']}"
        + (f" (at request {rec['decided_at_request']})" if rec["decided_at_request"] is not None else "")
        + ".",
        "",
        f"Adapter sha256 {rec['adapter_sha256'][:12]}, approval {rec['approval_id']}; log `{rec['log']}` "
        f"(sha256 {rec['log_sha256'][:12]}): {rec['requests']} requests, {rec['failures']} failed.",
        "",
        "| arm | requests | failure rate | parses | evidence verbatim | value in evidence | latency p50 / p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        a = rec["arms"][arm]
        cells = [
            _rate(a[k])
            for k in ("failure_rate", "parse_rate", "evidence_verbatim_rate", "value_in_evidence_rate")
        ]
        latency = (
            "—" if a["latency_p50_ms"] is None else f"{a['latency_p50_ms']:.0f} / {a['latency_p95_ms']:.0f}"
        )
        lines.append(
            f"| {arm} ({', '.join(a['batches']) or '—'}) | {a['requests']} | "
            + " | ".join(cells)
            + f" | {latency} |"
        )
    pr = rec["params"]
    lines += [
        "",
        f"Pre-registered (params serve.canary): fraction {pr['fraction']:g}, alpha {pr['alpha']:g}, max_ratio "
        f"{pr['max_ratio']:g}, max_requests {pr['max_requests']}. E-values now: harm {rec['harm_e_value']:.3g} (max "
        f"{rec['harm_e_max']:.3g}), non-inferiority {rec['non_inferiority_e_value']:.3g} (max {rec['non_inferiority_e_max']:.3g}); "
        "either crossing 1/alpha decides (clap/release/canary.py).",
    ]
    return "\n".join(lines) + "\n"


def _rate(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def report_paths(batch: str) -> tuple[Path, Path]:
    """Where the analysis of ``batch``'s canary is written (JSON record, markdown report)."""
    return REPORTS / f"{batch}.json", REPORTS / f"{batch}.md"


def promoted(root: Path, pointer: Mapping[str, Any]) -> bool:
    """Whether the canary in ``pointer`` ended with a committed-to-disk ``promote`` analysis of this very adapter."""
    path = Path(root) / report_paths(str(pointer.get("batch")))[0]
    if not path.exists():
        return False
    rec = io.read_json(path)
    return rec.get("decision") == "promote" and rec.get("adapter_sha256") == pointer.get("adapter_sha256")


def rollback_evidence(root: Path, pointer: Mapping[str, Any]) -> dict[str, Any]:
    """What a rollback on a canary breach records: the analysis it acts on (sha256 of record and log).

    Raises:
        ClapError: no analysis of the canary in production, or its verdict is not rollback.
    """
    record, _ = report_paths(str(pointer["batch"]))
    if not (Path(root) / record).exists():
        raise ClapError(
            f"no canary analysis of batch {pointer['batch']}: run `clap canary` first",
            file=Path(root) / record,
            rule="no_canary_analysis",
        )
    rec = io.read_json(Path(root) / record)
    if rec.get("adapter_sha256") != pointer.get("adapter_sha256") or rec.get("decision") != "rollback":
        raise ClapError(
            f"the canary analysis of batch {pointer['batch']} says {rec.get('decision')!r} about adapter "
            f"{str(rec.get('adapter_sha256'))[:12]}, not rollback of the adapter in production",
            file=Path(root) / record,
            column="decision",
            rule="not_a_rollback",
        )
    return {
        "reason": f"canary {pointer['batch']}: {rec['reason']}",
        "canary_record_sha256": io.sha256_file(Path(root) / record),
        **decision_fields(rec),
    }


def decision_fields(rec: Mapping[str, Any]) -> dict[str, Any]:
    """What the release history keeps of a canary decision: the log it was made on, where it was
    made, both e-values and who acted (``actor``: ``clap serve`` or ``clap canary``)."""
    return {
        "canary_log_sha256": rec["log_sha256"],
        "canary_decided_at_request": rec["decided_at_request"],
        "canary_requests": rec["requests"],
        "harm_e_value": rec["harm_e_value"],
        "non_inferiority_e_value": rec["non_inferiority_e_value"],
        "canary_actor": rec.get("actor", "clap canary"),
    }


def promotion_event(
    root: Path, pointer: Mapping[str, Any], rec: Mapping[str, Any], at: str
) -> dict[str, Any]:
    """The history event of a canary promoted (the pointer is unchanged: the release was approved as a
    canary, and its pre-registered test ended it)."""
    return {
        "event": "canary",
        "decision": "promote",
        "batch": pointer["batch"],
        "approval_id": pointer.get("approval_id"),
        "adapter_sha256": pointer["adapter_sha256"],
        "reason": f"canary {pointer['batch']}: {rec['reason']}",
        "canary_record_sha256": io.sha256_file(Path(root) / report_paths(str(pointer["batch"]))[0]),
        **decision_fields(rec),
        "at": at,
    }


def params_of(root: Path) -> CanaryParams:
    """Params ``serve.canary`` of the project at ``root``."""
    from clap import params

    raw = params.raw_section("serve", Path(root) / "params.yaml")
    return params.build(
        CanaryParams, (raw or {}).get("canary"), where="serve.canary", file=Path(root) / "params.yaml"
    )


def write_report(root: Path, rec: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write the analysis record and its markdown report; their repository paths."""
    json_path, md_path = report_paths(str(rec["batch"]))
    io.write_json(Path(root) / json_path, dict(rec))
    io.atomic_write_text(Path(root) / md_path, render(rec))
    return json_path, md_path
