"""params.yaml is the only home of every knob: this module reads it, nothing else defaults.

Each module that needs a section declares a frozen dataclass for it next to the code that
uses it and calls :func:`section`. A missing or unknown key is an error that names
params.yaml and the key, so a typo can never silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from clap.errors import ClapError

T = TypeVar("T")
DEFAULT_PATH = Path("params.yaml")
# libyaml's parser under PyYAML's safe constructor and resolver (the same documents, ~10x faster: a stage
# reads params.yaml once per section); PyYAML's pure-Python SafeLoader where PyYAML was built without libyaml
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, on libyaml when PyYAML has it."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


def load(path: Path | str = DEFAULT_PATH) -> dict[str, Any]:
    """Read the whole params file."""
    path = Path(path)
    if not path.exists():
        raise ClapError(
            "params file not found (run from the repository root)", file=path, rule="missing_params"
        )
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ClapError(f"params file is not valid YAML: {e}", file=path, rule="bad_yaml") from e
    if not isinstance(data, dict):
        raise ClapError("params file must be a mapping of sections", file=path, rule="bad_params")
    return data


def raw_section(name: str, path: Path | str = DEFAULT_PATH) -> dict[str, Any]:
    """One section as a plain dict (error if absent)."""
    data = load(path)
    if name not in data:
        raise ClapError(f"params section {name!r} is missing", file=path, column=name, rule="missing_section")
    return data[name]


def build(cls: type[T], raw: Any, *, where: str = "params", file: Path | str = DEFAULT_PATH) -> T:
    """Build dataclass ``cls`` from mapping ``raw``; nested dataclass fields are built recursively.

    Raises ClapError on a missing or unknown key, naming the dotted key path.
    """
    if not isinstance(raw, dict):
        raise ClapError(
            f"{where} must be a mapping, got {type(raw).__name__}", file=file, column=where, rule="bad_params"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    missing = sorted(set(fields) - set(raw))
    if unknown:
        raise ClapError(
            f"unknown key(s) {unknown} in {where}",
            file=file,
            column=f"{where}.{unknown[0]}",
            rule="unknown_param",
        )
    if missing:
        raise ClapError(
            f"missing key(s) {missing} in {where}",
            file=file,
            column=f"{where}.{missing[0]}",
            rule="missing_param",
        )
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name in fields:
        value = raw[name]
        ftype = hints.get(name)
        if isinstance(ftype, type) and dataclasses.is_dataclass(ftype):
            value = build(ftype, value, where=f"{where}.{name}", file=file)
        kwargs[name] = value
    return cls(**kwargs)


def section(name: str, cls: type[T], path: Path | str = DEFAULT_PATH) -> T:
    """Load section ``name`` of params.yaml into dataclass ``cls``."""
    return build(cls, raw_section(name, path), where=name, file=path)
