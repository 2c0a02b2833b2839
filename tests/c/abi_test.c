/*
 * Drives a backend shared library through omni_backend.h alone, as a backend host
 * written in C would: dlopen, version query, function table, then sessions.
 * Usage: omni_abi_test path/to/libbackend.so     Prints TAP; exits 1 on any failure.
 */
#define _POSIX_C_SOURCE 200809L
#include "omni_backend.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0, count = 0;
static const omni_backend_api *api;

#define CHECK(cond, ...)                                                                                     \
    do {                                                                                                     \
        count++;                                                                                             \
        if (cond) {                                                                                          \
            printf("ok %d - ", count);                                                                       \
        } else {                                                                                             \
            failures++;                                                                                      \
            printf("not ok %d - ", count);                                                                   \
        }                                                                                                    \
        printf(__VA_ARGS__);                                                                                 \
        printf("\n");                                                                                        \
    } while (0)

static omni_str S(const char *s) {
    omni_str r = {s, strlen(s)};
    return r;
}

static omni_backend *open_with(const char *k1, const char *v1) {
    omni_option opts[1] = {{S(k1 ? k1 : ""), S(v1 ? v1 : "")}};
    omni_backend *b = NULL;
    char err[256];
    omni_status st = api->open(opts, k1 ? 1 : 0, &b, err, sizeof err);
    if (st != OMNI_OK) printf("# open failed: %s\n", err);
    return b;
}

static void prepare_duplex(omni_backend *b) {
    omni_session_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.kind = OMNI_SESSION_DUPLEX;
    c.system_prompt = S("You are a test.");
    c.temperature = -1;
    omni_status st = api->prepare(b, &c);
    CHECK(st == OMNI_OK, "prepare a duplex session");
}

/* A message of one role, and a turn input of those messages with the given flags. */
static void message(omni_message *m, uint32_t role) {
    memset(m, 0, sizeof *m);
    m->struct_size = sizeof *m;
    m->role = role;
}

static void turn_input(omni_turn_input *ti, const omni_message *messages, size_t n, uint32_t flags) {
    memset(ti, 0, sizeof *ti);
    ti->struct_size = sizeof *ti;
    ti->flags = flags;
    ti->messages = messages;
    ti->n_messages = n;
    ti->temperature = -1;
}

static float loud[16000], quiet[16000];
static char text[512];
static float audio[48000];

/* Zeroes an output struct (step or turn: the same buffer fields) and points it at the
 * shared text and audio buffers and a transcript buffer (which may be NULL). */
#define POINT_OUT(out, tbuf, tcap)                                                                          \
    do {                                                                                                     \
        memset((out), 0, sizeof *(out));                                                                     \
        (out)->struct_size = sizeof *(out);                                                                  \
        (out)->text_buf = text;                                                                              \
        (out)->text_cap = sizeof text;                                                                       \
        (out)->audio_buf = audio;                                                                            \
        (out)->audio_cap = sizeof audio / sizeof audio[0];                                                   \
        (out)->transcript_buf = (tbuf);                                                                      \
        (out)->transcript_cap = (tcap);                                                                      \
    } while (0)

/* One whole step; returns the kind, fills *samples and *eot. */
static uint32_t step(omni_backend *b, const float *pcm, uint32_t flags, size_t *samples, int *eot, uint64_t *kv) {
    omni_duplex_input in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    in.flags = flags;
    in.audio.ptr = pcm;
    in.audio.len = 16000;
    if (api->duplex_prefill(b, &in) != OMNI_OK) return 99;
    omni_step_output out;
    POINT_OUT(&out, NULL, 0);
    if (api->duplex_generate(b, &out) != OMNI_OK) return 98;
    uint32_t kind = out.kind;
    *samples = out.audio_len;
    *eot = (int)out.end_of_turn;
    for (;;) {
        if (api->duplex_drain(b, &out) != OMNI_OK) return 97;
        if (out.kind == OMNI_OUTPUT_NONE) break;
        *samples += out.audio_len;
        *eot |= (int)out.end_of_turn;
    }
    *kv = out.kv_length;
    if (api->duplex_finalize(b) != OMNI_OK) return 96;
    return kind;
}

