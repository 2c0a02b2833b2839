/*
 * The omni-gateway reference backend: a deterministic stand-in for an omni model.
 *
 * It implements omni_backend.h with no model weights and no GPU, so that the gateway
 * runs anywhere and every test has a yardstick. Behaviour (option defaults in brackets):
 *
 *  duplex  A step is one input chunk. The backend listens until it has heard at least
 *          speech_min_ms [500] of input whose RMS (over 20 ms windows) is at least
 *          vad_threshold [0.02], followed by a chunk whose RMS is below it. That quiet
 *          chunk's step and the next reply_steps-1 steps [3 in all] speak: a short text
 *          piece and 24 kHz audio each (24000 samples per step, 12000 on the last one,
 *          which has end_of_turn). Each step's audio comes as two outputs: half from
 *          generate, the rest from drain. Then it listens again.
 *          force-listen (step flag or set_force_listen) ends speech at once; the chunk's
 *          own speech is still heard (it counts towards the next reply).
 *  kv      +1 per step, +25 per second of input audio, +64 per frame at max_slice_nums 1
 *          (192 at 4, linear in between and beyond), +1 per output text token (word).
 *          Past n_ctx [8192]: OMNI_ERR_CONTEXT_FULL.
 *  turn    Answers the last user message: "Reply with exactly: X" gives X; other text
 *          gives a sentence with its word count; audio/images only give a sentence with
 *          the seconds of audio and the number of images. One piece per word; with
 *          OMNI_TURN_SPEECH each piece carries 0.25 s of audio.
 *  pace    step_ms [0] per duplex step, token_ms [0] per text piece (interruptible).
 *  faults  fail_at_step=N (step N of a session fails once with OMNI_ERR_INFERENCE),
 *          hang_at_step=N with hang_ms [60000] (step N blocks, not interruptible),
 *          abort_at_step=N (step N calls abort()), segv_at_step=N (step N writes
 *          through a NULL pointer: SIGSEGV). Steps count duplex chunks and turn
 *          answers from 1 in each session. open_ms=N: open takes N ms (a model
 *          loading). interrupt_hang_ms=N: interrupt() blocks N ms (a broken backend).
 *  1.1     (revision >= 1, default 2; revision=0 behaves as a 1.0 backend: none of the below)
 *          settings: applies top_p, top_k, repetition_penalty, presence_penalty and seed
 *          (listed in info); a reply says which it holds: a duplex reply's first text names
 *          them in brackets, and the turn question "What are your settings?" is answered
 *          with them. Other settings are ignored, as the header allows. A top_k above
 *          max_top_k [1000] is refused (OMNI_ERR_INVALID_ARGUMENT), as a model's own limit.
 *          transcripts: a deterministic stand-in for speech recognition. A duplex reply
 *          reports "(N.N seconds of speech)" for the speech it answers, on its first step;
 *          a turn reports the same for the audio of the newest user message.
 *          token details: 25 audio tokens per second of input audio, and 25 per second of
 *          speech produced.
 *          turns: without OMNI_TURN_CONTINUE the messages replace the conversation (kv
 *          restarts from the system prompt); with it they are appended.
 *  1.2     (revision >= 2) info reports step_samples: chunk_ms [0] at 16 kHz.
 *  1.3     (revision 3, the default) tools (OMNI_CAP_TOOLS), by a fixed rule for tests: when
 *          tools are given (the turn's, else the session's) and tool_choice is not "none",
 *          a turn whose newest message is the user's (or a system message: some clients send
 *          typed input so) answers with a call of the tool whose
 *          name, or the last word of its name after an underscore (three letters or more),
 *          that message contains (case-insensitively); with tool_choice a tool's name, of
 *          that tool; with "required" and no match, of the first tool. A call's arguments
 *          are "{}", in two pieces ("{" with the name, then "}"). A turn whose newest
 *          message is a tool's result answers "The tool said: <result>." Calls are made in
 *          turns only, never in duplex steps. A caller whose output struct predates 1.3 hears
 *          the call as words: "Calling <name>."
 *          Duplex sessions take turns between steps. OMNI_TURN_PREFILL_ONLY answers nothing.
 *          A turn with no user message (a greeting) answers "Hello! How can I help?"; a
 *          system message of the turn holding "reply with exactly: X" (the response's own
 *          instructions) answers X. "What do you remember?" answers with the number of
 *          earlier messages the turns put into the context (a replacing turn restarts the
 *          count; each answer adds one) and the first user message's first words: what a
 *          replayed conversation still holds.
 *
 * Build as a shared library:  cc -O2 -shared -fPIC -Iinclude reference_backend.c -lm
 * Define OMNI_REFERENCE_STATIC to rename the two entry points to
 * omni_reference_abi_version / omni_reference_get_api for static linking.
 */
#define _POSIX_C_SOURCE 200809L
#include "omni_backend.h"

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#ifdef OMNI_REFERENCE_STATIC
#define ENTRY_ABI_VERSION omni_reference_abi_version
#define ENTRY_GET_API omni_reference_get_api
#else
#define ENTRY_ABI_VERSION omni_backend_abi_version
#define ENTRY_GET_API omni_backend_get_api
#endif

#define IN_RATE 16000
#define OUT_RATE 24000
/* the reply tones (synth): five, each with a whole number of periods in TONE_PERIOD samples */
#define TONES 5
#define TONE_PERIOD 240
#define STEP_AUDIO 24000      /* samples per speaking step */
#define LAST_STEP_AUDIO 12000 /* samples on the end_of_turn step */
#define TURN_PIECE_AUDIO 6000 /* 0.25 s per turn-mode piece */
#define MAX_TEXT 256
#define MAX_ANSWER 4096
#define VAD_WINDOW 320 /* 20 ms at 16 kHz */
#define TWO_PI 6.283185307179586

/* Minimal sizes: the version-1 layout of every struct up to its last field. */
#define MIN_SIZE(type, last) ((uint32_t)(offsetof(type, last) + sizeof(((type *)0)->last)))

enum state { ST_IDLE, ST_READY, ST_PREFILLED, ST_GENERATED, ST_FULL, ST_TURN_PREFILLED, ST_TURN_DONE };

struct options {
    double vad_threshold;
    long speech_min_ms, reply_steps, n_ctx, step_ms, token_ms;
    long fail_at_step, hang_at_step, hang_ms, abort_at_step, segv_at_step;
    long open_ms, interrupt_hang_ms;
    long revision;
    long vision;
    long max_top_k;
    long chunk_ms;
};

/* The generation settings this backend applies (reported by info). */
static const char SETTINGS[] = "top_p,top_k,repetition_penalty,presence_penalty,seed";
#define MAX_SETTINGS_TEXT 160
#define MAX_TRANSCRIPT 64
#define MAX_TOOLS 32
#define MAX_TOOL_NAME 64
#define MAX_TOOLS_JSON 65536
#define MAX_MEMORY_TEXT 80

/* 1.3: the names of the tools a session or a turn may call, and the choice among them. */
struct tools {
    char names[MAX_TOOLS][MAX_TOOL_NAME];
    size_t lens[MAX_TOOLS];
    size_t n;
    char choice[MAX_TOOL_NAME];
    size_t choice_len;
};

