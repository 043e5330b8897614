"""Plain data across the sandbox boundary: the value codec and the message framing.

The test of a code problem and the solution under test run in two separate sandboxed processes
(``docs/sandbox.md``). Every call from the test into the solution, and every value coming back,
crosses between them as a message of this module, in which each value keeps its exact type. ``True`` stays a ``bool`` and ``1`` an ``int``, a tuple stays a tuple, a set a set; an
object whose ``__eq__`` always answers True, a callable, a frame or a module cannot cross at all,
so the test only ever compares plain data that it rebuilt itself.

Written here rather than imported: ``pickle`` runs arbitrary callables while loading and
``marshal`` is documented as unsafe for untrusted input, so neither may read what the solution
sends; ``json`` loses the distinctions above (tuple vs list, int vs bool keys, sets, bytes), and
importing it (with ``re`` and ``enum``) costs each sandboxed process more than the rest of its
start-up. Standard library only: this file runs inside both sandboxed processes.

Values (``encode`` -> a tree of ``None``/``bool``/``int``/``float``/``str``/``list`` and
``dict`` with string keys; ``decode`` <- it):

* ``None``, ``bool``, ``str``, ``float`` (NaN and infinities included, round-trip exact) and
  ``int`` below 2**53 in magnitude: themselves; a ``list``: a list.
* every other value: a dict with one key naming its type -- ``int`` (hex digits, any size),
  ``tuple``, ``dict`` (a list of key/value pairs: keys of any type), ``set``, ``frozenset``,
  ``bytes``, ``bytearray``, ``complex``, ``range``, ``slice``, ``ellipsis``, ``decimal``,
  ``fraction``, ``OrderedDict``, ``Counter``, ``defaultdict`` (a builtin default factory only),
  ``deque``, ``dict_keys``, ``dict_values``, ``dict_items``, ``iterator`` (a generator, ``map``,
  ``zip``, ... is materialised, up to :data:`MAX_ITEMS` items, and comes back as an iterator over
  the items), ``type`` (a builtin type such as ``int``, by name), ``re.Match`` (its groups' spans;
  it comes back as :class:`Match`, which has the same read-only API), ``namedtuple`` and ``object`` (an instance of a class defined at the top level of
  the program, by class name and attributes; the receiving side rebuilds it from *its own*
  class of that name without running any of its code).
* a value of a subclass of ``int``, ``float``, ``str``, ``bytes``, ``tuple``, ``list``, ``dict``,
  ``set`` or ``frozenset`` (an ``IntEnum``, ``numpy.float64``, a namedtuple the other side does
  not define) crosses as that builtin; a numpy scalar as its ``.item()``.

Messages (``dumps``/``loads`` of such a tree; ``send``/``recv`` frame them with an 8-byte
big-endian length): ``N``, ``T``, ``F``; ``I<hex>;`` an int; ``D<float.hex()>;`` a float;
``S<n>:<n bytes of UTF-8>`` a string; ``L<n>:`` a list of n values; ``M<n>:`` n string keys, each
followed by its value. The reader checks every length against what is left and bounds nesting.
"""

import builtins
import os
import sys

__all__ = ["MAX_DEPTH", "MAX_ITEMS", "Match", "WireError", "decode", "dumps", "encode", "loads", "recv", "send"]

#: Deepest nesting of containers that crosses (deeper values are refused, not truncated).
MAX_DEPTH = 100
#: Most items an iterator result is materialised to.
MAX_ITEMS = 1_000_000
_JSON_INT = 1 << 53
_HEADER = 8

# collections, decimal and fractions are imported only when a value of theirs crosses: a value of
# one of their types can only exist where the module is loaded already (start-up time matters).
_BUILTIN_FACTORIES = {t.__name__: t for t in (int, float, str, bytes, list, tuple, dict, set, frozenset, bool, complex)}
_ITERATOR_TYPES = tuple(
    type(x) for x in ((i for i in ()), map(int, ()), filter(None, ()), zip(), enumerate(()), reversed([]), iter([]))
)
_KEYS, _VALUES, _ITEMS = type({}.keys()), type({}.values()), type({}.items())


