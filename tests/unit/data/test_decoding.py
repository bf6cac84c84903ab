"""clap.data.decoding: the encoding is chosen on evidence; sniffing helpers; JSON without RecursionError."""

from __future__ import annotations

import codecs
import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clap.data import decoding as D
from clap.errors import ClapError

DECLARED = ["utf-8-sig", "cp1252"]  # params.yaml assetize.encodings
SHARE = 0.5


def decode(data: bytes, encodings=None, share: float = SHARE) -> D.Decoded:
    return D.decode_file(
        data, DECLARED if encodings is None else encodings, "f.csv", max_bad_line_share=share
    )


def error(data: bytes, encodings=None, share: float = SHARE, rule: str = "bad_encoding") -> ClapError:
    with pytest.raises(ClapError) as e:
        decode(data, encodings, share)
    assert e.value.rule == rule, str(e.value)
    return e.value


# --- decode_file: UTF-8 with a few bad bytes ------------------------------------------------

CSV = "".join(f"SR-{i};Weiß;Größe {i} °C\n" for i in range(1, 11))


def mixed() -> tuple[bytes, list[int]]:
    """The measured case: valid UTF-8 except a cp1252 'ü' (0xfc) on lines 3 and 8."""
    lines = CSV.encode("utf-8").split(b"\n")
    for k in (3, 8):
        lines[k - 1] = lines[k - 1].replace(b"SR-", b"M\xfcller SR-")
    return b"\n".join(lines), [3, 8]


def test_the_old_rule_turned_the_mixed_file_into_mojibake():
    data, _ = mixed()
    assert "WeiÃŸ" in data.decode("cp1252")  # what "first that decodes" produced, without an error


def test_mixed_utf8_is_utf8_with_two_bad_lines():
    data, bad = mixed()
    d = decode(data)
    assert d.encoding == "utf-8-sig"
    assert sorted(d.bad_lines) == bad
    lines = d.text.split("\n")
    assert all("Weiß" in line and "Größe" in line for line in lines if line)
    assert lines[2].startswith("M\ufffdller SR-3;Weiß") and lines[7].startswith("M\ufffdller SR-8;")
    assert "\ufffd" not in d.text.replace(lines[2], "").replace(lines[7], "")
    offset = data.index(b"\xfc")
    assert d.bad_lines[3] == (
        f"byte 0xfc at byte offset {offset} (line 3, column 2) is not valid utf-8 (invalid start byte)"
    )
    assert data[offset] == 0xFC
    assert "2 of 10 lines have invalid bytes (lines 3, 8)" in d.evidence


def test_a_bad_line_reports_its_first_bad_bytes_and_how_many_more():
    data = (
        "Weiß\n".encode() + b"a\xe2\x82b \xff\xfe \xef\xbf\xbd\n"
    )  # truncated sequence, 2 bad bytes, a real U+FFFD
    d = decode(data, share=1.0)
    assert d.bad_lines == {
        2: "bytes 0xe2 0x82 at byte offset 7 (line 2, column 2) are not valid utf-8 (invalid continuation byte)"
        "; 2 more invalid sequences on this line"
    }
    assert d.text == "Weiß\n" + data.split(b"\n", 1)[1].decode("utf-8", "replace")


def test_the_bad_line_share_is_a_file_level_error():
    data = "Weiß\n".encode() + b"M\xfcller\nx\xe4\n"  # 2 of 3 lines bad
    e = error(data, share=0.5)
    assert e.row == 2 and "2 of 3 lines (67%)" in str(e) and "byte 0xfc at byte offset 7" in str(e)
    assert sorted(decode(data, share=0.7).bad_lines) == [2, 3]
    assert "1 of 2" in str(error("Weiß\n".encode() + b"\xfc", share=0))


