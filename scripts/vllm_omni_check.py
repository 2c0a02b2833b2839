"""The scenarios the gateway's tests run against a mock of vLLM-Omni, run against a gateway in
front of a real vLLM-Omni server (scripts/vllm_omni_check.sh starts one). Each prints PASS or
FAIL with what it saw; the exit status is the number of failures.

    .venv/bin/python scripts/vllm_omni_check.py GATEWAY SLOTS QUESTION_WAV

GATEWAY is http://HOST:PORT; SLOTS the `count` of its vllm-omni workers; QUESTION_WAV a spoken
question (any rate, mono or stereo, 16-bit).

1. A MiniCPM-o-dialect session hears the model answer the question.
2. An OpenAI-dialect session hears it too.
3. SLOTS sessions take every slot; one more waits in the queue (never refused) and is served
   when one of them leaves.
4. A force-listen while the model speaks ends its voice.
5. Afterwards every worker is idle: each session's `session.close` was confirmed.
"""

import asyncio
import base64
import json
import struct
import sys
import time
import urllib.request
import wave

import websockets

TIMEOUT = 60  # seconds for the model to answer a question


def read_question(path):
    with wave.open(path, "rb") as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
        frames = w.readframes(w.getnframes())
    if width != 2:
        raise SystemExit(f"{path}: 16-bit PCM only")
    samples = struct.unpack(f"<{len(frames) // 2}h", frames)
    mono = [sum(samples[i:i + channels]) / channels / 32768.0 for i in range(0, len(samples), channels)]
    return mono, rate


def resample(samples, rate, to):
    if rate == to:
        return list(samples)
    n = int(len(samples) * to / rate)
    return [samples[min(int(i * rate / to), len(samples) - 1)] for i in range(n)]


def f32_b64(samples):
    return base64.b64encode(struct.pack(f"<{len(samples)}f", *samples)).decode()


def pcm16_b64(samples):
    return base64.b64encode(struct.pack(f"<{len(samples)}h", *(int(max(-1, min(1, s)) * 32767) for s in samples))).decode()


