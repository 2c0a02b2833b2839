"""The official realtime clients, unchanged but for the URL and a key, against omni-gateway.

Usage: python sdk_e2e.py PORT API_KEY [CASE ...]
Cases: openai-ga-manual openai-ga-vad openai-beta-manual openai-beta-vad dashscope-manual dashscope-vad
Each case holds one voice turn with transcription of the user's speech on, and must receive
the transcript of what the user said (conversation.item.input_audio_transcription.completed),
audio and a transcript of the answer, usage in the flavor's own spelling (input_token_details
for OpenAI, input_tokens_details for Qwen) and end with response.done status "completed".
Prints one line per case; exits 1 if any failed.
"""

import asyncio
import base64
import math
import struct
import sys
import threading
import traceback

TIMEOUT = 30


def tone(seconds, rate, amplitude=0.3, hz=220):
    """pcm16 little-endian mono: speech to the reference backend."""
    n = int(seconds * rate)
    return b"".join(struct.pack("<h", int(amplitude * 32767 * math.sin(2 * math.pi * hz * i / rate))) for i in range(n))


def b64(data):
    return base64.b64encode(data).decode()


class Turn:
    """What one response produced."""

    def __init__(self):
        self.audio_bytes = 0
        self.transcript = ""
        self.heard = None
        self.status = None
        self.usage = None
        self.types = []

    def check(self, audio_delta, transcript_delta):
        assert audio_delta in self.types, f"no {audio_delta} in {self.types}"
        assert transcript_delta in self.types, f"no {transcript_delta} in {self.types}"
        assert self.audio_bytes > 0, "no audio"
        assert self.transcript.strip(), "no transcript"
        assert self.heard, f"no transcript of the user's speech in {self.types}"
        assert self.status == "completed", f"response.done status {self.status}"
        return (f"{self.audio_bytes // 2} samples, transcript {self.transcript!r}, heard {self.heard!r}, "
                f"usage {self.usage}")


HEARD = "conversation.item.input_audio_transcription.completed"


async def openai_turn(port, key, beta, vad):
    from openai import AsyncOpenAI

    # The SDK's own setting for where its WebSocket goes (the beta client defaults to wss).
    client = AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
    realtime = client.beta.realtime if beta else client.realtime
    audio_delta = "response.audio.delta" if beta else "response.output_audio.delta"
    transcript_delta = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"
    turn = Turn()
    async with realtime.connect(model="omni") as conn:
        detection = {"type": "server_vad"} if vad else None
        transcription = {"model": "whisper-1"}
        if beta:
            session = {"modalities": ["text", "audio"], "instructions": "Be brief.", "voice": "alloy",
                       "input_audio_format": "pcm16", "output_audio_format": "pcm16", "turn_detection": detection,
                       "input_audio_transcription": transcription}
        else:
            session = {"type": "realtime", "output_modalities": ["audio"], "instructions": "Be brief.",
                       "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": detection,
                                           "transcription": transcription},
                                 "output": {"voice": "alloy"}}}
        await conn.session.update(session=session)
        speech = tone(1.5, 24000)
        for i in range(0, len(speech), 9600):  # 200 ms appends
            await conn.input_audio_buffer.append(audio=b64(speech[i:i + 9600]))
        if not vad:
            await conn.input_audio_buffer.commit()
            await conn.response.create()
        async for event in conn:
            turn.types.append(event.type)
            if event.type == "error":
                raise AssertionError(f"error event: {event}")
            if event.type == audio_delta:
                turn.audio_bytes += len(base64.b64decode(event.delta))
            elif event.type == transcript_delta:
                turn.transcript += event.delta
            elif event.type == HEARD:
                turn.heard = event.transcript
            elif event.type == "response.done":
                turn.status = event.response.status
                usage = event.response.usage
                assert usage is not None and usage.total_tokens > 0, "usage"
                # The SDK's own types: OpenAI's spelling of the details.
                details = usage.input_token_details
                assert details is not None and details.audio_tokens > 0, f"input_token_details {usage}"
                assert usage.output_token_details is not None, f"output_token_details {usage}"
                turn.usage = f"in {usage.input_tokens} ({details.audio_tokens} audio), out {usage.output_tokens}"
                break
    assert turn.types[0] == "session.created", turn.types[:3]
    return turn.check(audio_delta, transcript_delta)


