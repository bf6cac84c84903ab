"""params.yaml is the only home of every knob: this module reads it, nothing else defaults.

Each module that needs a section declares a frozen dataclass for it next to the code that
uses it and calls :func:`section`. A missing or unknown key is an error that names
params.yaml and the key, so a typo can never silently fall back to a default.

**A params file may be an override** (a profile's: ``profiles/tatqa/params.yaml``; docs/profiles.md,
"A profile is an override"). It holds only what differs from the file it names in a top-level
``extends`` (a path relative to the override's own folder), and :func:`load` merges it onto that file:

- mappings merge key by key, recursively; a scalar or a list replaces the base's value whole;
- ``replace: [dotted.key, ...]`` (top level) names mappings of the override that replace the base's
  mapping whole instead of merging into it: free-form mappings whose entries are the profile's own data
  (``assetize.sources``, ``normalize.keys``, ``normalize.units``, ``task.answer``,
  ``chain.retrieval.entities`` / ``concepts``, ``admit.max_key_share``, ...), where a union with the
  base's entries would keep the demo's sources or vocabulary. An entry must name a mapping the override
  holds (else an error naming it);
- ``null`` deletes the key from the merged result (Helm's rule; no knob's value is null), e.g.
  ``demo: null`` for the demo data generator's section a profile does not use;
- a top-level section the base does not have is an error naming it (an override cannot add a section:
  a misspelt one would otherwise be silently ignored); a misspelt key inside a section still fails
  when :func:`section` builds it (unknown key), naming the override and the key;
- the base may itself extend another file (a chain); a cycle is an error naming the files, a missing
  base an error naming it and the file that extends it.

``extends`` and ``replace`` are not in the merged result. Why a list and not a YAML tag such as
``!replace``: DVC parses the profile's params.yaml itself (``${batches}`` and its params deps) with
ruamel's safe loader, which rejects an unknown tag. DVC tracks each file's own keys: a profile's
dvc.yaml (rendered by profiles/render_dvc_yaml.py) lists, per stage, the keys the override sets under
``params.yaml`` and the ones it inherits under the base file (:func:`key_origins`), so a stage re-runs
when a value it uses changes in either file, and not when an unrelated root section does.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from clap.errors import ClapError

T = TypeVar("T")
DEFAULT_PATH = Path("params.yaml")
EXTENDS = "extends"  # top-level key of an override: the file it extends, relative to the override's folder
REPLACE = "replace"  # top-level key of an override: dotted keys of mappings that replace the base's whole
# libyaml's parser under PyYAML's safe constructor and resolver (the same documents, ~10x faster: a stage
# reads params.yaml once per section); PyYAML's pure-Python SafeLoader where PyYAML was built without libyaml
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a key DVC can name in a dotted params key
_MISSING = object()


def bad_param(key: str, message: str, file: Path | str = "params.yaml") -> ClapError:
    """The error for a params value that is wrong: rule ``bad_params``, ``column`` the dotted key whose
    value failed (``gate.power``, ``chain.retrieval.k1``, not its section), ``file`` the params file."""
    return ClapError(message, file=file, column=key, rule="bad_params")


def check_keys(checks: Mapping[str, bool], message: str, file: Path | str = "params.yaml") -> None:
    """Raise :func:`bad_param` with ``message`` naming the first dotted key of ``checks`` (key -> its
    value is valid) whose check failed; nothing when all pass."""
    failed = next((key for key, ok in checks.items() if not ok), None)
    if failed is not None:
        raise bad_param(failed, message, file)


def stray_key(where: str, raw: Any, required: Iterable[str], optional: Iterable[str] = ()) -> str:
    """The dotted key to name when mapping ``raw`` (params ``where``) must have the keys ``required``
    and may have ``optional``: its first unknown key, else its first missing one, else ``where``
    itself (``raw`` is not a mapping, or no key is stray)."""
    if not isinstance(raw, dict):
        return where
    required = set(required)
    odd = sorted(str(k) for k in set(raw) - required - set(optional)) or sorted(required - set(raw))
    return f"{where}.{odd[0]}" if odd else where


def parse_yaml(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, on libyaml when PyYAML has it."""
    return yaml.load(text, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader


@dataclasses.dataclass(frozen=True)
class Layer:
    """One file of an ``extends`` chain: its own sections (``extends`` and ``replace`` removed) and the
    dotted paths of the mappings it replaces whole."""

    path: Path
    data: dict[str, Any]
    replace: frozenset[tuple[str, ...]]


def _read_file(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _layer(path: Path, text: str) -> tuple[Layer, str | None]:
    try:
        data = parse_yaml(text)
    except yaml.YAMLError as e:
        raise ClapError(f"params file is not valid YAML: {e}", file=path, rule="bad_yaml") from e
    if not isinstance(data, dict):
        raise ClapError("params file must be a mapping of sections", file=path, rule="bad_params")
    extends = data.pop(EXTENDS, None)
    if extends is not None and (not isinstance(extends, str) or not extends.strip()):
        raise bad_param(
            EXTENDS,
            f"{EXTENDS} must be the path of the params file this one overrides, got {extends!r}",
            path,
        )
    entries = data.pop(REPLACE, None)
    if entries is not None and extends is None:
        raise bad_param(REPLACE, f"{REPLACE} needs {EXTENDS}: it says what an override replaces", path)
    if entries is not None and (
        not isinstance(entries, list) or not all(isinstance(e, str) for e in entries)
    ):
        raise bad_param(REPLACE, f"{REPLACE} must be a list of dotted keys, got {entries!r}", path)
    replace = set()
    for entry in entries or []:
        parts = tuple(entry.split("."))
        if not isinstance(_get(data, parts), dict):
            raise ClapError(
                f"{REPLACE} names {entry!r}, which is not a mapping this file sets",
                file=path,
                column=f"{REPLACE}.{entry}",
                rule="bad_replace",
            )
        replace.add(parts)
    return Layer(path, data, frozenset(replace)), extends


def chain(path: Path | str = DEFAULT_PATH, *, read: Callable[[Path], str] | None = None) -> list[Layer]:
    """The params file at ``path`` and the files it extends, in that order (the root base last).

    ``read`` reads a file's text (default: the filesystem; ``clap verify`` reads a commit's files) and
    raises FileNotFoundError for a missing one.
    """
    path = Path(path)
    layers: list[Layer] = []
    seen: list[str] = []
    child: Path | None = None
    while True:
        key = os.path.normpath(path) if read is not None else str(path.resolve())
        if key in seen:
            cycle = " -> ".join(str(layer.path) for layer in layers) + f" -> {path}"
            raise ClapError(
                f"params files extend each other in a cycle: {cycle}",
                file=path,
                column=EXTENDS,
                rule="params_cycle",
            )
        seen.append(key)
        try:
            text = (read or _read_file)(path)
        except FileNotFoundError:
            if child is None:
                raise ClapError(
                    "params file not found (run from the repository root)", file=path, rule="missing_params"
                ) from None
            raise ClapError(
                f"params file not found: {child} extends it", file=path, column=EXTENDS, rule="missing_params"
            ) from None
        layer, extends = _layer(path, text)
        layers.append(layer)
        if extends is None:
            return layers
        child, path = path, Path(os.path.normpath(path.parent / extends))


def merge(base: dict[str, Any], layer: Layer) -> dict[str, Any]:
    """``layer``'s sections merged onto ``base`` (the rule in the module's docstring)."""
    unknown = [k for k in layer.data if k not in base]
    if unknown:
        raise ClapError(
            f"unknown section(s) {unknown}: an override sets only sections the file it extends has",
            file=layer.path,
            column=str(unknown[0]),
            rule="unknown_section",
        )
    return _merge(base, layer.data, layer.replace, ())


def _merge(base: dict[str, Any], over: dict[str, Any], replace: frozenset, prefix: tuple) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        here = (*prefix, k)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict) and isinstance(base.get(k), dict) and here not in replace:
            out[k] = _merge(base[k], v, replace, here)
        else:
            out[k] = v
    return out


def load(path: Path | str = DEFAULT_PATH, *, read: Callable[[Path], str] | None = None) -> dict[str, Any]:
    """Read the whole params file, merged onto the files it extends (``read``: see :func:`chain`)."""
    layers = chain(path, read=read)
    data = layers[-1].data
    for layer in reversed(layers[:-1]):
        data = merge(data, layer)
    return data


def _get(tree: Any, parts: Sequence[str]) -> Any:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def key_origins(layers: Sequence[Layer], keys: Iterable[str]) -> list[tuple[Path, list[str]]]:
    """For dotted params keys (a stage's DVC params), the keys of each file of ``layers`` (a
    :func:`chain`) whose values make up the merged values: per file, in chain order, keys the file
    holds (DVC fails on a key absent from the file it names). A key the override sets whole comes from
    it alone; a merging mapping is listed in the override and each key it leaves to the base is looked
    up there (recursively), so a change to a base value the override replaces leaves the stage alone.
    A mapping whose keys DVC cannot name (a dot, an empty key) is listed whole in every file."""
    keys = list(keys)
    merged = [layers[-1].data]  # merged[i]: layers i.. merged, built from the root base up
    for layer in reversed(layers[:-1]):
        merged.insert(0, _merge(merged[0], layer.data, layer.replace, ()))
    found: list[list[str]] = [[] for _ in layers]

    def add(i: int, parts: tuple) -> None:
        if ".".join(parts) not in found[i]:
            found[i].append(".".join(parts))

    def walk(parts: tuple, start: int) -> bool:
        for i in range(start, len(layers)):
            node = _get(layers[i].data, parts)
            if node is _MISSING:
                continue
            add(i, parts)
            if isinstance(node, dict) and parts not in layers[i].replace:
                below(parts, node, i)
            return True
        return False

    def below(parts: tuple, node: dict, i: int) -> None:
        base = _get(merged[i + 1], parts) if i + 1 < len(layers) else _MISSING
        if not isinstance(base, dict):
            return
        if not all(isinstance(k, str) and _PLAIN_KEY.fullmatch(k) for k in base):
            for j in range(i + 1, len(layers)):
                held = _get(layers[j].data, parts)
                if held is not _MISSING:
                    add(j, parts)
                    if not isinstance(held, dict) or parts in layers[j].replace:
                        break
            return
        for k in base:
            if k not in node:
                walk((*parts, k), i + 1)
            elif isinstance(node[k], dict) and (*parts, k) not in layers[i].replace:
                below((*parts, k), node[k], i)

    for key in keys:
        if not walk(tuple(key.split(".")), 0):
            raise ClapError(
                f"params key {key!r} is in none of the files",
                file=layers[0].path,
                column=key,
                rule="missing_param",
            )
    return [(layer.path, f) for layer, f in zip(layers, found, strict=True) if f]


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
        raise bad_param(where, f"{where} must be a mapping, got {type(raw).__name__}", file)
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