class Check:
    def __init__(self, gateway, slots, question):
        self.http = gateway.rstrip("/")
        self.ws = "ws" + self.http[4:]
        self.slots = slots
        q, rate = question
        self.q16 = resample(q, rate, 16000)
        self.q24 = resample(q, rate, 24000)
        self.failures = 0

    def report(self, name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        self.failures += not ok

    async def minicpm(self):
        return await websockets.connect(f"{self.ws}/v1/realtime?mode=audio", max_size=None)

    async def until(self, ws, kinds, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"none of {kinds} within {timeout} s")
            v = json.loads(await asyncio.wait_for(ws.recv(), left))
            if v.get("type") == "error":
                raise RuntimeError(f"error: {v.get('error')}")
            if v.get("type") in kinds:
                return v

    async def init(self, ws):
        await self.until(ws, ["session.queue_done"], TIMEOUT)
        await ws.send(json.dumps({"type": "session.init", "payload": {"system_prompt": "You are a helpful assistant."}}))
        await self.until(ws, ["session.created"])

    async def ask(self, ws, chunk_event, second, question, voice):
        """Streams the question then silence at real time until the model's voice comes."""
        chunks = [question[i:i + second] for i in range(0, len(question), second)]
        chunks[-1] = chunks[-1] + [0.0] * (second - len(chunks[-1]))
        chunks += [[0.0] * second] * TIMEOUT
        heard = asyncio.Event()
        asked_at = [None]

        async def read():
            while not heard.is_set():
                v = json.loads(await ws.recv())
                if voice(v):
                    heard.set()
                elif v.get("type") == "error":
                    raise RuntimeError(f"error: {v.get('error')}")

        reader = asyncio.create_task(read())
        try:
            for i, c in enumerate(chunks):
                if heard.is_set() or reader.done():
                    break
                if i * second >= len(question) and asked_at[0] is None:
                    asked_at[0] = time.monotonic()
                await ws.send(chunk_event(c))
                await asyncio.sleep(1)
            await asyncio.wait_for(reader, 5)
        finally:
            reader.cancel()
        return time.monotonic() - (asked_at[0] or time.monotonic())

    @staticmethod
    def minicpm_chunk(c, force_listen=False):
        event = {"type": "input.append", "input": {"audio": f32_b64(c)}}
        if force_listen:
            event["input"]["force_listen"] = True
        return json.dumps(event)

    @staticmethod
    def minicpm_voice(v):
        return v.get("type") == "response.output.delta" and v.get("kind") == "audio"

    async def minicpm_hears(self):
        ws = await self.minicpm()
        await self.init(ws)
        after = await self.ask(ws, self.minicpm_chunk, 16000, self.q16, self.minicpm_voice)
        await ws.send(json.dumps({"type": "session.close"}))
        await self.until(ws, ["session.closed"])
        await ws.close()
        return after

    async def openai_hears(self):
        ws = await websockets.connect(f"{self.ws}/v1/realtime?model=omni", max_size=None)
        await self.until(ws, ["session.created"])
        def chunk(c):
            return json.dumps({"type": "input_audio_buffer.append", "audio": pcm16_b64(c)})
        def voice(v):
            return v.get("type") == "response.output_audio.delta"
        after = await self.ask(ws, chunk, 24000, self.q24, voice)
        await ws.close()
        return after

    async def queue(self):
        held = []
        for _ in range(self.slots):
            ws = await self.minicpm()
            await self.init(ws)
            held.append(ws)
        extra = await self.minicpm()
        queued = await self.until(extra, ["session.queued", "session.queue_done"], 30)
        if queued["type"] != "session.queued":
            raise RuntimeError(f"the extra client got a worker at once: are there more than {self.slots} slots?")
        await held[0].send(json.dumps({"type": "session.close"}))
        await self.until(held[0], ["session.closed"])
        started = time.monotonic()
        await self.init(extra)
        served = time.monotonic() - started
        for ws in held[1:] + [extra]:
            await ws.send(json.dumps({"type": "session.close"}))
            await self.until(ws, ["session.closed"])
            await ws.close()
        return queued["position"], served

    async def interrupt(self):
        ws = await self.minicpm()
        await self.init(ws)
        await self.ask(ws, self.minicpm_chunk, 16000, self.q16, self.minicpm_voice)
        silence = [0.0] * 16000
        await ws.send(self.minicpm_chunk(silence, force_listen=True))
        # The voice stops: the next two chunks' answers are listens.
        listens = 0
        for _ in range(2):
            await ws.send(self.minicpm_chunk(silence))
        deadline = time.monotonic() + 10
        while listens < 2 and time.monotonic() < deadline:
            v = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if v.get("type") == "response.output.delta" and v.get("kind") == "listen":
                listens += 1
            elif v.get("type") == "response.output.delta" and v.get("kind") == "audio" and listens:
                raise RuntimeError("voice after the force-listen was answered by a listen")
        await ws.send(json.dumps({"type": "session.close"}))
        await self.until(ws, ["session.closed"])
        await ws.close()
        return listens

    def idle(self):
        deadline = time.monotonic() + 15
        while True:
            with urllib.request.urlopen(f"{self.http}/status", timeout=5) as r:
                status = json.load(r)
            states = [w["state"] for w in status["workers"]]
            if all(s == "idle" for s in states) or time.monotonic() > deadline:
                return states
            time.sleep(0.2)

    async def run(self):
        scenarios = [
            ("minicpm dialect", self.minicpm_hears, lambda t: f"the model's voice {t:.1f} s after the question"),
            ("openai dialect", self.openai_hears, lambda t: f"the model's voice {t:.1f} s after the question"),
            ("queue", self.queue, lambda r: f"client {self.slots + 1} waited at position {r[0]}, served {r[1]:.1f} s after a slot freed"),
            ("force-listen", self.interrupt, lambda n: f"{n} listens after the force-listen, no voice"),
        ]
        for name, run, say in scenarios:
            try:
                self.report(name, True, say(await run()))
            except Exception as e:  # each scenario says what went wrong and the next runs
                self.report(name, False, f"{type(e).__name__}: {e}")
        states = self.idle()
        self.report("slots released", all(s == "idle" for s in states), f"workers {states}")
        return self.failures


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    check = Check(sys.argv[1], int(sys.argv[2]), read_question(sys.argv[3]))
    sys.exit(asyncio.run(check.run()))


if __name__ == "__main__":
    main()
