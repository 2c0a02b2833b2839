"""The OpenAI Agents SDK (`agents.realtime`) against omni-gateway, as its users write it: a
RealtimeAgent with a function tool and a handoff to a second agent, driven headless.

Usage: python agents_sdk_case.py URL KEY [--cpu-model | --delegated]
  URL  ws://HOST:PORT/v1/realtime?model=NAME (the SDK takes the URL as given)

Steps (reference backend): a typed turn, a spoken turn (with the user's transcript in the
agent's history), a tool call whose result is in the answer, an interruption by speech (the
answer cancelled, the SDK's truncate accepted), a handoff (new instructions and tools) after
which the conversation is still the model's ("What do you remember?"). With --cpu-model: one
typed question that the CPU model answers by calling the tool. With --delegated (a voice that
calls no tools, a MiniCPM-o worker, with the gateway's decider beside it): a spoken question
(espeak-ng, through the gateway's Whisper) the decider answers with the tool, the voice speaking
its result, and a handoff the decider makes, after which the new agent's voice still answers.
"""

import asyncio
import sys

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner

from common import Inbox, Steps, paced, speech, spoken, tone, silence

TOOL_RESULT = "It is 12:00 UTC."
calls = []


@function_tool
def get_time() -> str:
    """The time now, in UTC."""
    calls.append("get_time")
    return TOOL_RESULT


def raw(event):
    """The server event a session event carries, if any."""
    if event.type == "raw_model_event" and getattr(event.data, "type", "") == "raw_server_event":
        return event.data.data
    return None


def raw_type(event):
    r = raw(event)
    return r.get("type") if r else None


def said(seen):
    """The assistant's words in these events: its audio transcripts and texts."""
    words = []
    for e in seen:
        r = raw(e)
        if r and r.get("type") in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            words.append(r.get("delta", ""))
    return "".join(words)


def transcript_done(e, words):
    """The voice's finished transcript, when it holds `words`."""
    r = raw(e) or {}
    return r.get("type") == "response.output_audio_transcript.done" and words in r.get("transcript", "")


async def delegated(session, inbox, steps, errors):
    """The steps on a voice that calls no tools, with the gateway's decider beside it."""
    await paced(spoken("What time is it now?") + silence(1.5), session.send_audio)
    ev, seen = await inbox.until(lambda e: e.type == "tool_end", 60)
    steps.check("tool call", ev is not None and calls == ["get_time"], f"calls {calls}")
    # The SDK sends the result and asks for a response; the voice, prepared again, speaks it.
    ev, seen = await inbox.until(lambda e: transcript_done(e, TOOL_RESULT), 60)
    steps.check("tool result in the answer", ev is not None, repr(said(seen)))
    await session.send_message("Transfer me to the SpanishAgent, please.")
    ev, seen = await inbox.until(lambda e: e.type == "handoff", 60)
    steps.check("handoff", ev is not None and ev.to_agent.name == "SpanishAgent",
                getattr(getattr(ev, "to_agent", None), "name", None))
    ev, seen = await inbox.until(lambda e: raw_type(e) == "session.updated" and "espanol" in raw(e)["session"]["instructions"], 60)
    steps.check("the new agent's instructions", ev is not None, "session.updated")
    ev, seen = await inbox.until(lambda e: transcript_done(e, "from what I was told"), 60)
    steps.check("the new agent's voice answers", ev is not None, repr(said(seen)))
    # The voice by name is the one setting such a voice does not take (it speaks in its reference
    # recording's): the gateway says so once, as it should; nothing else is an error.
    unexpected = [e for e in errors if "unsupported_setting" not in e]
    steps.check("no errors", not unexpected, f"{errors}")


