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


# --- overrides: `extends`, the merge rule, `replace`, null deletes ---------------------------------------
BASE = """\
batches: [a, b]
s:
  a: 0.5
  inner: {k: 3}
t:
  words: {x: [1], y: [2]}
  order: [1, 2, 3]
  deep: {one: {two: 2, three: 3}}
demo: {seed: 1}
"""


def _tree(tmp_path, files):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path / next(iter(files))


def test_override_merges_mappings_and_replaces_scalars_and_lists(tmp_path):
    p = _tree(
        tmp_path,
        {
            "profiles/p/params.yaml": "extends: ../../params.yaml\nbatches: [c]\ns: {inner: {k: 4}}\n"
            "t: {order: [9], deep: {one: {two: 22}}, words: {z: [3]}}\n",
            "params.yaml": BASE,
        },
    )
    data = params.load(p)
    assert "extends" not in data
    assert data["batches"] == ["c"]  # a list replaces the base's whole
    assert params.section("s", Outer, p) == Outer(a=0.5, inner=Inner(k=4))  # nested merge
    assert data["t"]["order"] == [9]
    assert data["t"]["deep"] == {"one": {"two": 22, "three": 3}}
    assert data["t"]["words"] == {"x": [1], "y": [2], "z": [3]}  # a mapping merges: the base's entries stay
    assert list(data) == ["batches", "s", "t", "demo"]  # the base's order; the base file is untouched
    assert params.load(tmp_path / "params.yaml")["batches"] == ["a", "b"]


def test_replace_takes_a_mapping_whole_and_null_deletes(tmp_path):
    p = _tree(
        tmp_path,
        {
            "p/params.yaml": "extends: ../params.yaml\nreplace: [t.words, t.deep.one]\n"
            "t: {words: {z: [3]}, deep: {one: {}}}\ndemo: null\n",
            "params.yaml": BASE,
        },
    )
    data = params.load(p)
    assert "replace" not in data and "demo" not in data
    assert data["t"] == {"words": {"z": [3]}, "order": [1, 2, 3], "deep": {"one": {}}}


def test_override_chain_applies_each_file_in_turn(tmp_path):
    p = _tree(
        tmp_path,
        {
            "a/b/params.yaml": "extends: ../params.yaml\ns: {a: 0.25}\n",
            "a/params.yaml": "extends: ../params.yaml\ns: {inner: {k: 5}}\nbatches: [m]\n",
            "params.yaml": BASE,
        },
    )
    assert params.section("s", Outer, p) == Outer(a=0.25, inner=Inner(k=5))
    assert params.load(p)["batches"] == ["m"]
    assert [layer.path for layer in params.chain(p)] == [
        p,
        tmp_path / "a/params.yaml",
        tmp_path / "params.yaml",
    ]


def test_cycle_is_an_error_naming_the_files(tmp_path):
    p = _tree(
        tmp_path,
        {"x/params.yaml": "extends: ../y/params.yaml\n", "y/params.yaml": "extends: ../x/params.yaml\n"},
    )
    with pytest.raises(ClapError) as e:
        params.load(p)
    assert e.value.rule == "params_cycle"
    assert "x/params.yaml -> " in str(e.value) and "y/params.yaml" in str(e.value)


def test_missing_base_is_an_error_naming_it_and_the_override(tmp_path):
    p = _tree(tmp_path, {"p/params.yaml": "extends: ../nowhere.yaml\nbatches: [c]\n"})
    with pytest.raises(ClapError) as e:
        params.load(p)
    assert e.value.rule == "missing_params"
    assert "nowhere.yaml" in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize(
    "override, rule, column",
    [
        ("s: {inner: {k: 1}, typo: 2}\n", "unknown_param", "s.typo"),  # built into its dataclass: named
        ("s: {inner: {kk: 1}}\n", "unknown_param", "s.inner.kk"),
        ("ss: {a: 1}\n", "unknown_section", "ss"),  # a misspelt section is not silently ignored
        ("s: {inner: null}\n", "missing_param", "s.inner"),
        ("replace: [s.a]\ns: {a: 1}\n", "bad_replace", "replace.s.a"),  # not a mapping
        ("replace: [t.words]\n", "bad_replace", "replace.t.words"),  # not set by the override
        ("extends: [x]\n", "bad_params", "extends"),
    ],
)
def test_a_bad_override_fails_naming_the_key(tmp_path, override, rule, column):
    text = override if override.startswith("extends") else "extends: ../params.yaml\n" + override
    p = _tree(tmp_path, {"p/params.yaml": text, "params.yaml": BASE})
    with pytest.raises(ClapError) as e:
        params.section("s", Outer, p)
    assert (e.value.rule, e.value.column) == (rule, column)
    assert str(p) in str(e.value)