class WireError(Exception):
    """A value that cannot cross the boundary, or a malformed or oversized message."""


def _type_name(value) -> str:
    t = type(value)
    module = getattr(t, "__module__", "?")
    name = getattr(t, "__qualname__", getattr(t, "__name__", "?"))
    return name if module == "builtins" else "%s.%s" % (module, name)


def _top_level_class(value, module_name: str):
    """The class of ``value`` if it is defined at the top level of the program's module."""
    cls = type(value)
    if getattr(cls, "__module__", None) != module_name or "." in getattr(cls, "__qualname__", "."):
        return None
    return cls


def encode(value, module_name: str = "__main__"):
    """``value`` as a JSON-ready structure (see the module docstring); :class:`WireError` if it cannot cross."""
    try:
        return _Encoder(module_name).encode(value, 0)
    except RecursionError:
        raise WireError("a value nested too deeply cannot cross") from None


class _Encoder:
    def __init__(self, module_name):
        self.module_name = module_name
        self.active = set()  # ids of containers being encoded: a cycle cannot cross

    def encode(self, value, depth):
        t = type(value)
        if value is None or t is bool or t is str or t is float:
            return value
        if t is int:
            return value if -_JSON_INT < value < _JSON_INT else {"int": hex(value)}
        if depth >= MAX_DEPTH:
            raise WireError("a value nested deeper than %d levels cannot cross" % MAX_DEPTH)
        key = id(value)
        if key in self.active:
            raise WireError("a value that contains itself cannot cross")
        self.active.add(key)
        try:
            return self._container(value, t, depth + 1)
        finally:
            self.active.discard(key)

    def _seq(self, items, depth):
        return [self.encode(v, depth) for v in items]

    def _pairs(self, mapping, depth):
        return [[self.encode(k, depth), self.encode(v, depth)] for k, v in mapping.items()]

    def _container(self, value, t, depth):
        if t is list:
            return self._seq(value, depth)
        if t is tuple:
            return {"tuple": self._seq(value, depth)}
        if t is dict:
            return {"dict": self._pairs(value, depth)}
        if t is set or t is frozenset:
            return {t.__name__: self._seq(value, depth)}
        if t is bytes or t is bytearray:
            return {t.__name__: bytes(value).hex()}
        if t is complex:
            return {"complex": [value.real, value.imag]}
        if t is range:
            return {"range": self._seq((value.start, value.stop, value.step), depth)}
        if t is slice:
            return {"slice": self._seq((value.start, value.stop, value.step), depth)}
        if value is Ellipsis:
            return {"ellipsis": None}
        module = getattr(t, "__module__", None)
        if module == "decimal" and t is _loaded("decimal", "Decimal"):
            return {"decimal": str(value)}
        if module == "fractions" and t is _loaded("fractions", "Fraction"):
            return {"fraction": self._seq((value.numerator, value.denominator), depth)}
        if module == "re" and t is _loaded("re", "Match"):
            spans = [list(value.span(i)) for i in range(len(value.regs))]
            names = [[name, index] for name, index in sorted(value.re.groupindex.items())]
            return {"re.Match": [self.encode(value.string, depth), value.pos, value.endpos, spans, names,
                                 self.encode(value.re.pattern, depth)]}
        if t is type and getattr(builtins, getattr(value, "__name__", ""), None) is value:
            return {"type": value.__name__}
        if module == "collections":
            if t is _loaded("collections", "OrderedDict") or t is _loaded("collections", "Counter"):
                return {t.__name__: self._pairs(value, depth)}
            if t is _loaded("collections", "defaultdict"):
                factory = value.default_factory
                name = factory.__name__ if factory in _BUILTIN_FACTORIES.values() else None
                return {"defaultdict": [name, self._pairs(value, depth)]}
            if t is _loaded("collections", "deque"):
                return {"deque": [self._seq(value, depth), value.maxlen]}
        if t is _KEYS or t is _VALUES or t is _ITEMS:
            name = {_KEYS: "dict_keys", _VALUES: "dict_values", _ITEMS: "dict_items"}[t]
            return {name: self._seq(value, depth)}
        if isinstance(value, _ITERATOR_TYPES) or (hasattr(t, "__next__") and hasattr(t, "__iter__")):
            items = []
            for item in value:
                if len(items) >= MAX_ITEMS:
                    raise WireError("an iterator of more than %d items cannot cross" % MAX_ITEMS)
                items.append(item)
            return {"iterator": self._seq(items, depth)}
        cls = _top_level_class(value, self.module_name)
        if cls is not None and issubclass(cls, tuple) and hasattr(cls, "_fields"):
            return {"namedtuple": [cls.__name__, self._seq(tuple(value), depth)]}
        if cls is not None and not _builtin_base(t) and isinstance(getattr(value, "__dict__", None), dict):
            return {"object": [cls.__name__, [[k, self.encode(v, depth)] for k, v in vars(value).items() if type(k) is str]]}
        base = _builtin_base(t)
        if base is not None:
            plain = base(value)
            if type(plain) is not base:
                raise WireError("a value of type %s cannot cross to the test (plain data only)" % _type_name(value))
            return self.encode(plain, depth - 1)
        if getattr(t, "__module__", "") == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
            return self.encode(value.item(), depth)
        raise WireError("a value of type %s cannot cross to the test (plain data only)" % _type_name(value))


