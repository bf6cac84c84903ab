"""decoding: decide a raw file's text encoding on evidence, and say what a file looks like.

A raw export is decoded with one of the declared encodings (params ``assetize.encodings``), but
the list is not tried in order until one "works": cp1252 decodes nearly any bytes, so a UTF-8
file with a few bad bytes used to come out as cp1252 with every non-ASCII character turned into
mojibake (``WeiÃŸ`` for ``Weiß``) and no error. :func:`decode_file` looks at the bytes first:

1. a ZIP/Parquet/gzip/OLE2 signature: not text at all (file-level error);
2. a UTF-32/UTF-16 byte-order mark, or the NUL-byte pattern of BOM-less UTF-16/32: that
   encoding, if declared (a matching ``utf-16``/``utf-32`` entry), else a file-level error;
3. a UTF-8 byte-order mark: UTF-8, if ``utf-8-sig`` is declared (``utf-8`` would keep the
   mark as U+FEFF in the first field, so it is an error there);
4. valid UTF-8 throughout: UTF-8 when it has multi-byte sequences; ASCII-only text is read
   by the first declared ASCII-compatible encoding (all of them read it the same);
5. valid multi-byte UTF-8 sequences *and* invalid bytes: UTF-8 with bad lines. Those physical
   lines are reported in :attr:`Decoded.bad_lines` and decoded with U+FFFD in place of the
   bad bytes, so a parser can still split records (the caller rejects every record that
   touches one, rule ``bad_encoding``). More than ``max_bad_line_share`` of the lines bad is
   a file-level error;
6. invalid UTF-8 and not a single valid multi-byte sequence (nor NUL bytes): a legacy export;
   the first declared non-UTF encoding that decodes every byte strictly (e.g. cp1252).

An encoding detector adds nothing here (benchmarks/charset_detection.py, 33 files: the demo
exports and three UTF-8 exports with two cp1252 lines each). charset-normalizer 3.5.3 on its own
read the cp1252 export as iso8859_14 (28 lines wrong) and the mixed files as cp1250/cp775;
restricted to the declared encodings it returned cp1252 for two mixed files (the same mojibake
as the old rule, 56 and 68 lines) and nothing for the third. This rule reads all 33 with no
silently wrong line and reports exactly the 2 bad lines of each mixed file.

The rest are sniffing helpers for clear error messages (:func:`describe`,
:func:`guess_delimiter`) and a recursion-safe JSON parse (:func:`json_depth_ok`,
:func:`loads_bounded`).
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from clap.errors import ClapError
from clap.params import bad_param

# (signature, what the file is); checked before anything else. A signature counts only in bytes with
# a NUL (these formats always have one in their first header; a text export never does): a CSV whose
# header happens to start with "PAR1" stays text
_MAGIC = (
    (b"PK\x03\x04", "a ZIP container (xlsx/docx?)"),
    (b"PK\x05\x06", "an empty ZIP container"),
    (b"PAR1", "Parquet (PAR1 magic)"),
    (b"\x1f\x8b", "gzip-compressed data"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an OLE2 container (legacy xls/doc?)"),
)
# (mark, codec that reads what follows it, label, declared names that accept it); UTF-32 LE before
# UTF-16 LE: FF FE 00 00 starts both
_WIDE_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32 LE", ("utf-32", "utf-32-le")),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32 BE", ("utf-32", "utf-32-be")),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16 LE", ("utf-16", "utf-16-le")),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16 BE", ("utf-16", "utf-16-be")),
)
_WIDE = {codec: (label, accepted) for _, codec, label, accepted in _WIDE_BOMS}
_UTF8 = ("utf-8", "utf-8-sig")
_UNICODE = (*_UTF8, "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be")
_SNIFF = 4096  # bytes looked at for the NUL-byte pattern
_ASCII = bytes(range(128))


@dataclass(frozen=True)
class Decoded:
    """A decoded raw file and why it was read that way.

    Attributes:
        text: the file's text; bad lines (UTF-8 only) have U+FFFD where their bad bytes were.
        encoding: the declared encoding used, as spelled in the declaration.
        bad_lines: 1-based physical line -> what is wrong with its bytes (empty unless the file
            is UTF-8 with a few invalid bytes).
        evidence: a short human sentence saying why this encoding was chosen (for provenance).
    """

    text: str
    encoding: str
    bad_lines: dict[int, str]
    evidence: str


def decode_file(
    data: bytes,
    encodings: list[str],
    file: str,
    *,
    max_bad_line_share: float,
    keys: tuple[str, str] = ("encodings", "max_bad_line_share"),
) -> Decoded:
    """Decode one raw file with the declared encoding its bytes are evidence of.

    Args:
        data: the file's bytes.
        encodings: the declared encodings (params), e.g. ``["utf-8-sig", "cp1252"]``; their order
            only breaks ties among encodings the evidence allows equally.
        file: the file's name, for errors.
        max_bad_line_share: in a UTF-8 file with invalid bytes, the largest share (0..1) of
            physical lines that may be bad; above it the whole file is an error.
        keys: the params keys of ``encodings`` and ``max_bad_line_share``, which a bad_params
            error names (e.g. ``assetize.sources.erp.encodings``, ``assetize.max_bad_line_share``).

    Returns:
        The text, the encoding used, the bad lines and the evidence.

    Raises:
        ClapError: rule ``bad_params`` (column: the key of ``keys``) for an
            unknown or non-text encoding, an empty list or a share outside 0..1; rule
            ``bad_encoding`` when the bytes are not text in any declared encoding, say so
            ambiguously, or have too many bad lines (the message says what the file looks like).
    """
    declared = _declared(encodings, keys[0])
    _check_share(max_bad_line_share, keys[1])
    ctx = f"declared encodings {list(encodings)}"

    def fail(message: str, row: int | None = None) -> ClapError:
        return ClapError(f"{message}; {ctx}", file=file, row=row, rule="bad_encoding")

    wide = _binary_or_wide(data, declared, fail)
    if wide is not None:
        return wide
    bom = _utf8_bom(data, declared, fail)
    body = data[bom:]
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        return _valid_utf8(text, body, bom, declared, fail)
    return _invalid_utf8(data, body, bom, declared, max_bad_line_share, fail)


def _check_share(max_bad_line_share: float, key: str) -> None:
    """``max_bad_line_share`` must be a number (not a bool) in 0..1: bad params otherwise."""
    if (
        isinstance(max_bad_line_share, bool)
        or not isinstance(max_bad_line_share, (int, float))
        or not (0 <= max_bad_line_share <= 1)
    ):
        raise bad_param(key, f"max_bad_line_share must be a number in 0..1, got {max_bad_line_share!r}")


def _binary_or_wide(
    data: bytes, declared: list[tuple[str, str]], fail: Callable[..., ClapError]
) -> Decoded | None:
    """Steps 1 and 2: a binary signature is an error; a UTF-32/UTF-16 byte-order mark or NUL-byte pattern
    decodes as that encoding if declared (an error if not); None when the bytes show neither."""
    what = _binary_format(data[:_SNIFF])
    if what is not None:
        raise fail(f"file is {what}, not text")
    for bom, codec, label, accepted in _WIDE_BOMS:
        if data.startswith(bom):
            name = _pick(declared, accepted)
            if name is None:
                raise fail(f"file starts with a {label} byte-order mark")
            return Decoded(_strict_wide(data, len(bom), codec, fail), name, {}, f"{label} byte-order mark")
    wide = _nul_pattern(data[:_SNIFF])
    if wide is not None:
        codec, why = wide
        label, accepted = _WIDE[codec]
        name = _pick(declared, accepted)
        if name is None:
            raise fail(f"file looks like {label} without a byte-order mark ({why})")
        return Decoded(_strict_wide(data, 0, codec, fail), name, {}, f"no byte-order mark; {why}: {label}")
    return None


def _utf8_bom(data: bytes, declared: list[tuple[str, str]], fail: Callable[..., ClapError]) -> int:
    """Step 3: the length of a UTF-8 byte-order mark at the start (0: none); one is an error unless
    ``utf-8-sig`` is declared."""
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    if bom:
        name = _pick(declared, ("utf-8-sig",))
        if name is None:
            hint = (
                " (utf-8-sig reads it; utf-8 keeps it as U+FEFF in the first field)"
                if _pick(declared, _UTF8)
                else ""
            )
            raise fail(f"file starts with a UTF-8 byte-order mark{hint}")
    return bom


def _valid_utf8(
    text: str, body: bytes, bom: int, declared: list[tuple[str, str]], fail: Callable[..., ClapError]
) -> Decoded:
    """Step 4: a body that is valid UTF-8 throughout (``text``): UTF-8 when it has multi-byte sequences
    or a byte-order mark, else (ASCII only) the first declared ASCII-compatible encoding."""
    mark = "UTF-8 byte-order mark; " if bom else ""
    multi = _non_ascii(text)
    if multi:
        name = _pick(declared, _UTF8)
        if name is None:
            at = _line_of(body, re.search(rb"[\x80-\xff]", body).start())
            raise fail(
                f"file is valid UTF-8 with {multi} multi-byte sequences (the first on line {at}), "
                f"which no declared encoding reads as such",
                row=at,
            )
        return Decoded(text, name, {}, f"{mark}valid UTF-8: {multi} multi-byte sequences, no invalid bytes")
    if bom:
        return Decoded(text, _pick(declared, ("utf-8-sig",)), {}, f"{mark}ASCII only")
    name = next((given for given, _ in declared if _ascii_compatible(given)), None)
    if name is None:
        raise fail(
            "file is ASCII text without a byte-order mark or NUL bytes, which no declared encoding reads"
        )
    return Decoded(
        text, name, {}, "ASCII only (no byte >= 0x80): every ASCII-compatible encoding reads it the same"
    )


def _invalid_utf8(
    data: bytes,
    body: bytes,
    bom: int,
    declared: list[tuple[str, str]],
    max_bad_line_share: float,
    fail: Callable[..., ClapError],
) -> Decoded:
    """Steps 5 and 6: a body with invalid UTF-8 bytes. With valid multi-byte sequences (or a byte-order
    mark: evidence too) it is UTF-8 with bad lines, up to ``max_bad_line_share`` of them; with none, a
    legacy export (:func:`_legacy`)."""
    text, bad, invalid = _utf8_lines(body, bom)
    multi = _non_ascii(text) - invalid
    first = min(bad)
    lines = _line_count(body)
    if not (multi or bom):
        return _legacy(data, declared, bad, invalid, lines, fail)
    name = _pick(declared, _UTF8)
    if name is None:
        raise fail(
            f"file is UTF-8 with {multi} valid multi-byte sequences and {invalid} invalid ones "
            f"(first: {bad[first]}), which no declared encoding reads",
            row=first,
        )
    share = len(bad) / lines
    if share > max_bad_line_share:
        raise fail(
            f"{len(bad)} of {lines} lines ({share:.0%}) have bytes that are not valid UTF-8 in a file "
            f"with {multi} valid multi-byte UTF-8 sequences (more than max_bad_line_share "
            f"{max_bad_line_share}: mixed encodings?); first: {bad[first]}",
            row=first,
        )
    mark = "UTF-8 byte-order mark; " if bom else ""
    return Decoded(
        text,
        name,
        bad,
        f"{mark}UTF-8: {multi} valid multi-byte sequences; {len(bad)} of {lines} lines have invalid "
        f"bytes (lines {_some(bad)})",
    )


def _legacy(
    data: bytes,
    declared: list[tuple[str, str]],
    bad: dict[int, str],
    invalid: int,
    lines: int,
    fail: Callable[..., ClapError],
) -> Decoded:
    """Step 6: no valid multi-byte UTF-8 at all (``invalid`` sequences on the ``bad`` lines): a legacy
    single/multi-byte export, read by the first declared non-UTF encoding that decodes every byte."""
    first = min(bad)
    if b"\x00" in data:
        raise fail(
            f"file is not UTF-8 (first: {bad[first]}) and has NUL bytes: it looks like {describe(data)}",
            row=first,
        )
    failures = []
    for given, canon in declared:
        if canon in _UNICODE:
            continue
        try:
            legacy = data.decode(given)
        except UnicodeDecodeError as e:
            failures.append(
                f"{given} cannot decode byte 0x{data[e.start]:02x} at byte offset {e.start} "
                f"(line {_line_of(data, e.start)})"
            )
            continue
        return Decoded(
            legacy,
            given,
            {},
            f"no valid multi-byte UTF-8 sequence; {invalid} invalid UTF-8 sequences on {len(bad)} of "
            f"{lines} lines (first: line {first}); decodes strictly as {given}",
        )
    tried = "; ".join(failures) if failures else "no non-UTF encoding is declared"
    raise fail(f"file is not UTF-8 ({bad[first]}; no valid multi-byte sequence) and {tried}", row=first)


def _declared(encodings: list[str], key: str) -> list[tuple[str, str]]:
    """(name as given, canonical codec name) per declared encoding; unknown names are bad params."""
    if isinstance(encodings, str) or not encodings:
        raise bad_param(key, f"encodings must be a non-empty list of encoding names, got {encodings!r}")
    out = []
    for enc in encodings:
        try:
            canon = codecs.lookup(enc).name
            b"a".decode(enc)  # also refuses codecs that are not text encodings (rot13, base64, undefined)
        except UnicodeDecodeError:
            pass  # a real text encoding (utf-16 cannot decode one byte)
        except (LookupError, TypeError, UnicodeError) as e:
            raise bad_param(
                key, f"unknown encoding {enc!r} in the declared encodings {list(encodings)}"
            ) from e
        out.append((enc, canon))
    return out


def _pick(declared: list[tuple[str, str]], accepted: tuple[str, ...]) -> str | None:
    """The first declared encoding (as given) whose canonical name is in ``accepted``."""
    return next((given for given, canon in declared if canon in accepted), None)


def _ascii_compatible(encoding: str) -> bool:
    try:
        return _ASCII.decode(encoding) == _ASCII.decode("ascii")
    except UnicodeDecodeError:
        return False


def _non_ascii(text: str) -> int:
    return len(text) - len(text.encode("ascii", "ignore"))


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def _line_count(data: bytes) -> int:
    """Physical lines (a final line end does not start another line); at least 1."""
    return max(1, data.count(b"\n") + (0 if data.endswith(b"\n") else 1))


def _some(lines: dict[int, str], n: int = 5) -> str:
    keys = sorted(lines)
    return ", ".join(map(str, keys[:n])) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def _binary_format(sample: bytes) -> str | None:
    """What binary format ``sample`` starts with (signature and a NUL byte), or None."""
    if b"\x00" in sample:
        return next((what for magic, what in _MAGIC if sample.startswith(magic)), None)
    return None


def _nul_pattern(sample: bytes) -> tuple[str, str] | None:
    """(codec, why) when NUL bytes fall on the offsets UTF-32/UTF-16 text puts them, else None.

    Latin text in UTF-16 LE has a NUL as the high byte of nearly every code unit (odd offsets)
    and none at even ones; UTF-32 has two or three NULs per four bytes.
    """
    if b"\x00" not in sample:
        return None
    n4 = len(sample) // 4 * 4
    if n4:
        z = [sample[i:n4:4].count(0) / (n4 // 4) for i in range(4)]
        if z[2] >= 0.9 and z[3] >= 0.9 and z[0] < 0.05:
            return "utf-32-le", f"NUL bytes at {z[3]:.0%} of offsets 4k+3 and {z[0]:.0%} of 4k"
        if z[0] >= 0.9 and z[1] >= 0.9 and z[3] < 0.05:
            return "utf-32-be", f"NUL bytes at {z[0]:.0%} of offsets 4k and {z[3]:.0%} of 4k+3"
    n2 = len(sample) // 2 * 2
    if n2:
        even, odd = (sample[i:n2:2].count(0) / (n2 // 2) for i in range(2))
        if odd >= 0.3 and even < 0.05:
            return "utf-16-le", f"NUL bytes at {odd:.0%} of odd offsets and {even:.0%} of even ones"
        if even >= 0.3 and odd < 0.05:
            return "utf-16-be", f"NUL bytes at {even:.0%} of even offsets and {odd:.0%} of odd ones"
    return None


def _strict_wide(data: bytes, start: int, codec: str, fail: Callable[..., ClapError]) -> str:
    try:
        return data[start:].decode(codec)
    except UnicodeDecodeError as e:
        at = start + e.start
        line = data[start:at].decode(codec, "replace").count("\n") + 1
        raise fail(
            f"{_WIDE[codec][0]} text has invalid bytes at byte offset {at} ({e.reason})", row=line
        ) from e


def _utf8_lines(body: bytes, offset: int) -> tuple[str, dict[int, str], int]:
    """Decode UTF-8 line by line: (text with U+FFFD for bad bytes, bad line -> detail, invalid sequences).

    ``offset`` is where ``body`` starts in the file (a BOM), for the byte offsets in the details;
    their column is the 1-based character column of the first bad byte in the decoded line.
    A line end (0x0A) never occurs inside a UTF-8 sequence, so per-line decoding gives the same
    text as decoding the whole file with ``errors="replace"``.
    """
    out, bad, invalid, pos = [], {}, 0, offset
    for k, line in enumerate(body.split(b"\n"), start=1):
        try:
            out.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            text = line.decode("utf-8", "replace")
            # one U+FFFD per invalid sequence, besides the U+FFFD characters the line really has
            n = text.count("\ufffd") - line.count(b"\xef\xbf\xbd")
            bytes_ = " ".join(f"0x{b:02x}" for b in line[e.start : e.end])
            what = "byte" if e.end - e.start == 1 else "bytes"
            col = len(line[: e.start].decode("utf-8")) + 1
            more = f"; {n - 1} more invalid sequences on this line" if n > 1 else ""
            verb = "is" if what == "byte" else "are"
            bad[k] = (
                f"{what} {bytes_} at byte offset {pos + e.start} (line {k}, column {col}) {verb} not valid "
                f"utf-8 ({e.reason}){more}"
            )
            invalid += n
            out.append(text)
        pos += len(line) + 1
    return "\n".join(out), bad, invalid


# --- what a file looks like -----------------------------------------------------------------


def describe(data: bytes, limit: int = 4096) -> str:
    """Say what the start of a file looks like, for errors about a file that is not as declared.

    Never raises, whatever the bytes.

    Args:
        data: the file's bytes (only the first ``limit`` are looked at).
        limit: how many bytes to look at.

    Returns:
        e.g. ``"UTF-16 LE BOM, then CSV-like text: ..."``, ``"a JSON array (starts with '[')"``,
        ``"JSON Lines (first line is an object)"``, ``"a JSON object (starts with '{')"``,
        ``"CSV-like text: first line splits into 8 fields on ';', 1 on ','..."``,
        ``"a ZIP container (xlsx/docx?)"``, ``"Parquet (PAR1 magic)"``, ``"binary (NUL bytes)"``,
        ``"empty"``.
    """
    head = data[: max(limit, 0)]
    if not head:
        return "empty" if not data else "not looked at (limit 0)"
    what = _binary_format(head[:_SNIFF])
    if what is not None:
        return what
    for bom, codec, label, _ in _WIDE_BOMS:
        if head.startswith(bom):
            return f"{label} BOM, then {_describe_text(head[len(bom) :].decode(codec, 'replace'))}"
    wide = _nul_pattern(head[:_SNIFF])
    if wide is not None:
        codec, why = wide
        return f"{_WIDE[codec][0]} without BOM ({why}), then {_describe_text(head.decode(codec, 'replace'))}"
    if b"\x00" in head:
        return f"binary (NUL bytes: {head.count(0)} in the first {len(head)})"
    prefix = ""
    if head.startswith(codecs.BOM_UTF8):
        prefix, head = "UTF-8 BOM, then ", head[len(codecs.BOM_UTF8) :]
    decoder = codecs.getincrementaldecoder("utf-8")()
    try:
        text = decoder.decode(head, final=len(data) <= limit)  # a sequence cut at the limit is not an error
    except UnicodeDecodeError as e:
        text = head.decode("cp1252", "replace")
        prefix += f"non-UTF-8 text (byte 0x{head[e.start]:02x} at offset {e.start}): "
    return prefix + _describe_text(text)


def _describe_text(text: str) -> str:
    s = text.lstrip("\ufeff \t\r\n")
    if not s:
        return "whitespace only" if text else "nothing"
    first = s.split("\n", 1)[0].rstrip("\r")
    if s[0] == "[":
        return "a JSON array (starts with '[')"
    if s[0] == "{":
        try:
            if isinstance(loads_bounded(first, 64), dict):
                return "JSON Lines (first line is an object)"
        except ValueError:
            pass
        return "a JSON object (starts with '{')"
    if s[0] == "<":
        return "XML/HTML (starts with '<')"
    best = guess_delimiter(first)
    if best is None:
        return f"text without ',', ';', tab or '|' on its first line ({first[:40]!r})"
    counts = {d: _fields(first, d) for d in ",;\t|"}
    others = [f"{counts[d]} on {d!r}" for d in sorted(counts, key=lambda d: -counts[d]) if d != best]
    return f"CSV-like text: first line splits into {counts[best]} fields on {best!r}, " + ", ".join(others)


def _fields(line: str, delimiter: str) -> int:
    """Fields of ``line`` split on ``delimiter`` outside double quotes (RFC 4180 ``""`` escapes)."""
    return 1 + sum(part.count(delimiter) for part in line.split('"')[::2])


def guess_delimiter(header_line: str, candidates: str = ",;\t|") -> str | None:
    """The candidate that splits a header line into the most fields (quotes respected).

    Lets a caller say "the header splits on ',' but ';' is declared".

    Args:
        header_line: one line (a trailing line end is ignored).
        candidates: one-character delimiters; on a tie the earlier one wins.

    Returns:
        The delimiter, or None when none of them splits the line.
    """
    line = header_line.rstrip("\r\n")
    best, most = None, 1
    for d in candidates:
        n = _fields(line, d)
        if n > most:
            best, most = d, n
    return best


# --- JSON without RecursionError -------------------------------------------------------------


class TooDeep(ValueError):
    """A JSON text nests deeper than allowed (checked before parsing)."""


# a string (possibly unterminated: it runs to the end) or a bracket; possessive, so linear time
_JSON_TOKEN = re.compile(r'"(?:[^"\\]++|\\.)*+"?|[\[\]{}]', re.DOTALL)


def json_depth_ok(text: str, max_depth: int) -> bool:
    """Whether a JSON text nests at most ``max_depth`` arrays/objects deep (``1`` is 0, ``[]`` is 1).

    One linear scan that skips string literals (brackets inside them do not count, escapes are
    honoured); it does not validate the JSON, it only bounds what :func:`json.loads` would
    recurse into.

    Args:
        text: a JSON text (one JSON Lines line).
        max_depth: the deepest nesting allowed.

    Returns:
        False as soon as the nesting exceeds ``max_depth``.
    """
    if max_depth < 0:
        return False
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > max_depth:
                return False
        elif c in "]}":
            depth -= 1
    return True


def loads_bounded(text: str, max_depth: int):
    """:func:`json.loads` that refuses deep nesting instead of raising RecursionError.

    Args:
        text: a JSON text.
        max_depth: the deepest nesting allowed (see :func:`json_depth_ok`).

    Returns:
        The parsed value.

    Raises:
        TooDeep: the text nests deeper than ``max_depth`` (or than the interpreter can parse).
        json.JSONDecodeError: the text is not JSON.
    """
    if not json_depth_ok(text, max_depth):
        raise TooDeep(f"JSON nests deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except RecursionError as e:
        raise TooDeep(
            f"JSON nests too deep for the parser (max_depth {max_depth} is above what it can do)"
        ) from e