struct omni_backend {
    struct options opt;
    /* one period of each reply tone (synth) */
    float tones[TONES][TONE_PERIOD];
    /* reached from any thread */
    atomic_uint_fast64_t kv;
    atomic_int force_listen;
    atomic_uint interrupt_epoch;
    /* owner thread */
    enum state state;
    uint32_t kind;
    uint32_t max_new_tokens, max_slice_nums, force_listen_count;
    long step_no;      /* steps in this session, from 1 */
    int fail_done;     /* fail_at_step already fired in this session */
    size_t audio_total; /* input samples heard in this session (for exact kv) */
    long voiced_ms;    /* loud input heard since the last reply */
    int speaking;      /* steps already spoken in the current reply, -1 when listening */
    long replies;      /* replies given in this session */
    double reply_seconds; /* speech heard before the current reply */
    /* the output of the step in flight, emitted by generate (first half) and drain */
    uint32_t out_kind;
    char out_text[MAX_TEXT];
    size_t out_text_len;
    size_t audio_done, audio_total_step;
    int out_eot, out_piece;
    uint32_t out_in_tokens, out_out_tokens, out_in_audio_tokens;
    char transcript[MAX_TRANSCRIPT]; /* to report with the step's (or turn's) first output */
    size_t transcript_len;
    /* 1.1: the settings applied, as "top_p=0.9 seed=7" (session's, then the turn's) */
    char settings[MAX_SETTINGS_TEXT];
    size_t settings_len;
    size_t session_settings_len; /* the prefix of settings that came with prepare */
    uint64_t prompt_kv;           /* kv of the system prompt alone */
    uint32_t prefill_us;
    unsigned step_epoch; /* interrupt_epoch when the step began (at prefill) */
    int pending_valid;
    /* turn mode */
    char answer[MAX_ANSWER];
    size_t answer_len, answer_pos;
    uint32_t turn_flags, turn_limit, turn_pieces, turn_in_tokens, turn_in_audio_tokens;
    /* 1.3 */
    struct tools tools;     /* the session's */
    enum state turn_home;   /* where a finished answer leaves the session: ST_TURN_DONE, or
                             * ST_READY in a duplex session */
    int call;               /* the answer is a call of call_name */
    char call_name[MAX_TOOL_NAME];
    size_t call_name_len;
    long remembered;        /* messages the turns put into the context, answers included */
    char first_user[MAX_MEMORY_TEXT];
    size_t first_user_len;
    char last_error[512];
};

/* ---- helpers ------------------------------------------------------------ */
static omni_status fail(omni_backend *b, omni_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->last_error, sizeof b->last_error, fmt, ap);
    va_end(ap);
    return code;
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Sleeps ms in short slices; returns 1 when interrupt() was called meanwhile. */
static int pace(omni_backend *b, long ms, unsigned epoch) {
    uint64_t end = now_us() + (uint64_t)ms * 1000u;
    for (;;) {
        if (atomic_load(&b->interrupt_epoch) != epoch) return 1;
        uint64_t t = now_us();
        if (t >= end) return 0;
        uint64_t left = end - t;
        struct timespec ts = {0, (long)((left > 2000 ? 2000 : left) * 1000u)};
        nanosleep(&ts, NULL);
    }
}

static size_t count_words(const char *s, size_t n) {
    size_t words = 0;
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        int space = s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r';
        if (!space && !in) words++;
        in = !space;
    }
    return words;
}

static uint32_t frame_tokens(uint32_t slices) {
    if (slices < 1) slices = 1;
    return 64u + (slices - 1u) * 128u / 3u;
}

/* Speech tokens of samples [done, done + n) of output audio: 25 per second, counted so
 * that the pieces of one output add up to the whole. */
static uint32_t speech_tokens(size_t done, size_t n) {
    return (uint32_t)((done + n) * 25u / OUT_RATE - done * 25u / OUT_RATE);
}

static int pcm_ok(omni_pcm p) { return p.len == 0 || p.ptr != NULL; }
static int str_ok(omni_str s) { return s.len == 0 || s.ptr != NULL; }

/* A recognisable signal: a tone per piece (300..700 Hz), 5 ms fades at the edges. */
/* Every tone has a whole number of periods in TONE_PERIOD samples (3 of 300 Hz ... 7 of
 * 700 Hz at 24 kHz): each backend computes the five periods once (tone_table) and a step's
 * audio is copies of them, faded at the edges: the same signal, deterministic, and a copy's
 * cost rather than a sine's per sample. */
static void tone_table(float table[TONES][TONE_PERIOD]) {
    for (int p = 0; p < TONES; p++) {
        double w = TWO_PI * (300.0 + 100.0 * p) / OUT_RATE;
        for (int k = 0; k < TONE_PERIOD; k++) table[p][k] = (float)(0.25 * sin(w * k));
    }
}

static void synth(const float table[TONES][TONE_PERIOD], float *dst, size_t n, size_t offset, size_t total, int piece) {
    const float *tone = table[piece % TONES];
    size_t at = offset % TONE_PERIOD;
    for (size_t i = 0; i < n;) {
        size_t run = TONE_PERIOD - at < n - i ? TONE_PERIOD - at : n - i;
        memcpy(dst + i, tone + at, run * sizeof *dst);
        i += run;
        at = 0;
    }
    size_t fade = OUT_RATE / 200;
    size_t tail = total > fade ? total - fade : 0;
    /* the fades, where this part of the step meets them (the last one wins where they meet) */
    for (size_t k = offset; k < fade && k < tail && k < offset + n; k++)
        dst[k - offset] = (float)((double)tone[k % TONE_PERIOD] * ((double)k / fade));
    for (size_t k = tail > offset ? tail : offset; k < offset + n; k++)
        dst[k - offset] = (float)((double)tone[k % TONE_PERIOD] * ((double)(total - k) / fade));
}

