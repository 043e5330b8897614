"""The codec between the test and the solution: exact types both ways, refusals, framing limits."""

from __future__ import annotations

import collections
import decimal
import fractions
import importlib.util
import math
import os
import re
import sys
import threading
from pathlib import Path

import pytest

_WIRE = Path(__file__).resolve().parents[2] / "sandbox" / "inside" / "wire.py"
_spec = importlib.util.spec_from_file_location("sandbox_inside_wire", _WIRE)
wire = importlib.util.module_from_spec(_spec)  # the file the sandboxed processes import as `wire`
_spec.loader.exec_module(wire)


def roundtrip(value, classes=None):
    return wire.decode(wire.loads(wire.dumps(wire.encode(value))), classes)


VALUES = [
    None, True, False, 0, 1, -7, 2**53, -(2**53), 2**200, -(10**5000), 1.5, -0.0, float("inf"), float("-inf"),
    "", "héllo", "\ud800 lone surrogate", [], [1, [2, [3]]], (), (1,), (1, (2, "x")), {}, {1: "a", (1, 2): [3], False: None, "k": 1.0},
    {1, 2, 3}, frozenset({(1, 2)}), b"\x00\xff", bytearray(b"ab"), 1 + 2j, range(1, 10, 3), slice(1, None, 2), Ellipsis,
    decimal.Decimal("1.10"), fractions.Fraction(3, 4), collections.OrderedDict(b=1, a=2), collections.Counter("abca"),
    collections.defaultdict(list, {1: [2]}), collections.deque([1, 2], maxlen=5), int, str, ValueError,
]


@pytest.mark.parametrize("value", VALUES, ids=[type(v).__name__ + str(i) for i, v in enumerate(VALUES)])
def test_values_cross_with_their_exact_type(value):
    out = roundtrip(value)
    assert type(out) is type(value)
    assert out == value or (isinstance(value, float) and math.isnan(value))
    if isinstance(value, dict):
        assert [type(k) for k in out] == [type(k) for k in value] and list(out) == list(value)
    if isinstance(value, collections.defaultdict):
        assert out.default_factory is list
    if isinstance(value, collections.deque):
        assert out.maxlen == 5


def test_nan_and_bool_keys_stay_what_they_were():
    out = roundtrip([float("nan"), {True: 1, 2.0: 2, 3: 3}])
    assert math.isnan(out[0]) and type(out[0]) is float
    assert list(out[1]) == [True, 2.0, 3] and [type(k) for k in out[1]] == [bool, float, int]


def test_views_iterators_and_matches_keep_their_behaviour():
    keys = roundtrip({1: 2, 3: 4}.keys())
    assert keys == {1, 3} and type(keys) is type({}.keys())
    assert roundtrip({1: 2}.items()) == {(1, 2)}
    assert list(roundtrip({1: 2}.values())) == [2]
    gen = roundtrip(x * x for x in range(4))
    assert list(gen) == [0, 1, 4, 9] and list(gen) == []  # an iterator, consumed once
    assert list(roundtrip(map(str, [1, 2]))) == ["1", "2"] and list(roundtrip(zip([1], [2]))) == [(1, 2)]
    match = roundtrip(re.search(r"(a)(?P<name>b)?(c)?", "zab"))
    assert bool(match) and match.group() == "ab" and match.group(1, "name") == ("a", "b") and match[2] == "b"
    assert match.groups() == ("a", "b", None) and match.groupdict() == {"name": "b"} and match.span(1) == (1, 2)
    assert match.start() == 1 and match.end() == 3 and match.string == "zab"