def test_a_utf8_bom_is_evidence_of_utf8_even_with_no_other_multibyte_sequence():
    d = decode(codecs.BOM_UTF8 + b"abc\nM\xfcller\n", share=1.0)
    assert d.encoding == "utf-8-sig" and list(d.bad_lines) == [2] and d.text == "abc\nM\ufffdller\n"
    assert "byte offset 8 " in d.bad_lines[2]  # offsets count the BOM


# --- decode_file: the other kinds of file ---------------------------------------------------


def test_genuine_cp1252_is_cp1252():
    text = "ticket_id,summary\r\nWO-1,Müller: Öl bei 85 °C – Größe “ok”\r\n"
    d = decode(text.encode("cp1252"))
    assert (d.text, d.encoding, d.bad_lines) == (text, "cp1252", {})
    assert d.evidence.startswith(
        "no valid multi-byte UTF-8 sequence; 8 invalid UTF-8 sequences on 1 of 2 lines"
    )


def test_bytes_no_declared_encoding_decodes():
    e = error(b"a\nb\x81\xfc\n")  # 0x81 is undefined in cp1252
    assert e.row == 2
    assert "cp1252 cannot decode byte 0x81 at byte offset 3 (line 2)" in str(e)
    assert "not UTF-8 (byte 0x81 at byte offset 3" in str(error(b"a\nb\x81\xfc\n", ["utf-8"]))
    assert "no non-UTF encoding is declared" in str(error(b"\xfc", ["utf-8-sig"]))


def test_pure_ascii_is_the_first_ascii_compatible_encoding():
    assert decode(b"a;b\n1;2\n").encoding == "utf-8-sig"
    assert decode(b"a;b\n", ["cp1252", "utf-8"]).encoding == "cp1252"
    d = decode(b"a;b\n", ["utf-16", "cp1252"])
    assert (d.text, d.encoding) == ("a;b\n", "cp1252") and d.evidence.startswith("ASCII only")
    assert "ASCII text" in str(error(b"a;b\n", ["utf-16"]))
    assert decode(b"").text == ""


def test_valid_utf8_with_bom_and_without():
    for data in (codecs.BOM_UTF8 + "Weiß\n".encode(), "Weiß\n".encode()):
        d = decode(data)
        assert (d.text, d.encoding, d.bad_lines) == ("Weiß\n", "utf-8-sig", {})
        assert "valid UTF-8: 1 multi-byte sequences" in d.evidence
    assert decode("Weiß".encode(), ["utf-8"]).encoding == "utf-8"


def test_a_utf8_bom_needs_utf8_sig():
    assert "utf-8-sig reads it" in str(error(codecs.BOM_UTF8 + b"a\n", ["utf-8"]))


def test_valid_utf8_is_never_read_as_cp1252():
    e = error("id\nWeiß\n".encode(), ["cp1252"])
    assert e.row == 2 and "valid UTF-8 with 1 multi-byte sequences" in str(e)
    assert "no declared encoding reads" in str(error("Weiß\n".encode() + b"\xfc\n", ["cp1252"], share=1))


@pytest.mark.parametrize(
    "encoding,label",
    [
        ("utf-16-le", "UTF-16 LE"),
        ("utf-16-be", "UTF-16 BE"),
        ("utf-32-le", "UTF-32 LE"),
        ("utf-32-be", "UTF-32 BE"),
    ],
)
def test_a_wide_bom_that_is_not_declared_is_named(encoding, label):
    bom = {"utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}.get(
        encoding, {"utf-32-le": codecs.BOM_UTF32_LE, "utf-32-be": codecs.BOM_UTF32_BE}.get(encoding)
    )
    e = error(bom + "a;b\nWeiß;1\n".encode(encoding))
    assert str(e).endswith(
        f"file starts with a {label} byte-order mark; declared encodings ['utf-8-sig', 'cp1252']"
    )
    assert e.file == "f.csv"


