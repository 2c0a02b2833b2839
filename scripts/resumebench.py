"""Clients that drop their connection under load, and take their sessions back (resumebench.sh).

Usage: python resumebench.py WS_BASE SESSIONS MINUTES [DROP_FRACTION]

SESSIONS clients each hold a duplex audio session (MiniCPM-o dialect) and stream one-second chunks
in real time (a tone every sixth, silence otherwise: the reference backend answers each tone) for
MINUTES. Every minute a DROP_FRACTION (0.10) of them, at random moments, lose their TCP connection
without a close (a phone changing networks), stay away 0.5 to 3 s, and connect again with
?resume=TOKEN&received=N. A build without resumption answers that with a new session: the one that
dropped is lost (counted; the client starts over on the new one).

Each client checks what it got: every chunk it sent is answered (by its input_id), no message
arrives twice, and what `session.resumed` says was lost or left out. Prints one JSON object.
"""

import asyncio
import base64
import json
import math
import random
import struct
import sys
import time

import websockets

RATE = 16000


def chunk(loud):
    samples = [0.3 * math.sin(2 * math.pi * 220 * i / RATE) if loud else 0.0 for i in range(RATE)]
    return base64.b64encode(struct.pack(f"<{RATE}f", *samples)).decode()


LOUD = json.dumps({"type": "input.append", "input": {"audio": chunk(True)}})
QUIET = json.dumps({"type": "input.append", "input": {"audio": chunk(False)}})
INIT = json.dumps({"type": "session.init", "payload": {"system_prompt": "You are a test."}})
CLOSE = json.dumps({"type": "session.close"})

totals = {
    "sessions": 0, "drops": 0, "resumed": 0, "sessions_lost": 0, "chunks_sent": 0, "chunks_unanswered": 0,
    "messages_lost": 0, "messages_twice": 0, "replayed": 0, "voice_skipped_ms": 0, "away_ms": 0,
    "session_s": 0.0, "refused": 0,
}


class Session:
    def __init__(self, base, end):
        self.base = base
        self.end = end
        self.token = None
        self.received = 0
        self.seen = set()
        self.sent = set()
        self.answered = set()
        self.ws = None
        self.reader = None
        self.created = None

    async def read(self, ws):
        async for text in ws:
            event = json.loads(text)
            kind = event.get("type")
            self.received += 1
            if text in self.seen:
                totals["messages_twice"] += 1
            self.seen.add(text)
            if "resume_token" in event:
                self.token = event["resume_token"]
            if kind == "session.queue_done" and self.created:
                await ws.send(INIT)
            if kind == "session.created" and self.created:
                self.created.set()
            if kind == "response.output.delta":
                self.answered.add(event["input_id"])
            if kind == "session.closed":
                return

    async def start(self):
        """A new session: connect, wait for a worker, initialise."""
        self.received, self.seen, self.sent, self.answered = 0, set(), set(), set()
        self.created = asyncio.Event()
        self.ws = await websockets.connect(f"{self.base}?mode=audio", max_size=None, open_timeout=60)
        # (the reader initialises the session once it has a worker)
        self.reader = asyncio.create_task(self.read(self.ws))
        await asyncio.wait_for(self.created.wait(), 120)
        totals["sessions"] += 1
        self.began = time.monotonic()

    async def drop_and_resume(self):
        totals["drops"] += 1
        self.ws.transport.abort()
        self.reader.cancel()
        await asyncio.sleep(random.uniform(0.5, 3.0))
        url = f"{self.base}?resume={self.token}&received={self.received}"
        try:
            self.ws = await websockets.connect(url, max_size=None, open_timeout=60)
        except websockets.InvalidStatus:
            totals["refused"] += 1
            return await self.lost()
        first = json.loads(await asyncio.wait_for(self.ws.recv(), 30))
        if first["type"] != "session.resumed":
            # A build without resumption: a new session (in video mode, its default).
            await self.ws.close()
            return await self.lost()
        totals["resumed"] += 1
        self.token = first["resume_token"]
        totals["replayed"] += first["replayed"]
        totals["messages_lost"] += first["lost"]
        totals["voice_skipped_ms"] += first["audio_skipped_ms"]
        totals["away_ms"] += first["away_ms"]
        self.reader = asyncio.create_task(self.read(self.ws))

    async def lost(self):
        totals["sessions_lost"] += 1
        totals["chunks_unanswered"] += len(self.sent - self.answered)
        totals["session_s"] += time.monotonic() - self.began
        await self.start()

    async def run(self, drops):
        await self.start()
        k = 0
        while time.monotonic() < self.end:
            k += 1
            self.sent.add(f"input_{len(self.sent) + 1}")
            await self.ws.send(LOUD if k % 6 == 1 else QUIET)
            totals["chunks_sent"] += 1
            if drops and time.monotonic() >= drops[0]:
                # Gone while the chunk just sent is being answered.
                drops.pop(0)
                await self.drop_and_resume()
            await asyncio.sleep(1.0)
        await self.ws.send(CLOSE)
        await asyncio.wait_for(self.reader, 30)
        await self.ws.close()
        totals["chunks_unanswered"] += len(self.sent - self.answered)
        totals["session_s"] += time.monotonic() - self.began


async def main(base, sessions, minutes, fraction):
    began = time.monotonic()
    ramp = min(30.0, sessions / 20)
    end = began + ramp + minutes * 60
    # Each minute, `fraction` of the sessions drop once, at a random moment of that minute.
    plans = [[] for _ in range(sessions)]
    for minute in range(minutes):
        for i in random.sample(range(sessions), round(sessions * fraction)):
            plans[i].append(began + ramp + minute * 60 + random.uniform(5, 55))
    for plan in plans:
        plan.sort()
    clients = []
    for i in range(sessions):
        clients.append(asyncio.create_task(Session(base, end).run(plans[i])))
        await asyncio.sleep(ramp / sessions)
    results = await asyncio.gather(*clients, return_exceptions=True)
    totals["client_failures"] = sum(1 for r in results if isinstance(r, Exception))
    import traceback

    failures = ["".join(traceback.format_exception(r)[-3:]) for r in results if isinstance(r, Exception)][:3]
    if failures:
        totals["first_failures"] = failures
    totals["session_s"] = round(totals["session_s"])
    print(json.dumps(totals))


if __name__ == "__main__":
    base, sessions, minutes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fraction = float(sys.argv[4]) if len(sys.argv) > 4 else 0.10
    asyncio.run(main(base, sessions, minutes, fraction))
