# Kiln's Python bootstrap: imports the function once, then serves invocations one at a time.
# Protocol (see runtime-sandbox/worker.ts): one JSON object per line on fd 3, a socketpair shared
# with the pool (or on the unix socket KILN_CHANNEL names, in a container). print(), sys.stdout/stderr and logging become log frames on that channel, so a
# stray line on stdout can never be mistaken for a response.
#
# argv: <task root> <entry, relative> <handler name>
# The handler is called as handler(event, context), sync or async. context is a dict whose keys are
# also attributes: function_name, invocation_id, region, deadline_ms, plus
# get_remaining_time_in_millis().
import io
import json
import logging
import os
import sys
import threading
import time
import traceback

TASK_ROOT, ENTRY, HANDLER = sys.argv[1:4]

# In a container the channel is a unix socket Kiln listens on (KILN_CHANNEL), not an inherited fd.
_channel_path = os.environ.pop("KILN_CHANNEL", None)
_channel_token = os.environ.pop("KILN_CHANNEL_TOKEN", None)
if _channel_path:
    import socket

    _sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inheritable by default
    _sock.connect(_channel_path)
    # The first line on a container's channel proves it is this worker's bootstrap.
    _sock.sendall((json.dumps({"t": "hello", "token": _channel_token}) + "\n").encode())
    _in = _sock.makefile("rb")
    _out = _sock.makefile("wb")
else:
    os.set_inheritable(3, False)  # subprocesses of the function must not hold the channel
    _in = open(3, "rb", closefd=False)
    _out = open(3, "wb", closefd=False)
_lock = threading.Lock()


def send(frame):
    data = (json.dumps(frame, separators=(",", ":")) + "\n").encode()
    with _lock:
        _out.write(data)
        _out.flush()


def log(level, message):
    send({"t": "log", "l": level, "m": message, "ts": time.time() * 1000})


class LogStream(io.TextIOBase):
    """Line-buffered text stream whose lines become log frames."""

    def __init__(self, level, fd):
        self.level, self.fd, self.buf = level, fd, ""

    def writable(self):
        return True

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            log(self.level, line)
        return len(s)

    def flush_partial(self):
        if self.buf:
            log(self.level, self.buf)
            self.buf = ""

    def fileno(self):
        # Code that needs a real descriptor (subprocess, faulthandler) gets the raw pipe, which the
        # pool also turns into log lines.
        return self.fd

    def isatty(self):
        return False

    @property
    def buffer(self):
        return _BytesTo(self)


class _BytesTo(io.RawIOBase):
    """sys.stdout.buffer: bytes are decoded into the text stream's lines."""

    def __init__(self, text):
        self.text = text

    def writable(self):
        return True

    def write(self, b):
        self.text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    @property
    def encoding(self):
        return "utf-8"


sys.stdout = LogStream("info", 1)
sys.stderr = LogStream("error", 2)


class LogHandler(logging.Handler):
    def emit(self, record):
        try:
            level = "error" if record.levelno >= logging.ERROR else "warn" if record.levelno >= logging.WARNING else "info"
            log(level, self.format(record))
        except Exception:
            self.handleError(record)


_handler = LogHandler()
_handler.setFormatter(logging.Formatter("[%(levelname)s] %(name)s: %(message)s"))
logging.getLogger().addHandler(_handler)


