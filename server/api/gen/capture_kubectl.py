#!/usr/bin/env python3
"""Captures the protobuf bodies the real kubectl sends, for server/api/testdata/.

A plain-HTTP server on 127.0.0.1 that answers `GET /version` as a 1.32 apiserver (so the
/usr/bin/kubectl dispatcher picks its bundled 1.32), 404s everything else, and saves each
POST body as <dir>/<path>.bin with its headers beside it. kubectl's generator commands
(`create namespace|deployment|secret|configmap`) POST `k8s\\0` + runtime.Unknown bodies.

    python3 server/api/gen/capture_kubectl.py 18765 /tmp/capture &
    HOME=/tmp/capture/home kubectl --server http://127.0.0.1:18765 create namespace x
"""

import http.server
import json
import os
import sys

VERSION = {"major": "1", "minor": "32", "gitVersion": "v1.32.0"}


class Handler(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body=b"", content_type="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/version"):
            self.reply(200, json.dumps(VERSION).encode())
        else:
            self.reply(404)

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        name = self.path.split("?")[0].strip("/").replace("/", "_")
        out = os.path.join(sys.argv[2], name + ".bin")
        with open(out, "wb") as f:
            f.write(body)
        with open(out + ".headers", "w") as f:
            f.write(str(self.headers))
        self.reply(404)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    os.makedirs(sys.argv[2], exist_ok=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
