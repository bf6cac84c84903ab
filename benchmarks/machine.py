"""The machine a benchmark ran on, as results record it (these machines' CPU model varies)."""

from __future__ import annotations

import os
import platform
import subprocess


def cpu_model() -> str:
    """lscpu's "Model name" (the platform string when lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")
        )
    except Exception:  # noqa: BLE001 - lscpu missing or silent: the platform string is the best we have
        return platform.processor() or platform.machine()


def machine() -> str:
    """``<cpu model>, <n> cores, load <1-min load>``."""
    return f"{cpu_model()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"


def header(command: list[str] | str) -> dict[str, str]:
    """The fields every result file starts with: commit, date (UTC), lscpu model, the command that wrote it."""
    import datetime
    import shlex

    from clap.vcs import commit_or_unknown, git_run

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirty = git_run(root, "status", "--porcelain", "-uno", text=True)
    return {  # "+dirty": tracked files differed from the commit (the change being measured, before it is committed)
        "commit": commit_or_unknown(root)[:7] + ("+dirty" if dirty.stdout.strip() else ""),
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "lscpu_model": cpu_model(),
        "command": command if isinstance(command, str) else shlex.join(command),
    }
