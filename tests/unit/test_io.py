"""clap.io: atomic writes, stable JSON, deterministic parquet, hashes."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from clap import io
from clap.errors import ClapError


def test_write_json_is_sorted_stable_and_refuses_nan(tmp_path):
    p = tmp_path / "m.json"
    io.write_json(p, {"b": 1, "a": np.float64(0.5), "c": np.int64(3)})
    assert p.read_text() == '{\n  "a": 0.5,\n  "b": 1,\n  "c": 3\n}\n'
    with pytest.raises(ValueError):
        io.write_json(p, {"loss": math.nan})
    assert json.loads(p.read_text())["b"] == 1  # the failed write left the old file intact


def test_atomic_write_leaves_no_temp_file_on_failure(tmp_path):
    p = tmp_path / "x.json"
    with pytest.raises(TypeError):
        io.write_json(p, {"bad": object()})
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_whole_folder_or_nothing(tmp_path):
    out = tmp_path / "out"
    with io.atomic_dir(out) as d:
        (d / "a.txt").write_text("1")
    with pytest.raises(RuntimeError):
        with io.atomic_dir(out) as d:
            (d / "b.txt").write_text("2")
            raise RuntimeError("killed")
    assert sorted(p.name for p in out.iterdir()) == ["a.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_parquet_bytes_are_deterministic_and_logical_hash_ignores_order(tmp_path):
    df = pd.DataFrame({"id": ["b", "a"], "v": [2.5, 1.0]})
    io.write_parquet(tmp_path / "1.parquet", df)
    io.write_parquet(tmp_path / "2.parquet", df)
    assert io.sha256_file(tmp_path / "1.parquet") == io.sha256_file(tmp_path / "2.parquet")
    shuffled = df.iloc[::-1][["v", "id"]]
    assert io.logical_hash(shuffled) == io.logical_hash(df)
    assert io.logical_hash(df.assign(v=[2.5, 1.5])) != io.logical_hash(df)
    pd.testing.assert_frame_equal(io.read_parquet(tmp_path / "1.parquet"), df)


def test_missing_and_corrupt_inputs_are_loud(tmp_path):
    with pytest.raises(ClapError) as e:
        io.read_json(tmp_path / "nope.json")
    assert e.value.rule == "missing_file"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ClapError) as e:
        io.read_json(tmp_path / "bad.json")
    assert e.value.rule == "corrupt_json"
    (tmp_path / "bad.parquet").write_bytes(b"PAR1garbage")
    with pytest.raises(ClapError) as e:
        io.read_parquet(tmp_path / "bad.parquet")
    assert e.value.rule == "corrupt_parquet"


def test_sha256_dir_depends_on_names_and_bytes(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"1")
    h1 = io.sha256_dir(tmp_path / "d")
    (tmp_path / "d" / "a").write_bytes(b"2")
    assert io.sha256_dir(tmp_path / "d") != h1


def test_killed_writer_leaves_no_partial_file_and_the_next_write_sweeps_its_temporary(tmp_path):
    import os
    import subprocess
    import sys

    target = tmp_path / "out" / "m.json"
    code = f"from clap import io; io.write_json({str(target)!r}, {{'a': 1}})"
    env = {**os.environ, io.CRASH_ENV: "*/out/m.json"}
    killed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True)
    assert killed.returncode == -9 and not target.exists()
    left = list(target.parent.glob(".m.json.*.tmp"))
    assert len(left) == 1 and left[0].read_text() == '{\n  "a": 1\n}\n'  # complete, but never published
    (target.parent / ".m.json.x.json.1.abc.tmp").write_text("another name's")  # not m.json's: kept
    live = target.parent / f".m.json.{os.getpid()}.abcd1234.tmp"
    live.write_text("a live writer's")  # its process is running: kept
    io.write_json(target, {"a": 2})
    assert io.read_json(target) == {"a": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        ["m.json", ".m.json.x.json.1.abc.tmp", live.name]
    )


def test_killed_folder_writer_leaves_the_old_folder_or_nothing(tmp_path):
    import os
    import subprocess
    import sys

    out = tmp_path / "assets"
    code = f"from clap import io\nwith io.atomic_dir({str(out)!r}) as d:\n    (d / 'a.txt').write_text('new')"
    killed = subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, io.CRASH_ENV: "*/assets"}, capture_output=True
    )
    assert killed.returncode == -9 and not out.exists()
    with io.atomic_dir(out) as d:
        (d / "a.txt").write_text("ok")
    assert [p.name for p in tmp_path.iterdir()] == ["assets"]
