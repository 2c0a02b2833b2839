"""Pipecat's OpenAI realtime service against omni-gateway: a pipeline of the service between
its context aggregators, driven headless (no transport), as a Pipecat bot is.

Usage: python pipecat_case.py URL KEY MODEL [--delegated]
  URL  ws://HOST:PORT/v1/realtime (Pipecat adds ?model=MODEL)

Steps: the first reply to the context, a spoken turn, an interruption by speech in the middle
of an answer after which the bot goes on answering, and a registered function the model calls
(its result in the next answer). Pipecat treats most error events as fatal and stops reading:
every step after one would fail. With --delegated (a voice that calls no tools, with the gateway's
decider beside it): the first reply, then a spoken question (espeak-ng, through the gateway's
Whisper) that the decider answers with the registered function, its result in the voice's answer.
"""

import asyncio
import sys

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from common import RATE, Inbox, Steps, paced, speech, spoken, tone, silence

TOOL_RESULT = "12:00 UTC"


class Sink(FrameProcessor):
    """What the service sends down the pipeline."""

    def __init__(self, inbox):
        super().__init__(name="sink")
        self.inbox = inbox

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.inbox.put(frame)
        await self.push_frame(frame, direction)


class Upstream(BaseObserver):
    """Transcriptions and errors, which go up the pipeline."""

    def __init__(self, inbox, errors):
        super().__init__()
        self.inbox, self.errors = inbox, errors

    async def on_push_frame(self, data: FramePushed):
        if data.direction == FrameDirection.UPSTREAM and isinstance(data.frame, (TranscriptionFrame, ErrorFrame)):
            if isinstance(data.frame, ErrorFrame):
                self.errors.append(str(data.frame.error)[:300])
            self.inbox.put(data.frame)


def words(seen):
    return "".join(f.text for f in seen if isinstance(f, TTSTextFrame))


async def main(url, key, model, delegated):
    steps = Steps()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    calls = []

    async def get_time(params):
        calls.append(params.function_name)
        await params.result_callback({"time": TOOL_RESULT})

    tools = ToolsSchema(standard_tools=[FunctionSchema(
        name="get_time", description="The time now, in UTC.", properties={}, required=[])])
    context = LLMContext(messages=[{"role": "user", "content": "Say hello."}], tools=tools)
    pair = LLMContextAggregatorPair(context)
    llm = OpenAIRealtimeLLMService(
        api_key=key,
        base_url=url,
        settings=OpenAIRealtimeLLMService.Settings(
            model=model,
            system_instruction="You are a helpful assistant.",
            session_properties=events.SessionProperties(audio=events.AudioConfiguration(input=events.AudioInput(
                transcription=events.InputAudioTranscription(), turn_detection=events.TurnDetection()))),
        ),
    )
    llm.register_function("get_time", get_time)
    down, up, errors = Inbox(), Inbox(), []
    pipeline = Pipeline([pair.user(), llm, Sink(down), pair.assistant()])
    worker = PipelineWorker(pipeline, observers=[Upstream(up, errors)], idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())

    async def mic(pcm):
        await worker.queue_frame(InputAudioRawFrame(audio=pcm, sample_rate=RATE, num_channels=1))

    def audio(f):
        return isinstance(f, TTSAudioRawFrame)

    def end(f):
        return isinstance(f, LLMFullResponseEndFrame)

    try:
        await worker.queue_frames([LLMRunFrame()])
        first, _ = await down.until(audio)
        done, seen = await down.until(end) if first else (None, [])
        steps.check("first reply", done is not None, repr(words(seen)))

        if delegated:
            said = []

            def result_said(f):
                if isinstance(f, TTSTextFrame):
                    said.append(f.text)
                return end(f) and TOOL_RESULT in "".join(said)

            await paced(spoken("What time is it now?") + silence(1.5), mic)
            done, _ = await down.until(result_said, 60)
            steps.check("function call", calls == ["get_time"], f"calls {calls}")
            steps.check("its result in the answer", done is not None, repr("".join(said)))
            steps.check("no errors", not errors and not running.done(), f"{errors}")
            return steps

        await paced(speech(), mic)
        heard, _ = await up.until(lambda f: isinstance(f, TranscriptionFrame))
        first, _ = await down.until(audio)
        done, seen = await down.until(end) if first else (None, [])
        steps.check("spoken turn", heard is not None and done is not None,
                    f"heard {getattr(heard, 'text', None)!r}, said {words(seen)!r}")

        await llm.queue_frame(LLMMessagesAppendFrame(
            messages=[{"role": "user", "content": "Tell me a long story about a brave knight and a dragon."}],
            run_llm=True))
        first, _ = await down.until(audio)
        barge = asyncio.create_task(paced(tone(0.8) + silence(1.0), mic))
        cut, _ = await down.until(lambda f: isinstance(f, InterruptionFrame)) if first else (None, [])
        await barge
        steps.check("interruption", cut is not None, "InterruptionFrame while answering")
        first, _ = await down.until(audio)
        done, seen = await down.until(end) if first else (None, [])
        steps.check("answers after the interruption", done is not None, repr(words(seen)))

        await llm.queue_frame(LLMMessagesAppendFrame(
            messages=[{"role": "user", "content": "What time is it?"}], run_llm=True))
        answer = []

        def answered(f):
            if isinstance(f, TTSTextFrame):
                answer.append(f.text)
            return end(f) and TOOL_RESULT in "".join(answer)

        done, _ = await down.until(answered)
        steps.check("function call", calls == ["get_time"], f"calls {calls}")
        steps.check("its result in the answer", done is not None, repr("".join(answer)))
        steps.check("no errors", not errors and not running.done(), f"{errors}")
    finally:
        await worker.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(running, 10)
        except (asyncio.TimeoutError, Exception):
            await runner.cancel()
    return steps


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], "--delegated" in sys.argv)).exit()
