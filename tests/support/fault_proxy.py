"""A fault-injecting HTTP proxy for tests, in front of a GCS JSON API server on loopback.

Stdlib only. Point ``STORAGE_EMULATOR_HOST`` at ``proxy.endpoint`` and queue faults:

    proxy.fail(503, times=3, match="upload")     # answer 503 to the next 3 uploads
    proxy.reset(times=1, match="download", after_bytes=1000)  # RST mid-body
    proxy.cut_upload(after_bytes=4096)           # read 4 KiB of the request body, then RST
    proxy.corrupt(match="download", strip_hash=True)  # flip a body byte (and drop x-goog-hash)
    proxy.rewrite(fn, match=...)                 # fn(status, headers, body) -> same, upstream's
                                                 # answer altered after upstream acted on it
    proxy.hook(fn)                               # before forwarding: fn(method, path) ->
                                                 # (status, body) to answer, or None to go on
    proxy.fail(503, match="upload", key="/ckpt-4.index")  # only uploads of that object
    proxy.latency(0.05, match="upload")          # every upload waits 50 ms first (until
                                                 # proxy.latency(0): a slow link, not a fault)

Each request takes the first queued fault whose ``match`` fits it ("any", "upload",
"download", or a regex searched in "METHOD /path?query") and whose ``key`` regex, if
given, is found in the name of the object the request is about (from the path, or for an
upload from its metadata: the body is then read before the fault acts, so a ``cut_upload``
restricted to an object cuts after the whole body arrived), after letting ``skip`` matching
requests through untouched; a fault is used ``times`` times, then dropped.
``hook`` may block (e.g. on a ``threading.Event``) to hold a request in flight while a test
kills the client.
Every request is logged in ``proxy.log`` as a (method, path, outcome) tuple whose ``key``
attribute is the name of the object concerned, when known. ``max_in_flight`` is the most
requests the proxy held at once, each counted from its arrival until its answer starts
(``reset_in_flight()`` restarts the count): a client that got no answer yet still has that
request open, so the count never exceeds what the client has open, however the threads on
either side are scheduled (counting to the end of the proxy's handler would add a finished
request's tail to the client's next one). A request the client gave up on (a timeout) still
counts until the proxy answers it: where the count matters, check that nothing was retried.

    barrier = proxy.gather(8, match="upload")    # hold uploads until 8 are held at once
    ...; assert barrier.met.is_set(), barrier.most

``gather`` shows concurrency without a clock: the requests it holds go on together once
``count`` are held (or, so that a client that never sends that many is not hung, once
``timeout`` seconds passed since the first; ``most`` then says how many came).
The proxy serves one request per connection (HTTP/1.0, like the emulator), with socket
timeouts, in daemon threads; ``stop()`` shuts it down (the fixture does).
"""

from __future__ import annotations

import dataclasses
import http.client
import http.server
import json
import re
import socket
import struct
import threading
import time
from urllib.parse import parse_qs, unquote, urlparse

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade",
               "proxy-connection", "content-length"}


@dataclasses.dataclass
class Fault:
    kind: str  # "status", "reset", "cut_upload", "rewrite", "hook"
    times: int
    match: str = "any"
    skip: int = 0
    status: int = 503
    after_bytes: int = 0
    fn: object = None
    key: str | None = None  # regex searched in the name of the object concerned

    def fits(self, method: str, target: str, name: str | None) -> bool:
        if self.key is not None and (name is None or not re.search(self.key, name)):
            return False
        if self.match == "any":
            return True
        if self.match == "upload":
            return target.startswith("/upload/")
        if self.match == "download":
            return target.startswith("/download/") or "alt=media" in target
        return re.search(self.match, f"{method} {target}") is not None


_OBJECT_PATH = re.compile(r"^(?:/download|/upload)?/storage/v1/b/[^/]+/o/([^?]+)")
_METADATA_PART = re.compile(rb"\r\n\r\n(\{.*?\})\r\n--", re.S)


def object_name(target: str, body: bytes | None) -> str | None:
    """The name of the object a JSON API request is about, if it names one: from the path
    (reads, metadata, deletes), the ``name`` query parameter, or an upload's metadata (a
    multipart body's JSON part, or a resumable upload's initiating JSON body)."""
    url = urlparse(target)
    found = _OBJECT_PATH.match(url.path)
    if found:
        return unquote(found.group(1))
    names = parse_qs(url.query).get("name")
    if names:
        return names[0]
    if not body:
        return None
    part = _METADATA_PART.search(body[:65536])
    try:
        metadata = json.loads(part.group(1) if part else body)
    except ValueError:
        return None
    return metadata.get("name") if isinstance(metadata, dict) else None