@pytest.mark.parametrize("encoding,label", [("utf-16-le", "UTF-16 LE"), ("utf-16-be", "UTF-16 BE")])
def test_bomless_utf16_is_recognised_by_its_nul_bytes(encoding, label):
    data = "ticket_id,opened\nWO-1,Weiß\n".encode(encoding)
    assert f"looks like {label} without a byte-order mark (NUL bytes at" in str(error(data))
    d = decode(data, ["utf-8-sig", "utf-16"])
    assert (d.text, d.encoding) == ("ticket_id,opened\nWO-1,Weiß\n", "utf-16")
    assert d.evidence.startswith("no byte-order mark; NUL bytes at 100% of")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32"])
def test_declared_utf16_and_utf32_decode(encoding):
    text = "ticket_id,summary\r\nWO-1,Müller €\r\n"
    declared = ["utf-8-sig", encoding if encoding != "utf-16-be" else "UTF-16BE"]
    endian = {"utf-16": "utf-16-le", "utf-32": "utf-32-le"}.get(encoding, encoding)
    bom = {
        "utf-16-le": codecs.BOM_UTF16_LE,
        "utf-16-be": codecs.BOM_UTF16_BE,
        "utf-32-le": codecs.BOM_UTF32_LE,
    }
    d = decode(bom[endian] + text.encode(endian), declared)
    assert (d.text, d.encoding, d.bad_lines) == (text, declared[1], {})
    assert d.evidence.endswith("byte-order mark")


def test_utf16_with_the_wrong_endianness_declared():
    e = error(codecs.BOM_UTF16_LE + "a".encode("utf-16-le"), ["utf-16-be"])
    assert "UTF-16 LE byte-order mark; declared encodings ['utf-16-be']" in str(e)


def test_invalid_utf16_is_a_file_level_error():
    e = error(
        codecs.BOM_UTF16_LE + "a\nb\n".encode("utf-16-le") + b"\x00\xd8a\x00", ["utf-16"]
    )  # lone surrogate
    assert e.row == 3 and "UTF-16 LE text has invalid bytes at byte offset 10" in str(e)


def test_binary_files_are_not_text():
    zipped = b"PK\x03\x04\x14\x00\x00\x00\x08\x00" + bytes(range(256))
    assert "file is a ZIP container (xlsx/docx?), not text" in str(error(zipped))
    assert "Parquet" in str(error(b"PAR1\x15\x04\x15\x00\x00PAR1"))
    assert "looks like binary (NUL bytes" in str(error(b"\x01\x00\x02\xfc\x00\x00\x00\x81"))
    assert decode(b"PAR1_id;x\n1;2\n").text.startswith("PAR1")  # no NUL: a CSV whose header starts so


def test_bad_params():
    for encodings in (["utf-8", "klingon"], ["rot13"], ["undefined"], [], "utf-8"):
        assert error(b"a", encodings, rule="bad_params").column == "encodings"
    for share in (1.5, -0.1, None, True):
        e = error(b"a", share=share, rule="bad_params")
        assert e.column == "max_bad_line_share"
    with pytest.raises(TypeError):
        D.decode_file(b"a", DECLARED, "f.csv")  # the share is a knob: params, no default


def test_decoding_is_linear_in_the_file_size():
    data, _ = mixed()
    big = data * 20_000  # 6.7 MB, 40 000 bad lines of 200 000
    t0 = time.perf_counter()
    d = decode(big)
    assert len(d.bad_lines) == 40_000 and time.perf_counter() - t0 < 5


# --- properties ------------------------------------------------------------------------------

NO_NUL = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=200)


@settings(max_examples=300, deadline=None)
@given(NO_NUL)
def test_utf8_sig_text_round_trips_exactly(text):
    d = decode(text.encode("utf-8-sig"))
    assert (d.text, d.bad_lines) == (text, {}) and d.encoding == "utf-8-sig"


