"""Progress of the long loops (training, the GRPO probe, eval generation, replay) the way users expect it.

On a terminal (the stream, stderr, is a tty) a tqdm bar shows the count, rate and ETA. Anywhere else
(``dvc repro > log``, CI, a piped ``clap`` command) a bar's carriage returns would be noise in the file,
so the loop writes one plain line per interval instead, and a last one when it ends::

    train 2026-01: 12/32 steps (38%), 0.41 steps/s, elapsed 0:29, ETA 0:49, loss 0.4123

The interval is params ``progress.log_every_s``; a stage that runs such a loop reads it and calls
:func:`configure` once. A process that never configures it (``clap serve``, a benchmark, a test) writes
no plain lines; a terminal still gets the bar. Only what is printed depends on this module: nothing it
does reaches a record, a metric or a curve.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from clap.params import bad_param


@dataclass(frozen=True)
class ProgressParams:
    """params ``progress``: ``log_every_s``, seconds between two plain progress lines when stderr is not a
    terminal (0: a line at every update)."""

    log_every_s: float


_log_every_s: float | None = None


def configure(p: ProgressParams) -> None:
    """Set this process's interval of plain progress lines (params ``progress``)."""
    global _log_every_s
    if isinstance(p.log_every_s, bool) or not isinstance(p.log_every_s, (int, float)) or p.log_every_s < 0:
        raise bad_param(
            "progress.log_every_s",
            f"progress.log_every_s must be a number of seconds >= 0, got {p.log_every_s!r}",
        )
    _log_every_s = float(p.log_every_s)
    if not _isatty(sys.stderr):
        quiet_library_bars()


def quiet_library_bars() -> None:
    """Turn off the Hugging Face libraries' own tqdm bars ("Loading weights", "Tokenizing train dataset"):
    in a log each is a line of carriage-return frames. Libraries not imported yet read the environment at
    import; those already imported are told directly."""
    import os

    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers and huggingface_hub
    os.environ["HF_DATASETS_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:  # transformers asks it at import
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


def log_every_s() -> float | None:
    """The configured interval (None: not configured, no plain lines)."""
    return _log_every_s


def clock_text(seconds: float) -> str:
    """``M:SS`` (or ``H:MM:SS`` from an hour on)."""
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _value_text(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def line(
    desc: str, n: int, total: int | None, unit: str, rate: float, elapsed_s: float, postfix: dict[str, Any]
) -> str:
    """One plain progress line: ``desc: n/total units (p%), r units/s, elapsed M:SS, ETA M:SS, key value, ...``."""
    units = unit if unit.endswith("s") else f"{unit}s"
    parts = [f"{n}/{total} {units} ({100.0 * n / total:.0f}%)" if total else f"{n} {units}"]
    parts.append(f"{rate:.3g} {units}/s" if rate > 0 else f"- {units}/s")
    parts.append(f"elapsed {clock_text(elapsed_s)}")
    if total:
        parts.append(f"ETA {clock_text((total - n) / rate)}" if rate > 0 and n < total else "ETA -")
    parts.extend(f"{k} {_value_text(v)}" for k, v in postfix.items())
    return f"{desc}: " + ", ".join(parts)


class Progress:
    """Progress of one loop of ``total`` ``unit``s: a bar on a terminal, plain lines elsewhere.

    Args:
        total: units the loop will do (None: unknown).
        desc: what the loop is (``train 2026-01``, ``eval candidate``).
        unit: singular unit name (``step``, ``item``, ``request``).
        initial: units already done (a resumed run).
        leave: keep the terminal bar after the loop (plain lines are always kept).
        stream: where to write (default: the current ``sys.stderr``).
        log_every_s: seconds between plain lines (default: the configured :func:`log_every_s`).
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str,
        *,
        initial: int = 0,
        leave: bool = True,
        stream: TextIO | None = None,
        log_every_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.total, self.desc, self.unit = total, desc, unit
        self.n = self._start_n = initial
        self.postfix: dict[str, Any] = {}
        self._stream = stream if stream is not None else sys.stderr
        self._every = log_every_s if log_every_s is not None else _log_every_s
        self._clock = clock
        self._started = self._last_line = clock()
        self._printed_n = initial
        self._bar = None
        self._closed = False
        if _isatty(self._stream):
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, leave=leave, file=self._stream
            )

    @property
    def mode(self) -> str:
        """``bar`` (terminal), ``lines`` (not a terminal, interval configured) or ``off``."""
        return "bar" if self._bar is not None else ("lines" if self._every is not None else "off")

    def update(self, n: int = 1, **postfix: Any) -> None:
        """``n`` more units done; ``postfix`` values (loss, reward, ...) are shown after the counts."""
        self.set(self.n + n, **postfix)

    def set(self, n: int, **postfix: Any) -> None:
        """``n`` units done in all (a trainer's global step)."""
        self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: _value_text(v) for k, v in self.postfix.items()}, refresh=False)
            self._bar.update(n - self.n)
            self.n = n
            return
        news = n != self._printed_n or bool(postfix)
        self.n = n
        if self._every is not None and news and self._clock() - self._last_line >= self._every:
            self._write()

    def close(self) -> None:
        """End the loop: the bar closes; in a log, a last line unless the last one already said it all."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._every is not None and self.n != self._printed_n:
            self._write()

    def text(self) -> str:
        """The plain line for the current state."""
        elapsed = self._clock() - self._started
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        return line(self.desc, self.n, self.total, self.unit, rate, elapsed, self.postfix)

    def _write(self) -> None:
        print(self.text(), file=self._stream, flush=True)
        self._last_line, self._printed_n = self._clock(), self.n

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