/* One whole turn answer; returns the pieces, the answer in answer_out (NUL-terminated) and
 * the first piece's transcript in transcript_out. */
static int answer_turn(omni_backend *b, omni_turn_input *ti, char *answer_out, char *transcript_out,
                       uint32_t *in_audio_tokens, uint32_t *out_audio_tokens) {
    static char tbuf[128];
    if (api->turn_prefill(b, ti) != OMNI_OK) return -1;
    size_t alen = 0;
    int pieces = 0;
    *in_audio_tokens = *out_audio_tokens = 0;
    transcript_out[0] = 0;
    omni_turn_output to;
    do {
        POINT_OUT(&to, tbuf, sizeof tbuf);
        if (api->turn_generate(b, &to) != OMNI_OK) return -1;
        if (alen + to.text_len < 255) {
            memcpy(answer_out + alen, text, to.text_len);
            alen += to.text_len;
        }
        if (to.transcript_len) {
            memcpy(transcript_out, tbuf, to.transcript_len);
            transcript_out[to.transcript_len] = 0;
        }
        *in_audio_tokens += to.input_audio_tokens;
        *out_audio_tokens += to.output_audio_tokens;
        pieces++;
    } while (!to.done && pieces < 100);
    answer_out[alen] = 0;
    return pieces;
}

/* An answer that may be a call: its words, or the called tool's name and its arguments. */
static int answer_call(omni_backend *b, omni_turn_input *ti, uint32_t out_size, char *words, char *name, char *args) {
    if (api->turn_prefill(b, ti) != OMNI_OK) return -1;
    size_t wlen = 0, alen = 0;
    int pieces = 0;
    name[0] = 0;
    omni_turn_output to;
    do {
        POINT_OUT(&to, NULL, 0);
        to.struct_size = out_size;
        if (api->turn_generate(b, &to) != OMNI_OK) return -1;
        int call = out_size >= sizeof to && to.call;
        if (call && to.call_name_len) {
            memcpy(name, to.call_name, to.call_name_len);
            name[to.call_name_len] = 0;
        }
        char *dst = call ? args : words;
        size_t *len = call ? &alen : &wlen;
        if (*len + to.text_len < 255) {
            memcpy(dst + *len, text, to.text_len);
            *len += to.text_len;
        }
        pieces++;
    } while (!to.done && pieces < 100);
    words[wlen] = 0;
    args[alen] = 0;
    return pieces;
}

static const char *TOOLS = "[{\"name\": \"get_time\", \"description\": \"The time now\", \"parameters\": "
                           "{\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"string\", \"name\": \"x\"}}}}, "
                           "{\"name\": \"transfer_to_spanish_agent\", \"parameters\": {}}]";

/* Revision 1.3: tools and calls, call and result messages, prefill-only turns, turns without
 * messages and turns in a duplex session; and what a caller or a backend of an earlier
 * revision sees of it. */
