#!/usr/bin/env python3
"""What a real-model session costs: spoken questions streamed in real time to a running gateway.

Each session asks the questions one after another, as a person would: every 1 s chunk is sent
when it has been "recorded" (at the end of its second), the question's speech followed by
silence until the answer has ended. Measured per answer, from the events the server sends:

  - latency: from the end of the user's speech (wall clock) to the first audio delta. The end
    of speech is the end of the last 10 ms of the question's audio as loud as the page's
    microphone counts as talking (RMS 0.01), not the end of its clip: espeak-ng ends a clip with
    some 0.4 s of silence;
  - compute per second of spoken answer: the speaking steps' generate_ms over the seconds of
    audio they produced (the first step, which also transcribes and prefills, apart);
  - listen-step cost: prefill_ms + generate_ms of every listen step;
  - silence inside an answer: played from its first audio delta on, the time a piece of the
    answer arrived after everything before it had been played (answers_with_silence counts the
    answers with more than 20 ms of it).

  - with --facts, whether each answer is right: ten short factual questions whose answers hold
    a known word ("What colour is grass?" -> green), scored on the answer's text, beside what the
    model heard (its transcript, `input.transcript`);
  - session start: from session.init sent to session.created.

    python3 scripts/cascade_bench.py URL SESSIONS [QUESTIONS_PER_SESSION] [--json FILE]
        [--facts | --held-out] [--chunk-ms MS] [--prompt TEXT]

--facts asks the ten factual questions (QUESTIONS_PER_SESSION of them, 10 by default with it),
each in a fresh session, one after another; --held-out asks twenty others the same way (20 by
default), which no prompt or setting was chosen on.

--chunk-ms sends chunks of MS milliseconds (default 1000), each when its audio has been "recorded".

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

# Short factual questions and the words a right answer holds (any of them).
FACTS = [
    ("What is the capital of France?", ["paris"]),
    ("How many days are there in a week?", ["seven", "7"]),
    ("What color is grass?", ["green"]),
    ("Is fire hot or cold?", ["hot"]),
    ("How many legs does a spider have?", ["eight", "8"]),
    ("What do bees make?", ["honey"]),
    ("How many hours are in a day?", ["24", "twenty-four", "twenty four"]),
    ("What is the opposite of up?", ["down"]),
    ("What planet do we live on?", ["earth"]),
    ("What color is the sky on a clear day?", ["blue"]),
]

# Twenty more (--held-out), written to see whether what helps the ten above is tuned to them.
# The score is a word the answer holds: an answer that only repeats the question's own words
# ("Which is bigger, the sun or the moon?") can score; read the log beside the count.
HELD_OUT = [
    ("How many wheels does a bicycle have?", ["two", "2"]),
    ("What animal says moo?", ["cow"]),
    ("What is frozen water called?", ["ice"]),
    ("What color is a banana?", ["yellow"]),
    ("How many months are in a year?", ["twelve", "12"]),
    ("What is the capital of Japan?", ["tokyo"]),
    ("How many minutes are in an hour?", ["sixty", "60"]),
    ("What season comes after winter?", ["spring"]),
    ("How many sides does a triangle have?", ["three", "3"]),
    ("What is two plus two?", ["four", "4"]),
    ("Where do fish live?", ["water", "sea", "ocean", "river", "lake"]),
    ("What do we use to see?", ["eye"]),
    ("What is the largest ocean on Earth?", ["pacific"]),
    ("Which is bigger, the sun or the moon?", ["sun"]),
    ("What do you call a baby dog?", ["puppy", "puppies", "pup"]),
    ("What gas do we breathe in to live?", ["oxygen"]),
    ("What color are ripe strawberries?", ["red"]),
    ("Is ice cream hot or cold?", ["cold"]),
    ("What is the capital of England?", ["london"]),
    ("How many legs does a cat have?", ["four", "4"]),
]

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


def voiced_end(samples, window=160, rms=0.01):
    """Seconds from the clip's start to the end of its last `window` samples with this RMS."""
    for end in range(len(samples) - len(samples) % window, 0, -window):
        block = samples[end - window:end]
        if (sum(x * x for x in block) / window) ** 0.5 >= rms:
            return end / 16000
    return len(samples) / 16000


def b64(samples):
    return base64.b64encode(struct.pack(f"<{len(samples)}f", *samples)).decode()


def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


