"""Acting on the canary analysis of the release in production: ``clap canary`` and ``clap serve``'s watcher.

:mod:`clap.release.canary` analyses (it imports no release control); this module runs the analysis
on the canary log (:func:`run_canary`) and acts on its verdict (:func:`act_on_canary`): ``rollback``
through ``clap rollback``'s path (:func:`clap.release.rollback.rollback`), ``promote`` by committing
the analysis with a ``canary`` event (:func:`commit_canary_promotion`), ``continue``: nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clap import io, vcs
from clap.errors import ClapError
from clap.release import canary as canary_mod
from clap.release.records import read_pointer
from clap.release.registry import HISTORY, LEDGER, POINTER
from clap.release.rollback import rollback
from clap.release.transaction import append_line, commit_files, file_text, locked, transaction, utc_now


def run_canary(root: Path, apply: bool, *, actor: str = "clap canary") -> dict[str, Any]:
    """Analyze the log of the canary in production and write its record and report; with ``apply``,
    act on the verdict (:func:`act_on_canary`). ``clap canary`` by hand; ``clap serve``'s watcher
    calls :func:`act_on_canary` itself.

    Returns:
        The analysis record, with ``applied`` (the rollback event, the promote commit, or None).

    Raises:
        ClapError: nothing in production is a canary, the log is missing or malformed.
    """
    root = Path(root)
    p = canary_mod.params_of(root)
    pointer = read_pointer(root)
    if pointer.get("decision") != "canary":
        raise ClapError(
            f"production serves batch {pointer.get('batch')!r} as {pointer.get('decision')!r}, not as a canary: "
            "nothing to analyze",
            file=root / POINTER,
            column="decision",
            rule="no_canary",
        )
    log = root / p.log
    if not log.exists():
        raise ClapError(
            "no canary log: `clap serve` writes one while a canary is served", file=log, rule="no_canary_log"
        )
    rec = {
        **canary_mod.report(pointer, log, canary_mod.read_log(log, pointer["adapter_sha256"]), p),
        "actor": actor,
    }
    canary_mod.write_report(root, rec)
    applied = act_on_canary(root, pointer, rec) if apply else None
    return {**rec, "applied": applied}


def act_on_canary(root: Path, pointer: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any] | str | None:
    """Act on the canary analysis ``rec`` (already written by :func:`clap.release.canary.write_report`)
    of the release ``pointer``: ``rollback`` through :func:`rollback` (previous adapter restored and
    hash-checked, a ``rollback`` event with the decision and its e-values, the analysis committed with
    it), ``promote`` through :func:`commit_canary_promotion`; ``continue``: nothing (None).

    Who acts signs nothing: neither action can put an unapproved adapter in production (a rollback
    only moves down the stack to a release approved before; a promotion leaves the pointer, approved
    as a canary, as it is), and the decision is a function of the committed analysis and the
    pre-registered params; ``canary_actor`` records who made it.
    """
    if rec["decision"] == "rollback":
        return rollback(root, canary=True)
    if rec["decision"] == "promote":
        return commit_canary_promotion(root, pointer, rec)
    return None


def commit_canary_promotion(root: Path, pointer: dict[str, Any], rec: dict[str, Any]) -> str:
    """Commit the canary analysis that promotes the release in production (it then serves all
    traffic) with a ``canary`` event in history.jsonl (decision, e-values, who acted); the commit id."""
    paths = [p for p in canary_mod.report_paths(str(pointer["batch"])) if (root / p).exists()]
    with locked(root):
        vcs.require_committed(root, [POINTER, HISTORY, LEDGER], "releases/ has uncommitted changes")
        event = canary_mod.promotion_event(root, pointer, rec, utc_now())
        with transaction(root, [HISTORY, *paths]):
            io.atomic_write_text(root / HISTORY, append_line(file_text(root / HISTORY), event))
            return commit_files(root, [HISTORY, *paths], f"canary {pointer['batch']}: promote (all traffic)")
