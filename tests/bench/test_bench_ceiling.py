"""``bench/bench_ceiling.py``'s pipelining (``--pipeline N``): its depths, wrk's Lua script writing N
requests at a time, and the self-check that the engine answers pipelined checks in order.

* ``--pipeline``'s value: depths of 1 or more, anything else refused by the parser;
* ``bench/wrk/requests.lua`` run by real wrk (the bench's own ``wrk()``) against a loopback server
  that answers only when it holds N unanswered requests: at depth N wrk completes requests (one at
  a time, it would wait for ever and count none), and the bodies arrive in groups of N in the
  file's order, the last group wrapping round to the first lines;
* ``verify_pipelined`` against the service: pipelined checks answer 200 with the expected
  ``allowed``, in order, and a wrong expectation stops the run.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.fixtures.service import ROOT, Project

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_ceiling", ROOT / "bench" / "bench_ceiling.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ceiling"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


bc = _load()


def test_pipeline_depths_are_whole_numbers_of_one_or_more() -> None:
    assert bc.parse_depths("1,8,16") == [1, 8, 16]
    assert bc.parse_depths("4") == [4]
    for bad in ("0", "1,0", "", "-2", "x"):
        with pytest.raises(ValueError):
            bc.parse_depths(bad)
    with pytest.raises(SystemExit) as exit_:  # argparse refuses before anything starts
        bc.main(["--pipeline", "0", "--api-key", "k"])
    assert exit_.value.code == 2


class BatchingServer(asyncio.Protocol):
    """Records each request's body (requests carry ``Content-Length``) and answers only when it
    holds ``depth`` unanswered requests, all of them at once."""

    def __init__(self, depth: int, bodies: list[bytes]) -> None:
        self.depth, self.bodies, self.buf, self.pending = depth, bodies, b"", 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (end := self.buf.find(b"\r\n\r\n")) >= 0:
            head = self.buf[:end].decode("latin-1").lower().split("\r\n")
            size = next(int(h.split(":", 1)[1]) for h in head if h.startswith("content-length:"))
            if len(self.buf) < end + 4 + size:
                return
            self.bodies.append(self.buf[end + 4:end + 4 + size])
            self.buf = self.buf[end + 4 + size:]
            self.pending += 1
            if self.pending == self.depth:
                self.transport.write(ANSWER * self.depth)  # type: ignore[attr-defined]
                self.pending = 0


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)")
async def test_wrk_script_writes_groups_of_depth_in_file_order(tmp_path: Path) -> None:
    depth, lines = 4, [f'{{"n":{k}}}' for k in range(5)]
    (tmp_path / "bodies.jsonl").write_text("\n".join(lines) + "\n")
    groups = [lines[0:4], [lines[4], *lines[0:3]]]  # 5 lines, depth 4: the last group wraps
    bodies: list[bytes] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: BatchingServer(depth, bodies), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        res = await asyncio.to_thread(bc.wrk, f"http://127.0.0.1:{port}", "/check", method="POST",
                                      headers="Authorization: Bearer k\n",
                                      bodies=tmp_path / "bodies.jsonl", conc=1, seconds=1,
                                      pipeline=depth)
    finally:
        server.close()
        await server.wait_closed()
    assert res["requests"] >= 10 * depth, res  # one at a time, this server would answer none
    assert res["status_errors"] == res["read_errors"] == res["write_errors"] == 0, res
    received = [b.decode() for b in bodies]
    sent = [received[k:k + depth] for k in range(0, len(received) - len(received) % depth, depth)]
    assert all(group in groups for group in sent), sent[:4]
    assert all(a != b for a, b in itertools.pairwise(sent)), sent[:4]  # the groups cycle


async def test_engine_answers_pipelined_checks_in_order(project: Project) -> None:
    api = project.api
    r = await api.post("/v1/stores", {"name": "pipelined"})
    assert r.status == 201, r.body
    store = r.body["id"]
    tuples = [{"object": f"doc:{k}", "relation": "viewer", "user": "user:a"} for k in range(0, 6, 2)]
    w = await api.post(f"/v1/stores/{store}/write", {"writes": tuples})
    assert w.status == 200, w.body
    c = await api.post(f"/v1/stores/{store}/check",  # the engine has the writes from here on
                       {"tuple_key": tuples[0], "consistency": {"at_least_revision": w.body["revision"]}})
    assert c.status == 200 and c.body["allowed"] is True, c.body
    bodies = [f'{{"tuple_key":{{"object":"doc:{k}","relation":"viewer","user":"user:a"}}}}'
              for k in range(6)]
    expected = [k % 2 == 0 for k in range(6)]
    path, headers = f"/v1/stores/{store}/check", f"Authorization: Bearer {api.key}\n"
    for depth in (1, 3, 8):  # 2, 6 and 16 requests in one write
        await asyncio.to_thread(bc.verify_pipelined, api.base_url, path, method="POST",
                                headers=headers, bodies=bodies, expected=expected, depth=depth)
    with pytest.raises(SystemExit, match="allowed is not False"):
        await asyncio.to_thread(bc.verify_pipelined, api.base_url, path, method="POST",
                                headers=headers, bodies=bodies,
                                expected=[not e for e in expected], depth=4)
    with pytest.raises(SystemExit, match=r"answer 1 of 4: 401"):
        await asyncio.to_thread(bc.verify_pipelined, api.base_url, path, method="POST",
                                headers="Authorization: Bearer sk_test_wrong\n", bodies=bodies,
                                expected=expected, depth=2)
