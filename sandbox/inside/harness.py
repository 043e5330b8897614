"""The two roles of a code check, each in its own sandboxed process (see ``docs/sandbox.md``).

* :func:`serve_solution` runs the solution module (the prompt's code with the model's
  completion) and then answers calls: each request names positional and keyword arguments as
  plain data (:mod:`wire`), the reply is the return value as plain data, or the exception the
  solution raised (type name, message, line), or why the value cannot cross.
* :func:`run_test` runs the benchmark's test code (the prompt's helpers and ``check``) with a
  :class:`Solution` proxy in place of the function under test, and alone decides the verdict: it
  reports ``done`` to the parent only when ``check`` returned. Nothing the solution sends can
  reach that report: the solution's process holds neither the status pipe nor any object of the
  test, and its replies are decoded into fresh plain values before the test compares them.

Standard library only; imported by ``boot.py`` inside the sandbox.
"""
import builtins
import os
import sys

import wire

__all__ = ["Solution", "run_test", "serve_solution"]

_SOLUTION_FILE = "solution.py"
_TEST_FILE = "<test>"
_REPR_LIMIT = 160


def _one_line(text, limit=300):
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _message(exc):
    try:
        return _one_line(str(exc))
    except BaseException:  # noqa: BLE001 - a broken __str__ must not break the report
        return "<unprintable>"


def _where(exc, filename, source_lines, label):
    """'<label> line N: <code>' for the innermost frame of ``exc`` in ``filename``, or ''."""
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) and getattr(exc, "filename", None) == filename else None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line and 0 < line <= len(source_lines):
        return "%s line %d: %s" % (label, line, source_lines[line - 1].strip()[:200])
    return ""


def _describe(exc, filename, source_lines, label):
    name = type(exc).__name__
    message = _message(exc)
    reason = "%s: %s" % (name, message) if message else name
    where = _where(exc, filename, source_lines, label)
    return name, reason + (" (%s)" % where if where else "")


