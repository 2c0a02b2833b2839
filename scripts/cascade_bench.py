#!/usr/bin/env python3
"""What a real-model session costs: spoken questions streamed in real time to a running gateway.

Each session asks the questions one after another, as a person would: every 1 s chunk is sent
when it has been "recorded" (at the end of its second), the question's speech followed by
silence until the answer has ended. Measured per answer, from the events the server sends:

  - latency: from the end of the user's speech (wall clock) to the first audio delta;
  - compute per second of spoken answer: the speaking steps' generate_ms over the seconds of
    audio they produced (the first step, which also transcribes and prefills, apart);
  - listen-step cost: prefill_ms + generate_ms of every listen step.

    python3 scripts/cascade_bench.py URL SESSIONS [QUESTIONS_PER_SESSION] [--json FILE]

Needs `websockets` (the .venv that ./test.sh creates has it) and espeak-ng for the questions.
"""

import asyncio
import base64
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import wave

QUESTIONS = [
    "What is the capital of France?",
    "Describe a cat in three sentences.",
    "How many days are there in a week?",
    "Tell me about the moon in three sentences.",
    "What color is the sky on a clear day?",
    "Give me three tips for sleeping well.",
]


def speech(text):
    """16 kHz float32 samples of `text` spoken by espeak-ng."""
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", f.name, "--", text], check=True)
        w = wave.open(f.name)
        rate, n = w.getframerate(), w.getnframes()
        data = struct.unpack(f"<{n}h", w.readframes(n))
    out = []
    step = rate / 16000
    for i in range(int(n / step)):
        pos = i * step
        j = int(pos)
        frac = pos - j
        a = data[j]
        b = data[min(j + 1, n - 1)]
        out.append((a + (b - a) * frac) / 32768.0)
    return out


def b64(samples):
    return base64.b64encode(struct.pack(f"<{len(samples)}f", *samples)).decode()


def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def session(url, questions, results):
    import websockets

    async with websockets.connect(url, max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "session.queue_done":
            pass
        await ws.send(json.dumps({"type": "session.init", "payload": {"system_prompt": "You are a helpful assistant."}}))
        while json.loads(await ws.recv())["type"] != "session.created":
            pass
        events = asyncio.Queue()

        async def reader():
            async for m in ws:
                events.put_nowait((time.monotonic(), json.loads(m)))

        task = asyncio.create_task(reader())
        for q in questions:
            audio = speech(q)
            spoken = len(audio) / 16000
            start = time.monotonic()
            first_audio = None
            ended = False
            steps = {}  # input_id -> [generate_ms, audio seconds, first?]
            text = ""
            k = 0
            while not ended and k < 60:
                chunk = audio[k * 16000:(k + 1) * 16000]
                chunk = chunk + [0.0] * (16000 - len(chunk))
                # the chunk is sent once its second has been "recorded"
                await asyncio.sleep(max(0, start + (k + 1) - time.monotonic()))
                await ws.send(json.dumps({"type": "input.append", "input": {"audio": b64(chunk)}}))
                k += 1
                deadline = start + k + 1
                while time.monotonic() < deadline and not ended:
                    try:
                        t, e = await asyncio.wait_for(events.get(), max(0.01, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
                    if e.get("type") == "error":
                        results["errors"].append(e["error"]["code"])
                        continue
                    if e.get("type") != "response.output.delta":
                        continue
                    m = e.get("metrics") or {}
                    if e["kind"] == "listen":
                        results["listen_ms"].append((m.get("prefill_ms") or 0) + (m.get("generate_ms") or 0))
                        continue
                    s = steps.setdefault(e["input_id"], [m.get("generate_ms") or 0, 0.0, first_audio is None])
                    if e["kind"] == "text":
                        text += e.get("text", "")
                    if e["kind"] == "audio":
                        if first_audio is None:
                            first_audio = t
                            results["latency_s"].append(t - (start + spoken))
                            results["first_step_ms"].append(m.get("generate_ms") or 0)
                        s[1] += len(base64.b64decode(e["audio"])) / 4 / 24000
                        if e.get("end_of_turn"):
                            ended = True
            for gen, secs, first in steps.values():
                if not first and secs > 0:
                    results["compute_per_s"].append(gen / 1000 / secs)
            results["answers"] += 1 if ended else 0
            results["log"].append({"question": q, "answer": text, "latency_s": (first_audio or 0) - (start + spoken),
                                   "steps": [[round(g), round(a, 2)] for g, a, _ in steps.values()]})
            results["questions"] += 1
            # a pause before the next question
            for _ in range(2):
                await ws.send(json.dumps({"type": "input.append", "input": {"audio": b64([0.0] * 16000)}}))
                await asyncio.sleep(1)
        task.cancel()
        await ws.send(json.dumps({"type": "session.close", "reason": "user_stop"}))


async def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    if out in args:
        args.remove(out)
    url, sessions = args[0], int(args[1])
    per = int(args[2]) if len(args) > 2 else 4
    results = {"latency_s": [], "first_step_ms": [], "compute_per_s": [], "listen_ms": [], "errors": [],
               "answers": 0, "questions": 0, "log": []}
    await asyncio.gather(*(session(f"{url}/v1/realtime?mode=audio",
                                   [QUESTIONS[(i + j) % len(QUESTIONS)] for j in range(per)], results)
                           for i in range(sessions)))
    summary = {
        "sessions": sessions,
        "questions": results["questions"],
        "answered": results["answers"],
        "errors": results["errors"],
        "latency_s_p50": pct(results["latency_s"], 50),
        "latency_s_p90": pct(results["latency_s"], 90),
        "first_step_ms_p50": pct(results["first_step_ms"], 50),
        "speaking_steps": len(results["compute_per_s"]),
        "compute_per_s_p50": pct(results["compute_per_s"], 50),
        "compute_per_s_p90": pct(results["compute_per_s"], 90),
        "listen_ms_p50": pct(results["listen_ms"], 50),
        "listen_ms_p99": pct(results["listen_ms"], 99),
        "listen_steps": len(results["listen_ms"]),
    }
    print(json.dumps(summary, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "raw": results}, f)


if __name__ == "__main__":
    asyncio.run(main())