/* ---- options ------------------------------------------------------------ */
static int parse_num(const omni_option *o, double *out) {
    char buf[64];
    if (o->value.len == 0 || o->value.len >= sizeof buf || !o->value.ptr) return 0;
    memcpy(buf, o->value.ptr, o->value.len);
    buf[o->value.len] = 0;
    char *end = NULL;
    double v = strtod(buf, &end);
    if (end == buf || *end != 0 || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

static int key_is(const omni_option *o, const char *k) {
    return o->key.len == strlen(k) && o->key.ptr && memcmp(o->key.ptr, k, o->key.len) == 0;
}

static omni_status parse_options(struct options *opt, const omni_option *options, size_t n, char *err,
                                 size_t cap) {
    static const char *names[] = {"vad_threshold", "speech_min_ms", "reply_steps",  "n_ctx",
                                  "step_ms",       "token_ms",      "fail_at_step", "hang_at_step",
                                  "hang_ms",       "abort_at_step", "segv_at_step", "open_ms",
                                  "interrupt_hang_ms", "revision", "vision", "max_top_k",
                                  "chunk_ms"};
    long *ints[] = {NULL,           &opt->speech_min_ms, &opt->reply_steps,  &opt->n_ctx,
                    &opt->step_ms,  &opt->token_ms,      &opt->fail_at_step, &opt->hang_at_step,
                    &opt->hang_ms,  &opt->abort_at_step, &opt->segv_at_step, &opt->open_ms,
                    &opt->interrupt_hang_ms, &opt->revision, &opt->vision, &opt->max_top_k,
                    &opt->chunk_ms};
    *opt = (struct options){0.02, 500, 3, 8192, 0, 0, 0, 0, 60000, 0, 0, 0, 0, 3, 1, 1000, 0};
    if (n > 0 && !options) {
        snprintf(err, cap, "options is NULL with n_options %zu", n);
        return OMNI_ERR_INVALID_ARGUMENT;
    }
    for (size_t i = 0; i < n; i++) {
        const omni_option *o = &options[i];
        if (!str_ok(o->key) || !str_ok(o->value)) {
            snprintf(err, cap, "option %zu has a NULL key or value", i);
            return OMNI_ERR_INVALID_ARGUMENT;
        }
        size_t k = 0;
        while (k < sizeof names / sizeof names[0] && !key_is(o, names[k])) k++;
        if (k == sizeof names / sizeof names[0]) {
            snprintf(err, cap, "unknown option '%.*s' (known: vad_threshold, speech_min_ms, reply_steps, n_ctx, "
                     "step_ms, token_ms, fail_at_step, hang_at_step, hang_ms, abort_at_step, segv_at_step, "
                     "open_ms, interrupt_hang_ms, revision, vision, max_top_k, chunk_ms)",
                     (int)(o->key.len > 64 ? 64 : o->key.len), o->key.ptr ? o->key.ptr : "");
            return OMNI_ERR_OPEN_FAILED;
        }
        double v;
        if (!parse_num(o, &v) || v < 0 || (ints[k] && (v != floor(v) || v > 1e9))) {
            snprintf(err, cap, "option %s: '%.*s' is not a %s", names[k], (int)(o->value.len > 64 ? 64 : o->value.len),
                     o->value.ptr ? o->value.ptr : "", ints[k] ? "non-negative integer" : "non-negative number");
            return OMNI_ERR_OPEN_FAILED;
        }
        if (ints[k]) *ints[k] = (long)v;
        else opt->vad_threshold = v;
    }
    if (opt->reply_steps < 1) {
        snprintf(err, cap, "option reply_steps: must be at least 1");
        return OMNI_ERR_OPEN_FAILED;
    }
    if (opt->n_ctx < 1) {
        snprintf(err, cap, "option n_ctx: must be at least 1");
        return OMNI_ERR_OPEN_FAILED;
    }
    if (opt->revision > 3) {
        snprintf(err, cap, "option revision: 0 (a 1.0 backend), 1 (1.1), 2 (1.2) or 3");
        return OMNI_ERR_OPEN_FAILED;
    }
    if (opt->chunk_ms > 10000) {
        snprintf(err, cap, "option chunk_ms: at most 10000");
        return OMNI_ERR_OPEN_FAILED;
    }
    if (opt->vision > 1) {
        snprintf(err, cap, "option vision: 0 (no vision: frames and images refused) or 1");
        return OMNI_ERR_OPEN_FAILED;
    }
    return OMNI_OK;
}

/* ---- 1.1 generation settings -------------------------------------------- */
/* Checks the settings this backend applies and appends them to b->settings as
 * "name=value" words; the others are ignored. Returns OMNI_OK or a failure naming the
 * setting (the gateway checks values first, so this only guards the ABI). */
static omni_status apply_settings(omni_backend *b, const omni_option *s, size_t n, const char *fn) {
    if (b->opt.revision < 1 || n == 0) return OMNI_OK;
    if (!s) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: settings is NULL with n_settings %zu", fn, n);
    for (size_t i = 0; i < n; i++) {
        const omni_option *o = &s[i];
        if (!str_ok(o->key) || !str_ok(o->value))
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: setting %zu has a NULL key or value", fn, i);
        double v;
        int known = key_is(o, "top_p") || key_is(o, "top_k") || key_is(o, "repetition_penalty") ||
                    key_is(o, "presence_penalty") || key_is(o, "seed");
        if (!known) continue;
        int ok = parse_num(o, &v);
        if (ok && key_is(o, "top_p")) ok = v > 0 && v <= 1;
        if (ok && (key_is(o, "top_k") || key_is(o, "seed"))) ok = v >= 0 && v == floor(v);
        if (ok && key_is(o, "top_k")) ok = v <= b->opt.max_top_k;
        if (ok && key_is(o, "repetition_penalty")) ok = v > 0;
        if (ok && key_is(o, "presence_penalty")) ok = v >= -2 && v <= 2;
        if (!ok)
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: setting %.*s has an invalid value '%.*s'", fn,
                        (int)o->key.len, o->key.ptr, (int)(o->value.len > 32 ? 32 : o->value.len),
                        o->value.ptr ? o->value.ptr : "");
        int w = snprintf(b->settings + b->settings_len, MAX_SETTINGS_TEXT - b->settings_len, "%s%.*s=%.*s",
                         b->settings_len ? " " : "", (int)o->key.len, o->key.ptr, (int)o->value.len, o->value.ptr);
        if (w < 0 || (size_t)w >= MAX_SETTINGS_TEXT - b->settings_len)
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: the settings are longer than %d bytes", fn,
                        MAX_SETTINGS_TEXT - 1);
        b->settings_len += (size_t)w;
    }
    return OMNI_OK;
}

/* Writes the pending transcript into an output's 1.1 fields, if the caller gave them and
 * there is one. Returns OMNI_ERR_BUFFER_TOO_SMALL (with the size needed) when it does not
 * fit. */
static omni_status emit_transcript(omni_backend *b, char *buf, size_t cap, size_t *len) {
    *len = 0;
    if (b->transcript_len == 0 || !buf) return OMNI_OK; /* none, or the caller wants none */
    *len = b->transcript_len;
    if (cap < b->transcript_len)
        return fail(b, OMNI_ERR_BUFFER_TOO_SMALL, "the transcript needs %zu bytes", b->transcript_len);
    memcpy(buf, b->transcript, b->transcript_len);
    return OMNI_OK;
}

static void set_transcript(omni_backend *b, double seconds) {
    if (b->opt.revision < 1) return;
    b->transcript_len = (size_t)snprintf(b->transcript, MAX_TRANSCRIPT, "(%.1f seconds of speech)", seconds);
}

/* ---- 1.3 tools ---------------------------------------------------------- */
/* Reads the tool names of a JSON array of tool objects (each object's "name" member) into
 * t, and the choice. Strings are skipped with their escapes; a name is taken only as a
 * string member of an object directly inside the array. */
static omni_status parse_tools(omni_backend *b, omni_str json, omni_str choice, struct tools *t, const char *fn) {
    t->n = 0;
    t->choice_len = 0;
    if (!str_ok(json) || !str_ok(choice)) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tools is NULL", fn);
    if (json.len > MAX_TOOLS_JSON)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tools take %zu bytes, at most %d", fn, json.len, MAX_TOOLS_JSON);
    if (choice.len >= MAX_TOOL_NAME)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tool_choice is longer than %d bytes", fn, MAX_TOOL_NAME - 1);
    memcpy(t->choice, choice.ptr ? choice.ptr : "", choice.len);
    t->choice_len = choice.len;
    const char *p = json.ptr;
    size_t n = json.len, i = 0;
    int depth = 0, want_name = 0; /* the last string at depth 2 was the key "name" */
    while (i < n) {
        char c = p[i];
        if (c == '"') {
            size_t start = ++i;
            while (i < n && p[i] != '"') i += p[i] == '\\' ? 2 : 1;
            if (i >= n) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tools: an unterminated string", fn);
            size_t len = i - start;
            i++;
            size_t k = i;
            while (k < n && (p[k] == ' ' || p[k] == '\n' || p[k] == '\t' || p[k] == '\r')) k++;
            int is_key = k < n && p[k] == ':';
            if (depth == 2 && want_name && !is_key) {
                if (t->n >= MAX_TOOLS) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: more than %d tools", fn, MAX_TOOLS);
                if (len == 0 || len >= MAX_TOOL_NAME)
                    return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: a tool name of %zu bytes (1 to %d)", fn, len,
                                MAX_TOOL_NAME - 1);
                memcpy(t->names[t->n], p + start, len);
                t->lens[t->n++] = len;
            }
            want_name = depth == 2 && is_key && len == 4 && memcmp(p + start, "name", 4) == 0;
            continue;
        }
        if (c == '[' || c == '{') depth++;
        if (c == ']' || c == '}') depth--;
        if (depth < 0) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tools is not a JSON array", fn);
        if (c != ' ' && c != ':' && c != '\n' && c != '\t' && c != '\r') want_name = want_name && c == ':';
        i++;
    }
    if (depth != 0 || (n > 0 && p[0] != '['))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: tools is not a JSON array", fn);
    return OMNI_OK;
}

static int choice_is(const struct tools *t, const char *s) {
    return t->choice_len == strlen(s) && memcmp(t->choice, s, t->choice_len) == 0;
}

/* Whether text holds needle, case-insensitively. */
static int contains(const char *text, size_t n, const char *needle, size_t m) {
    if (m == 0 || m > n) return 0;
    for (size_t i = 0; i + m <= n; i++)
        if (strncasecmp(text + i, needle, m) == 0) return 1;
    return 0;
}