static void abi_1_3(void) {
    omni_backend *b = open_with(NULL, NULL);
    omni_backend_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && info.abi_revision == 3 && (info.capabilities & OMNI_CAP_TOOLS),
          "1.3 info: revision 3, OMNI_CAP_TOOLS");
    omni_session_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.kind = OMNI_SESSION_TURN;
    c.temperature = -1;
    c.tools = S(TOOLS);
    c.tool_choice = S("auto");
    CHECK(api->prepare(b, &c) == OMNI_OK, "prepare a turn session with two tools");
    omni_message m[3];
    message(&m[0], OMNI_ROLE_USER);
    m[0].text = S("What time is it in UTC?");
    omni_turn_input ti;
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE | OMNI_TURN_SPEECH);
    char words[256], name[80], args[256];
    int pieces = answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(pieces == 2 && strcmp(name, "get_time") == 0 && strcmp(args, "{}") == 0 && words[0] == 0,
          "a question naming a tool is answered with its call: %s(%s) in %d pieces, no words", name, args, pieces);
    message(&m[0], OMNI_ROLE_TOOL_CALL);
    m[0].call_id = S("call_1");
    m[0].name = S("get_time");
    m[0].text = S("{}");
    message(&m[1], OMNI_ROLE_TOOL_RESULT);
    m[1].call_id = S("call_1");
    m[1].text = S("12:00 UTC");
    turn_input(&ti, &m[1], 1, OMNI_TURN_CONTINUE);
    pieces = answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(pieces > 0 && strcmp(words, "The tool said: 12:00 UTC.") == 0 && name[0] == 0,
          "the tool's result is answered with words: '%s'", words);
    message(&m[0], OMNI_ROLE_USER);
    m[0].text = S("What time is it?");
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE);
    ti.tool_choice = S("none");
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(name[0] == 0 && strncmp(words, "You said 4 words", 16) == 0, "tool_choice none for one turn: words ('%s')", words);
    ti.tool_choice = S("transfer_to_spanish_agent");
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(strcmp(name, "transfer_to_spanish_agent") == 0, "a turn's tool_choice names the tool it calls (%s)", name);
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE);
    answer_call(b, &ti, (uint32_t)offsetof(omni_turn_output, call), words, name, args);
    CHECK(strcmp(words, "Calling get_time.") == 0, "a caller from before 1.3 hears a call as words: '%s'", words);
    message(&m[0], OMNI_ROLE_USER);
    m[0].text = S("My name is Ada.");
    message(&m[1], OMNI_ROLE_ASSISTANT);
    m[1].text = S("Hello Ada.");
    turn_input(&ti, m, 2, OMNI_TURN_PREFILL_ONLY);
    pieces = answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(pieces == 1 && words[0] == 0 && name[0] == 0, "a prefill-only turn answers one empty piece");
    message(&m[0], OMNI_ROLE_USER);
    m[0].text = S("What do you remember?");
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE);
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(strcmp(words, "I remember 2 earlier messages; the first was: My name is Ada.") == 0,
          "a replayed conversation is remembered: '%s'", words);
    turn_input(&ti, NULL, 0, OMNI_TURN_CONTINUE | OMNI_TURN_SPEECH);
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(strcmp(words, "Hello! How can I help?") == 0, "a turn with no message speaks first: '%s'", words);
    api->reset(b);
    /* a 1.2 caller's config ends before the tools: none */
    c.struct_size = (uint32_t)offsetof(omni_session_config, tools);
    CHECK(api->prepare(b, &c) == OMNI_OK, "prepare with a 1.2-sized config");
    m[0].text = S("What time is it?");
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE);
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(name[0] == 0 && strncmp(words, "You said", 8) == 0, "its tools are not read: words ('%s')", words);
    api->reset(b);
    /* a duplex session answers a turn between its steps, then steps on */
    c.struct_size = sizeof c;
    c.kind = OMNI_SESSION_DUPLEX;
    CHECK(api->prepare(b, &c) == OMNI_OK, "prepare a duplex session with tools");
    m[0].text = S("Reply with exactly: typed and answered");
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE | OMNI_TURN_SPEECH);
    answer_call(b, &ti, sizeof(omni_turn_output), words, name, args);
    CHECK(strcmp(words, "typed and answered") == 0, "the duplex session answers a typed turn: '%s'", words);
    omni_duplex_input in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    in.audio.ptr = quiet;
    in.audio.len = 16000;
    omni_step_output out;
    POINT_OUT(&out, NULL, 0);
    CHECK(api->duplex_prefill(b, &in) == OMNI_OK && api->duplex_generate(b, &out) == OMNI_OK &&
              out.kind == OMNI_OUTPUT_LISTEN && api->duplex_finalize(b) == OMNI_OK,
          "and steps on after it");
    api->close(b);
    /* a 1.2 backend: no tools, and call and result messages are refused */
    b = open_with("revision", "2");
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && info.abi_revision == 2 && !(info.capabilities & OMNI_CAP_TOOLS),
          "revision=2 reports no tools");
    c.kind = OMNI_SESSION_TURN;
    CHECK(api->prepare(b, &c) == OMNI_OK, "it takes a 1.3 config (its tools unread)");
    message(&m[0], OMNI_ROLE_TOOL_RESULT);
    m[0].call_id = S("call_1");
    m[0].text = S("noon");
    turn_input(&ti, m, 1, OMNI_TURN_CONTINUE);
    CHECK(api->turn_prefill(b, &ti) == OMNI_ERR_INVALID_ARGUMENT, "and refuses a tool's result (a role it does not know)");
    api->close(b);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    omni_backend_abi_version_fn version;
    omni_backend_get_api_fn get_api;
    *(void **)&version = dlsym(lib, OMNI_BACKEND_ABI_VERSION_SYMBOL);
    *(void **)&get_api = dlsym(lib, OMNI_BACKEND_GET_API_SYMBOL);
    CHECK(version && get_api, "both entry points are exported");
    if (!version || !get_api) return 1;
    CHECK(version() == OMNI_BACKEND_ABI_VERSION, "ABI version is %u", version());
    CHECK(get_api(OMNI_BACKEND_ABI_VERSION + 1) == NULL, "an unknown ABI version gives no table");
    api = get_api(OMNI_BACKEND_ABI_VERSION);
    CHECK(api && api->struct_size >= sizeof(omni_backend_api) && api->abi_version == OMNI_BACKEND_ABI_VERSION,
          "the version-1 table is complete");
    if (!api) return 1;

    for (int i = 0; i < 16000; i++) {
        loud[i] = 0.3f * (float)sin(6.283185307179586 * 220.0 * i / 16000.0);
        quiet[i] = 0.0f;
    }

    /* open errors */
    char err[256] = "";
    omni_backend *b = NULL;
    omni_option bad[1] = {{S("no_such_option"), S("1")}};
    CHECK(api->open(bad, 1, &b, err, sizeof err) == OMNI_ERR_OPEN_FAILED && b == NULL && strstr(err, "no_such_option"),
          "an unknown option fails open with its name (%s)", err);
    omni_option nan_opt[1] = {{S("step_ms"), S("soon")}};
    CHECK(api->open(nan_opt, 1, &b, err, sizeof err) == OMNI_ERR_OPEN_FAILED && strstr(err, "step_ms"),
          "a non-numeric option fails open (%s)", err);
    CHECK(api->open(NULL, 0, NULL, err, sizeof err) == OMNI_ERR_INVALID_ARGUMENT, "open with out NULL is refused");

    /* info */
    b = open_with(NULL, NULL);
    CHECK(b != NULL, "open with defaults");
    omni_backend_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && info.input_sample_rate == 16000 && info.output_sample_rate == 24000 &&
              info.context_size == 8192 && (info.capabilities & OMNI_CAP_DUPLEX) && (info.capabilities & OMNI_CAP_TURN),
          "info: 16 kHz in, 24 kHz out, 8192 tokens, duplex and turn");
    info.struct_size = 4;
    CHECK(api->info(b, &info) == OMNI_ERR_INVALID_ARGUMENT, "info with a short struct_size is refused");
    char msg[256];
    size_t n = api->last_error(b, msg, sizeof msg);
    CHECK(n > 0 && strstr(msg, "struct_size"), "last_error explains it: %s", msg);

    /* wrong state and invalid arguments */
    omni_step_output out;
    memset(&out, 0, sizeof out);
    out.struct_size = sizeof out;
    CHECK(api->duplex_generate(b, &out) == OMNI_ERR_BAD_STATE, "generate before prepare is a state error");
    CHECK(api->duplex_prefill(b, NULL) == OMNI_ERR_INVALID_ARGUMENT, "prefill(NULL) is refused");
    CHECK(api->prepare(NULL, NULL) == OMNI_ERR_INVALID_ARGUMENT, "prepare on a NULL handle is refused");
    prepare_duplex(b);
    omni_duplex_input empty;
    memset(&empty, 0, sizeof empty);
    empty.struct_size = sizeof empty;
    CHECK(api->duplex_prefill(b, &empty) == OMNI_ERR_INVALID_ARGUMENT, "an empty audio buffer is refused");
    api->last_error(b, msg, sizeof msg);
    CHECK(strstr(msg, "empty") != NULL, "with a reason: %s", msg);

    /* listen, then speak three steps, then listen */
    size_t samples;
    int eot;
    uint64_t kv = 0, kv_before;
    uint32_t k = step(b, loud, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_LISTEN, "loud chunk: listen (kind %u)", k);
    CHECK(kv == 4 + 1 + 25, "kv = prompt 4 + step 1 + 25 per second (%llu)", (unsigned long long)kv);
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_SPEAK && samples == 24000 && !eot, "quiet chunk after speech: speak 24000 samples");
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_SPEAK && samples == 24000 && !eot, "second speaking step");
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_SPEAK && eot, "third speaking step ends the turn");
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_LISTEN, "then it listens again");

    /* force-listen from another thread's call, mid-speech */
    step(b, loud, 0, &samples, &eot, &kv);
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_SPEAK, "speaking again");
    CHECK(api->set_force_listen(b, 1) == OMNI_OK, "set_force_listen");
    k = step(b, quiet, 0, &samples, &eot, &kv);
    CHECK(k == OMNI_OUTPUT_LISTEN, "the next step listens");
    kv_before = api->kv_length(b);
    CHECK(kv_before == kv, "kv_length (any thread) matches the step's (%llu)", (unsigned long long)kv_before);

    /* buffer too small: the call can be repeated with room */
    step(b, loud, 0, &samples, &eot, &kv);
    omni_duplex_input in;
    memset(&in, 0, sizeof in);
    in.struct_size = sizeof in;
    in.audio.ptr = quiet;
    in.audio.len = 16000;
    CHECK(api->duplex_prefill(b, &in) == OMNI_OK, "prefill");
    POINT_OUT(&out, NULL, 0);
    out.text_cap = 2;
    out.audio_cap = 10;
    CHECK(api->duplex_generate(b, &out) == OMNI_ERR_BUFFER_TOO_SMALL && out.audio_len == 12000,
          "a small buffer is refused with the size needed (%zu samples)", out.audio_len);
    out.text_cap = sizeof text;
    out.audio_cap = sizeof audio / sizeof audio[0];
    CHECK(api->duplex_generate(b, &out) == OMNI_OK && out.kind == OMNI_OUTPUT_SPEAK, "the retry succeeds");
    while (api->duplex_drain(b, &out) == OMNI_OK && out.kind != OMNI_OUTPUT_NONE) {
    }
    CHECK(api->duplex_finalize(b) == OMNI_OK, "finalize");
    CHECK(api->reset(b) == OMNI_OK && api->kv_length(b) == 0, "reset forgets the session");
    api->close(b);

    /* context full */
    b = open_with("n_ctx", "50");
    prepare_duplex(b);
    step(b, loud, 0, &samples, &eot, &kv);
    in.audio.ptr = loud;
    CHECK(api->duplex_prefill(b, &in) == OMNI_ERR_CONTEXT_FULL, "n_ctx 50: the second chunk fills the context");
    CHECK(api->duplex_prefill(b, &in) == OMNI_ERR_CONTEXT_FULL, "and it stays full until reset");
    api->close(b);

    /* inference failure at step 2, once */
    b = open_with("fail_at_step", "2");
    prepare_duplex(b);
    step(b, loud, 0, &samples, &eot, &kv);
    CHECK(step(b, loud, 0, &samples, &eot, &kv) == 98, "step 2 fails in generate");
    CHECK(step(b, loud, 0, &samples, &eot, &kv) == OMNI_OUTPUT_LISTEN, "step 3 works again");
    api->close(b);

    /* turn mode */
    b = open_with(NULL, NULL);
    omni_session_config c;
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.kind = OMNI_SESSION_TURN;
    CHECK(api->prepare(b, &c) == OMNI_OK, "prepare a turn session");
    omni_message m;
    message(&m, OMNI_ROLE_USER);
    m.text = S("Reply with exactly: hello from C");
    omni_turn_input ti;
    turn_input(&ti, &m, 1, OMNI_TURN_SPEECH);
    CHECK(api->turn_prefill(b, &ti) == OMNI_OK, "turn_prefill");
    char answer[256] = "";
    size_t alen = 0, asamples = 0;
    int pieces = 0;
    omni_turn_output to;
    POINT_OUT(&to, NULL, 0);
    do {
        if (api->turn_generate(b, &to) != OMNI_OK) break;
        memcpy(answer + alen, text, to.text_len);
        alen += to.text_len;
        asamples += to.audio_len;
        pieces++;
    } while (!to.done && pieces < 100);
    answer[alen] = 0;
    CHECK(strcmp(answer, "hello from C") == 0 && pieces == 3 && asamples == 3 * 6000,
          "the answer is exactly 'hello from C' in 3 pieces with audio ('%s', %d pieces)", answer, pieces);
    api->close(b);

    /* revision 1.1: settings, transcripts, token details, replacing turns */
    b = open_with(NULL, NULL);
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && (info.capabilities & OMNI_CAP_TRANSCRIPTS) &&
              (info.capabilities & OMNI_CAP_TOKEN_DETAILS) && info.settings_len > 0 && info.abi_revision == 3 &&
              strncmp(info.settings, "top_p,", 6) == 0,
          "1.3 info (revision 3): transcripts, token details, settings '%.*s'", (int)info.settings_len, info.settings);
    omni_option session_settings[2] = {{S("top_k"), S("20")}, {S("listen_prob_scale"), S("0.5")}};
    memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    c.kind = OMNI_SESSION_TURN;
    c.system_prompt = S("Be brief.");
    c.settings = session_settings;
    c.n_settings = 2;
    CHECK(api->prepare(b, &c) == OMNI_OK, "prepare with settings (one it does not apply is ignored)");
    uint64_t prompt_kv = api->kv_length(b);
    omni_option turn_settings[1] = {{S("seed"), S("7")}};
    m.text = S("What are your settings?");
    turn_input(&ti, &m, 1, 0);
    ti.settings = turn_settings;
    ti.n_settings = 1;
    char said[256], heard[128];
    uint32_t in_audio = 0, out_audio = 0;
    int pieces11 = answer_turn(b, &ti, said, heard, &in_audio, &out_audio);
    CHECK(pieces11 > 0 && strcmp(said, "My settings: top_k=20 seed=7.") == 0, "the session's and the turn's settings reach the model: '%s'", said);
    uint64_t after_first = api->kv_length(b);
    pieces11 = answer_turn(b, &ti, said, heard, &in_audio, &out_audio);
    CHECK(pieces11 > 0 && api->kv_length(b) == after_first,
          "a turn without CONTINUE replaces the conversation: kv stays %llu (prompt %llu)",
          (unsigned long long)api->kv_length(b), (unsigned long long)prompt_kv);
    ti.flags = OMNI_TURN_CONTINUE;
    pieces11 = answer_turn(b, &ti, said, heard, &in_audio, &out_audio);
    CHECK(pieces11 > 0 && api->kv_length(b) > after_first, "with CONTINUE it is appended: kv %llu > %llu",
          (unsigned long long)api->kv_length(b), (unsigned long long)after_first);
    omni_option bad_setting[1] = {{S("top_p"), S("3")}};
    ti.settings = bad_setting;
    CHECK(api->turn_prefill(b, &ti) == OMNI_ERR_INVALID_ARGUMENT, "an out-of-range setting is refused");
    omni_pcm clip = {loud, 16000};
    omni_message spoken;
    message(&spoken, OMNI_ROLE_USER);
    spoken.audios = &clip;
    spoken.n_audios = 1;
    turn_input(&ti, &spoken, 1, OMNI_TURN_SPEECH);
    pieces11 = answer_turn(b, &ti, said, heard, &in_audio, &out_audio);
    CHECK(strcmp(heard, "(1.0 seconds of speech)") == 0 && in_audio == 25 && out_audio == (uint32_t)pieces11 * 6,
          "a spoken turn: transcript '%s', %u audio tokens in, %u out", heard, in_audio, out_audio);
    api->close(b);

    /* a duplex reply reports the transcript of what it answers, once; a small buffer is refused */
    b = open_with(NULL, NULL);
    prepare_duplex(b);
    step(b, loud, 0, &samples, &eot, &kv);
    in.audio.ptr = quiet;
    CHECK(api->duplex_prefill(b, &in) == OMNI_OK, "prefill the quiet chunk that starts a reply");
    char tsmall[4];
    POINT_OUT(&out, tsmall, sizeof tsmall);
    CHECK(api->duplex_generate(b, &out) == OMNI_ERR_BUFFER_TOO_SMALL && out.transcript_len == 23,
          "a small transcript buffer is refused with the size needed (%zu)", out.transcript_len);
    char tbig[64];
    out.transcript_buf = tbig;
    out.transcript_cap = sizeof tbig;
    CHECK(api->duplex_generate(b, &out) == OMNI_OK && out.kind == OMNI_OUTPUT_SPEAK && out.transcript_len == 23 &&
              memcmp(tbig, "(1.0 seconds of speech)", 23) == 0 && out.output_audio_tokens == 12,
          "the reply's first output carries it, and 12 speech tokens for 0.5 s");
    CHECK(api->duplex_drain(b, &out) == OMNI_OK && out.transcript_len == 0 && out.output_audio_tokens == 13,
          "the drain does not repeat it (%zu), 13 more speech tokens (%u)", out.transcript_len, out.output_audio_tokens);
    while (api->duplex_drain(b, &out) == OMNI_OK && out.kind != OMNI_OUTPUT_NONE) {
    }
    api->duplex_finalize(b);
    api->close(b);

    /* revision=0: a 1.0 backend, which ignores every 1.1 field */
    b = open_with("revision", "0");
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && !(info.capabilities & OMNI_CAP_TRANSCRIPTS) && info.settings_len == 0 &&
              info.abi_revision == 0,
          "revision=0 reports no 1.1 capability");
    api->close(b);

    /* revision 1.2: the preferred duplex chunk, 0 (one second) unless set */
    b = open_with("chunk_ms", "200");
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(api->info(b, &info) == OMNI_OK && info.abi_revision == 3 && info.step_samples == 3200,
          "1.2 info: step_samples %u for chunk_ms=200", info.step_samples);
    api->close(b);
    {
        omni_option both[2] = {{S("revision"), S("1")}, {S("chunk_ms"), S("200")}};
        b = NULL;
        char err[256];
        CHECK(api->open(both, 2, &b, err, sizeof err) == OMNI_OK, "open as a 1.1 backend with a preferred chunk");
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        CHECK(api->info(b, &info) == OMNI_OK && info.abi_revision == 1 && info.step_samples == 0,
              "revision=1 reports a 1.1 backend, with no preferred chunk (%u)", info.step_samples);
        api->close(b);
    }
    /* a caller of revision 1.1: the info struct ends before step_samples, which stays untouched */
    b = open_with("chunk_ms", "200");
    memset(&info, 0, sizeof info);
    info.step_samples = 7;
    info.struct_size = (uint32_t)offsetof(omni_backend_info, step_samples);
    CHECK(api->info(b, &info) == OMNI_OK && info.step_samples == 7 && info.settings_len > 0,
          "a 1.1-sized info is filled up to its size (step_samples %u)", info.step_samples);
    api->close(b);

    abi_1_3();

    printf("1..%d\n", count);
    dlclose(lib);
    return failures ? 1 : 0;
}
