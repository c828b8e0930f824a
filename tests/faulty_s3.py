"""An HTTP proxy on 127.0.0.1 in front of the S3 emulator (moto) that injects the faults object stores show:
throttling (503 SlowDown), internal errors (500), and connections reset before any answer (a request cut off).

Each ``Rule`` matches requests by method and a pattern over the path and query, and fails the first ``times`` of
them (``math.inf``: all); every other request is forwarded unchanged. Point ``AWS_ENDPOINT_URL`` at ``endpoint``.
"""
from __future__ import annotations

import http.client
import re
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

_ERRORS = {503: ("SlowDown", "Please reduce your request rate."), 500: ("InternalError", "We encountered an "
                                                                      "internal error. Please try again.")}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass
class Rule:
    method: str                  # GET, PUT, POST, HEAD, DELETE
    pattern: str                 # a regular expression searched in "path?query"
    fault: str                   # "503", "500" or "reset"
    times: float = 1             # how many matching requests fail; math.inf: every one
    hits: int = field(default=0, init=False)

    def takes(self, method: str, target: str) -> bool:
        return method == self.method and self.hits < self.times and re.search(self.pattern, target) is not None


class FaultyS3:
    """``with FaultyS3(moto_endpoint, [Rule(...), ...]) as proxy: ... proxy.endpoint ...``; ``proxy.faults``
    lists the (method, target, fault) injected, ``proxy.forwarded`` counts the requests passed on."""

    def __init__(self, upstream: str, rules: list[Rule]):
        self.upstream = urlparse(upstream)
        self.rules = rules
        self.faults: list[tuple[str, str, str]] = []
        self.forwarded = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FaultyS3:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _fault_for(self, method: str, target: str) -> str | None:
        with self._lock:
            for rule in self.rules:
                if rule.takes(method, target):
                    rule.hits += 1
                    self.faults.append((method, target, rule.fault))
                    return rule.fault
            self.forwarded += 1
            return None

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

            def log_message(self, *args) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _serve(self) -> None:
                body = self._body()
                fault = proxy._fault_for(self.command, self.path)
                if fault == "reset":  # RST instead of an answer: the client sees its connection reset
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if fault is not None:
                    code, message = _ERRORS[int(fault)]
                    payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                               f"<Message>{message}</Message></Error>").encode()
                    self.send_response(int(fault))
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload if self.command != "HEAD" else b"")
                    return
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                    headers["Content-Length"] = str(len(body))
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    payload = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for key, value in answer.getheaders():
                        if key.lower() not in _HOP_BY_HOP:
                            self.send_header(key, value)
                    length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                    self.send_header("Content-Length", length or str(len(payload)))  # HEAD: the object's length
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(payload)
                finally:
                    upstream.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _serve

        return Handler


__all__ = ["FaultyS3", "Rule"]