/* The tool a user's message calls by the rule in the header comment; -1: none. */
static int tool_called(const struct tools *t, const char *text, size_t n) {
    if (t->n == 0 || choice_is(t, "none")) return -1;
    for (size_t i = 0; i < t->n; i++)
        if (t->choice_len && t->choice_len == t->lens[i] && memcmp(t->choice, t->names[i], t->lens[i]) == 0)
            return (int)i;
    for (size_t i = 0; i < t->n; i++) {
        const char *name = t->names[i];
        size_t len = t->lens[i];
        if (contains(text, n, name, len)) return (int)i;
        const char *under = NULL;
        for (size_t k = 0; k < len; k++)
            if (name[k] == '_') under = name + k;
        if (under && (size_t)(name + len - under - 1) >= 3 && contains(text, n, under + 1, (size_t)(name + len - under - 1)))
            return (int)i;
    }
    return choice_is(t, "required") ? 0 : -1;
}

/* ---- lifecycle ---------------------------------------------------------- */
static omni_status ref_open(const omni_option *options, size_t n_options, omni_backend **out, char *err,
                            size_t cap) {
    char dummy[1];
    if (!err || cap == 0) {
        err = dummy;
        cap = sizeof dummy;
    }
    err[0] = 0;
    if (!out) {
        snprintf(err, cap, "out is NULL");
        return OMNI_ERR_INVALID_ARGUMENT;
    }
    *out = NULL;
    struct options opt;
    omni_status st = parse_options(&opt, options, n_options, err, cap);
    if (st != OMNI_OK) return st;
    /* a model that takes this long to load (for the open timeout's tests) */
    if (opt.open_ms > 0) sleep_ms(opt.open_ms);
    omni_backend *b = calloc(1, sizeof *b);
    if (!b) {
        snprintf(err, cap, "out of memory");
        return OMNI_ERR_OPEN_FAILED;
    }
    b->opt = opt;
    tone_table(b->tones);
    atomic_init(&b->kv, 0);
    atomic_init(&b->force_listen, 0);
    atomic_init(&b->interrupt_epoch, 0);
    b->state = ST_IDLE;
    *out = b;
    return OMNI_OK;
}

static void ref_close(omni_backend *b) { free(b); }

static omni_status ref_info(omni_backend *b, omni_backend_info *out) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (!out) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "info: out is NULL");
    if (out->struct_size < MIN_SIZE(omni_backend_info, name))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "info: struct_size %u is smaller than version 1 (%u)",
                    out->struct_size, MIN_SIZE(omni_backend_info, name));
    out->capabilities = (b->opt.vision ? OMNI_CAP_VISION : 0u) | OMNI_CAP_SPEECH_OUTPUT | OMNI_CAP_DUPLEX | OMNI_CAP_TURN;
    if (b->opt.revision >= 1 && out->struct_size >= MIN_SIZE(omni_backend_info, settings)) {
        out->capabilities |= OMNI_CAP_TRANSCRIPTS | OMNI_CAP_TOKEN_DETAILS;
        out->abi_revision = (uint32_t)b->opt.revision;
        memcpy(out->settings, SETTINGS, sizeof SETTINGS - 1);
        out->settings_len = sizeof SETTINGS - 1;
    }
    if (b->opt.revision >= 2 && out->struct_size >= MIN_SIZE(omni_backend_info, step_samples))
        out->step_samples = (uint32_t)(b->opt.chunk_ms * IN_RATE / 1000);
    if (b->opt.revision >= 3) out->capabilities |= OMNI_CAP_TOOLS;
    out->input_sample_rate = IN_RATE;
    out->output_sample_rate = OUT_RATE;
    out->context_size = (uint32_t)b->opt.n_ctx;
    out->max_output_samples = STEP_AUDIO;
    out->max_output_text_bytes = MAX_TEXT;
    static const char name[] = "omni-reference";
    memcpy(out->name, name, sizeof name - 1);
    out->name_len = sizeof name - 1;
    return OMNI_OK;
}

static size_t ref_last_error(omni_backend *b, char *buf, size_t cap) {
    if (!b) return 0;
    size_t n = strlen(b->last_error);
    if (buf && cap > 0) {
        size_t c = n < cap - 1 ? n : cap - 1;
        memcpy(buf, b->last_error, c);
        buf[c] = 0;
    }
    return n;
}

static void forget_session(omni_backend *b) {
    b->state = ST_IDLE;
    b->step_no = 0;
    b->fail_done = 0;
    b->audio_total = 0;
    b->voiced_ms = 0;
    b->speaking = -1;
    b->replies = 0;
    b->pending_valid = 0;
    b->answer_len = b->answer_pos = 0;
    b->transcript_len = 0;
    b->settings_len = b->session_settings_len = 0;
    b->prompt_kv = 0;
    b->tools.n = b->tools.choice_len = 0;
    b->call = 0;
    b->remembered = 0;
    b->first_user_len = 0;
    atomic_store(&b->kv, 0);
    atomic_store(&b->force_listen, 0);
}

static omni_status ref_prepare(omni_backend *b, const omni_session_config *c) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (!c) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "prepare: config is NULL");
    if (c->struct_size < MIN_SIZE(omni_session_config, temperature))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "prepare: struct_size %u is smaller than version 1 (%u)",
                    c->struct_size, MIN_SIZE(omni_session_config, temperature));
    if (b->state != ST_IDLE) return fail(b, OMNI_ERR_BAD_STATE, "prepare: a session is already prepared; reset first");
    if (c->kind != OMNI_SESSION_DUPLEX && c->kind != OMNI_SESSION_TURN)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "prepare: unknown session kind %u", c->kind);
    if (!str_ok(c->system_prompt) || !str_ok(c->voice) || !pcm_ok(c->ref_audio) || !pcm_ok(c->tts_ref_audio))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "prepare: a buffer is NULL with a non-zero length");
    if (c->max_slice_nums > 9)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "prepare: max_slice_nums %u is outside 1..9", c->max_slice_nums);
    forget_session(b);
    b->kind = c->kind;
    b->max_new_tokens = c->max_new_tokens ? c->max_new_tokens : 256;
    b->max_slice_nums = c->max_slice_nums ? c->max_slice_nums : 1;
    b->force_listen_count = c->force_listen_count;
    if (c->struct_size >= MIN_SIZE(omni_session_config, n_settings)) {
        omni_status st = apply_settings(b, c->settings, c->n_settings, "prepare");
        if (st != OMNI_OK) {
            forget_session(b);
            return st;
        }
        b->session_settings_len = b->settings_len;
    }
    if (b->opt.revision >= 3 && c->struct_size >= MIN_SIZE(omni_session_config, tool_choice)) {
        omni_status st = parse_tools(b, c->tools, c->tool_choice, &b->tools, "prepare");
        if (st != OMNI_OK) {
            forget_session(b);
            return st;
        }
    }
    /* the system prompt occupies the context: one token per word, +25/s of reference audio */
    uint64_t kv = count_words(c->system_prompt.ptr, c->system_prompt.len) +
                  (uint64_t)(c->ref_audio.len * 25u / IN_RATE);
    if (kv > (uint64_t)b->opt.n_ctx) {
        b->state = ST_FULL;
        return fail(b, OMNI_ERR_CONTEXT_FULL, "prepare: the system prompt needs %llu tokens, context is %ld",
                    (unsigned long long)kv, b->opt.n_ctx);
    }
    atomic_store(&b->kv, kv);
    b->prompt_kv = kv;
    b->state = c->kind == OMNI_SESSION_DUPLEX ? ST_READY : ST_TURN_DONE;
    b->turn_home = b->state;
    return OMNI_OK;
}

static omni_status ref_reset(omni_backend *b) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    forget_session(b);
    return OMNI_OK;
}

/* Fault injection shared by duplex and turn steps. Returns OMNI_OK to go on. */
static omni_status faults(omni_backend *b) {
    if (b->opt.abort_at_step && b->step_no == b->opt.abort_at_step) abort();
    if (b->opt.segv_at_step && b->step_no == b->opt.segv_at_step) {
        /* A genuine invalid write: the compiler cannot know the pointer is NULL. */
        int *volatile wild = NULL;
        *wild = 1;
    }
    if (b->opt.hang_at_step && b->step_no == b->opt.hang_at_step) sleep_ms(b->opt.hang_ms);
    if (b->opt.fail_at_step && b->step_no == b->opt.fail_at_step && !b->fail_done) {
        b->fail_done = 1;
        return fail(b, OMNI_ERR_INFERENCE, "injected inference failure at step %ld (fail_at_step)", b->step_no);
    }
    return OMNI_OK;
}

