"""clap.progress: a bar on a terminal, plain lines (one per interval and a last one) in a log."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from clap import progress
from clap.errors import ClapError
from clap.progress import Progress, ProgressParams


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_line_format():
    assert progress.line("train 2026-01", 12, 32, "step", 0.4, 30.0, {"loss": 0.41234567}) == (
        "train 2026-01: 12/32 steps (38%), 0.4 steps/s, elapsed 0:30, ETA 0:50, loss 0.4123"
    )
    assert progress.line("replay A", 0, 40, "item", 0.0, 0.0, {}) == (
        "replay A: 0/40 items (0%), - items/s, elapsed 0:00, ETA -"
    )
    assert progress.line("x", 5, None, "request", 2.0, 3725.0, {"kl": 3}) == (
        "x: 5 requests, 2 requests/s, elapsed 1:02:05, kl 3"
    )


def test_a_log_gets_one_line_per_interval_and_a_last_one():
    out, clock = io.StringIO(), Clock()
    bar = Progress(10, "eval candidate", "item", stream=out, log_every_s=30, clock=clock)
    assert bar.mode == "lines"
    for _ in range(9):
        clock.t += 10
        bar.update()
    bar.close()
    bar.close()  # a second close writes nothing
    assert out.getvalue().splitlines() == [
        "eval candidate: 3/10 items (30%), 0.1 items/s, elapsed 0:30, ETA 1:10",
        "eval candidate: 6/10 items (60%), 0.1 items/s, elapsed 1:00, ETA 0:40",
        "eval candidate: 9/10 items (90%), 0.1 items/s, elapsed 1:30, ETA 0:10",
    ]  # the loop stopped at 9: the last line already said it, close adds none


def test_close_writes_the_end_and_a_resumed_run_counts_its_rate_from_here():
    out, clock = io.StringIO(), Clock()
    with Progress(8, "train b", "step", initial=4, stream=out, log_every_s=60, clock=clock) as bar:
        for _ in range(4):
            clock.t += 5
            bar.set(bar.n + 1, loss=0.5)
    assert out.getvalue() == "train b: 8/8 steps (100%), 0.2 steps/s, elapsed 0:20, ETA -, loss 0.5\n"


def test_interval_zero_writes_every_update_but_never_a_repeat():
    out, clock = io.StringIO(), Clock()
    bar = Progress(2, "grpo b", "step", stream=out, log_every_s=0, clock=clock)
    clock.t += 1
    bar.set(1, reward=0.25)
    bar.set(1)  # a trainer's final log: nothing new
    clock.t += 1
    bar.set(2, reward=0.5, kl=0.001)
    bar.close()
    assert [ln.split(", elapsed")[0] for ln in out.getvalue().splitlines()] == [
        "grpo b: 1/2 steps (50%), 1 steps/s",
        "grpo b: 2/2 steps (100%), 1 steps/s",
    ]
    assert out.getvalue().splitlines()[-1].endswith("reward 0.5, kl 0.001")


def test_a_terminal_gets_a_bar_and_no_plain_lines():
    out = Terminal()
    with Progress(4, "eval base", "item", stream=out, log_every_s=0) as bar:
        assert bar.mode == "bar"
        bar.update(3, loss=1.5)
    text = out.getvalue()
    assert "\r" in text and "eval base" in text and "3/4" in text and "loss=1.5" in text
    assert "items (" not in text  # no plain line


def test_unconfigured_and_not_a_terminal_writes_nothing(monkeypatch):
    monkeypatch.setattr(progress, "_log_every_s", None)
    out = io.StringIO()
    with Progress(3, "chain", "item", stream=out) as bar:
        assert bar.mode == "off"
        bar.update(3)
    assert out.getvalue() == ""


def test_configure_sets_the_interval_and_refuses_a_bad_one(monkeypatch):
    monkeypatch.setattr(progress, "_log_every_s", None)
    progress.configure(ProgressParams(log_every_s=15))
    assert progress.log_every_s() == 15.0
    assert Progress(1, "x", "item", stream=io.StringIO()).mode == "lines"
    for bad in (-1, "30", True):
        with pytest.raises(ClapError) as e:
            progress.configure(ProgressParams(log_every_s=bad))
        assert e.value.column == "progress.log_every_s"


def test_repository_params_configure_progress():
    from clap import params

    p = params.section("progress", ProgressParams)
    assert p.log_every_s > 0


def test_a_log_silences_the_hugging_face_bars():
    """In a log, transformers' and datasets' own bars ("Loading weights", "Tokenizing ...") are off."""
    code = (
        "from clap import progress\n"
        "import datasets\n"  # one imported before configure, one after: both must end up off
        "progress.configure(progress.ProgressParams(log_every_s=30))\n"
        "from transformers.utils import logging\n"
        "print(logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())\n"
    )
    env = {k: v for k, v in os.environ.items() if "PROGRESS_BARS" not in k}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.split() == ["False", "False"]
