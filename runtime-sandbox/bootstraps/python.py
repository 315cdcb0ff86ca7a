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


def main():
    try:
        handler = load()
    except BaseException as e:  # SyntaxError, ImportError, SystemExit at import time...
        flush_partial()
        log("error", "".join(traceback.format_exception(e)).rstrip())
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
            value = handler(msg["event"], context)
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
        except MemoryError as e:
            flush_partial()
            log("error", "".join(traceback.format_exception(e)).rstrip())
            send({"t": "fatal", "kind": "out_of_memory", "error": "MemoryError"})
            os._exit(1)
        except Exception as e:
            flush_partial()
            log("error", "".join(traceback.format_exception(e)).rstrip())
            send({"t": "error", "id": msg["id"], **describe(e)})
            continue
        flush_partial()
        with _lock:
            _out.write((data + "\n").encode())
            _out.flush()
    # The pool closed the channel: nothing left to serve.
    os._exit(0)


main()
