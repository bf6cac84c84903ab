"""clap.params: strict sections, no silent defaults."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from clap import params
from clap.errors import ClapError


@dataclass(frozen=True)
class Inner:
    k: int


@dataclass(frozen=True)
class Outer:
    a: float
    inner: Inner


def _write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(text)
    return p


def test_section_builds_nested_dataclasses(tmp_path):
    p = _write(tmp_path, "s:\n  a: 0.5\n  inner: {k: 3}\n")
    assert params.section("s", Outer, p) == Outer(a=0.5, inner=Inner(k=3))


@pytest.mark.parametrize(
    "text, rule, column",
    [
        ("s:\n  a: 1\n  inner: {k: 1}\n  typo: 2\n", "unknown_param", "s.typo"),
        ("s:\n  a: 1\n", "missing_param", "s.inner"),
        ("s:\n  a: 1\n  inner: {}\n", "missing_param", "s.inner.k"),
        ("other: {}\n", "missing_section", "s"),
        ("s: [1, 2\n", "bad_yaml", None),
    ],
)
def test_bad_params_name_the_key(tmp_path, text, rule, column):
    p = _write(tmp_path, text)
    with pytest.raises(ClapError) as e:
        params.section("s", Outer, p)
    assert e.value.rule == rule
    assert e.value.column == column
    assert str(p) in str(e.value)


def test_repository_params_file_loads():
    data = params.load()
    assert isinstance(data["batches"], list) and data["batches"]
