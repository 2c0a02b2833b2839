"""A vLLM-Omni server for benchmarks and for trying the gateway without a GPU: its duplex
WebSocket (`/v1/realtime?duplex=1`, `/v1/duplex`) and `GET /health` on one port, with SLOTS
session slots, speaking the protocol of vLLM-Omni 0.30.0 as the gateway's `vllm-omni` backend
drives it. No model: each one-second unit (counted by samples, float32 or pcm16 at 16 kHz) is
answered at once with a standalone `response.listen`, except the third of every six, which
speaks a response of one piece (`response.created`, `response.speak`, one second of 24 kHz
pcm16 with its words, the done chain). A session past SLOTS gets `resource_exhausted` and the
socket closes; `session.close` gets `session.closed` and a close 1000. (The tests' mock,
tests/it/common/vllm_omni.rs, keeps more of the contract: holds after a drop, the autostart
trap, cancels, its own silence units.)

    .venv/bin/python scripts/mock_vllm_omni.py SLOTS [PORT]

Prints "ready PORT" once it listens. Used by scripts/vllm_omni_path.sh.
"""

import asyncio
import base64
import json
import math
import struct
import sys
import uuid
from http import HTTPStatus

from websockets.asyncio.server import serve

SPEECH = base64.b64encode(
    struct.pack("<24000h", *(int(3000 * math.sin(i * 0.05)) for i in range(24000)))
).decode()
UNIT = 16000


def eid():
    return "event_" + uuid.uuid4().hex


class Server:
    def __init__(self, slots):
        self.slots = slots
        self.admitted = 0

    def route(self, connection, request):
        path = request.path.split("?")[0]
        if path == "/health":
            response = connection.respond(HTTPStatus.OK, json.dumps({"status": "healthy"}))
            response.headers["Content-Type"] = "application/json"
            return response
        if path not in ("/v1/realtime", "/v1/duplex"):
            return connection.respond(HTTPStatus.NOT_FOUND, "no such path\n")
        return None

    async def duplex(self, ws):
        try:
            first = json.loads(await asyncio.wait_for(ws.recv(), 10))
        except Exception:
            return
        if first.get("type") != "session.update":
            await ws.send(json.dumps({"type": "error", "event_id": eid(),
                                      "error": {"type": "invalid_request_error", "code": "bad_event"}}))
            return
        if self.admitted >= self.slots:
            await ws.send(json.dumps({"type": "error", "event_id": eid(), "error": {
                "type": "rate_limit_error", "code": "resource_exhausted",
                "message": f"duplex_session_capacity_exhausted: limit={self.slots}"}}))
            return
        self.admitted += 1
        session = first.get("session") or {}
        f32 = session.get("input_audio_format") == "pcm_f32le"
        sid = "duplex-" + uuid.uuid4().hex
        seq = 0

        def event(v):
            nonlocal seq
            seq += 1
            v["event_id"] = eid()
            v["server_event_seq"] = seq
            return json.dumps(v)

        obj = {"id": sid, "object": "realtime.session", "state": "open"}
        await ws.send(json.dumps({"type": "session.created", "event_id": eid(), "session": obj,
                                  "attachment_generation": 1, "resume_token": uuid.uuid4().hex}))
        await ws.send(event({"type": "session.updated", "session": obj}))
        pending = 0
        units = 0
        closed = False
        try:
            async for text in ws:
                v = json.loads(text)
                kind = v.get("type")
                if kind == "input_audio_buffer.append":
                    pending += len(base64.b64decode(v.get("audio", ""))) // (4 if f32 else 2)
                    while pending >= UNIT:
                        pending -= UNIT
                        units += 1
                        if units % 6 == 3:
                            rid = "resp_" + uuid.uuid4().hex
                            item = "item_" + rid
                            out = [
                                {"type": "response.created", "response_id": rid,
                                 "response": {"id": rid, "object": "realtime.response", "status": "in_progress"}},
                                {"type": "response.speak", "response_id": rid, "item_id": item},
                                {"type": "response.output_audio.delta", "response_id": rid, "item_id": item,
                                 "delta": SPEECH, "format": "pcm16", "sample_rate_hz": 24000,
                                 "metadata": {"end_of_turn": True}},
                                {"type": "response.output_audio_transcript.delta", "response_id": rid,
                                 "item_id": item, "delta": "Mock reply."},
                                {"type": "response.done", "response_id": rid,
                                 "response": {"id": rid, "status": "completed",
                                              "status_details": {"type": "completed", "reason": "stop"}}},
                            ]
                        else:
                            out = [{"type": "response.listen", "session_id": sid,
                                    "response": {"status": "listening", "metadata": {"reason": "model_listen"}}}]
                        for e in out:
                            await ws.send(event(e))
                elif kind == "session.close":
                    await ws.send(event({"type": "session.closed", "session_id": sid,
                                         "reason": v.get("reason", "client_close"), "event": {}}))
                    closed = True
                    await ws.close(1000, "client_close")
                    break
                elif kind in ("playback.ack", "response.cancel", "session.heartbeat"):
                    pass
                else:
                    await ws.send(json.dumps({"type": "error", "event_id": eid(), "error": {
                        "type": "invalid_request_error", "code": "unknown_event", "message": kind}}))
        except Exception:
            pass  # the peer went away
        finally:
            if not closed:
                await asyncio.sleep(30)  # a drop without session.close holds the slot
            self.admitted -= 1


async def main(slots, port):
    server = Server(slots)
    s = await serve(server.duplex, "127.0.0.1", port, process_request=server.route,
                    max_size=16 << 20, compression=None, ping_interval=None)
    print("ready", s.sockets[0].getsockname()[1], flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0))