class Context(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def get_remaining_time_in_millis(self):
        return max(0, int(self["deadline_ms"] - time.time() * 1000))


def describe(e):
    return {"error": str(e), "type": type(e).__name__}


_BOOTSTRAP = os.path.abspath(__file__)


def format_exc(e):
    """Python's own traceback of e (as the interpreter prints an uncaught one), without this bootstrap's frames."""
    tb = e.__traceback__
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == _BOOTSTRAP:
        tb = tb.tb_next
    if tb is not None:
        e.__traceback__ = tb
    return "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip()


def flush_partial():
    sys.stdout.flush_partial() if isinstance(sys.stdout, LogStream) else None
    sys.stderr.flush_partial() if isinstance(sys.stderr, LogStream) else None


def load():
    # The bootstrap's own folder must not shadow the function's modules.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    sys.path.insert(0, TASK_ROOT)
    module_name = ENTRY[:-3] if ENTRY.endswith(".py") else ENTRY
    import importlib

    mod = importlib.import_module(module_name.replace("/", "."))
    fn = getattr(mod, HANDLER, None)
    if not callable(fn):
        raise AttributeError(f'{ENTRY} defines no function named "{HANDLER}"')
    return fn


# --- durable executions ----------------------------------------------------------------------
# A durable handler is called as handler(event, step, context) (or handler(event, step)). Each step
# call takes the next position; a position the journal settles is answered from it without running
# anything; a new one runs, is reported, and returns only once Kiln has written it down. Kiln may
# answer "suspend" (a sleep, a retry later, a stop): the invocation then ends at once.


class _Suspend(BaseException):
    """Unwinds the handler when Kiln ends the invocation (not an Exception: `except Exception` keeps out)."""


class StepError(Exception):
    def __init__(self, message, type_name="Error"):
        super().__init__(message)
        self.type = type_name


def _await_ack(seq):
    # Only acks arrive while a handler runs (one invocation at a time).
    for line in _in:
        msg = json.loads(line)
        if msg.get("t") == "step_ack" and msg.get("seq") == seq:
            return msg
    os._exit(0)


def _error_of(e):
    return {"message": str(e), "type": getattr(e, "type", None) or type(e).__name__}


class Step:
    def __init__(self, msg):
        self._id = msg["id"]
        self._journal = {e["seq"]: e for e in msg["durable"]["journal"]}
        self._next = 0

    def _ask(self, frame):
        send({"t": "step", "id": self._id, **frame})
        ack = _await_ack(frame["seq"])
        if ack.get("action") == "suspend":
            raise _Suspend()
        if ack.get("action") == "throw":
            err = ack.get("error") or {}
            raise StepError(err.get("message", ""), err.get("type", "Error"))
        return ack

    def _position(self, name, op):
        if not isinstance(name, str) or not name:
            raise TypeError("the first argument of a step must be its name (a non-empty string)")
        seq = self._next
        self._next += 1
        e = self._journal.get(seq)
        if e is not None and (e["name"] != name or e["op"] != op):
            self._ask({"seq": seq, "name": name, "op": "mismatch",
                       "error": f'non-deterministic replay: step {seq + 1} was {e["op"]} "{e["name"]}" when the execution first ran, and is now {op} "{name}"'})
        return seq, e

    def _finish_run(self, seq, name, started, value=None, error=None, retries=None):
        ms = (time.monotonic() - started) * 1000
        if error is None:
            try:
                output = json.loads(json.dumps(value))
                frame = {"status": "completed", "output": output}
            except (TypeError, ValueError) as e:
                error = e
        if error is not None:
            log("error", format_exc(error))
            frame = {"status": "failed", "error": _error_of(error)}
        if retries is not None:
            frame["retries"] = retries
        self._ask({"seq": seq, "name": name, "op": "run", "ms": ms, **frame})
        if error is not None:
            raise StepError(frame["error"]["message"], frame["error"]["type"])
        return frame["output"]

    def run(self, name, fn, retries=None):
        seq, e = self._position(name, "run")
        if _in_event_loop():
            # In an async handler every step is awaited (a replayed one too), so it is always a coroutine.
            return self._run_async(seq, name, e, fn, retries)
        if e is not None:
            return self._settled(e)
        started = time.monotonic()
        try:
            value = fn()
        except Exception as err:  # noqa: BLE001 - the step failed
            return self._finish_run(seq, name, started, error=err, retries=retries)
        return self._finish_run(seq, name, started, value=value, retries=retries)

    async def _run_async(self, seq, name, e, fn, retries):
        if e is not None:
            return self._settled(e)
        started = time.monotonic()
        try:
            value = fn()
            if hasattr(value, "__await__"):
                value = await value
        except Exception as err:  # noqa: BLE001 - the step failed
            return self._finish_run(seq, name, started, error=err, retries=retries)
        return self._finish_run(seq, name, started, value=value, retries=retries)

    @staticmethod
    def _settled(e):
        if e["status"] == "completed":
            return e.get("output")
        err = e.get("error") or {}
        raise StepError(err.get("message", ""), err.get("type", "Error"))

    def _sleep(self, seq, name, e, frame):
        if e is None:
            self._ask({"seq": seq, "name": name, "op": "sleep", **frame})

    def sleep(self, name, duration):
        seq, e = self._position(name, "sleep")
        return self._maybe_async(lambda: self._sleep(seq, name, e, {"duration": duration}))

    def sleep_until(self, name, instant):
        seq, e = self._position(name, "sleep")
        if hasattr(instant, "isoformat"):
            instant = instant.isoformat()
        return self._maybe_async(lambda: self._sleep(seq, name, e, {"until": instant}))

    sleepUntil = sleep_until

    @staticmethod
    def _maybe_async(run):
        if not _in_event_loop():
            return run()

        async def later():
            return run()

        return later()


def _in_event_loop():
    asyncio = sys.modules.get("asyncio")  # an async handler's worker has it; a sync one needs no import
    if asyncio is None:
        return False
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _call(handler, event, step, context):
    import inspect

    try:
        n = len(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        n = 3
    return handler(event, step, context) if n >= 3 else handler(event, step)


def main():
    try:
        handler = load()
    except BaseException as e:  # SyntaxError, ImportError, SystemExit at import time...
        flush_partial()
        log("error", format_exc(e))
        if isinstance(e, MemoryError):
            send({"t": "fatal", "kind": "out_of_memory", "error": "MemoryError"})
        else:
            send({"t": "init_error", **describe(e)})
        os._exit(1)
    loop = None
    send({"t": "ready"})
    for line in _in:
        msg = json.loads(line)
        if msg.get("t") != "invoke":
            continue
        c = msg["context"]
        context = Context(function_name=c["functionName"], invocation_id=c["invocationId"], region=c["region"], deadline_ms=c["deadlineMs"])
        try:
            value = _call(handler, msg["event"], Step(msg), context) if msg.get("durable") else handler(msg["event"], context)
            if hasattr(value, "__await__"):
                # asyncio costs ~50 ms to import: only workers of async handlers pay it. One loop
                # for the worker's life, so clients created in an earlier invocation stay usable.
                if loop is None:
                    import asyncio

                    loop = asyncio.new_event_loop()
                    asyncio.set_event_loop(loop)
                value = loop.run_until_complete(value)
            frame = {"t": "result", "id": msg["id"], "value": value}
            data = json.dumps(frame)  # fails here, not halfway through the write, if not JSON
        except _Suspend:
            # Kiln ended the invocation (a sleep, a retry later, a stop): nothing more to say.
            flush_partial()
            send({"t": "result", "id": msg["id"], "value": None})
            continue
        except MemoryError as e:
            flush_partial()
            log("error", format_exc(e))
            send({"t": "fatal", "kind": "out_of_memory", "error": "MemoryError"})
            os._exit(1)
        except Exception as e:
            flush_partial()
            log("error", format_exc(e))
            send({"t": "error", "id": msg["id"], **describe(e)})
            continue
        flush_partial()
        with _lock:
            _out.write((data + "\n").encode())
            _out.flush()
    # The pool closed the channel: nothing left to serve.
    os._exit(0)


main()
