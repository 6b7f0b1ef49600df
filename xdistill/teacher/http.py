"""JSON over HTTP for served teachers (standard library only): timeouts, bounded retries, clear errors.

:func:`request_json` sends one request and returns the decoded JSON answer. A connection error, a
timeout or an HTTP 5xx answer is retried ``retries`` times with exponential backoff (0.5 s, 1 s,
2 s, ... at most 8 s); an HTTP 4xx answer (a bad request: too many log-probs, a prompt longer than
the server's context, an unknown model) is not retried. ``timeout_s`` bounds one try as a whole
(connecting, waiting and reading the answer, however slowly it arrives). Every failure ends in one
:class:`HttpFailure` whose message names the URL, the number of tries and what went wrong (the
server's own error message for an HTTP error); the served teacher turns it into a
:class:`~xdistill.errors.TeacherError` naming the teacher and the row.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request

# at most this many characters of an unexpected answer are quoted in an error
_QUOTE = 300
_BACKOFF_S = 0.5
_BACKOFF_MAX_S = 8.0


class HttpFailure(Exception):
    """One request failed for good (after its retries); ``status`` is the HTTP status or None."""

    def __init__(self, message: str, status: int | None = None, transient: bool = False):
        super().__init__(message)
        self.status = status
        # a connection error, timeout or 5xx (worth waiting for while a server starts)
        self.transient = transient


def _quote(raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


def server_message(raw: bytes) -> str:
    """The error message inside an error answer (OpenAI ``{"error": {"message": ...}}``, vLLM's
    ``{"message": ...}`` or ``{"detail": ...}``), else the answer's first characters."""
    try:
        body = json.loads(raw)
    except ValueError:
        return _quote(raw)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            for key in ("message", "detail"):
                if isinstance(err.get(key), str):
                    return _quote(err[key])
        if isinstance(err, str):
            return _quote(err)
    return _quote(raw)


class _Deadline:
    """Shuts a try's sockets down at its deadline: a read blocked on a server that trickles its
    status line, headers or body then ends, and the try is a timeout (a socket timeout alone
    bounds each read, not the try)."""

    def __init__(self, deadline: float):
        self.deadline, self._timers = deadline, []

    def watch(self, sock) -> None:
        timer = threading.Timer(max(0.0, self.deadline - time.monotonic()), _shut, (sock,))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def passed(self) -> bool:
        return time.monotonic() >= self.deadline

    def cancel(self) -> None:
        for timer in self._timers:
            timer.cancel()


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _watched(base):
    class Watched(base):
        def __init__(self, *args, watch, **kwargs):
            super().__init__(*args, **kwargs)
            self._watch = watch

        def connect(self):
            super().connect()
            self._watch(self.sock)
    return Watched


_HTTP, _HTTPS = _watched(http.client.HTTPConnection), _watched(http.client.HTTPSConnection)


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watch):
        super().__init__()
        self._w = watch

    def http_open(self, req):
        return self.do_open(_HTTP, req, watch=self._w)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watch):
        super().__init__()
        self._w = watch

    def https_open(self, req):
        return self.do_open(_HTTPS, req, context=self._context, watch=self._w)


def _once(url: str, body: dict | None, timeout_s: float, headers: dict) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST",
                                 headers={"Content-Type": "application/json", **headers})
    deadline = _Deadline(time.monotonic() + timeout_s)
    opener = urllib.request.build_opener(_HTTPHandler(deadline.watch),
                                         _HTTPSHandler(deadline.watch))
    try:
        return _try(opener, req, deadline, timeout_s)
    finally:
        deadline.cancel()


def _try(opener, req, deadline: _Deadline, timeout_s: float) -> dict:
    timeout = HttpFailure(f"no answer within {timeout_s:g} s (timeout)", transient=True)
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            raw = _read_by(resp, deadline.deadline)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            text = server_message(exc.read() or b"")
        except (http.client.HTTPException, OSError) as read_exc:
            text = f"(its answer could not be read: {type(read_exc).__name__})"
        if deadline.passed():
            raise timeout from None
        raise HttpFailure(f"HTTP {status}: {text}", status, transient=status >= 500) from None
    except (socket.timeout, TimeoutError):
        raise timeout from None
    except http.client.HTTPException as exc:   # cut mid-answer, or not an HTTP server
        if deadline.passed():
            raise timeout from None
        raise HttpFailure(f"not a complete HTTP answer ({type(exc).__name__}: {_quote(str(exc))})",
                          transient=True) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)) or deadline.passed():
            raise timeout from None
        raise HttpFailure(f"cannot connect ({reason})", transient=True) from None
    except (ConnectionError, OSError) as exc:  # reset / closed mid-answer
        if deadline.passed():
            raise timeout from None
        raise HttpFailure(f"connection failed ({type(exc).__name__}: {exc})",
                          transient=True) from None
    try:
        return json.loads(raw)
    except ValueError:
        raise HttpFailure(f"the answer is not JSON: {_quote(raw)!r}") from None


def _read_by(resp, deadline: float) -> bytes:
    """The whole answer body, read in chunks, before ``deadline`` (``timeout_s`` bounds the whole
    request, not each socket read: a server trickling its answer is a timeout too)."""
    chunks = []
    while True:      # a read blocked past the deadline ends when _Deadline shuts the socket
        if time.monotonic() >= deadline:
            raise TimeoutError
        chunk = resp.read1(1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    raw = b"".join(chunks)
    expected = resp.getheader("Content-Length")
    if expected is not None and expected.isdigit() and len(raw) < int(expected):
        raise http.client.IncompleteRead(raw, int(expected) - len(raw))   # closed mid-answer
    return raw


def request_json(url: str, body: dict | None = None, *, timeout_s: float, retries: int = 0,
                 headers: dict | None = None, sleep=time.sleep) -> dict:
    """POST ``body`` (GET when None) to ``url`` and return the JSON answer (see module doc)."""
    tries = retries + 1
    for attempt in range(tries):
        try:
            return _once(url, body, timeout_s, headers or {})
        except HttpFailure as exc:
            if not exc.transient or attempt == tries - 1:
                n = f"{attempt + 1} tr{'y' if attempt == 0 else 'ies'}"
                raise HttpFailure(f"{url}: {exc} ({n})", exc.status, exc.transient) from None
            sleep(min(_BACKOFF_S * 2 ** attempt, _BACKOFF_MAX_S))
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["HttpFailure", "request_json", "server_message"]
