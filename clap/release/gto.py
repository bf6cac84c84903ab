"""The registry as GTO (iterative/gto, read by DVC Studio) writes it: annotated git tags.

The N-th release registers version ``clap-adapter@vN.0.0`` on its release commit and assigns it
the ``prod`` stage (``clap-adapter#prod#<counter>``); a rollback unassigns ``prod`` from the current
version (``clap-adapter#prod!#<counter>``) and assigns it again to the version rolled back to (a
new ``#prod#<counter>`` tag on that version's commit). ``gto show`` / ``gto history`` list them.
The tags are part of the transaction (:mod:`clap.release.transaction`): a tag that cannot be
created undoes the commit, and an existing tag name is refused, never moved. Used by the release
ceremony (:mod:`clap.release.control`) and rollback (:mod:`clap.release.rollback`).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

from clap import vcs
from clap.errors import ClapError
from clap.release.registry import HISTORY, read_history

# The GTO registry (iterative/gto 1.10 tag format, gto/tag.py): one artifact, one stage.
GTO_ARTIFACT = "clap-adapter"
GTO_STAGE = "prod"


def gto_version(ordinal: int) -> str:
    """The GTO version of the ``ordinal``-th release (1-based): ``v<ordinal>.0.0``.

    Every release is a new adapter that may change answers, so each one is a new major
    version; semver order is release order and the major number is the release count.
    """
    return f"v{ordinal}.0.0"


def release_ordinal(history: list[dict[str, Any]], approval_id: str) -> int:
    """1-based position of the release of ``approval_id`` among the release events of ``history``."""
    ids = [e.get("pointer", {}).get("approval_id") for e in history if e.get("event") == "release"]
    if ids.count(approval_id) != 1:
        raise ClapError(
            f"history.jsonl has {ids.count(approval_id)} releases of approval {approval_id}, expected one",
            file=HISTORY,
            rule="inconsistent_releases",
        )
    return ids.index(approval_id) + 1


def tag_commit(root: Path, name: str) -> str | None:
    """The commit tag ``name`` points to (peeled), or None when there is no such tag."""
    out = vcs.git(root, "for-each-ref", "--format=%(objectname) %(*objectname)", f"refs/tags/{name}").split()
    return out[-1] if out else None


def next_counter(root: Path) -> int:
    """GTO numbers an artifact's tags with one counter (gto/tag.py name_tag): the highest ``#<n>`` plus one."""
    names = vcs.git(root, "tag", "--list", f"{GTO_ARTIFACT}@*", f"{GTO_ARTIFACT}#*").split()
    return max((int(m[1]) for n in names if (m := re.search(r"#(\d+)$", n))), default=0) + 1


def refuse_taken(root: Path, names: list[str]) -> None:
    taken = [n for n in names if tag_commit(root, n) is not None]
    if taken:
        raise ClapError(
            f"git tag {', '.join(taken)} already exists: registry tags are never moved or overwritten "
            "(delete it by hand only if it is not a clap release)",
            rule="tag_exists",
        )


def create_tags(root: Path, tags: list[tuple[str, str, str]]) -> list[str]:
    """Create the annotated tags ``(name, commit, message)``, all or none; an existing name is refused."""
    refuse_taken(root, [name for name, _, _ in tags])
    created: list[str] = []
    try:
        for name, commit, message in tags:
            vcs.git(root, "tag", "-a", name, "-m", message, commit)  # no -f: git refuses an existing name
            created.append(name)
    except BaseException:
        for name in created:
            with contextlib.suppress(ClapError):
                vcs.git(root, "tag", "-d", name)
        raise
    return created


def register_message(version: str, batch: str, approval_id: str) -> str:
    return (
        f"Registering artifact {GTO_ARTIFACT} version {version}\n\nbatch: {batch}\napproval: {approval_id}\n"
    )


def assign_message(version: str, detail: str) -> str:
    return f"Assigning stage {GTO_STAGE} to artifact {GTO_ARTIFACT} version {version}\n\n{detail}\n"


def unassign_tag(
    root: Path, approval_id: str, reverted: str, counter: int, detail: str
) -> list[tuple[str, str, str]]:
    """GTO's unassignment of ``prod`` from the rolled-back version (when its registration tag is on the
    reverted release commit)."""
    current = gto_version(release_ordinal(read_history(root), approval_id))
    if tag_commit(root, f"{GTO_ARTIFACT}@{current}") != reverted:
        return []
    return [
        (
            f"{GTO_ARTIFACT}#{GTO_STAGE}!#{counter}",
            reverted,
            f"Unassigning stage {GTO_STAGE} from artifact {GTO_ARTIFACT} version {current}\n\n{detail}\n",
        )
    ]
