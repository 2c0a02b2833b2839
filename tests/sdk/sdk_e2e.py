"""The official realtime clients, unchanged but for the URL and a key, against omni-gateway.

Usage: python sdk_e2e.py PORT API_KEY [CASE ...]
Cases: openai-ga-manual openai-ga-vad openai-beta-manual openai-beta-vad dashscope-manual dashscope-vad
openai-ga-conversation openai-ga-out-of-band openai-ga-idle-timeout openai-ga-no-auto-response
openai-ga-error-codes
The first six each hold one voice turn with transcription of the user's speech on, and must receive
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


class Ga:
    """A GA connection of the official client, and the events it hears, by type."""

    def __init__(self, conn):
        self.conn = conn
        self.events = []

    async def until(self, kind, check=None):
        """The next event of `kind` (errors other than one of that kind fail)."""
        while True:
            event = await asyncio.wait_for(self.conn.recv(), TIMEOUT)
            self.events.append(event)
            if event.type == kind and (check is None or check(event)):
                return event
            if event.type == "error":
                raise AssertionError(f"error event: {event}")

    def count(self, kind):
        return sum(e.type == kind for e in self.events)


async def ga(port, key, session, body):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", websocket_base_url=f"ws://127.0.0.1:{port}/v1")
    async with client.realtime.connect(model="omni") as conn:
        c = Ga(conn)
        await c.until("session.created")
        await conn.session.update(session={"type": "realtime", **session})
        await c.until("session.updated")
        return await body(conn, c)


def text_item(text, role="user"):
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


async def ga_conversation(port, key):
    """Truncate, retrieve, delete: what an agent does to the conversation on an interruption."""
    async def body(conn, c):
        await conn.conversation.item.create(item=text_item("Reply with exactly: one two three four"))
        user = (await c.until("conversation.item.added")).item.id
        await conn.response.create()
        answer = (await c.until("response.output_item.done")).item
        await c.until("response.done")
        await conn.conversation.item.truncate(item_id=answer.id, content_index=0, audio_end_ms=500)
        cut = await c.until("conversation.item.truncated")
        await conn.conversation.item.retrieve(item_id=answer.id)
        kept = (await c.until("conversation.item.retrieved")).item
        heard = kept.content[0].transcript
        assert heard == "one two", f"what was heard of 1 s of 'one two three four' at 500 ms: {heard!r}"
        await conn.conversation.item.delete(item_id=user)
        gone = await c.until("conversation.item.deleted")
        assert gone.item_id == user
        await conn.conversation.item.retrieve(item_id=user)
        while True:
            event = await asyncio.wait_for(conn.recv(), TIMEOUT)
            if event.type == "error":
                assert event.error.code == "item_retrieve_invalid_item_id", event
                break
        return f"truncated at {cut.audio_end_ms} ms to {heard!r}, deleted {user}"

    return await ga(port, key, {"output_modalities": ["audio"], "audio": {"input": {"turn_detection": None}}}, body)


async def ga_out_of_band(port, key):
    """A response outside the conversation, on its own input, with the client's metadata."""
    async def body(conn, c):
        await conn.conversation.item.create(item=text_item("keep me"))
        await c.until("conversation.item.added")
        await conn.response.create(response={
            "conversation": "none", "metadata": {"topic": "side"}, "output_modalities": ["text"],
            "input": [text_item("Reply with exactly: side note")]})
        created = await c.until("response.created")
        assert created.response.metadata == {"topic": "side"}, created.response.metadata
        done = await c.until("response.done")
        words = done.response.output[0].content[0].text
        assert words == "side note" and done.response.conversation_id is None, done.response
        added = [e for e in c.events if e.type == "conversation.item.added"]
        assert len(added) == 1, f"the answer is not in the conversation: {added}"
        return f"{words!r}, metadata {created.response.metadata}"

    return await ga(port, key, {"audio": {"input": {"turn_detection": None}}}, body)


async def ga_idle_timeout(port, key):
    """Server VAD's idle_timeout_ms: silence becomes a turn the model answers."""
    async def body(conn, c):
        fired = await c.until("input_audio_buffer.timeout_triggered")
        await c.until("response.created")
        done = await c.until("response.done")
        return f"after {fired.audio_end_ms - fired.audio_start_ms} ms of silence: {done.response.status}"

    detection = {"type": "server_vad", "idle_timeout_ms": 1500}
    return await ga(port, key, {"audio": {"input": {"turn_detection": detection}}}, body)


async def ga_no_auto_response(port, key):
    """create_response false: the user's turn is committed, and the client asks for the answer."""
    async def body(conn, c):
        speech = tone(1.5, 24000) + bytes(2 * 24000)
        for i in range(0, len(speech), 9600):
            await conn.input_audio_buffer.append(audio=b64(speech[i:i + 9600]))
        await c.until("input_audio_buffer.committed")
        assert c.count("response.created") == 0, "no response before the client asks"
        await conn.response.create()
        done = await c.until("response.done")
        assert c.count("response.created") == 1, [e.type for e in c.events]
        return f"{done.response.status}, {c.count('response.created')} response"

    detection = {"type": "server_vad", "create_response": False}
    return await ga(port, key, {"audio": {"input": {"turn_detection": detection}}}, body)


async def ga_error_codes(port, key):
    """OpenAI's codes, which clients branch on."""
    async def body(conn, c):
        codes = []

        async def error_of(send):
            await send()
            while True:
                event = await asyncio.wait_for(conn.recv(), TIMEOUT)
                if event.type == "error":
                    assert event.error.type, event
                    codes.append(event.error.code)
                    return

        await error_of(lambda: conn.response.cancel())
        await error_of(lambda: conn.input_audio_buffer.commit())
        await error_of(lambda: conn.conversation.item.truncate(item_id="nope", content_index=0, audio_end_ms=0))
        await error_of(lambda: conn.conversation.item.delete(item_id="nope"))
        await conn.conversation.item.create(item=text_item("Tell me a long story about the sea."))

        async def twice():
            await conn.response.create()
            await conn.response.create()

        await error_of(twice)
        await c.until("response.done")
        expected = ["response_cancel_not_active", "input_audio_buffer_commit_empty", "item_truncate_invalid_item_id",
                    "item_delete_invalid_item_id", "conversation_already_has_active_response"]
        assert codes == expected, codes
        return ", ".join(codes)

    return await ga(port, key, {"audio": {"input": {"turn_detection": None}}}, body)


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
    "openai-ga-conversation": lambda p, k: asyncio.run(ga_conversation(p, k)),
    "openai-ga-out-of-band": lambda p, k: asyncio.run(ga_out_of_band(p, k)),
    "openai-ga-idle-timeout": lambda p, k: asyncio.run(ga_idle_timeout(p, k)),
    "openai-ga-no-auto-response": lambda p, k: asyncio.run(ga_no_auto_response(p, k)),
    "openai-ga-error-codes": lambda p, k: asyncio.run(ga_error_codes(p, k)),
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
