"""A model folder served over real HTTP on a loopback address, as a hub's resolve URLs or a plain file server would:
Range requests (206), a bearer token it may require, a transfer it may cut after some bytes, a redirect it may send
to another server; every request recorded (path, Range, whether a token came)."""

from __future__ import annotations

import http.server
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Seen:
    path: str
    range: str | None
    token: str | None
    sent: int = 0                         # body bytes written


@dataclass
class Source:
    """A running server; set its fields between requests to change what it does."""

    folder: Path
    host: str = "127.0.0.1"
    token: str | None = None              # required as "Bearer TOKEN" when set
    cut_after: dict[str, int] = field(default_factory=dict)   # path -> bytes sent before the connection drops (once)
    ranges: bool = True                   # False: answers 200 with the whole file whatever the Range
    redirect_to: str | None = None        # a base URL every file request is sent on to (302)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    _server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> "Source":
        with socket.socket() as s:
            s.bind((self.host, 0))
            port = s.getsockname()[1]
        self._server = http.server.ThreadingHTTPServer((self.host, port), _handler(self))
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.url = f"http://{self.host}:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _handler(source: Source):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):  # noqa: N802 (http.server's name)
            auth = self.headers.get("Authorization")
            entry = Seen(self.path, self.headers.get("Range"), auth.removeprefix("Bearer ") if auth else None)
            source.seen.append(entry)
            if source.token is not None and auth != f"Bearer {source.token}":
                return self._status(401, "Unauthorized")
            if source.redirect_to:
                self.send_response(302)
                self.send_header("Location", source.redirect_to.rstrip("/") + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            file = (source.folder / self.path.lstrip("/")).resolve()
            if source.folder.resolve() not in file.parents or not file.is_file():
                return self._status(404, "Not Found")
            self._send(file, entry)
            return None

        def _status(self, code: int, text: str) -> None:
            self.send_response(code, text)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _send(self, file: Path, entry: Seen) -> None:
            data = file.read_bytes()
            start = 0
            asked = self.headers.get("Range")
            if asked and source.ranges:
                start = int(asked.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    return self._status(416, "Range Not Satisfiable")
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            cut = source.cut_after.pop(self.path, None)
            if cut is not None:
                self.wfile.write(body[:cut])
                entry.sent = cut
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return None
            self.wfile.write(body)
            entry.sent = len(body)
            return None

    return Handler
