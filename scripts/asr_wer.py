#!/usr/bin/env python3
"""Word error rate of the speech recognisers the CPU model backend can use, on spoken sentences.

Each sentence is spoken by espeak-ng in two voices (en-us, en-gb). Every model hears the same audio through the backend's own library
(libomni_asr_whisper.so, loaded with ctypes), so the figures are what the backend gets.

    python3 scripts/asr_wer.py LIBRARY MODEL [MODEL...] [--threads N]

Prints, per model: the word error rate over all sentences, the milliseconds per utterance
(median), and each sentence it got wrong. Standard library only (and espeak-ng).
"""

import ctypes
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import wave
import array

SENTENCES = [
    "What color is grass?",
    "Is fire hot or cold?",
    "How many hours are in a day?",
    "What do bees make?",
    "What is the capital of France?",
    "How many legs does a spider have?",
    "What is the opposite of up?",
    "What planet do we live on?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "What is two plus two?",
    "Which animal says moo?",
    "What do we call frozen water?",
    "How many wheels does a bicycle have?",
    "What is the largest ocean on Earth?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water?",
    "Can you tell me a joke?",
    "What month comes after June?",
    "Where does the sun rise?",
]
VOICES = ["en-us", "en-gb"]


def speak(text, voice):
    with tempfile.NamedTemporaryFile(suffix=".wav") as f:
        subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", f.name, "--", text], check=True)
        with wave.open(f.name) as w:
            rate = w.getframerate()
            pcm = array.array("h", w.readframes(w.getnframes()))
    samples = [s / 32768.0 for s in pcm]
    # linear resampling to 16 kHz
    step = rate / 16000
    n = int(len(samples) / step)
    out = []
    for i in range(n):
        x = i * step
        j = int(x)
        f = x - j
        a = samples[j]
        b = samples[min(j + 1, len(samples) - 1)]
        out.append(a + (b - a) * f)
    return out


NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


def words(text):
    """Lower-case words; digits as words ("2" is "two"), as a listener hears them."""
    text = text.lower().replace("-", " ")
    return [NUMBERS[int(w)] if w.isdigit() and int(w) < len(NUMBERS) else w
            for w in re.findall(r"[a-z0-9']+", text)]


def distance(a, b):
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


class Asr:
    def __init__(self, library, model, threads):
        lib = ctypes.CDLL(library)
        lib.omni_asr_open.restype = ctypes.c_void_p
        lib.omni_asr_open.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t]
        lib.omni_asr_transcribe.restype = ctypes.c_int32
        lib.omni_asr_transcribe.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
                                            ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        lib.omni_asr_close.argtypes = [ctypes.c_void_p]
        err = ctypes.create_string_buffer(512)
        path = model.encode()
        self.h = lib.omni_asr_open(path, len(path), threads, err, len(err))
        if not self.h:
            sys.exit(f"{model}: {err.value.decode()}")
        self.lib = lib

    def __call__(self, samples):
        buf = (ctypes.c_float * len(samples))(*samples)
        out = ctypes.create_string_buffer(4096)
        n = ctypes.c_size_t(0)
        code = self.lib.omni_asr_transcribe(self.h, buf, len(samples), out, len(out), ctypes.byref(n))
        if code != 0:
            raise RuntimeError(out.raw[: n.value].decode(errors="replace"))
        return out.raw[: n.value].decode(errors="replace")

    def close(self):
        self.lib.omni_asr_close(self.h)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
    if str(threads) in args:
        args.remove(str(threads))
    library, models = args[0], args[1:]
    clips = [(s, v, speak(s, v)) for s in SENTENCES for v in VOICES]
    for model in models:
        asr = Asr(library, model, threads)
        asr([0.0] * 16000)  # warm up
        errors = total = 0
        times, wrong = [], []
        for sentence, voice, audio in clips:
            t = time.perf_counter()
            heard = asr(audio)
            times.append((time.perf_counter() - t) * 1000)
            ref, hyp = words(sentence), words(heard)
            e = distance(ref, hyp)
            errors += e
            total += len(ref)
            if e:
                wrong.append(f"    [{voice}] {sentence!r} -> {heard.strip()!r}")
        asr.close()
        print(f"{os.path.basename(model)}: WER {100 * errors / total:.1f} % ({errors} of {total} words, "
              f"{len(clips)} utterances), {statistics.median(times):.0f} ms per utterance (median), "
              f"{len(wrong)} utterances with an error")
        for line in wrong:
            print(line)


if __name__ == "__main__":
    main()