/* ---- duplex ------------------------------------------------------------- */
static omni_status ref_duplex_prefill(omni_backend *b, const omni_duplex_input *in) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (!in) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: input is NULL");
    if (in->struct_size < MIN_SIZE(omni_duplex_input, max_slice_nums))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: struct_size %u is smaller than version 1 (%u)",
                    in->struct_size, MIN_SIZE(omni_duplex_input, max_slice_nums));
    if (b->state == ST_FULL) return fail(b, OMNI_ERR_CONTEXT_FULL, "duplex_prefill: the context is full");
    if (b->kind != OMNI_SESSION_DUPLEX || b->state == ST_IDLE)
        return fail(b, OMNI_ERR_BAD_STATE, "duplex_prefill: no duplex session is prepared");
    /* 1.3: an answer to a turn not read to its end is abandoned by the next step, as by the next
       turn_prefill (a caller stops reading an answer its user interrupted between two pieces) */
    if (b->state == ST_TURN_PREFILLED && b->turn_home == ST_READY) {
        b->pending_valid = 0;
        b->call = 0;
        b->state = ST_READY;
    }
    if (b->state != ST_READY)
        return fail(b, OMNI_ERR_BAD_STATE, "duplex_prefill: the previous step was not finalized");
    if (!in->audio.ptr || in->audio.len == 0)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: audio is empty");
    if (in->n_frames > 0 && !b->opt.vision)
        return fail(b, OMNI_ERR_UNSUPPORTED, "duplex_prefill: no vision (option vision = 0): %zu frames refused",
                    in->n_frames);
    if (in->n_frames > 0 && !in->frames)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: frames is NULL with n_frames %zu", in->n_frames);
    for (size_t i = 0; i < in->n_frames; i++)
        if (!in->frames[i].ptr || in->frames[i].len == 0)
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: frame %zu is empty", i);
    if (in->max_slice_nums > 9)
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "duplex_prefill: max_slice_nums %u is outside 1..9",
                    in->max_slice_nums);

    uint64_t t0 = now_us();
    /* The step begins here: an interrupt from now on, even before generate, cuts it short. */
    b->step_epoch = atomic_load(&b->interrupt_epoch);
    uint32_t slices = in->max_slice_nums ? in->max_slice_nums : b->max_slice_nums;
    size_t n = in->audio.len;
    uint64_t audio_tokens = (uint64_t)(b->audio_total + n) * 25u / IN_RATE - (uint64_t)b->audio_total * 25u / IN_RATE;
    uint64_t add = 1 + audio_tokens + (uint64_t)in->n_frames * frame_tokens(slices);
    uint64_t kv = atomic_load(&b->kv);
    if (kv + add > (uint64_t)b->opt.n_ctx) {
        b->state = ST_FULL;
        return fail(b, OMNI_ERR_CONTEXT_FULL, "duplex_prefill: context full (%llu + %llu > n_ctx %ld)",
                    (unsigned long long)kv, (unsigned long long)add, b->opt.n_ctx);
    }
    atomic_store(&b->kv, kv + add);
    b->audio_total += n;
    b->step_no++;

    /* loudness: voiced 20 ms windows, and the RMS of the whole chunk */
    double total = 0, thr2 = b->opt.vad_threshold * b->opt.vad_threshold;
    long voiced = 0;
    for (size_t off = 0; off < n; off += VAD_WINDOW) {
        size_t w = n - off < VAD_WINDOW ? n - off : VAD_WINDOW;
        /* four sums, not one: a chain of dependent additions is the loop's whole cost */
        const float *x = in->audio.ptr + off;
        double e4[4] = {0, 0, 0, 0};
        size_t i = 0;
        for (; i + 4 <= w; i += 4)
            for (int j = 0; j < 4; j++) e4[j] += (double)x[i + j] * x[i + j];
        for (; i < w; i++) e4[0] += (double)x[i] * x[i];
        double e = (e4[0] + e4[1]) + (e4[2] + e4[3]);
        total += e;
        if (e / w >= thr2) voiced += (long)(w * 1000 / IN_RATE);
    }
    int quiet = total / n < thr2;

    /* Both the step's flag and a pending set_force_listen are consumed here, once: the
     * exchange must run even when the flag is set (a short-circuit || once left it pending,
     * forcing the next step too). */
    int pending_force = atomic_exchange(&b->force_listen, 0);
    int force = (in->flags & OMNI_STEP_FORCE_LISTEN) || pending_force || b->step_no <= (long)b->force_listen_count;
    b->out_kind = OMNI_OUTPUT_LISTEN;
    if (force) {
        /* it stops speaking at once, and hears this chunk: speech in it counts towards a reply
         * (a user who talks over the model is answered once they pause) */
        b->speaking = -1;
        b->voiced_ms = voiced;
    } else if (b->speaking < 0) {
        b->voiced_ms += voiced;
        if (quiet && b->voiced_ms >= b->opt.speech_min_ms) {
            b->reply_seconds = b->voiced_ms / 1000.0;
            b->replies++;
            b->speaking = 0;
        }
    }
    if (!force && b->speaking >= 0) {
        int piece = b->speaking++;
        int last = b->speaking >= b->opt.reply_steps;
        b->out_kind = OMNI_OUTPUT_SPEAK;
        b->out_piece = piece;
        b->out_eot = last;
        if (piece == 0 && b->session_settings_len)
            b->out_text_len = (size_t)snprintf(b->out_text, MAX_TEXT, "Reply %ld: I heard %.1f seconds of speech [%.*s].",
                                               b->replies, b->reply_seconds, (int)b->session_settings_len, b->settings);
        else if (piece == 0)
            b->out_text_len = (size_t)snprintf(b->out_text, MAX_TEXT, "Reply %ld: I heard %.1f seconds of speech.",
                                               b->replies, b->reply_seconds);
        else
            b->out_text_len = (size_t)snprintf(b->out_text, MAX_TEXT, last ? " Over." : " Still talking (%d).",
                                               piece + 1);
        b->audio_total_step = last ? LAST_STEP_AUDIO : STEP_AUDIO;
        b->audio_done = 0;
        if (last) {
            b->speaking = -1;
            b->voiced_ms = 0;
        }
    }
    b->transcript_len = 0;
    if (b->out_kind == OMNI_OUTPUT_SPEAK && b->out_piece == 0) set_transcript(b, b->reply_seconds);
    b->out_in_tokens = (uint32_t)add;
    b->out_in_audio_tokens = (uint32_t)audio_tokens;
    b->prefill_us = (uint32_t)(now_us() - t0);
    b->pending_valid = 0;
    b->state = ST_PREFILLED;
    return OMNI_OK;
}

/* Writes the next part of the step's output: the text and the first half of the audio
 * from generate, the rest of the audio from drain. */