def test_subclasses_of_builtins_cross_as_the_builtin():
    class AlwaysEqualInt(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class LoudStr(str):
        def __eq__(self, other):
            return True

    out = roundtrip([AlwaysEqualInt(3), LoudStr("x"), collections.namedtuple("P", "a b")(1, 2)])
    assert out == [3, "x", (1, 2)] and [type(v) for v in out] == [int, str, tuple]
    assert out[0] != 4 and out[1] != "y"


@pytest.mark.parametrize(
    "value, message",
    [
        (lambda: 1, "type function cannot cross"),
        (type("AlwaysEqual", (), {"__eq__": lambda self, other: True})(), "cannot cross"),
        (NotImplemented, "cannot cross"),
        (sys, "type module cannot cross"),
        (sys._getframe(), "type frame cannot cross"),
        (object(), "type object cannot cross"),
        (open, "cannot cross"),
    ],
)
def test_values_that_carry_behaviour_are_refused(value, message):
    with pytest.raises(wire.WireError, match=message):
        wire.encode(value)


def test_cycles_and_deep_nesting_are_refused():
    loop = []
    loop.append(loop)
    with pytest.raises(wire.WireError, match="contains itself"):
        wire.encode(loop)
    deep = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(wire.WireError, match="deeper than"):
        wire.encode(deep)
    shallow = []
    for _ in range(wire.MAX_DEPTH - 1):
        shallow = [shallow]
    assert roundtrip(shallow) == shallow


class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b

    def __eq__(self, other):
        return isinstance(other, Pair) and (self.a, self.b) == (other.a, other.b)


def test_instances_of_program_classes_are_rebuilt_from_the_receivers_class_without_running_it():
    encoded = wire.encode(Pair(1, [2]), module_name=__name__)
    assert encoded == {"object": ["Pair", [["a", 1], ["b", [2]]]]}

    class ReceiverPair:  # the receiving side's own class of that name: its __init__ must not run
        def __init__(self, *args):
            raise AssertionError("__init__ ran")

    out = wire.decode(encoded, {"Pair": ReceiverPair})
    assert type(out) is ReceiverPair and vars(out) == {"a": 1, "b": [2]}
    with pytest.raises(wire.WireError, match="does not define"):
        wire.decode(encoded, {})
    with pytest.raises(wire.WireError, match="does not define"):
        wire.decode({"object": ["check", []]}, {"check": lambda: None})  # only classes, never functions


@pytest.mark.parametrize(
    "data",
    [
        {"tuple": [1], "extra": 2}, {"unknown_tag": 1}, {"int": 5}, {"complex": ["1", 2.0]}, {"type": "open"},
        {"type": "__import__"}, {"range": [1, "2", 3]}, {"defaultdict": ["eval", []]}, {"set": [[1]]},
        {"re.Match": ["ab", 0, 2, [["x", 1]], [], "a"]},
    ],
)
def test_malformed_structures_are_wire_errors(data):
    with pytest.raises(wire.WireError):
        wire.decode(data)


def _recv_bytes(data: bytes, limit: int = 1 << 30):
    """wire.recv on a pipe fed with ``data`` by a thread: ('value', v) or ('error', exc)."""
    r, w = os.pipe()

    def feed():
        view = memoryview(data)
        while view:
            view = view[os.write(w, view):]
        os.close(w)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        return "value", wire.recv(r, limit)
    except wire.WireError as exc:
        return "error", exc
    finally:
        writer.join(10)
        os.close(r)


def _framed(body: bytes) -> bytes:
    return len(body).to_bytes(8, "big") + body


def test_messages_roundtrip_through_a_pipe():
    message = {"op": "return", "value": wire.encode([1, -2**80, 0.1, float("-inf"), "é\ud800", {"k": (None, True)}])}
    assert _recv_bytes(_framed(wire.dumps(message))) == ("value", message)
    assert _recv_bytes(b"") == ("value", None)  # end of file before a message: the other side is gone


@pytest.mark.parametrize(
    "data, message",
    [
        (_framed(b"x" * 100), "exceeds the limit of 50 bytes"),
        ((1000).to_bytes(8, "big") + b"M1:", "ended early"),
        (_framed(b"{'x': }"), "malformed message"),
        (_framed(b"S99999:abc"), "a length beyond its end"),
        (_framed(b"L3:NN"), "a length beyond its end"),
        (_framed(b"M1:S1:k"), "truncated"),
        (_framed(b"NN"), "trailing bytes"),
        (_framed(b"M1:IA;N"), "not a string"),
        (_framed(b"Dnotafloat;"), "a number"),
        (_framed(b"Ixyz;"), "a number"),
        (_framed(b"S2:\xff\xfe"), "text"),
        (_framed(b"L1:" * 100_000 + b"N"), "nested too deeply"),
        (_framed(b"L99999999999999999999999:"), "malformed"),
    ],
)
def test_malformed_or_oversized_messages_are_wire_errors(data, message):
    kind, value = _recv_bytes(data, 50 if message.startswith("exceeds") else 1 << 30)
    assert kind == "error" and message in str(value), (kind, value)


def test_message_parts_outside_the_tree_are_refused():
    for tree in ({1: 2}, (1, 2), b"x", object()):
        with pytest.raises(wire.WireError):
            wire.dumps(tree)
