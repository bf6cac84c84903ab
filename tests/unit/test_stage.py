"""clap.stage: the allocator setting every stage and the CLI apply before their work."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pytest

from clap import stage

# one process per setting: mallopt changes the whole process, so a test must not leave it on in pytest's
PROBE = """
import resource, sys
sys.path.insert(0, {root!r})
from clap.stage import reuse_freed_memory
took = reuse_freed_memory() if sys.argv[1] == "on" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
start = faults()
for _ in range(20):  # a step's buffers: allocated together, freed together, allocated again
    bufs = [bytearray(12 << 20) for _ in range(3)]
    del bufs
print(took, faults() - start)
"""


def _faults(setting: str) -> tuple[str, int]:
    root = str(Path(stage.__file__).resolve().parents[1])
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(root=root), setting], capture_output=True, text=True, check=True
    )
    took, faults = out.stdout.split()
    return took, int(faults)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_freed_buffers_are_reused_instead_of_faulted_in_again():
    took, faults_on = _faults("on")
    _, faults_off = _faults("off")
    assert took == "True"
    # off: glibc trims the freed 36 MiB from the heap's top (above twice its dynamic threshold), so every
    # round faults its 3 x 3072 pages in again; on: the first round's pages are kept and reused
    assert faults_on < 2 * 9216 and faults_off > 10 * 9216
