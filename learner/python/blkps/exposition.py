"""blkps.exposition: Prometheus's text exposition format (version 0.0.4),
written and served over HTTP, with no dependency beyond Python's own
library (python3-prometheus-client stays optional: a GPU host may have no
package registry). The server's exporter (`blkps metrics`, doc/monitoring.md)
and the learners' (blkps.metrics) both write through it::

    page = Exposition()
    page.add("blkps_updates_total", "counter", "Gradient updates applied.", 42, shard="0")
    text = page.text()          # "# HELP ...\\n# TYPE ...\\nblkps_updates_total{shard=\\"0\\"} 42\\n"

    server = MetricsServer(listening_socket("127.0.0.1", 9465), page.text)
    server.serve_until(lambda: False)       # or serve_in_thread()

Contract: a family (one name) gets its HELP and TYPE once, before its
samples, whatever order samples are added in; a name given two types or
two help texts is a ValueError (a bug of the caller). Label values are
escaped as the format asks (backslash, double quote, newline); values are
written as Python's repr of a float (integers as integers), NaN and
infinities as NaN, +Inf, -Inf.
"""

import base64
import hmac
import http.server
import math
import re
import socket
import threading

__all__ = ["Exposition", "MetricsServer", "listening_socket", "CONTENT_TYPE"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("counter", "gauge", "untyped")


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def _number(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class Exposition:
    """One scrape's page: metric families in the order first added."""

    def __init__(self):
        self._families = {}  # name -> [type, help, [sample lines]]

    def add(self, name, kind, help_text, value, **labels):
        """Adds one sample of family `name` (`kind`: counter, gauge or
        untyped) with `labels` (str values; None values are left out)."""
        if not _NAME.fullmatch(name) or kind not in TYPES:
            raise ValueError(f"bad metric {name!r} of type {kind!r}")
        family = self._families.setdefault(name, [kind, help_text, []])
        if family[0] != kind or family[1] != help_text:
            raise ValueError(f"metric {name} given two types or help texts")
        pairs = []
        for key, label in labels.items():
            if label is None:
                continue
            if not _LABEL.fullmatch(key):
                raise ValueError(f"bad label name {key!r} of {name}")
            pairs.append(f'{key}="{_escape(label)}"')
        family[2].append(f"{name}{{{','.join(pairs)}}} {_number(value)}" if pairs else f"{name} {_number(value)}")

    def text(self):
        out = []
        for name, (kind, help_text, samples) in self._families.items():
            out.append(f"# HELP {name} {help_text.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(samples)
        return "\n".join(out) + "\n" if out else ""


class MetricsServer(http.server.HTTPServer):
    """Serves GET /metrics on `sock` (a listening socket: listening_socket())
    with the text `page()` returns, one request at a time (page() is called
    on the serving thread only). `credentials` (user, password) or None:
    with them, a request without that HTTP basic authentication gets 401.
    A page() that raises answers 503 with the exception's text (Prometheus
    marks the target down); other paths get 404."""

    def __init__(self, sock, page, credentials=None):
        self.page = page
        self.expected = None
        if credentials:
            token = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
            self.expected = f"Basic {token}".encode()
        super().__init__(sock.getsockname()[:2], _Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock

    def serve_until(self, done, poll_s=1.0):
        """Serves requests until done() (asked at least every `poll_s`) is
        true; then closes the socket."""
        self.timeout = poll_s
        try:
            while not done():
                self.handle_request()
        finally:
            self.server_close()

    def serve_in_thread(self):
        """Serves on a daemon thread (a learner's exporter); returns it."""
        thread = threading.Thread(target=self.serve_forever, name="blkps-metrics", daemon=True)
        thread.start()
        return thread


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = 10  # a client that stalls mid-request is dropped, not waited for

    def do_GET(self):
        server = self.server
        if server.expected is not None:
            given = self.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, server.expected):
                self._answer(401, "authentication required\n", {"WWW-Authenticate": 'Basic realm="blkps"'})
                return
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, "blkps serves /metrics only\n")
            return
        try:
            body = server.page()
        except Exception as e:  # noqa: BLE001 (the scrape fails, the exporter stays)
            why = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).removeprefix("blkps: ")
            self._answer(503, f"blkps: {why}\n")
            return
        self._answer(200, body, {"Content-Type": CONTENT_TYPE})

    def _answer(self, code, body, headers=None):
        data = body.encode()
        self.send_response(code)
        for key, value in (headers or {"Content-Type": "text/plain; charset=utf-8"}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_):  # one line per scrape would fill a log for nothing
        pass


def listening_socket(address, port):
    """A TCP socket bound to (address, port) and listening; OSError if the
    port is taken. IPv6 addresses are accepted."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(16)
    except BaseException:
        sock.close()
        raise
    return sock