def dashscope_turn(port, key, vad):
    from dashscope.audio.qwen_omni import AudioFormat, MultiModality, OmniRealtimeCallback, OmniRealtimeConversation

    turn = Turn()
    done = threading.Event()
    failure = []
    updated = []

    class Callback(OmniRealtimeCallback):
        def on_event(self, message):
            kind = message.get("type")
            turn.types.append(kind)
            if kind == "error":
                failure.append(message)
                done.set()
            elif kind == "response.audio.delta":
                turn.audio_bytes += len(base64.b64decode(message["delta"]))
            elif kind == "response.audio_transcript.delta":
                turn.transcript += message["delta"]
            elif kind == HEARD:
                turn.heard = message["transcript"]
            elif kind == "session.updated":
                updated.append(message["session"])
            elif kind == "response.done":
                turn.status = message["response"]["status"]
                usage = message["response"]["usage"]
                # Qwen's spelling of the details.
                details = usage.get("input_tokens_details") or {}
                if details.get("audio_tokens", 0) <= 0 or "output_tokens_details" not in usage:
                    failure.append(f"usage without Qwen's details: {usage}")
                turn.usage = f"in {usage['input_tokens']} ({details.get('audio_tokens')} audio), out {usage['output_tokens']}"
                done.set()

    conversation = OmniRealtimeConversation(
        model="qwen-omni", callback=Callback(), url=f"ws://127.0.0.1:{port}/api-ws/v1/realtime", api_key=key)
    conversation.connect()
    conversation.update_session(
        output_modalities=[MultiModality.AUDIO, MultiModality.TEXT],
        voice="Cherry",
        input_audio_format=AudioFormat.PCM_16000HZ_MONO_16BIT,
        output_audio_format=AudioFormat.PCM_24000HZ_MONO_16BIT,
        enable_input_audio_transcription=True,
        enable_turn_detection=vad,
        top_k=20,  # a generation setting, passed through by the SDK's kwargs
    )
    speech = tone(1.5, 16000)
    for i in range(0, len(speech), 6400):  # 200 ms appends
        conversation.append_audio(b64(speech[i:i + 6400]))
    if not vad:
        conversation.commit()
        conversation.create_response()
    assert done.wait(TIMEOUT), f"no response.done within {TIMEOUT} s: {turn.types}"
    assert not failure, f"error event: {failure}"
    assert updated and updated[-1].get("top_k") == 20, f"session.updated echoes top_k: {updated}"
    assert conversation.get_session_id(), "session.created carried session.id"
    assert conversation.get_last_response_id(), "response.created carried response.id"
    conversation.end_session(timeout=TIMEOUT)  # sends session.finish, waits for session.finished
    assert "session.finished" in turn.types, turn.types[-5:]
    conversation.close()
    return turn.check("response.audio.delta", "response.audio_transcript.delta")


CASES = {
    "openai-ga-manual": lambda p, k: asyncio.run(openai_turn(p, k, beta=False, vad=False)),
    "openai-ga-vad": lambda p, k: asyncio.run(openai_turn(p, k, beta=False, vad=True)),
    "openai-beta-manual": lambda p, k: asyncio.run(openai_turn(p, k, beta=True, vad=False)),
    "openai-beta-vad": lambda p, k: asyncio.run(openai_turn(p, k, beta=True, vad=True)),
    "dashscope-manual": lambda p, k: dashscope_turn(p, k, vad=False),
    "dashscope-vad": lambda p, k: dashscope_turn(p, k, vad=True),
}


def main():
    port, key = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(CASES)
    failed = 0
    for name in names:
        try:
            print(f"ok {name}: {CASES[name](port, key)}", flush=True)
        except Exception:  # noqa: BLE001 - report every case
            failed += 1
            print(f"FAILED {name}:\n{traceback.format_exc()}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