static omni_status emit_step(omni_backend *b, omni_step_output *out, int first, uint64_t t0) {
    size_t half = b->audio_total_step / 2;
    size_t audio_n = 0, text_n = 0;
    if (b->out_kind == OMNI_OUTPUT_SPEAK) {
        audio_n = first ? half : b->audio_total_step - b->audio_done;
        text_n = first ? b->out_text_len : 0;
    }
    out->text_len = text_n;
    out->audio_len = audio_n;
    int v11 = b->opt.revision >= 1 && out->struct_size >= MIN_SIZE(omni_step_output, output_audio_tokens);
    if ((text_n && (!out->text_buf || out->text_cap < text_n)) || (audio_n && (!out->audio_buf || out->audio_cap < audio_n)))
        return fail(b, OMNI_ERR_BUFFER_TOO_SMALL, "output needs %zu text bytes and %zu samples", text_n, audio_n);
    if (v11) {
        omni_status st = emit_transcript(b, out->transcript_buf, out->transcript_cap, &out->transcript_len);
        if (st != OMNI_OK) return st;
        out->input_audio_tokens = first ? b->out_in_audio_tokens : 0;
        out->output_audio_tokens = speech_tokens(b->audio_done, audio_n);
    }
    if (text_n) memcpy(out->text_buf, b->out_text, text_n);
    if (audio_n) synth(b->tones, out->audio_buf, audio_n, b->audio_done, b->audio_total_step, b->out_piece);
    b->audio_done += audio_n;
    out->kind = b->out_kind;
    out->end_of_turn = b->out_kind == OMNI_OUTPUT_SPEAK && b->out_eot && b->audio_done == b->audio_total_step;
    uint32_t out_tokens = first && text_n ? (uint32_t)count_words(b->out_text, text_n) : 0;
    if (first) {
        uint64_t kv = atomic_load(&b->kv) + out_tokens;
        if (kv > (uint64_t)b->opt.n_ctx) {
            b->state = ST_FULL;
            return fail(b, OMNI_ERR_CONTEXT_FULL, "duplex_generate: context full (%llu > n_ctx %ld)",
                        (unsigned long long)kv, b->opt.n_ctx);
        }
        atomic_store(&b->kv, kv);
    }
    out->kv_length = atomic_load(&b->kv);
    out->input_tokens = first ? b->out_in_tokens : 0;
    out->output_tokens = out_tokens;
    out->prefill_us = first ? b->prefill_us : 0;
    out->generate_us = (uint32_t)(now_us() - t0);
    b->transcript_len = 0; /* reported once */
    return OMNI_OK;
}

static omni_status check_step_output(omni_backend *b, omni_step_output *out, const char *fn) {
    if (!out) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (out->struct_size < MIN_SIZE(omni_step_output, generate_us))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "%s: struct_size %u is smaller than version 1 (%u)", fn,
                    out->struct_size, MIN_SIZE(omni_step_output, generate_us));
    return OMNI_OK;
}

static omni_status ref_duplex_generate(omni_backend *b, omni_step_output *out) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    omni_status st = check_step_output(b, out, "duplex_generate");
    if (st != OMNI_OK) return st;
    if (b->state == ST_FULL) return fail(b, OMNI_ERR_CONTEXT_FULL, "duplex_generate: the context is full");
    if (b->state != ST_PREFILLED)
        return fail(b, OMNI_ERR_BAD_STATE, "duplex_generate: called without a prefilled chunk");
    uint64_t t0 = now_us();
    if (!b->pending_valid) {
        unsigned epoch = b->step_epoch;
        if ((st = faults(b)) != OMNI_OK) {
            b->state = ST_READY;
            return st;
        }
        long ms = b->opt.step_ms + (b->out_kind == OMNI_OUTPUT_SPEAK ? b->opt.token_ms : 0);
        if (ms > 0 && pace(b, ms, epoch)) {
            b->state = ST_READY;
            return fail(b, OMNI_ERR_INTERRUPTED, "duplex_generate: interrupted");
        }
        if (b->out_kind == OMNI_OUTPUT_SPEAK && atomic_load(&b->force_listen)) {
            /* force-listen arrived while this step was computing: its speech is void */
            atomic_store(&b->force_listen, 0);
            b->out_kind = OMNI_OUTPUT_LISTEN;
            b->speaking = -1;
            b->voiced_ms = 0;
        }
        b->pending_valid = 1;
    }
    st = emit_step(b, out, 1, t0);
    if (st == OMNI_OK) b->state = ST_GENERATED;
    return st;
}

static omni_status ref_duplex_drain(omni_backend *b, omni_step_output *out) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    omni_status st = check_step_output(b, out, "duplex_drain");
    if (st != OMNI_OK) return st;
    if (b->state != ST_GENERATED) return fail(b, OMNI_ERR_BAD_STATE, "duplex_drain: called before duplex_generate");
    if (b->out_kind != OMNI_OUTPUT_SPEAK || b->audio_done >= b->audio_total_step) {
        out->kind = OMNI_OUTPUT_NONE;
        out->text_len = out->audio_len = 0;
        out->end_of_turn = 0;
        out->kv_length = atomic_load(&b->kv);
        out->input_tokens = out->output_tokens = 0;
        out->prefill_us = out->generate_us = 0;
        if (b->opt.revision >= 1 && out->struct_size >= MIN_SIZE(omni_step_output, output_audio_tokens)) {
            out->transcript_len = 0;
            out->input_audio_tokens = out->output_audio_tokens = 0;
        }
        return OMNI_OK;
    }
    return emit_step(b, out, 0, now_us());
}

static omni_status ref_duplex_finalize(omni_backend *b) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (b->state != ST_GENERATED && b->state != ST_PREFILLED)
        return fail(b, OMNI_ERR_BAD_STATE, "duplex_finalize: no step in flight");
    b->pending_valid = 0;
    b->state = ST_READY;
    return OMNI_OK;
}

/* ---- turn mode ---------------------------------------------------------- */
/* The answer to a turn's messages, in b->answer (or a call, in b->call_name). */
static void choose_answer(omni_backend *b, const omni_turn_input *in, const omni_message *last_user,
                          const struct tools *tools, long earlier) {
    const omni_message *newest = in->n_messages ? &in->messages[in->n_messages - 1] : NULL;
    b->call = 0;
    b->answer_len = 0;
    if (b->opt.revision >= 3 && newest && newest->role == OMNI_ROLE_TOOL_RESULT) {
        size_t n = newest->text.len > 1000 ? 1000 : newest->text.len;
        const char *t = newest->text.ptr ? newest->text.ptr : "";
        int stop = n > 0 && (t[n - 1] == '.' || t[n - 1] == '!' || t[n - 1] == '?');
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "The tool said: %.*s%s", (int)n, t, stop ? "" : ".");
        return;
    }
    if (b->opt.revision >= 3) {
        /* the response's own instructions: a system message of this turn */
        static const char exact[] = "reply with exactly:";
        for (size_t i = 0; i < in->n_messages; i++) {
            const omni_message *m = &in->messages[i];
            if (m->role != OMNI_ROLE_SYSTEM || !m->text.ptr) continue;
            for (size_t k = 0; k + sizeof exact - 1 <= m->text.len; k++) {
                if (strncasecmp(m->text.ptr + k, exact, sizeof exact - 1) != 0) continue;
                const char *t = m->text.ptr + k + sizeof exact - 1;
                size_t n = m->text.len - k - (sizeof exact - 1), e = 0;
                while (n && (*t == ' ' || *t == '\t')) t++, n--;
                while (e < n && t[e] != '\n') e++;
                while (e && (t[e - 1] == ' ' || t[e - 1] == '\r')) e--;
                if (e > MAX_ANSWER) e = MAX_ANSWER;
                memcpy(b->answer, t, e);
                b->answer_len = e;
                return;
            }
        }
        /* (Pipecat sends typed input as a system message) */
        if (newest && (newest->role == OMNI_ROLE_USER || newest->role == OMNI_ROLE_SYSTEM)) {
            int tool = tool_called(tools, newest->text.ptr ? newest->text.ptr : "", newest->text.len);
            if (tool >= 0) {
                b->call = 1;
                memcpy(b->call_name, tools->names[tool], tools->lens[tool]);
                b->call_name_len = tools->lens[tool];
                return;
            }
        }
        if (!last_user) {
            b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "Hello! How can I help?");
            return;
        }
    }
    const char *t = last_user->text.ptr;
    size_t n = last_user->text.len;
    while (n && (*t == ' ' || *t == '\n' || *t == '\t')) t++, n--;
    static const char prefix[] = "reply with exactly:";
    static const char ask_settings[] = "what are your settings?";
    static const char ask_memory[] = "what do you remember?";
    if (n >= sizeof ask_settings - 1 && strncasecmp(t, ask_settings, sizeof ask_settings - 1) == 0) {
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "My settings: %.*s.", (int)b->settings_len,
                                         b->settings_len ? b->settings : "the defaults");
    } else if (b->opt.revision >= 3 && n >= sizeof ask_memory - 1 &&
               strncasecmp(t, ask_memory, sizeof ask_memory - 1) == 0) {
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "I remember %ld earlier messages; the first was: %.*s.",
                                         earlier, (int)b->first_user_len, b->first_user);
    } else if (n >= sizeof prefix - 1 && strncasecmp(t, prefix, sizeof prefix - 1) == 0) {
        t += sizeof prefix - 1;
        n -= sizeof prefix - 1;
        while (n && (*t == ' ' || *t == '\t')) t++, n--;
        while (n && (t[n - 1] == ' ' || t[n - 1] == '\n' || t[n - 1] == '\t')) n--;
        if (n > MAX_ANSWER) n = MAX_ANSWER;
        memcpy(b->answer, t, n);
        b->answer_len = n;
    } else if (count_words(t, n) > 0) {
        size_t w = count_words(t, n);
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "You said %zu word%s, and I have answered.", w,
                                         w == 1 ? "" : "s");
    } else {
        size_t samples = 0;
        for (size_t k = 0; k < last_user->n_audios; k++) samples += last_user->audios[k].len;
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "I received %.1f seconds of audio and %zu image%s.",
                                         (double)samples / IN_RATE, last_user->n_images,
                                         last_user->n_images == 1 ? "" : "s");
    }
}