def test_replace_needs_extends(tmp_path):
    p = _write(tmp_path, "replace: [s]\ns: {a: 1, inner: {k: 1}}\n")
    with pytest.raises(ClapError, match="replace needs extends"):
        params.load(p)


def test_load_reads_through_a_reader(tmp_path):
    files = {"prof/params.yaml": "extends: ../params.yaml\nbatches: [z]\n", "params.yaml": BASE}
    data = params.load("prof/params.yaml", read=lambda path: files[path.as_posix()])
    assert data["batches"] == ["z"] and data["s"]["a"] == 0.5


def test_key_origins_list_each_file_only_keys_it_holds(tmp_path):
    p = _tree(
        tmp_path,
        {
            "p/params.yaml": "extends: ../params.yaml\nreplace: [t.words]\nbatches: [c]\n"
            "s: {inner: {k: 4}}\nt: {words: {z: [3]}, deep: {one: {two: 22}}}\n",
            "params.yaml": BASE,
        },
    )
    layers = params.chain(p)
    got = params.key_origins(layers, ["batches", "s", "t", "demo"])
    assert got == [
        (p, ["batches", "s", "t"]),
        # t.words is replaced: nothing of the base's; t.deep.one merges: only its three comes from the base
        (tmp_path / "params.yaml", ["s.a", "t.order", "t.deep.one.three", "demo"]),
    ]
    assert params.key_origins(layers, ["s.inner.k"]) == [(p, ["s.inner.k"])]
    with pytest.raises(ClapError, match="nope"):
        params.key_origins(layers, ["nope"])


def test_bad_param_names_the_dotted_key_and_the_file():
    e = params.bad_param("gate.power", "gate: 0 < power < 1")
    assert (e.rule, e.column, e.file) == ("bad_params", "gate.power", "params.yaml")
    assert str(e) == "[file params.yaml, column 'gate.power', rule bad_params] gate: 0 < power < 1"
    assert params.bad_param("batches", "empty", "profiles/x/params.yaml").file == "profiles/x/params.yaml"


def test_check_keys_names_the_first_key_that_fails():
    params.check_keys({"s.a": True, "s.b": True}, "fine")  # nothing to raise
    with pytest.raises(ClapError) as e:
        params.check_keys({"s.a": True, "s.b": False, "s.c": False}, "s: a, b and c > 0", "p.yaml")
    assert (e.value.rule, e.value.column, e.value.file, e.value.args[0]) == (
        "bad_params",
        "s.b",
        "p.yaml",
        "s: a, b and c > 0",
    )


@pytest.mark.parametrize(
    "raw, column",
    [
        ({"a": 1, "b": 2, "typo": 3}, "s.typo"),  # an unknown key first
        ({"a": 1, "typo": 3}, "s.typo"),
        ({"a": 1}, "s.b"),  # else the missing one
        ({"a": 1, "b": 2, "note": "x"}, "s"),  # an optional key is no stray
        ([1, 2], "s"),  # not a mapping: the key itself
    ],
)
def test_stray_key_names_the_unknown_or_missing_key(raw, column):
    assert params.stray_key("s", raw, ("a", "b"), ("note",)) == column


def test_params_imports_nothing_heavy():
    """Every stage imports clap.params: it must stay a light import (no numpy, pandas, torch)."""
    import subprocess
    import sys

    code = (
        "import sys, clap.params; "
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