@settings(max_examples=300, deadline=None)
@given(NO_NUL.filter(lambda t: not t.startswith("\ufeff")))
def test_utf8_text_round_trips_exactly(text):
    for declared in (DECLARED, ["utf-8"], ["cp1252", "utf-8"]):
        d = decode(text.encode("utf-8"), declared)
        assert (d.text, d.bad_lines) == (text, {})


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("\x00ab\n;ß€"), max_size=40))
def test_utf8_text_with_nul_round_trips_or_is_an_error(text):
    try:
        d = decode(text.encode("utf-8"))
    except ClapError as e:
        assert e.rule == "bad_encoding" and "without a byte-order mark" in str(e)
    else:
        assert d.text == text


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_decode_faithfully_or_raise_a_clap_error(data):
    try:
        d = decode(data, share=1.0)
    except ClapError as e:
        assert e.rule == "bad_encoding"
        return
    if d.encoding == "cp1252":
        assert d.text == data.decode("cp1252")
    elif not d.bad_lines:
        assert d.text.encode("utf-8") == data.removeprefix(codecs.BOM_UTF8)
    else:
        assert d.text == data.removeprefix(codecs.BOM_UTF8).decode("utf-8", "replace")
        ok = [k for k, line in enumerate(data.removeprefix(codecs.BOM_UTF8).split(b"\n"), 1) if _utf8(line)]
        assert set(d.bad_lines).isdisjoint(ok)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# --- describe ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"", "empty"),
        (
            codecs.BOM_UTF16_LE + "a;b;c\n".encode("utf-16-le"),
            "UTF-16 LE BOM, then CSV-like text: first line splits into 3",
        ),
        (codecs.BOM_UTF16_BE + "[1]".encode("utf-16-be"), "UTF-16 BE BOM, then a JSON array"),
        (codecs.BOM_UTF32_LE + "{}".encode("utf-32-le"), "UTF-32 LE BOM, then JSON Lines"),
        ("a,b\n".encode("utf-16-le"), "UTF-16 LE without BOM (NUL bytes at 100% of odd offsets"),
        (codecs.BOM_UTF8 + b"a;b\n", "UTF-8 BOM, then CSV-like text"),
        (b'  [{"a": 1}]', "a JSON array (starts with '[')"),
        (b'{"a": 1}\n{"a": 2}\n', "JSON Lines (first line is an object)"),
        (b'{\n  "a": 1\n}\n', "a JSON object (starts with '{')"),
        (b"<?xml version='1.0'?>", "XML/HTML (starts with '<')"),
        (b"a;b;c;d;e;f;g;h\n1;2", "CSV-like text: first line splits into 8 fields on ';', 1 on ','"),
        (b'"x,y";b\n', "CSV-like text: first line splits into 2 fields on ';', 1 on ','"),
        (b"a\tb\tc\n", "CSV-like text: first line splits into 3 fields on '\\t'"),
        (b"hello world\n", "text without ',', ';', tab or '|' on its first line ('hello world')"),
        (b"PK\x03\x04\x14\x00\x00\x00", "a ZIP container (xlsx/docx?)"),
        (b"PAR1\x15\x00\x15", "Parquet (PAR1 magic)"),
        (b"\x1f\x8b\x08\x00\x00\x00", "gzip-compressed data"),
        (b"\x01\x02\x00\xff\xfa\x00\x00\x00\x00", "binary (NUL bytes: 5 in the first 9)"),
        (
            "a;Müller\n".encode("cp1252"),
            "non-UTF-8 text (byte 0xfc at offset 3): CSV-like text: first line splits into 2",
        ),
        (b" \r\n\t", "whitespace only"),
    ],
)
def test_describe(data, expected):
    assert D.describe(data).startswith(expected)


def test_describe_looks_only_at_the_limit():
    data = "x" * 10 + "ß"
    assert D.describe(data.encode(), limit=11).startswith("text without")  # ß cut in half is not an error
    assert D.describe(b"a;b" + b"\x00" * 10_000, limit=3).startswith("CSV-like text")
    assert D.describe(b"abc", limit=0) == "not looked at (limit 0)"