/* What a replayed conversation keeps: the messages so far, and the first user words. */
static void remember(omni_backend *b, const omni_message *m) {
    b->remembered++;
    if (m->role != OMNI_ROLE_USER || b->first_user_len || !m->text.ptr) return;
    size_t n = m->text.len < MAX_MEMORY_TEXT ? m->text.len : MAX_MEMORY_TEXT;
    while (n && (m->text.ptr[n - 1] == ' ' || m->text.ptr[n - 1] == '.' || m->text.ptr[n - 1] == '?')) n--;
    memcpy(b->first_user, m->text.ptr, n);
    b->first_user_len = n;
}

static omni_status ref_turn_prefill(omni_backend *b, const omni_turn_input *in) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (!in) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: input is NULL");
    if (in->struct_size < MIN_SIZE(omni_turn_input, tts_ref_audio))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: struct_size %u is smaller than version 1 (%u)",
                    in->struct_size, MIN_SIZE(omni_turn_input, tts_ref_audio));
    if (b->state == ST_FULL) return fail(b, OMNI_ERR_CONTEXT_FULL, "turn_prefill: the context is full");
    /* 1.3: a duplex session takes turns between its steps */
    int duplex_turns = b->opt.revision >= 3 && b->kind == OMNI_SESSION_DUPLEX;
    if ((b->kind != OMNI_SESSION_TURN && !duplex_turns) || b->state == ST_IDLE)
        return fail(b, OMNI_ERR_BAD_STATE, "turn_prefill: no turn session is prepared");
    /* (an unfinished answer, ST_TURN_PREFILLED, is abandoned) */
    if (b->state != b->turn_home && b->state != ST_TURN_PREFILLED)
        return fail(b, OMNI_ERR_BAD_STATE, "turn_prefill: called in the middle of a duplex step");
    /* 1.3: no messages answers the context as it stands (speaking first) */
    if ((!in->messages && in->n_messages) || (in->n_messages == 0 && b->opt.revision < 3))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: no messages");
    if (!pcm_ok(in->tts_ref_audio)) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: tts_ref_audio is NULL");
    int v11 = b->opt.revision >= 1 && in->struct_size >= MIN_SIZE(omni_turn_input, n_settings);
    int v13 = b->opt.revision >= 3 && in->struct_size >= MIN_SIZE(omni_turn_input, tool_choice);
    int prefill_only = v13 && (in->flags & OMNI_TURN_PREFILL_ONLY);
    const omni_message *last_user = NULL;
    uint64_t tokens = 1, audio_tokens = 0;
    uint32_t slices = in->max_slice_nums ? in->max_slice_nums : b->max_slice_nums;
    for (size_t i = 0; i < in->n_messages; i++) {
        const omni_message *m = &in->messages[i];
        if (m->struct_size < MIN_SIZE(omni_message, n_audios))
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: struct_size %u is too small", i,
                        m->struct_size);
        int tool_role = m->role == OMNI_ROLE_TOOL_CALL || m->role == OMNI_ROLE_TOOL_RESULT;
        if (m->role > OMNI_ROLE_ASSISTANT &&
            !(tool_role && b->opt.revision >= 3 && m->struct_size >= MIN_SIZE(omni_message, name)))
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: unknown role %u", i, m->role);
        if (!str_ok(m->text) || (m->n_images && !m->images) || (m->n_audios && !m->audios))
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: NULL buffer", i);
        if (tool_role && (!str_ok(m->call_id) || !str_ok(m->name) || m->call_id.len == 0))
            return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: a tool message without call_id", i);
        if (m->n_images > 0 && !b->opt.vision)
            return fail(b, OMNI_ERR_UNSUPPORTED, "turn_prefill: no vision (option vision = 0): images refused");
        tokens += count_words(m->text.ptr, m->text.len) + m->n_images * frame_tokens(slices);
        for (size_t k = 0; k < m->n_images; k++)
            if (!m->images[k].ptr || m->images[k].len == 0)
                return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: image %zu is empty", i, k);
        for (size_t k = 0; k < m->n_audios; k++) {
            if (!m->audios[k].ptr || m->audios[k].len == 0)
                return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: message %zu: audio %zu is empty", i, k);
            tokens += m->audios[k].len * 25u / IN_RATE;
            audio_tokens += m->audios[k].len * 25u / IN_RATE;
        }
        if (m->role == OMNI_ROLE_USER) last_user = m;
    }
    /* 1.3: a turn with no user message is a greeting, a tool's result, or a replay */
    if (!last_user && b->opt.revision < 3) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_prefill: no user message");
    struct tools turn_tools;
    const struct tools *tools = &b->tools;
    if (v13 && (in->tools.len || in->tool_choice.len)) {
        omni_status st = parse_tools(b, in->tools.len ? in->tools : (omni_str){0}, in->tool_choice, &turn_tools,
                                     "turn_prefill");
        if (st != OMNI_OK) return st;
        if (!in->tools.len) {
            /* the session's tools, the turn's choice */
            memcpy(turn_tools.names, b->tools.names, sizeof turn_tools.names);
            memcpy(turn_tools.lens, b->tools.lens, sizeof turn_tools.lens);
            turn_tools.n = b->tools.n;
        }
        if (!in->tool_choice.len) {
            memcpy(turn_tools.choice, b->tools.choice, b->tools.choice_len);
            turn_tools.choice_len = b->tools.choice_len;
        }
        tools = &turn_tools;
    }
    /* the turn's settings come after the session's; a failure leaves the session's alone */
    b->settings_len = b->session_settings_len;
    if (v11) {
        omni_status st = apply_settings(b, in->settings, in->n_settings, "turn_prefill");
        if (st != OMNI_OK) {
            b->settings_len = b->session_settings_len;
            return st;
        }
    }
    /* 1.1: without OMNI_TURN_CONTINUE the messages are the whole conversation */
    int replace = v11 && !(in->flags & OMNI_TURN_CONTINUE);
    uint64_t kv = replace ? b->prompt_kv : atomic_load(&b->kv);
    if (kv + tokens > (uint64_t)b->opt.n_ctx) {
        b->state = ST_FULL;
        return fail(b, OMNI_ERR_CONTEXT_FULL, "turn_prefill: context full (%llu + %llu > n_ctx %ld)",
                    (unsigned long long)kv, (unsigned long long)tokens, b->opt.n_ctx);
    }
    atomic_store(&b->kv, kv + tokens);
    b->step_no++;
    if (replace) {
        b->remembered = 0;
        b->first_user_len = 0;
    }
    long earlier = b->remembered;
    for (size_t i = 0; i < in->n_messages; i++) remember(b, &in->messages[i]);
    if (!prefill_only) {
        /* "earlier": before this turn's own question */
        choose_answer(b, in, last_user, tools, earlier + (long)(in->n_messages ? in->n_messages - 1 : 0));
        b->remembered++;
    } else {
        b->call = 0;
        b->answer_len = 0;
    }
    b->answer_pos = 0;
    b->turn_flags = in->flags;
    b->turn_limit = in->max_new_tokens ? in->max_new_tokens : b->max_new_tokens;
    b->turn_pieces = 0;
    b->turn_in_tokens = (uint32_t)tokens;
    b->turn_in_audio_tokens = (uint32_t)audio_tokens;
    b->transcript_len = 0;
    size_t heard = 0;
    for (size_t k = 0; last_user && k < last_user->n_audios; k++) heard += last_user->audios[k].len;
    if (heard && !prefill_only) set_transcript(b, (double)heard / IN_RATE);
    b->pending_valid = 0;
    b->state = ST_TURN_PREFILLED;
    return OMNI_OK;
}