async def session(url, questions, results, chunk_ms=1000, prompt=""):
    import websockets

    n = 16 * chunk_ms
    async with websockets.connect(url, max_size=None) as ws:
        while json.loads(await ws.recv())["type"] != "session.queue_done":
            pass
        init = time.monotonic()
        await ws.send(json.dumps({"type": "session.init", "payload": {"system_prompt": prompt, "transcripts": True}}))
        while json.loads(await ws.recv())["type"] != "session.created":
            pass
        results["created_ms"].append((time.monotonic() - init) * 1000)
        events = asyncio.Queue()

        async def reader():
            async for m in ws:
                events.put_nowait((time.monotonic(), json.loads(m)))

        task = asyncio.create_task(reader())
        for q in questions:
            expected = None
            if isinstance(q, tuple):
                q, expected = q
            audio = speech(q)
            spoken = voiced_end(audio)
            start = time.monotonic()
            first_audio = None
            play_end, gap = None, 0.0
            ended = False
            steps = {}  # input_id -> [generate_ms, audio seconds, first?]
            text = ""
            heard = []
            k = 0
            while not ended and k < 60000 // chunk_ms:
                chunk = audio[k * n:(k + 1) * n]
                chunk = chunk + [0.0] * (n - len(chunk))
                # the chunk is sent once its audio has been "recorded"
                await asyncio.sleep(max(0, start + (k + 1) * chunk_ms / 1000 - time.monotonic()))
                await ws.send(json.dumps({"type": "input.append", "input": {"audio": b64(chunk)}}))
                k += 1
                deadline = start + (k + 1) * chunk_ms / 1000
                while time.monotonic() < deadline and not ended:
                    try:
                        t, e = await asyncio.wait_for(events.get(), max(0.01, deadline - time.monotonic()))
                    except asyncio.TimeoutError:
                        break
                    if e.get("type") == "error":
                        results["errors"].append(e["error"]["code"])
                        continue
                    if e.get("type") == "input.transcript":
                        heard.append(e.get("text", ""))
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
                        secs = len(base64.b64decode(e["audio"])) / 4 / 24000
                        s[1] += secs
                        # A player that starts with the first audio: a piece that arrives after
                        # what came before it has been played leaves a silence in the answer.
                        if secs > 0:
                            play_end = t if play_end is None else play_end
                            gap += max(0.0, t - play_end)
                            play_end = max(play_end, t) + secs
                        if e.get("end_of_turn"):
                            ended = True
            for gen, secs, first in steps.values():
                if not first and secs > 0:
                    results["compute_per_s"].append(gen / 1000 / secs)
            results["answers"] += 1 if ended else 0
            results["gap_s"].append(gap)
            right = None
            if expected is not None:
                right = any(w in text.lower() for w in expected)
                results["right"] += 1 if right else 0
            results["log"].append({"question": q, "heard": " ".join(heard), "answer": text, "right": right,
                                   "latency_s": (first_audio or 0) - (start + spoken), "gap_s": gap,
                                   "steps": [[round(g), round(a, 2)] for g, a, _ in steps.values()]})
            results["questions"] += 1
            # a pause before the next question
            for _ in range(2000 // chunk_ms):
                await ws.send(json.dumps({"type": "input.append", "input": {"audio": b64([0.0] * n)}}))
                await asyncio.sleep(chunk_ms / 1000)
        task.cancel()
        await ws.send(json.dumps({"type": "session.close", "reason": "user_stop"}))


async def main():
    def option(name, default):
        return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default

    out = option("--json", None)
    chunk_ms = int(option("--chunk-ms", "1000"))
    prompt = option("--prompt", "")
    values = {out, str(chunk_ms), prompt} if "--prompt" in sys.argv else {out, str(chunk_ms)}
    args = [a for a in sys.argv[1:] if not a.startswith("--") and a not in values]
    facts = "--facts" in sys.argv
    url, sessions = args[0], int(args[1])
    held_out = "--held-out" in sys.argv  # the twenty others, with or without --facts
    per = int(args[2]) if len(args) > 2 else (20 if held_out else 10 if facts else 4)
    results = {"latency_s": [], "first_step_ms": [], "compute_per_s": [], "listen_ms": [], "errors": [], "gap_s": [],
               "answers": 0, "questions": 0, "log": [], "created_ms": [], "right": 0}
    facts = facts or held_out
    if facts:
        # A fresh session for each question, one after another, as a new user would ask.
        pool = HELD_OUT if held_out else FACTS
        for q in pool[:per] if per < len(pool) else pool:
            await session(f"{url}/v1/realtime?mode=audio", [q], results, chunk_ms, prompt)
    else:
        await asyncio.gather(*(session(f"{url}/v1/realtime?mode=audio",
                                       [QUESTIONS[(i + j) % len(QUESTIONS)] for j in range(per)], results,
                                       chunk_ms, prompt)
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
        "created_ms_p50": pct(results["created_ms"], 50),
        "answers_with_silence": sum(1 for g in results["gap_s"] if g > 0.02),
        "silence_s_max": max(results["gap_s"], default=0.0),
        "right": results["right"] if facts else None,
    }
    for entry in results["log"]:
        print(f"{entry['latency_s']:5.2f} s  {'right' if entry['right'] else 'WRONG' if entry['right'] is False else '':5}  "
              f"{entry['question']!r} heard {entry['heard']!r}: {entry['answer']!r}", file=sys.stderr)
    print(json.dumps(summary, indent=1))
    if out:
        with open(out, "w") as f:
            json.dump({"summary": summary, "raw": results}, f)


if __name__ == "__main__":
    asyncio.run(main())