PREFIXES = [
    b"",
    codecs.BOM_UTF8,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF16_BE,
    codecs.BOM_UTF32_LE,
    b"PK\x03\x04",
    b"PAR1",
    b"[",
    b"{",
    b'{"a": [',
    b"<",
    b"a;b,c\t|",
]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(PREFIXES), st.binary(max_size=200), st.integers(-1, 300))
def test_describe_never_raises(prefix, data, limit):
    assert isinstance(D.describe(prefix + data), str)
    assert isinstance(D.describe(prefix + data, limit=limit), str)


# --- guess_delimiter ----------------------------------------------------------------------------


def test_guess_delimiter():
    assert D.guess_delimiter("report_id;shift_date;line;shift;kpi;value;uom;remark\r\n") == ";"
    assert D.guess_delimiter("ticket_id,opened,line;shift") == ","
    assert D.guess_delimiter("a,b;c") == ","  # a tie: the earlier candidate
    assert D.guess_delimiter('"a;b;c",d') == ","  # delimiters inside quotes do not split
    assert D.guess_delimiter("a\tb|c\td") == "\t"
    assert D.guess_delimiter("report_id") is None
    assert D.guess_delimiter("a;b", candidates=",") is None


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(",;\t|"), st.lists(st.text(st.characters(exclude_characters=',;\t|"\r\n')), min_size=2)
)
def test_guess_delimiter_finds_the_joining_delimiter(delimiter, fields):
    assert D.guess_delimiter(delimiter.join(fields)) == delimiter


# --- JSON depth ----------------------------------------------------------------------------------


def test_ten_thousand_brackets_are_too_deep_not_a_recursion_error():
    text = "[" * 10_000 + "]" * 10_000
    with pytest.raises(RecursionError):
        json.loads(text)  # why the check exists
    assert not D.json_depth_ok(text, 64)
    with pytest.raises(D.TooDeep) as e:
        D.loads_bounded(text, 64)
    assert isinstance(e.value, ValueError) and "deeper than 64" in str(e.value)
    with pytest.raises(D.TooDeep):
        D.loads_bounded(text, 10**6)  # allowed by the caller, but beyond what json.loads can: still TooDeep


def test_json_depth_counts_only_brackets_outside_strings():
    assert D.json_depth_ok('["[[[[", "{{{", "]]]"]', 1)
    assert D.json_depth_ok(r'["\"[[[", "\\", {"k\\\"[": []}]', 3)
    assert not D.json_depth_ok(r'["\"[[[", "\\", {"k\\\"[": []}]', 2)
    assert D.json_depth_ok("1", 0) and not D.json_depth_ok("[]", 0) and not D.json_depth_ok("1", -1)
    assert D.json_depth_ok('"[[[[[[', 0)  # an unterminated string hides the rest
    assert D.loads_bounded('{"a": [1, {"b": "[["}]}', 3) == {"a": [1, {"b": "[["}]}


def test_loads_bounded_passes_json_errors_through():
    with pytest.raises(json.JSONDecodeError):
        D.loads_bounded('{"a": ', 8)


def test_json_depth_is_linear_on_pathological_text():
    t0 = time.perf_counter()
    for text in ('"' + "\\" * 1_000_001, '"\\"' * 300_000, "[" * 1_000_000, '"' * 1_000_000):
        D.json_depth_ok(text, 10**7)
    assert time.perf_counter() - t0 < 5


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=30,
)


def _depth(v) -> int:
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    return 0


@settings(max_examples=400, deadline=None)
@given(JSON, st.booleans())
def test_json_depth_ok_agrees_with_the_actual_nesting(value, ascii_only):
    text, depth = json.dumps(value, ensure_ascii=ascii_only), _depth(value)
    assert D.json_depth_ok(text, depth)
    assert not D.json_depth_ok(text, depth - 1)
    assert D.loads_bounded(text, depth) == value