static omni_status ref_turn_generate(omni_backend *b, omni_turn_output *out) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    if (!out) return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_generate: out is NULL");
    if (out->struct_size < MIN_SIZE(omni_turn_output, generate_us))
        return fail(b, OMNI_ERR_INVALID_ARGUMENT, "turn_generate: struct_size %u is smaller than version 1 (%u)",
                    out->struct_size, MIN_SIZE(omni_turn_output, generate_us));
    if (b->state == ST_FULL) return fail(b, OMNI_ERR_CONTEXT_FULL, "turn_generate: the context is full");
    if (b->state != ST_TURN_PREFILLED) return fail(b, OMNI_ERR_BAD_STATE, "turn_generate: no prefilled conversation");
    uint64_t t0 = now_us();
    int v13 = out->struct_size >= MIN_SIZE(omni_turn_output, call_name);
    if (v13) out->call = out->call_name_len = 0;
    if (b->call && !v13 && b->turn_pieces == 0) {
        /* a caller from before 1.3 hears the call as words */
        b->answer_len = (size_t)snprintf(b->answer, MAX_ANSWER, "Calling %.*s.", (int)b->call_name_len, b->call_name);
        b->call = 0;
    }
    omni_status st;
    if (!b->pending_valid) {
        unsigned epoch = atomic_load(&b->interrupt_epoch);
        if (b->turn_pieces == 0 && (st = faults(b)) != OMNI_OK) {
            b->state = b->turn_home;
            return st;
        }
        if (b->opt.token_ms > 0 && pace(b, b->opt.token_ms, epoch)) {
            b->state = b->turn_home;
            return fail(b, OMNI_ERR_INTERRUPTED, "turn_generate: interrupted");
        }
        if (b->call) {
            /* a call's arguments, "{}", in two pieces */
            b->out_text[0] = b->turn_pieces == 0 ? '{' : '}';
            b->out_text_len = 1;
            b->audio_total_step = 0;
        } else {
            /* next piece: one word with the whitespace before it */
            size_t s = b->answer_pos, e = s;
            while (e < b->answer_len && b->answer[e] == ' ') e++;
            while (e < b->answer_len && b->answer[e] != ' ') e++;
            b->out_text_len = e - s < MAX_TEXT ? e - s : MAX_TEXT;
            memcpy(b->out_text, b->answer + s, b->out_text_len);
            b->answer_pos = s + b->out_text_len;
            b->audio_total_step = (b->turn_flags & OMNI_TURN_SPEECH) && b->out_text_len ? TURN_PIECE_AUDIO : 0;
        }
        b->out_piece = (int)b->turn_pieces;
        b->turn_pieces++;
        b->pending_valid = 1;
    }
    size_t audio_n = b->audio_total_step;
    out->text_len = b->out_text_len;
    out->audio_len = audio_n;
    if ((b->out_text_len && (!out->text_buf || out->text_cap < b->out_text_len)) ||
        (audio_n && (!out->audio_buf || out->audio_cap < audio_n)))
        return fail(b, OMNI_ERR_BUFFER_TOO_SMALL, "turn_generate: piece needs %zu text bytes and %zu samples",
                    b->out_text_len, audio_n);
    int v11 = b->opt.revision >= 1 && out->struct_size >= MIN_SIZE(omni_turn_output, output_audio_tokens);
    if (v11) {
        omni_status tst = emit_transcript(b, out->transcript_buf, out->transcript_cap, &out->transcript_len);
        if (tst != OMNI_OK) return tst;
        out->input_audio_tokens = b->turn_pieces == 1 ? b->turn_in_audio_tokens : 0;
        out->output_audio_tokens = speech_tokens(0, audio_n);
    }
    if (b->call) {
        out->call = 1;
        if (b->turn_pieces == 1) {
            memcpy(out->call_name, b->call_name, b->call_name_len);
            out->call_name_len = (uint32_t)b->call_name_len;
        }
    }
    if (b->out_text_len) memcpy(out->text_buf, b->out_text, b->out_text_len);
    if (audio_n) synth(b->tones, out->audio_buf, audio_n, 0, audio_n, b->out_piece);
    uint32_t tokens = b->out_text_len ? (uint32_t)count_words(b->out_text, b->out_text_len) : 0;
    uint64_t kv = atomic_load(&b->kv) + tokens;
    if (kv > (uint64_t)b->opt.n_ctx) {
        b->state = ST_FULL;
        return fail(b, OMNI_ERR_CONTEXT_FULL, "turn_generate: context full (%llu > n_ctx %ld)",
                    (unsigned long long)kv, b->opt.n_ctx);
    }
    atomic_store(&b->kv, kv);
    b->pending_valid = 0;
    int rest = 0;
    for (size_t i = b->answer_pos; i < b->answer_len; i++) rest |= b->answer[i] != ' ';
    out->done = b->call ? b->turn_pieces >= 2 : !rest || b->turn_pieces >= b->turn_limit;
    out->output_tokens = tokens;
    out->kv_length = kv;
    out->input_tokens = b->turn_pieces == 1 ? b->turn_in_tokens : 0;
    out->generate_us = (uint32_t)(now_us() - t0);
    b->transcript_len = 0; /* reported once, with the first piece */
    if (out->done) b->state = b->turn_home;
    return OMNI_OK;
}

/* ---- any thread --------------------------------------------------------- */
static omni_status ref_interrupt(omni_backend *b) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    atomic_fetch_add(&b->interrupt_epoch, 1);
    /* a broken backend whose any-thread call blocks (for the gateway's tests) */
    if (b->opt.interrupt_hang_ms > 0) sleep_ms(b->opt.interrupt_hang_ms);
    return OMNI_OK;
}

static omni_status ref_set_force_listen(omni_backend *b, int32_t on) {
    if (!b) return OMNI_ERR_INVALID_ARGUMENT;
    atomic_store(&b->force_listen, on ? 1 : 0);
    return OMNI_OK;
}

static uint64_t ref_kv_length(omni_backend *b) { return b ? atomic_load(&b->kv) : 0; }

/* ---- entry points ------------------------------------------------------- */
static const omni_backend_api API = {
    sizeof(omni_backend_api), OMNI_BACKEND_ABI_VERSION, ref_open, ref_close, ref_info, ref_last_error,
    ref_prepare, ref_reset, ref_duplex_prefill, ref_duplex_generate, ref_duplex_drain, ref_duplex_finalize,
    ref_turn_prefill, ref_turn_generate, ref_interrupt, ref_set_force_listen, ref_kv_length,
};

/* Tests build a copy that claims another ABI version, to prove the loader refuses it. */
#ifndef OMNI_REFERENCE_CLAIMED_ABI
#define OMNI_REFERENCE_CLAIMED_ABI OMNI_BACKEND_ABI_VERSION
#endif

OMNI_EXPORT uint32_t ENTRY_ABI_VERSION(void) { return OMNI_REFERENCE_CLAIMED_ABI; }

OMNI_EXPORT const omni_backend_api *ENTRY_GET_API(uint32_t abi_version) {
    return abi_version == OMNI_BACKEND_ABI_VERSION ? &API : NULL;
}
