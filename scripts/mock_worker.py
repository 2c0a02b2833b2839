"""MiniCPM-o model workers for benchmarks: N of them in one process, one per port, each
speaking the worker's own protocol as the gateway's `minicpmo-worker` backend drives it
(`GET /health`; `/ws/duplex`: `prepare`, `audio_chunk`, `stop`). No model: every step is
answered at once, with a listen, except the third of every six, which speaks one second of
audio (text and 24 kHz float32), so answers carry what a speaking model's do.

    .venv/bin/python scripts/mock_worker.py N

Listens on N free ports of 127.0.0.1, then prints them on one line: "ready PORT PORT ...". Used by scripts/worker_path.sh, which measures a
client talking to these workers directly against the same client through the gateway.
"""

import asyncio
import base64
import json
import math
import struct
import os
import sys
import time
from http import HTTPStatus

from websockets.asyncio.server import serve

# With MOCK_TIMES=FILE, each `prepare` is written there with the time it came (monotonic clock).
TIMES = os.environ.get("MOCK_TIMES")

SPEECH = base64.b64encode(
    struct.pack("<24000f", *(0.1 * math.sin(i * 0.05) for i in range(24000)))
).decode()


class Worker:
    def __init__(self):
        self.busy = False

    def health(self, connection, request):
        path = request.path.split("?")[0]
        if path == "/health":
            status = "duplex_active" if self.busy else "idle"
            body = json.dumps({"status": "healthy", "worker_status": status})
            response = connection.respond(HTTPStatus.OK, body)
            response.headers["Content-Type"] = "application/json"
            return response
        if path != "/ws/duplex":
            return connection.respond(HTTPStatus.NOT_FOUND, "no such path\n")
        return None

    async def duplex(self, ws):
        if self.busy:
            await ws.send(json.dumps({"type": "error", "error": "Worker busy after waiting 5s: duplex_active"}))
            return
        self.busy = True
        steps, kv = 0, 0
        try:
            async for text in ws:
                kind = json.loads(text).get("type")
                if kind == "prepare":
                    steps, kv = 0, 50
                    if TIMES:
                        with open(TIMES, "a") as f:
                            f.write(f"prepare {time.monotonic()}\n")
                    await ws.send(json.dumps({"type": "prepared", "prompt_length": 50}))
                elif kind == "audio_chunk":
                    steps += 1
                    kv += 25
                    result = {"type": "result", "is_listen": True, "text": "", "audio_data": None,
                              "end_of_turn": False, "current_time": steps, "kv_cache_length": kv,
                              "n_tokens": 0, "n_tts_tokens": 0}
                    if steps % 6 == 3:
                        kv += 4
                        result.update(is_listen=False, text="Mock reply.", audio_data=SPEECH,
                                      end_of_turn=True, n_tokens=4, kv_cache_length=kv)
                    await ws.send(json.dumps(result))
                elif kind == "stop":
                    await ws.send(json.dumps({"type": "stopped"}))
                    break
                else:
                    await ws.send(json.dumps({"type": "error", "error": f"Unknown message type: {kind}"}))
        except Exception:
            pass  # the peer went away
        finally:
            self.busy = False


async def main(n):
    servers = []
    for _ in range(n):
        worker = Worker()
        servers.append(await serve(worker.duplex, "127.0.0.1", 0, process_request=worker.health,
                                   max_size=16 << 20, compression=None, ping_interval=None))
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    print("ready", *ports, flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
