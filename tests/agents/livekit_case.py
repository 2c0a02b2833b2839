"""LiveKit Agents' OpenAI realtime model (livekit-plugins-openai) against omni-gateway, driven
headless: a RealtimeSession without a room, as an AgentSession drives it.

Usage: python livekit_case.py URL KEY MODEL [--delegated]
  URL  ws://HOST:PORT/v1/realtime (LiveKit adds ?model=MODEL)

Steps: generate_reply() without instructions (the model speaks first) and with instructions
(which must reach the answer: LiveKit resolves the call only when response.created echoes its
metadata), a function tool the model calls and whose output the next reply speaks, and chat
context updates acknowledged by the items' own ids. With --delegated (a voice that calls no tools,
with the gateway's decider beside it), the function call and its output only: a voice that
speaks when it has something to say is not asked to speak first.
"""

import asyncio
import logging
import sys

from livekit.agents import llm
from livekit.plugins.openai.realtime import RealtimeModel

from common import Steps

TIMEOUT = 20
TOOL_RESULT = "12:00 UTC"


@llm.function_tool
async def get_time() -> str:
    """The time now, in UTC."""
    return TOOL_RESULT


class Generation:
    """One reply: its words, its audio and the function calls it made."""

    def __init__(self, event):
        self.text, self.audio, self.calls = "", 0, []
        self.done = asyncio.create_task(self.drain(event))

    async def drain(self, event):
        async def message(m):
            async def text():
                async for t in m.text_stream:
                    self.text += t

            async def audio():
                async for f in m.audio_stream:
                    self.audio += len(f.data)

            await asyncio.gather(text(), audio())

        async def messages():
            async for m in event.message_stream:
                await message(m)

        async def functions():
            async for call in event.function_stream:
                self.calls.append(call)

        await asyncio.gather(messages(), functions())


async def main(url, key, model_name, delegated):
    steps = Steps()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    model = RealtimeModel(model=model_name, api_key=key, base_url=url)
    session = model.session()
    generations = asyncio.Queue()
    errors = []
    session.on("generation_created", lambda e: generations.put_nowait(Generation(e)))
    session.on("error", lambda e: errors.append(f"{e.error!r}"[:300]))

    async def reply(**kwargs):
        """generate_reply() resolved, and the generation it made, drained."""
        await asyncio.wait_for(session.generate_reply(**kwargs), TIMEOUT)
        g = await asyncio.wait_for(generations.get(), TIMEOUT)
        await asyncio.wait_for(g.done, TIMEOUT)
        return g

    try:
        if not delegated:
            g = await reply()
            steps.check("generate_reply", g.audio > 0 and g.text.strip() != "", f"{g.text!r}, {g.audio} audio bytes")

            g = await reply(instructions="Reply with exactly: Welcome aboard")
            steps.check("generate_reply with instructions", g.text.strip() == "Welcome aboard", repr(g.text))

        await session.update_tools([get_time])
        ctx = session.chat_ctx.copy()
        ctx.add_message(role="user", content="What time is it?")
        await session.update_chat_ctx(ctx)
        g = await reply()
        names = [c.name for c in g.calls]
        steps.check("function call", names == ["get_time"], f"{names}")
        if g.calls:
            call = g.calls[0]
            ctx = session.chat_ctx.copy()
            output = await get_time()
            ctx.items.append(llm.FunctionCallOutput(call_id=call.call_id, name=call.name, output=output, is_error=False))
            await session.update_chat_ctx(ctx)
            g = await reply()
            steps.check("its output in the next reply", TOOL_RESULT in g.text, repr(g.text))
        ids = [i.id for i in session.chat_ctx.items]
        least = 4 if delegated else 5
        steps.check("the chat context mirrors the server's", len(ids) >= least and len(set(ids)) == len(ids), f"{ids}")
        # A voice that speaks in its reference recording takes no voice by name: the gateway says
        # so once (unsupported_setting), which LiveKit logs and goes on; nothing else is an error.
        unexpected = [e for e in errors if not (delegated and "unsupported_setting" in e)]
        steps.check("no errors", not unexpected, f"{errors}")
    except Exception as e:
        steps.check("no exception", False, repr(e))
    finally:
        await session.aclose()
        await model.aclose()
    return steps


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "--delegated" in sys.argv)).exit()