class Gathering:
    """Requests ``rule`` fits, held until ``count`` are held at once (``met``) or ``timeout``
    seconds passed since the first arrived; ``most``: the most that were held together."""

    def __init__(self, count: int, match: str, timeout: float):
        self.count, self.timeout = count, timeout
        self.rule = Fault("gather", 0, match)
        self.held = self.most = 0
        self.met = threading.Event()


class Request(tuple):
    """One logged request: (method, path, outcome), and ``key``, the object's name or None."""

    def __new__(cls, method: str, path: str, outcome: str, key: str | None = None):
        entry = super().__new__(cls, (method, path, outcome))
        entry.key = key
        return entry


class FaultProxy:
    def __init__(self, upstream: str, socket_timeout: float = 30.0):
        url = urlparse(upstream)
        self.upstream = (url.hostname, url.port)
        self.socket_timeout = socket_timeout
        self.log: list[Request] = []
        self.injected = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self._faults: list[Fault] = []
        self._delays: list[tuple[float, Fault]] = []
        self._gathering: Gathering | None = None
        self._lock = threading.Lock()
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    # -- queueing faults ----------------------------------------------------------------------

    def fail(self, status: int, times: int = 1, match: str = "any", skip: int = 0,
             key: str | None = None) -> None:
        """Answer ``status`` (nothing reaches upstream)."""
        self._add(Fault("status", times, match, skip, status=status, key=key))

    def reset(self, times: int = 1, match: str = "any", after_bytes: int = 0,
              skip: int = 0, key: str | None = None) -> None:
        """Forward, then reset the connection after relaying ``after_bytes`` of the body."""
        self._add(Fault("reset", times, match, skip, after_bytes=after_bytes, key=key))

    def cut_upload(self, after_bytes: int, times: int = 1, match: str = "upload",
                   skip: int = 0, key: str | None = None) -> None:
        """Read ``after_bytes`` of the request body, then reset; nothing reaches upstream."""
        self._add(Fault("cut_upload", times, match, skip, after_bytes=after_bytes,
                        key=key))

    def rewrite(self, fn, times: int = 1, match: str = "any", skip: int = 0,
                key: str | None = None) -> None:
        """Forward, then answer ``fn(status, headers, body)`` instead of upstream's reply."""
        self._add(Fault("rewrite", times, match, skip, fn=fn, key=key))

    def corrupt(self, times: int = 1, match: str = "download", strip_hash: bool = False,
                skip: int = 0, key: str | None = None) -> None:
        """Flip one byte in the middle of the response body; optionally drop x-goog-hash."""
        def flip(status, headers, body):
            if body:
                i = len(body) // 2
                body = body[:i] + bytes([body[i] ^ 0xFF]) + body[i + 1:]
            if strip_hash:
                headers = [(k, v) for k, v in headers if k.lower() != "x-goog-hash"]
            return status, headers, body
        self.rewrite(flip, times, match, skip, key)

    def hook(self, fn, times: int = 1, match: str = "any", skip: int = 0,
             key: str | None = None) -> None:
        """Before forwarding, call ``fn(method, path)``: (status, body) answers, None goes on."""
        self._add(Fault("hook", times, match, skip, fn=fn, key=key))

    def latency(self, seconds: float, match: str = "any") -> None:
        """Every request that ``match`` fits (as for faults) waits ``seconds`` before it is
        handled, for good; requests fitting several rules wait for the first one added.
        ``latency(0)`` removes every rule. Concurrent requests wait concurrently."""
        with self._lock:
            if seconds <= 0:
                self._delays.clear()
            else:
                self._delays.append((float(seconds), Fault("latency", 0, match)))

    def gather(self, count: int, match: str = "any", timeout: float = 30.0) -> Gathering:
        """Hold the requests ``match`` fits until ``count`` of them are held at once, then let
        them all go on (later ones pass); ``timeout`` bounds the wait for a client that never
        sends that many (the test then reads ``most``). Replaces an earlier gathering."""
        gathering = Gathering(count, match, timeout)
        with self._lock:
            self._gathering = gathering
        return gathering

    def _gather(self, method: str, target: str) -> None:
        with self._lock:
            gathering = self._gathering
            if gathering is None or gathering.met.is_set() or \
                    not gathering.rule.fits(method, target, None):
                return
            gathering.held += 1
            gathering.most = max(gathering.most, gathering.held)
            if gathering.held >= gathering.count:
                gathering.met.set()
        gathering.met.wait(gathering.timeout)
        with self._lock:
            gathering.held -= 1

    def reset_in_flight(self) -> None:
        with self._lock:
            self.max_in_flight = self.in_flight

    def _delay(self, method: str, target: str) -> float:
        with self._lock:
            return next((seconds for seconds, rule in self._delays
                         if rule.fits(method, target, None)), 0.0)

    def _enter(self, delta: int) -> None:
        with self._lock:
            self.in_flight += delta
            self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def pending(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _add(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _names_wanted(self) -> bool:
        with self._lock:
            return any(f.key is not None for f in self._faults)

    def _take(self, method: str, target: str, name: str | None = None) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.fits(method, target, name):
                    if fault.skip > 0:
                        fault.skip -= 1
                        return None
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    self.injected += 1
                    return fault
        return None

    def _record(self, method: str, target: str, outcome: str, key: str | None = None) -> None:
        with self._lock:
            self.log.append(Request(method, target, outcome, key))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # clients that hung up (timeouts, the faults themselves) are expected here


class _Handler(http.server.BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.0"

    def setup(self):
        super().setup()
        self.connection.settimeout(self.owner.socket_timeout)

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        self._handle()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_GET

    def _handle(self):
        self._answering = False
        self.owner._enter(+1)
        try:
            self.owner._gather(self.command, self.path)
            delay = self.owner._delay(self.command, self.path)
            if delay:
                time.sleep(delay)
            self._handle_request()
        finally:
            self._answer_starts()

    def _answer_starts(self):
        """The request stops counting as in flight (once): from the first byte of its answer
        the client may be done with it and send its next one."""
        if not self._answering:
            self._answering = True
            self.owner._enter(-1)

    def _handle_request(self):
        owner, method, target = self.owner, self.command, self.path
        length = int(self.headers.get("Content-Length") or 0)
        body = None
        if target.startswith("/upload/") and owner._names_wanted():
            body = self.rfile.read(length) if length else b""  # the name is in the metadata
        key = object_name(target, body)
        fault = owner._take(method, target, key)

        if fault and fault.kind == "cut_upload":
            if body is None:
                self.rfile.read(min(length, fault.after_bytes))
            owner._record(method, target, f"cut after {fault.after_bytes} bytes", key)
            return self._reset_now()
        if body is None:
            body = self.rfile.read(length) if length else b""
            key = key or object_name(target, body)
        if fault and fault.kind == "status":
            owner._record(method, target, str(fault.status), key)
            return self._reply(fault.status, b'{"error": {"code": %d, "message": "injected"}}'
                               % fault.status, {"Content-Type": "application/json"})
        if fault and fault.kind == "hook":
            answer = fault.fn(method, target)
            if answer is not None:
                owner._record(method, target, f"hook {answer[0]}", key)
                return self._reply(answer[0], answer[1], {"Content-Type": "application/json"})

        status, headers, payload = self._forward(method, target, body)
        if fault and fault.kind == "rewrite":
            upstream_status = status
            status, headers, payload = fault.fn(status, headers, payload)
            owner._record(method, target, f"{upstream_status} rewritten to {status}", key)
        elif fault and fault.kind == "reset":
            self._start_reply(status, headers, len(payload))
            self.wfile.write(payload[:fault.after_bytes])
            owner._record(method, target, f"reset after {fault.after_bytes} bytes", key)
            return self._reset_now()
        else:
            owner._record(method, target, str(status), key)
        self._start_reply(status, headers, len(payload))
        self.wfile.write(payload)

    def _forward(self, method, target, body):
        conn = http.client.HTTPConnection(*self.owner.upstream, timeout=self.owner.socket_timeout)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            return response.status, out, payload
        finally:
            conn.close()

    def _reply(self, status, payload, headers):
        self._start_reply(status, list(headers.items()), len(payload))
        self.wfile.write(payload)

    def _start_reply(self, status, headers, length):
        self._answer_starts()
        self.send_response_only(status)
        for k, v in headers:
            if k.lower() not in ("server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.send_header("Connection", "close")
        self.end_headers()

    def _reset_now(self):
        """Close with RST (SO_LINGER 0), as a dropped connection looks to the client."""
        self._answer_starts()
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