def _loaded(module, name):
    return getattr(sys.modules.get(module), name, None)


def _builtin_base(t):
    for base in (bool, int, float, str, bytes, tuple, list, dict, frozenset, set):
        if issubclass(t, base):
            return base
    return None


def decode(data, classes=None):
    """The value that :func:`encode` produced ``data`` from.

    ``classes`` maps class names to the receiving side's own top-level classes, used for the
    ``object`` and ``namedtuple`` tags; an unknown name is a :class:`WireError`.
    """
    try:
        return _decode(data, classes or {}, 0)
    except WireError:
        raise
    except (RecursionError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed structure is a wire error
        raise WireError("malformed value (%s: %s)" % (type(exc).__name__, exc)) from None


def _decode(data, classes, depth):
    t = type(data)
    if data is None or t is bool or t is str or t is float or t is int:
        return data
    if depth >= MAX_DEPTH + 2:
        raise WireError("a value nested deeper than %d levels cannot cross" % MAX_DEPTH)
    if t is list:
        return [_decode(v, classes, depth + 1) for v in data]
    if t is not dict or len(data) != 1:
        raise WireError("malformed value of JSON type %s" % t.__name__)
    (tag, body), = data.items()
    seq = lambda: [_decode(v, classes, depth + 1) for v in body]  # noqa: E731
    pairs = lambda: [(_decode(k, classes, depth + 1), _decode(v, classes, depth + 1)) for k, v in body]  # noqa: E731
    if tag == "int":
        if type(body) is not str:
            raise WireError("malformed int")
        return int(body, 16)
    if tag == "tuple":
        return tuple(seq())
    if tag == "dict":
        return dict(pairs())
    if tag == "set":
        return set(seq())
    if tag == "frozenset":
        return frozenset(seq())
    if tag == "bytes":
        return bytes.fromhex(body)
    if tag == "bytearray":
        return bytearray.fromhex(body)
    if tag == "complex":
        re_, im = body
        if type(re_) is not float or type(im) is not float:
            raise WireError("malformed complex")
        return complex(re_, im)
    if tag == "range":
        return range(*_ints(seq(), 3))
    if tag == "slice":
        return slice(*seq()[:3])
    if tag == "ellipsis":
        return Ellipsis
    if tag == "decimal":
        # here, not at the top: every sandboxed process loads this module; only values of this type need it
        import decimal

        return decimal.Decimal(str(body))
    if tag == "fraction":
        # here, not at the top: every sandboxed process loads this module; only values of this type need it
        import fractions

        return fractions.Fraction(*_ints(seq(), 2))
    if tag in ("OrderedDict", "Counter", "defaultdict", "deque"):
        # here, not at the top: every sandboxed process loads this module; only values of this type need it
        import collections

        if tag == "OrderedDict":
            return collections.OrderedDict(pairs())
        if tag == "Counter":
            return collections.Counter(dict(pairs()))
        if tag == "defaultdict":
            name, items = body
            factory = _BUILTIN_FACTORIES[name] if name is not None else None
            out = collections.defaultdict(factory)
            out.update((_decode(k, classes, depth + 1), _decode(v, classes, depth + 1)) for k, v in items)
            return out
        items, maxlen = body
        if maxlen is not None and type(maxlen) is not int:
            raise WireError("malformed deque")
        return collections.deque([_decode(v, classes, depth + 1) for v in items], maxlen)
    if tag == "dict_keys":
        return dict.fromkeys(seq()).keys()
    if tag == "dict_values":
        return dict(enumerate(seq())).values()
    if tag == "dict_items":
        return dict(seq()).items()
    if tag == "iterator":
        return iter(seq())
    if tag == "type":
        cls = getattr(builtins, body, None) if type(body) is str else None
        if not isinstance(cls, type):
            raise WireError("%r names no builtin type" % (body,))
        return cls
    if tag == "re.Match":
        string, pos, endpos, spans, names, pattern = body
        return Match(_decode(string, classes, depth + 1), pos, endpos, spans, names, _decode(pattern, classes, depth + 1))
    if tag in ("namedtuple", "object"):
        name, fields = body
        cls = classes.get(name) if type(name) is str else None
        if not isinstance(cls, type):
            raise WireError("an instance of class %r crossed, which this side does not define" % (name,))
        if tag == "namedtuple":
            if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
                raise WireError("class %r is not a namedtuple here" % name)
            return tuple.__new__(cls, [_decode(v, classes, depth + 1) for v in fields])
        obj = object.__new__(cls) if cls.__new__ is object.__new__ else cls.__new__(cls)
        attrs = vars(obj)
        for key, value in fields:
            if type(key) is not str:
                raise WireError("malformed attribute name")
            attrs[key] = _decode(value, classes, depth + 1)
        return obj
    raise WireError("unknown type tag %r" % (tag,))


class Match:
    """A ``re.Match`` that crossed: the same read-only API over the groups' spans.

    ``re.Match`` objects cannot be constructed, so the receiving side gets this stand-in: true in
    a boolean context, ``group``/``groups``/``groupdict``/``span``/``start``/``end``/``[]``,
    ``string``, ``pos``, ``endpos``, ``lastindex``, ``pattern``.
    """

    def __init__(self, string, pos, endpos, spans, names, pattern):
        if type(string) not in (str, bytes) or not all(type(a) is int and type(b) is int for a, b in spans):
            raise WireError("malformed re.Match")
        self.string, self.pos, self.endpos, self.pattern = string, pos, endpos, pattern
        self._spans = [tuple(span) for span in spans]
        self._names = {str(name): int(index) for name, index in names}
        self.lastindex = max((i for i, (a, _) in enumerate(self._spans) if i and a >= 0), default=None)

    def _index(self, group):
        index = self._names.get(group, group) if isinstance(group, str) else group
        if type(index) is not int or not 0 <= index < len(self._spans):
            raise IndexError("no such group")
        return index

    def span(self, group=0):
        return self._spans[self._index(group)]

    def start(self, group=0):
        return self.span(group)[0]

    def end(self, group=0):
        return self.span(group)[1]

    def group(self, *groups):
        values = [self._text(g) for g in (groups or (0,))]
        return values[0] if len(values) == 1 else tuple(values)

    def _text(self, group, default=None):
        start, end = self.span(group)
        return default if start < 0 else self.string[start:end]

    def __getitem__(self, group):
        return self._text(group)

    def groups(self, default=None):
        return tuple(self._text(i, default) for i in range(1, len(self._spans)))

    def groupdict(self, default=None):
        return {name: self._text(index, default) for name, index in self._names.items()}

    def __bool__(self):
        return True

    def __repr__(self):
        return "<re.Match object; span=%r, match=%r>" % (self.span(), self.group())


def _ints(values, n):
    if len(values) != n or not all(v is None or type(v) is int for v in values):
        raise WireError("malformed integer arguments")
    return values


# --------------------------------------------------------------------------------------------
# Messages and framing

#: Deepest nesting of a message's tree (each value level adds up to two: a tag and its list).
_MAX_NEST = 2 * MAX_DEPTH + 16


def dumps(tree) -> bytes:
    """The bytes of a message tree (see the module docstring); :class:`WireError` on anything else."""
    out = []
    _dump(tree, out.append, 0)
    return b"".join(out)


def _dump(value, put, depth):
    if depth > _MAX_NEST:
        raise WireError("a message nested too deeply")
    t = type(value)
    if value is None:
        put(b"N")
    elif value is True:
        put(b"T")
    elif value is False:
        put(b"F")
    elif t is int:
        put(b"I%x;" % value)
    elif t is float:
        put(b"D" + value.hex().encode("ascii") + b";")
    elif t is str:
        data = value.encode("utf-8", "surrogatepass")
        put(b"S%d:" % len(data))
        put(data)
    elif t is list:
        put(b"L%d:" % len(value))
        for item in value:
            _dump(item, put, depth + 1)
    elif t is dict:
        put(b"M%d:" % len(value))
        for key, item in value.items():
            if type(key) is not str:
                raise WireError("a message key that is not a string")
            _dump(key, put, depth + 1)
            _dump(item, put, depth + 1)
    else:
        raise WireError("a message part of type %s" % t.__name__)


def loads(data: bytes):
    """The message tree in ``data``; :class:`WireError` for anything malformed or trailing."""
    reader = _Reader(bytes(data))
    tree = reader.value(0)
    if reader.pos != len(reader.data):
        raise WireError("malformed message (trailing bytes)")
    return tree


class _Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def _field(self, end, limit):
        stop = self.data.find(end, self.pos, self.pos + limit + 1)
        if stop < 0:
            raise WireError("malformed message")
        text = self.data[self.pos : stop]
        self.pos = stop + 1
        return text

    def _count(self):
        text = self._field(b":", 20)
        if not text.isdigit():
            raise WireError("malformed message")
        count = int(text)
        if count > len(self.data) - self.pos:
            raise WireError("malformed message (a length beyond its end)")
        return count

    def value(self, depth):
        if depth > _MAX_NEST:
            raise WireError("a message nested too deeply")
        if self.pos >= len(self.data):
            raise WireError("malformed message (truncated)")
        kind = self.data[self.pos : self.pos + 1]
        self.pos += 1
        if kind == b"N":
            return None
        if kind == b"T":
            return True
        if kind == b"F":
            return False
        try:
            if kind == b"I":
                return int(self._field(b";", len(self.data)), 16)
            if kind == b"D":
                return float.fromhex(self._field(b";", 40).decode("ascii"))
        except ValueError:
            raise WireError("malformed message (a number)") from None
        if kind == b"S":
            count = self._count()
            text = self.data[self.pos : self.pos + count]
            self.pos += count
            try:
                return text.decode("utf-8", "surrogatepass")
            except UnicodeDecodeError:
                raise WireError("malformed message (text)") from None
        if kind == b"L":
            return [self.value(depth + 1) for _ in range(self._count())]
        if kind == b"M":
            out = {}
            for _ in range(self._count()):
                key = self.value(depth + 1)
                if type(key) is not str:
                    raise WireError("malformed message (a key that is not a string)")
                out[key] = self.value(depth + 1)
            return out
        raise WireError("malformed message (unknown part %r)" % kind)


def send(fd: int, message) -> None:
    """Write one message (a tree) to ``fd``, blocking until all of it is written."""
    data = dumps(message)
    view = memoryview(len(data).to_bytes(_HEADER, "big") + data)
    while view:
        view = view[os.write(fd, view):]


def recv(fd: int, max_bytes: int):
    """Read one message from ``fd``; None at end of file before a message starts.

    :class:`WireError` for a truncated or malformed message or one longer than ``max_bytes``.
    Reads exactly the message's bytes (no read-ahead buffer holds anything more).
    """
    header = _read_exact(fd, _HEADER)
    if header is None:
        return None
    size = int.from_bytes(header, "big")
    if size > max_bytes:
        raise WireError("a message of %d bytes exceeds the limit of %d bytes" % (size, max_bytes))
    body = _read_exact(fd, size) if size else b""
    if body is None:
        raise WireError("the message ended early")
    return loads(body)


def _read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            if got == 0:
                return None
            raise WireError("the message ended early")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