def _new_main(path):
    module = type(sys)("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    return module


def _classes(module):
    return {k: v for k, v in vars(module).items() if isinstance(v, type) and v.__module__ == "__main__"}


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - a broken stream must not change the result
            pass


# --------------------------------------------------------------------------------------------
# The solution's process


def serve_solution(source, cfg):
    """Load the solution module, then answer the test's calls until it closes the channel."""
    send_fd, recv_fd, entry_point = cfg["send_fd"], cfg["recv_fd"], cfg["entry_point"]
    path = os.path.join(os.getcwd(), _SOLUTION_FILE)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(source)
    lines = source.splitlines()
    module = _new_main(path)
    try:
        exec(compile(source, path, "exec"), module.__dict__)
        func = module.__dict__.get(entry_point)
        if not callable(func):
            raise NameError("the solution does not define %s" % entry_point)
    except SystemExit as exc:
        _load_failed(send_fd, "exit", "SystemExit", "the solution called sys.exit(%r) while loading" % (exc.code,))
    except BaseException as exc:  # noqa: BLE001 - any failure to load is the result
        name, reason = _describe(exc, path, lines, "solution")
        _load_failed(send_fd, "memory" if isinstance(exc, MemoryError) else "load", name, reason)
    _reply(send_fd, {"op": "ready"})
    while True:
        try:
            request = wire.recv(recv_fd, 1 << 62)
        except (wire.WireError, OSError):
            break
        if request is None:
            break  # the test is over
        reply = _call(module, entry_point, request, path, lines, send_fd)
        _flush()  # the solution's output up to this call, before the test may end
        _reply(send_fd, reply)
    _flush()
    os._exit(0)


def _reply(fd, message):
    try:
        wire.send(fd, message)
    except OSError:  # the test has gone: nothing left to answer
        _flush()
        os._exit(0)


def _load_failed(send_fd, kind, name, reason):
    _flush()
    try:
        wire.send(send_fd, {"op": "load_error", "kind": kind, "type": name, "reason": reason})
    except OSError:
        pass
    os._exit(1)


def _call(module, entry_point, request, path, lines, send_fd):
    try:
        classes = _classes(module)
        args = wire.decode(request["args"], classes)
        kwargs = wire.decode(request["kwargs"], classes)
    except (wire.WireError, KeyError, TypeError) as exc:
        return {"op": "unsupported", "reason": "the call's arguments did not arrive: %s" % exc}
    try:
        result = module.__dict__[entry_point](*args, **kwargs)
        return {"op": "return", "value": wire.encode(result)}
    except SystemExit as exc:
        _flush()
        _reply(send_fd, {"op": "exit", "reason": "the solution called sys.exit(%r) during a call" % (exc.code,)})
        os._exit(exc.code if isinstance(exc.code, int) and 0 <= exc.code < 256 else 1)
    except wire.WireError as exc:
        return {"op": "unsupported", "reason": str(exc)}
    except BaseException as exc:  # noqa: BLE001 - the solution's exception is the reply
        name, reason = _describe(exc, path, lines, "solution")
        return {"op": "raise", "type": name, "message": _message(exc), "reason": reason}


# --------------------------------------------------------------------------------------------
# The test's process


class SolutionGone(BaseException):
    """The solution's process ended, or it answered something that is not a value.

    A ``BaseException``: a test's ``except Exception`` must not swallow the loss of the solution.
    """

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Solution:
    """Stands for the function under test inside the test's process.

    Calling it sends the arguments as plain data to the solution's process and returns the
    decoded reply: a fresh value of exact builtin types (or of the test module's own classes).
    An exception the solution raised is raised here as the builtin exception of the same name
    (``ValueError``, ``IndexError``, ...) with the same message, so tests that expect an
    exception behave as with an in-process function; other exception types arrive as
    ``SolutionError``.
    """

    def __init__(self, name, send_fd, recv_fd, module, max_bytes):
        self.__name__ = self.__qualname__ = name
        self._send_fd, self._recv_fd = send_fd, recv_fd
        self._module, self._max_bytes = module, max_bytes
        self.calls = 0
        self.last_call = ""
        self.broken = None  # the first SolutionGone, kept even if a test swallowed it

    def __repr__(self):
        return "<solution %s>" % self.__name__

    def __call__(self, *args, **kwargs):
        if self.broken is not None:
            raise self.broken
        shown = ", ".join([_short(a) for a in args] + ["%s=%s" % (k, _short(v)) for k, v in kwargs.items()])
        self.last_call = "%s(%s)" % (self.__name__, shown)
        self.calls += 1
        try:
            request = {"op": "call", "args": wire.encode(list(args)), "kwargs": wire.encode(dict(kwargs))}
        except wire.WireError as exc:
            raise self._fail("argument", "an argument of %s cannot cross to the solution: %s" % (self.last_call, exc))
        try:
            wire.send(self._send_fd, request)
            reply = wire.recv(self._recv_fd, self._max_bytes)
        except wire.WireError as exc:
            raise self._fail("wire", "the solution's reply to %s was refused: %s" % (self.last_call, exc))
        except OSError:
            reply = None
        if reply is None:
            raise self._fail("gone", "the solution's process ended during %s" % self.last_call)
        op = reply.get("op") if isinstance(reply, dict) else None
        if op == "return":
            try:
                value = wire.decode(reply.get("value"), _classes(self._module))
            except wire.WireError as exc:
                raise self._fail("wire", "the value %s returned was refused: %s" % (self.last_call, exc))
            self.last_call += " returned " + _short(value)
            return value
        if op == "raise":
            self.last_call += " raised " + str(reply.get("type"))
            raise _rebuild(reply)
        if op == "unsupported":
            raise self._fail("unsupported", "%s: %s" % (self.last_call, reply.get("reason")))
        if op == "exit":
            raise self._fail("exit", "%s (in %s)" % (reply.get("reason"), self.last_call))
        raise self._fail("wire", "the solution answered %s with a message that is not a reply" % self.last_call)

    def _fail(self, kind, reason):
        self.broken = SolutionGone(kind, reason)
        return self.broken


class SolutionError(Exception):
    """An exception the solution raised whose type is not a builtin exception."""


def _short(value):
    try:
        text = repr(value)
    except BaseException:  # noqa: BLE001
        text = "<unprintable>"
    return text if len(text) <= _REPR_LIMIT else text[: _REPR_LIMIT - 3] + "..."


def _rebuild(reply):
    name, message = str(reply.get("type")), str(reply.get("message", ""))
    cls = getattr(builtins, name, None)
    exc = None
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            exc = cls(message)
        except BaseException:  # noqa: BLE001 - e.g. UnicodeDecodeError needs five arguments
            exc = None
    if exc is None:
        exc = SolutionError("%s: %s" % (name, message))
    exc._atlas_solution = (name, str(reply.get("reason", name)))
    return exc


def run_test(source, cfg, status):
    """Run the test module, then ``check(<the solution>)``; report ``done`` only if it returns."""
    send_fd, recv_fd, entry_point = cfg["send_fd"], cfg["recv_fd"], cfg["entry_point"]
    lines = source.splitlines()
    module = _new_main(_TEST_FILE)
    try:
        exec(compile(source, _TEST_FILE, "exec"), module.__dict__)
        check = module.__dict__.get("check")
        if not callable(check):
            raise NameError("the test defines no check function")
    except BaseException as exc:  # noqa: BLE001 - a test that cannot load is the benchmark's fault
        _flush()
        status.send("error", "test_load", type(exc).__name__, "the test failed to load: " + _describe(exc, _TEST_FILE, lines, "test")[1])
        os._exit(1)
    try:
        first = wire.recv(recv_fd, cfg["max_message_bytes"])
    except (wire.WireError, OSError):
        first = None
    if not isinstance(first, dict) or first.get("op") != "ready":
        _flush()
        if isinstance(first, dict) and first.get("op") == "load_error":
            kind = "memory" if first.get("kind") == "memory" else "load"
            status.send("error", kind, str(first.get("type")), "the solution failed to load: %s" % first.get("reason"))
        else:
            status.send("error", "gone", "SolutionGone", "the solution's process ended before it was ready")
        os._exit(1)
    solution = Solution(entry_point, send_fd, recv_fd, module, cfg["max_message_bytes"])
    module.__dict__[entry_point] = solution
    try:
        check(solution)
        if solution.broken is not None:
            raise solution.broken
    except SolutionGone as exc:
        _flush()
        status.send("error", exc.kind, "SolutionGone", exc.reason)
        os._exit(1)
    except BaseException as exc:  # noqa: BLE001 - any failure of the test is the verdict
        _flush()
        origin = getattr(exc, "_atlas_solution", None)
        if origin is not None:
            name, reason = origin
            kind = "memory" if name == "MemoryError" else "solution"
            detail = reason[len(name):].lstrip(": ") if reason.startswith(name) else reason
            status.send("error", kind, name, "%s raised by the solution%s" % (name, (": " + detail) if detail else ""))
        else:
            name, reason = _describe(exc, _TEST_FILE, lines, "test")
            if solution.last_call:
                reason += "; last call: " + solution.last_call
            status.send("error", "assertion" if isinstance(exc, AssertionError) else "exception", name, reason)
        os._exit(1)
    _flush()
    status.send("done", str(solution.calls))
    os._exit(0)
