"""The shared entry point of the stage scripts in ``stages/``.

Every stage takes positional paths, calls one ``run`` function of its own, prints one summary
line, and exits 2 with the error (file, row, column, rule) on a :class:`ClapError` or a wrong
argument count. Keeping this here keeps each script to its paths and its call into the library.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

# glibc's mallopt parameters (malloc.h) and the largest mmap threshold it accepts on 64-bit
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20


def reuse_freed_memory() -> bool:
    """Keep freed memory in the process for the next allocation instead of returning it to the OS.

    glibc serves each allocation above its mmap threshold (128 KiB, raised on the fly up to
    32 MiB) with fresh pages and unmaps them on free, and trims the heap's free top. Torch frees
    and re-allocates the same activation, KV and logits buffers every step, so every step pays
    page faults on fresh, zeroed pages again: 4.5 million faults in one eval stage (2026-01),
    about 8 % of its wall time. With the threshold at its maximum and trimming off (above
    2 GiB free), those buffers are reused. Memory only: no result changes (eval answers
    byte-identical), peak RSS unchanged. Returns whether the allocator took the settings
    (False off glibc, where nothing is changed).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


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
    reuse_freed_memory()
    try:
        result = run(*(Path(a) for a in argv))
    except ClapError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if result is not None:
        print(describe(argv, result))
    return 0
