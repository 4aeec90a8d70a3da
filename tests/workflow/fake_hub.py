"""A stand-in for the Hugging Face Hub's HTTP API, enough for ``hf auth login --token`` and ``HfApi.upload_folder``:
``whoami-v2``, ``repos/create``, ``validate-yaml`` (the card's front matter), ``preupload`` (every file answered
"regular", so no LFS or Xet transfer) and ``commit`` (the NDJSON body decoded into files). Point ``HF_ENDPOINT`` at
:attr:`FakeHub.url`.

It checks the bearer token on every call and records what it was asked, so a test sees which token was used, which
repo was created and which files (with their bytes) were committed. Anything else answers 404 and is recorded too.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeHub:
    def __init__(self, token: str, user: str):
        self.token, self.user = token, user
        self.calls: list[tuple[str, str]] = []  # (method, path)
        self.repos: list[str] = []
        self.commits: dict[str, dict[str, bytes]] = {}  # repo id -> {path: content}
        self.cards: list[dict] = []  # card metadata sent to validate-yaml
        self.unexpected: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path = self.path.split("?")[0]
                hub.calls.append((method, path))
                if self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                status, answer = hub.answer(method, path, body)
                self._reply(status, answer)

            def do_GET(self):
                self._handle("GET")

            def do_POST(self):
                self._handle("POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict]:
        if (method, path) == ("GET", "/api/whoami-v2"):
            return 200, {"type": "user", "name": self.user,
                         "auth": {"accessToken": {"displayName": "fake-write", "role": "write"}}}
        if (method, path) == ("POST", "/api/repos/create"):
            request = json.loads(body)
            repo_id = f"{request.get('organization') or self.user}/{request['name']}"
            self.repos.append(repo_id)
            return 200, {"url": f"{self.url}/{repo_id}"}
        if (method, path) == ("POST", "/api/validate-yaml"):  # the card's metadata, checked before the commit
            return self._validate_card(json.loads(body)["content"])
        if method == "POST" and (m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/[^/]+", path)):
            files = json.loads(body)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                   for f in files]}
        if method == "POST" and (m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/[^/]+", path)):
            files = self.commits.setdefault(m.group(1), {})
            for line in body.decode().splitlines():
                record = json.loads(line)
                if record["key"] == "file":
                    files[record["value"]["path"]] = base64.b64decode(record["value"]["content"])
                elif record["key"] != "header":
                    self.unexpected.append(f"commit record {record['key']}")
            return 200, {"commitUrl": f"{self.url}/{m.group(1)}/commit/{'0' * 40}", "commitOid": "0" * 40}
        self.unexpected.append(f"{method} {path}")
        return 404, {"error": f"not served by the fake Hub: {method} {path}"}

    def _validate_card(self, content: str) -> tuple[int, dict]:
        """The front matter must be a YAML mapping (the Hub also checks its keys; this stand-in does not)."""
        import yaml

        match = re.match(r"^---\n(.*?)\n---\n", content, re.S)
        try:
            metadata = yaml.safe_load(match.group(1)) if match else None
        except yaml.YAMLError as err:
            metadata, problem = None, str(err)
        else:
            problem = "no YAML front matter mapping"
        if not isinstance(metadata, dict):
            return 400, {"errors": [{"message": problem}], "warnings": []}
        self.cards.append(metadata)
        return 200, {"errors": [], "warnings": []}

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