async def main(url, key, cpu_model, delegate=False):
    steps = Steps()
    spanish = RealtimeAgent(name="SpanishAgent", instructions="Responde siempre en espanol.",
                            handoff_description="Speaks Spanish")
    main_agent = RealtimeAgent(name="MainAgent", instructions="You are a helpful assistant.",
                               tools=[get_time], handoffs=[spanish])
    runner = RealtimeRunner(main_agent)
    session = await runner.run(model_config={"url": url, "api_key": key})
    inbox = Inbox()
    errors = []

    async def pump():
        async for event in session:
            if event.type == "error":
                errors.append(str(event.error)[:300])
            inbox.put(event)

    async with session:
        task = asyncio.create_task(pump())
        ev, _ = await inbox.until(lambda e: raw_type(e) == "session.updated")
        steps.check("connect", ev is not None, "session.updated")

        if delegate:
            await delegated(session, inbox, steps, errors)
            task.cancel()
            return steps

        if cpu_model:
            await session.send_message("What time is it now? Use the get_time tool.")
            ev, seen = await inbox.until(lambda e: e.type == "tool_end", 120)
            steps.check("cpu-model tool call", ev is not None and calls == ["get_time"], f"calls {calls}")
            ev, seen = await inbox.until(lambda e: e.type == "agent_end", 120)
            answer = said(seen)
            # The model's own words, with the tool's result in them.
            steps.check("cpu-model answer", ev is not None and "12:00" in answer, repr(answer))
            task.cancel()
            return steps

        await session.send_message("Hello there.")
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        audio = sum(len(e.audio.data) for e in seen if e.type == "audio")
        steps.check("typed turn", ev is not None and audio > 0, f"{audio} bytes of audio, said {said(seen)!r}")

        await paced(speech(), session.send_audio)
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        heard = [raw(e).get("transcript") for e in seen
                 if raw_type(e) == "conversation.item.input_audio_transcription.completed"]
        steps.check("spoken turn", ev is not None and heard and heard[0], f"heard {heard}, said {said(seen)!r}")
        await inbox.until(lambda e: e.type == "history_updated" and any(
            getattr(c, "transcript", None) for i in e.history if getattr(i, "role", "") == "user"
            for c in getattr(i, "content", []) if getattr(c, "type", "") == "input_audio"), 5)
        transcripts = [getattr(c, "transcript", None) for i in session._history if getattr(i, "role", "") == "user"
                       for c in getattr(i, "content", []) if getattr(c, "type", "") == "input_audio"]
        steps.check("transcript in history", any(transcripts), f"{transcripts}")

        await session.send_message("What time is it?")
        ev, seen = await inbox.until(lambda e: e.type == "tool_end")
        steps.check("tool call", ev is not None and calls == ["get_time"], f"calls {calls}")
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        answer = said(seen)
        steps.check("tool result in the answer", ev is not None and TOOL_RESULT.rstrip(".") in answer, repr(answer))

        await session.send_message("Tell me a long story about a brave knight and a dragon.")
        ev, seen = await inbox.until(lambda e: e.type == "audio")
        got = {"audio_interrupted": False, "cancelled": False, "truncated": False}

        def interrupted(e):
            got["audio_interrupted"] |= e.type == "audio_interrupted"
            r = raw(e) or {}
            got["cancelled"] |= r.get("type") == "response.done" and r["response"]["status"] == "cancelled"
            got["truncated"] |= r.get("type") == "conversation.item.truncated"
            return all(got.values())

        barge = asyncio.create_task(paced(tone(0.8) + silence(1.0), session.send_audio))
        ev, seen = await inbox.until(interrupted)
        await barge
        steps.check("interruption", ev is not None, f"{got}")
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        steps.check("answers after the interruption", ev is not None, f"said {said(seen)!r}")

        await session.send_message("Transfer me to the SpanishAgent, please.")
        ev, seen = await inbox.until(lambda e: e.type == "handoff")
        steps.check("handoff", ev is not None and ev.to_agent.name == "SpanishAgent",
                    getattr(getattr(ev, "to_agent", None), "name", None))
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        updates = [raw(e)["session"]["instructions"] for e in seen if raw_type(e) == "session.updated"]
        steps.check("the new agent's instructions", any("espanol" in u for u in updates), f"{updates}")
        await session.send_message("What do you remember?")
        ev, seen = await inbox.until(lambda e: e.type == "agent_end")
        answer = said(seen)
        steps.check("the conversation survives the handoff", "the first was: Hello there" in answer, repr(answer))
        unexpected = errors
        steps.check("no errors", not unexpected, f"{unexpected}")
        task.cancel()
    return steps


if __name__ == "__main__":
    url, key = sys.argv[1], sys.argv[2]
    asyncio.run(main(url, key, "--cpu-model" in sys.argv, "--delegated" in sys.argv)).exit()
