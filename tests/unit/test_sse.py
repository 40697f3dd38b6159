"""SSE decoder/encoder: framing, line endings, BOM, limits, byte fidelity."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec
import pytest

from lore_gateway.protocols.common import ProtocolError
from lore_gateway.sse import (
    SSEDecoder,
    SSELimitError,
    encode_comment,
    encode_event,
    frame_block,
    json_values,
    looks_like_sse,
)

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"


def decode_all(chunks: list[bytes], **kw: Any) -> list:
    dec = SSEDecoder(**kw)
    out = []
    for c in chunks:
        out += dec.feed(c)
    out += dec.close()
    return out


def test_basic_event_fields_and_raw_bytes() -> None:
    data = b'event: response.created\ndata: {"a":1}\n\n: keepalive\n\ndata: x\ndata: y\n\n'
    events = decode_all([data])
    assert [(e.event, e.data, e.has_data) for e in events] == [
        ("response.created", '{"a":1}', True),
        (None, "", False),
        (None, "x\ny", True),
    ]
    assert events[2].name == "message"
    assert b"".join(e.raw for e in events) == data


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings_split_at_every_byte(eol: bytes) -> None:
    data = (b"event: a" + eol + b"data: 1" + eol + eol + b"data: 2" + eol + eol)
    for cut in range(len(data) + 1):
        events = decode_all([data[:cut], data[cut:]])
        assert [(e.event, e.data) for e in events] == [("a", "1"), (None, "2")], cut
        assert b"".join(e.raw for e in events) == data


def test_mixed_line_endings() -> None:
    events = decode_all([b"data: 1\r\n\ndata: 2\r\rdata: 3\n\r\n"])
    assert [e.data for e in events] == ["1", "2", "3"]


def test_bom_stripped_once_even_when_split() -> None:
    data = b"\xef\xbb\xbfdata: 1\n\ndata: \xef\xbb\xbf2\n\n"
    for cut in range(5):
        events = decode_all([data[:cut], data[cut:]])
        assert [e.data for e in events] == ["1", "\ufeff2"]
        assert b"".join(e.raw for e in events) == data


def test_unterminated_last_event_is_lenient_by_default_and_strict_on_request() -> None:
    data = b"data: 1\n\ndata: 2\n"
    events = decode_all([data])
    assert [e.data for e in events] == ["1", "2"]
    assert b"".join(e.raw for e in events) == data
    dec = SSEDecoder(require_terminator=True)
    dec.feed(data)
    with pytest.raises(ProtocolError, match="^unterminated SSE event at EOF$"):
        dec.close()


def test_frame_limit() -> None:
    dec = SSEDecoder(max_frames=2)
    dec.feed(b"data: 1\n\n: c\n\n")
    with pytest.raises(SSELimitError, match="^SSE stream exceeded 2 frame limit$"):
        dec.feed(b"data: 3\n\n")


def test_event_byte_limit_for_pending_and_complete_events() -> None:
    with pytest.raises(SSELimitError, match="^SSE event exceeded 16 byte limit$"):
        SSEDecoder(max_event_bytes=16).feed(b"data: " + b"x" * 20)
    with pytest.raises(SSELimitError, match="^SSE event exceeded 16 byte limit$"):
        SSEDecoder(max_event_bytes=16).feed(b"data: " + b"x" * 20 + b"\n\n")


def test_total_byte_limit() -> None:
    dec = SSEDecoder(max_total_bytes=10)
    dec.feed(b"data: 1\n\n")
    with pytest.raises(SSELimitError, match="^SSE stream exceeded aggregate byte limit$"):
        dec.feed(b"data: 2\n\n")


def test_malformed_utf8() -> None:
    with pytest.raises(ProtocolError, match="^malformed SSE UTF-8$"):
        decode_all([b"data: \xff\n\n"])


def test_encode_always_has_event_line_and_blank_line() -> None:
    assert encode_event("ping", '{"type":"ping"}') == b'event: ping\ndata: {"type":"ping"}\n\n'
    assert encode_event("m", "a\nb") == b"event: m\ndata: a\ndata: b\n\n"
    assert encode_comment("keepalive") == b": keepalive\n\n"
    (ev,) = decode_all([encode_event("m", "a\nb")])
    assert (ev.event, ev.data) == ("m", "a\nb")


def test_sniff() -> None:
    assert looks_like_sse(b"\xef\xbb\xbf  event: x")
    assert looks_like_sse(b"data: {}")
    assert not looks_like_sse(b'{"id": 1}')


@pytest.mark.parametrize(
    "path", sorted(itertools.chain(FIXTURES.glob("**/*.sse"))), ids=lambda p: p.name
)
def test_recorded_fixtures_round_trip_byte_for_byte(path: Path) -> None:
    data = path.read_bytes()
    for size in (1, 7, 4096):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        events = decode_all(chunks)
        assert b"".join(e.raw for e in events) == data
        assert any(e.has_data for e in events)


def test_skip_suffix_leaves_out_matching_frames_and_still_counts_them() -> None:
    stream = (b"event: response.created\ndata: {\"a\":1}\n\n"
              b"event: response.output_text.delta\ndata: {\"d\":\"x\"}\n\n"
              b"event: response.output_text.delta\ndata: \xff\xfe not even utf-8\n\n"
              b"event: response.completed\ndata: {\"b\":2}\n\n")
    decoder = SSEDecoder(skip_suffix=b".delta")
    events = [e for i in range(0, len(stream), 7) for e in decoder.feed(stream[i:i + 7])]
    events += decoder.close()
    assert [e.event for e in events] == ["response.created", "response.completed"]
    assert events[1].raw == b"event: response.completed\ndata: {\"b\":2}\n\n"
    assert decoder.frames == 4
    limited = SSEDecoder(skip_suffix=b".delta", max_frames=2)
    with pytest.raises(SSELimitError, match="frame limit"):
        limited.feed(stream)


def test_the_usual_frame_shapes_decode_as_the_general_parser_does() -> None:
    # LF-only input takes the decoder's shortcut for `data:` and `event:`+`data:`
    # frames; CRLF input takes the line-by-line parser. Both must agree on every
    # near-miss of those shapes (no space after the colon, extra lines, a
    # comment, an empty value, a BOM first).
    frames = [
        "data: {\"a\":1}", "event: x\ndata: {}", "event:  padded  \ndata: v", "data:",
        "data: ", "data:nospace", "event:x\ndata: v", "event: x\ndata:v",
        "event: x\ndata: a\ndata: b", "data: a\n: comment", ": c\ndata: a",
        "event: x", "event: x\nid: 1\ndata: a", "data: \u00e9t\u00e9",
    ]
    for frame in frames:
        for bom in ("", "\ufeff"):
            lf = (bom + frame + "\n\n").encode()
            crlf = (bom + frame.replace("\n", "\r\n") + "\r\n\r\n").encode()
            fast = [(e.event, e.data, e.has_data) for e in decode_all([lf])]
            general = [(e.event, e.data, e.has_data) for e in decode_all([crlf])]
            assert fast == general, frame
            assert b"".join(e.raw for e in decode_all([lf])) == lf


def test_usual_frames_among_others_decode_alike_however_the_chunks_fall() -> None:
    # A chunk that starts on a frame boundary is cut up where it lies; the
    # first frame of another shape, or an unfinished one, hands the rest to the
    # buffered parser. Every split gives the frames the CRLF (line-by-line)
    # parse gives, less the skipped ones.
    frames = [b"event: a\ndata: 1", b"data: 2", b": comment", b"", b"event: b\nid: 7\ndata: 3",
              b"event: c.delta\ndata: 4", b"data: 5\ndata: 6", b"event: d\ndata: \xc3\xa9"]
    lf = b"".join(f + b"\n\n" for f in frames)
    crlf = b"".join(f.replace(b"\n", b"\r\n") + b"\r\n\r\n" for f in frames)
    for skip in (None, b".delta"):
        expected = [(e.event, e.data, e.has_data) for e in decode_all([crlf])
                    if skip is None or not e.name.endswith(".delta")]
        for cut in range(len(lf) + 1):
            for cut2 in (cut, min(len(lf), cut + 9)):
                chunks = [lf[:cut], lf[cut:cut2], lf[cut2:]]
                events = decode_all(chunks, skip_suffix=skip)
                assert [(e.event, e.data, e.has_data) for e in events] == expected, (cut, cut2)
                if skip is None:
                    assert b"".join(e.raw for e in events) == lf


_any = msgspec.json.Decoder().decode


def test_a_run_of_one_line_frames_is_decoded_frame_by_frame_in_one_go() -> None:
    data = 'data: {"a":1}\n\ndata: {"b":"é"}\n\ndata: {"c":3}\n\ndata: {"d"'.encode()
    block = frame_block(data, len(data), b"data: ", 10, _any)
    assert block is not None
    assert (block.values, block.frames, block.chars) == ([{"a": 1}, {"b": "é"}, {"c": 3}], 3,
                                                         len('{"a":1}{"b":"é"}{"c":3}'))
    assert data[:block.size].endswith(b"\n\n") and data[block.size:] == b'data: {"d"'
    end = data.find(b'{"c"')
    assert frame_block(data, end, b"data: ", 10, _any).frames == 2  # type: ignore[union-attr]


def test_a_prefix_of_two_lines_counts_its_own_line_break() -> None:
    prefix = b"event: d\ndata: "
    data = prefix + b'{"a":1}\n\n' + prefix + b'{"b":2}\n\n'
    block = frame_block(data, len(data), prefix, 10, _any)
    assert block is not None and block.values == [{"a": 1}, {"b": 2}]
    assert block.chars == len(b'{"a":1}{"b":2}') and block.size == len(data)
    assert frame_block(data.replace(b"\n\nevent", b"\n\n\nevent"), len(data) + 1, prefix,
                       10, _any) is None


@pytest.mark.parametrize("data", [
    b'data: {"a":1}\n\nevent: x\ndata: {"b":2}\n\n',  # another field
    b'data: {"a":1}\n\n: comment\n\n',
    b'data: {"a":\n1}\n\n',  # a payload over two lines
    b'data: {"a":1}\r\n\r\n',
    b'data: {"a":1}\n\n\ndata: {"b":2}\n\n',  # an extra blank line
    b'data:{"a":1}\n\n',
    b'data: {"a":"\xff"}\n\n',  # not UTF-8
    b'data: {"a":1}',  # no whole frame
    b'data: {"a":1},{"b":2}\n\n',  # two values in a frame
])
def test_a_run_with_anything_else_is_not_taken(data: bytes) -> None:
    assert frame_block(data, len(data), b"data: ", 10, _any) is None


def test_a_run_over_the_frame_limit_is_not_taken() -> None:
    data = b'data: {"a":1}\n\n' * 3
    assert frame_block(data, len(data), b"data: ", 2, _any) is None


def test_payloads_are_decoded_only_when_each_is_one_value() -> None:
    assert json_values([b'{"a":"x"}', b"[1]", b"2"], _any) == [{"a": "x"}, [1], 2]
    # Joined with commas, these are two values for two payloads, but neither is one.
    assert json_values([b'{"a":"x', b'y"},{"b":1}'], _any) is None
    assert json_values([b'{"a":[1', b"2]}", b"3,4"], _any) is None
    assert json_values([b"1", b""], _any) is None
    assert json_values([b"1", b"2\n"], _any) is None  # a line break: another line
    # Space around a value is whitespace to a reader of one frame too.
    assert json_values([b" 1", b"2 "], _any) == [1, 2]
    strict = msgspec.json.Decoder(int).decode
    assert json_values([b"1", b'"2"'], strict) is None  # the type is the caller's check


@pytest.mark.parametrize(("first", "second", "end"), [
    (b'data: {"a":', b'1}\n\ndata: {"b":2}\n\n', 4),
    (b'data: {"a":1}\n', b'\ndata: {"b":2}\n\n', 1),
    (b'data: {"a":1}', b'\n\n', 2),
    (b'event: x\ndata: {"a":', b'1}\n\n', 4),
])
def test_the_frame_a_read_left_unfinished_ends_where_its_blank_line_is(
        first: bytes, second: bytes, end: int) -> None:
    decoder = SSEDecoder()
    assert decoder.feed(first) == [] and not decoder.idle
    assert decoder.pending_end(second) == end
    events = decoder.feed(second[:end])
    assert len(events) == 1 and events[0].raw == first + second[:end] and decoder.idle


@pytest.mark.parametrize(("first", "second"), [
    (b"", b'data: {"a":1}\n\n'),  # nothing pending
    (b'data: {"a":', b"1}\n"),  # no blank line yet
    (b'data: {"a":', b"1}\r\n\r\n"),  # CR endings: the decoder's general path decides
    (b'data: {"a":\r', b"1}\n\n"),
])
def test_a_pending_frame_without_a_plain_end_is_left_to_the_decoder(
        first: bytes, second: bytes) -> None:
    decoder = SSEDecoder()
    decoder.feed(first)
    assert decoder.pending_end(second) == -1
