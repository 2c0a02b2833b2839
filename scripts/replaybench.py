#!/usr/bin/env python3
"""What an instructions change costs a conversation: the time from a client's `session.update`
(new instructions) to the first audio of the next answer, with N items in the conversation
before it, on one OpenAI-dialect server. Prints one JSON object per N.

    python3 scripts/replaybench.py ws://127.0.0.1:8006/v1/realtime [ROUNDS] [N...]

Each round: a fresh session (manual turns: turn_detection null), N items created (user and
assistant messages in turn, the last the user's), one answer so the backend holds them, then new instructions and a
question; measured: session.update -> session.updated, and -> the answer's first audio.
Needs the `websockets` package (scripts/replaybench.sh runs it from the agents' venv).
"""

import asyncio
import json
import statistics
import sys
import time

import websockets


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


async def until(ws, kind, timeout=30):
    """The next event of `kind` (a type, or a tuple of types)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    while True:
        e = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        if e["type"] in kinds:
            return e
        if e["type"] == "error":
            raise RuntimeError(f"error while waiting for {kind}: {e['error']}")


def message(role, text):
    part = "input_text" if role == "user" else "output_text"
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": role, "content": [{"type": part, "text": text}]}}


async def round_trip(url, n):
    async with websockets.connect(url + "?model=bench", max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": "You are terse.", "audio": {"input": {"turn_detection": None}}}}))
        await until(ws, "session.updated")
        for i in range(n):
            role = "user" if (n - 1 - i) % 2 == 0 else "assistant"  # the last one the user's
            await ws.send(json.dumps(message(role, f"Item {i}: the quick brown fox jumps over the lazy dog.")))
            await until(ws, "conversation.item.added")
        if n:
            await ws.send(json.dumps({"type": "response.create"}))
            await until(ws, "response.done")
        t0 = time.perf_counter()
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "realtime", "instructions": "You are kind."}}))
        await until(ws, "session.updated")
        updated = time.perf_counter() - t0
        await ws.send(json.dumps(message("user", "What do you remember?")))
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.output_audio.delta")
        first = time.perf_counter() - t0
        await until(ws, "response.done")
        return updated * 1000, first * 1000


async def main():
    url = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    sizes = [int(a) for a in sys.argv[3:]] or [0, 10, 50]
    for n in sizes:
        updated, first = [], []
        for _ in range(rounds):
            u, f = await round_trip(url, n)
            updated.append(u)
            first.append(f)
        print(json.dumps({"items": n, "rounds": rounds,
                          "updated_ms": {"p50": statistics.median(updated), "p90": pct(updated, 90)},
                          "first_audio_ms": {"p50": statistics.median(first), "p90": pct(first, 90)}}), flush=True)


asyncio.run(main())
