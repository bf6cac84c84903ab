"""The shared entry point of the stage scripts in ``stages/``.

Every stage takes positional paths, calls one ``run`` function of its own, prints one summary
line, and exits 2 with the error (file, row, column, rule) on a :class:`ClapError` or a wrong
argument count. Keeping this here keeps each script to its paths and its call into the library.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any


def main(
    argv: Sequence[str],
    usage: str,
    arity: Collection[int],
    run: Callable[..., Any],
    describe: Callable[[Sequence[str], Any], str],
) -> int:
    """Run one stage: ``run(*paths)``, then print ``describe(argv, result)`` (skipped for None).

    Returns:
        0 on success, 2 on a usage error or a ClapError (printed to stderr as ``error: ...``).
    """
    from clap.errors import ClapError

    if len(argv) not in arity:
        print(usage, file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        result = run(*(Path(a) for a in argv))
    except ClapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(describe(argv, result))
    return 0
