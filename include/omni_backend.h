/*
 * omni_backend.h - the omni-gateway backend ABI, version 1 (revision 1.3).
 *
 * A backend is a shared library (or a statically linked object) that exports
 *
 *     uint32_t                  omni_backend_abi_version(void);
 *     const omni_backend_api   *omni_backend_get_api(uint32_t abi_version);
 *
 * The gateway first asks for the version, then for the function table of that
 * version. Every other entry point is reached through the table, so two
 * backends never clash on symbol names.
 *
 * Rules that hold for every function:
 *  - Plain C types only. No C++ exception and no Rust panic may cross this boundary.
 *  - Text is UTF-8 with an explicit length (omni_str); it is not NUL-terminated.
 *  - Audio is float32 mono PCM: 16 kHz into the backend, 24 kHz out of it
 *    (the rates a backend really uses are reported by info()).
 *  - Every buffer belongs to the caller. A backend reads input buffers only during
 *    the call and never keeps a pointer to them; it writes output only into the
 *    buffers the caller passes, never more than their stated capacity.
 *  - Every struct starts with `struct_size`, set by whoever fills the struct in
 *    (the caller for inputs and for output structs it hands over). A struct may grow
 *    at its end in a later minor revision; a backend accepts any struct_size at least
 *    as large as the version-1 size and ignores what it does not know.
 *  - Errors are status codes; the text of the last error on a handle is available
 *    from last_error(). Context exhaustion has its own code.
 *
 * Revision 1.1 grew some structs at their end (marked "since 1.1"): generation settings by
 * name, transcripts of the user's speech, audio token counts, and the rule of a chat turn's
 * context. A 1.0 backend works unchanged: it ignores what its struct_size does not cover,
 * the gateway zeroes output fields before a call, and zero means "not reported".
 * Revision 1.2 added one field to the info: the duplex chunk a backend answers best on.
 * Revision 1.3 is for agents (marked "since 1.3"): the session's tools and the choice among
 * them (OMNI_CAP_TOOLS), function calls as a kind of output, the model's calls and their
 * results as messages of a conversation, turn-mode answers between the steps of a duplex
 * session, and turns that only prefill (the gateway replays a conversation after a reset).
 * The gateway sends none of it to a backend that reports a lower abi_revision: the client
 * hears that tools are not supported, calls and results are written into messages as
 * text, a duplex session takes no turn, and a replay waits for the next turn's messages.
 *
 * Threads: a handle is owned by the thread that opened it. Functions marked
 * OWNER THREAD ONLY may be called only from that thread, one at a time.
 * Functions marked ANY THREAD may be called from any thread at any moment,
 * including while the owner thread is inside a step; they must return promptly.
 */
#ifndef OMNI_BACKEND_H
#define OMNI_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OMNI_BACKEND_ABI_VERSION 1u
#define OMNI_BACKEND_ABI_REVISION 3u /* 1.3: the "since 1.1" to "since 1.3" fields below */

#if defined(_WIN32)
#define OMNI_EXPORT __declspec(dllexport)
#else
#define OMNI_EXPORT __attribute__((visibility("default")))
#endif

/* ---- status codes ------------------------------------------------------ */
typedef int32_t omni_status;
#define OMNI_OK 0
#define OMNI_ERR_INVALID_ARGUMENT 1 /* NULL, empty or malformed argument, bad struct_size */
#define OMNI_ERR_BAD_STATE 2        /* call not allowed in the handle's current state      */
#define OMNI_ERR_INFERENCE 3        /* the model failed on this input; the session may go on */
#define OMNI_ERR_CONTEXT_FULL 4     /* the KV cache reached the context size                 */
#define OMNI_ERR_INTERRUPTED 5      /* the call was cut short by interrupt()                 */
#define OMNI_ERR_UNSUPPORTED 6      /* the backend lacks this capability                     */
#define OMNI_ERR_BUFFER_TOO_SMALL 7 /* output did not fit; *_len say what is needed, retry   */
#define OMNI_ERR_OPEN_FAILED 8      /* open() could not create a handle                      */
#define OMNI_ERR_INTERNAL 9         /* anything else                                         */

/* ---- plain data -------------------------------------------------------- */
typedef struct omni_backend omni_backend; /* opaque handle */

typedef struct {
    const char *ptr; /* UTF-8, may be NULL when len == 0 */
    size_t len;      /* bytes */
} omni_str;

typedef struct {
    const uint8_t *ptr;
    size_t len; /* bytes */
} omni_bytes;

typedef struct {
    const float *ptr;
    size_t len; /* samples */
} omni_pcm;

typedef struct {
    omni_str key;
    omni_str value;
} omni_option;

/* ---- info -------------------------------------------------------------- */
#define OMNI_CAP_VISION (1u << 0)        /* accepts JPEG frames / images        */
#define OMNI_CAP_SPEECH_OUTPUT (1u << 1) /* produces audio                      */
#define OMNI_CAP_DUPLEX (1u << 2)        /* duplex_* steps                      */
#define OMNI_CAP_TURN (1u << 3)          /* turn_* conversation mode            */
#define OMNI_CAP_TRANSCRIPTS (1u << 4)   /* since 1.1: reports transcripts of the user's speech */
#define OMNI_CAP_TOKEN_DETAILS (1u << 5) /* since 1.1: reports input_audio_tokens / output_audio_tokens */
#define OMNI_CAP_TOOLS (1u << 6)         /* since 1.3: calls the tools it is given (the "call" outputs) */

typedef struct {
    uint32_t struct_size;           /* set by the caller */
    uint32_t capabilities;          /* OMNI_CAP_* bits */
    uint32_t input_sample_rate;     /* Hz, 16000 */
    uint32_t output_sample_rate;    /* Hz, 24000 */
    uint32_t context_size;          /* tokens */
    uint32_t max_output_samples;    /* most samples one generate/drain call yields */
    uint32_t max_output_text_bytes; /* most text bytes one generate/drain call yields */
    uint32_t name_len;              /* bytes used in name */
    char name[64];                  /* UTF-8, not NUL-terminated */
    /* since 1.1 */
    uint32_t abi_revision;          /* the revision this backend implements: 3 for 1.3, 2 for 1.2,
                                     * 1 for 1.1 (a 1.0 backend leaves it 0) */
    uint32_t settings_len;          /* bytes used in settings */
    char settings[512];             /* the names of the generation settings this backend applies
                                     * from omni_session_config.settings and
                                     * omni_turn_input.settings, comma-separated ("top_p,top_k,seed") */
    /* since 1.2 */
    uint32_t step_samples;          /* the duplex chunk this backend answers best on, in input
                                     * samples: a backend that decides on every chunk (it has its
                                     * own voice activity detection) says 3200 (200 ms) and hears
                                     * the end of speech sooner. The gateway gathers audio from
                                     * clients that do not chunk it themselves (the OpenAI/Qwen
                                     * dialects, WebRTC calls) into whole multiples of it (clamped
                                     * to 1600..16000), at most a second a chunk; MiniCPM-o
                                     * clients are told it and may send any chunk of at least
                                     * 4000. A backend still takes any chunk size. 0: one second
                                     * (16000), as before 1.2. */
} omni_backend_info;

/* ---- sessions ---------------------------------------------------------- */
#define OMNI_SESSION_DUPLEX 1u /* one step per input chunk, listen or speak     */
#define OMNI_SESSION_TURN 2u   /* a conversation prefilled, then one answer      */

typedef struct {
    uint32_t struct_size;
    uint32_t kind;           /* OMNI_SESSION_* */
    omni_str system_prompt;  /* may be empty */
    omni_str voice;          /* a named voice, may be empty */
    omni_pcm ref_audio;      /* LLM reference audio, 16 kHz, may be empty */
    omni_pcm tts_ref_audio;  /* TTS reference audio, 16 kHz, may be empty */
    uint32_t max_new_tokens; /* 0 = backend default */
    uint32_t max_slice_nums; /* 0 = backend default (1); 1..9 */
    uint32_t force_listen_count; /* the first N duplex steps listen whatever they hear */
    float length_penalty;    /* 0 = backend default */
    float temperature;       /* negative = backend default */
    /* since 1.1 */
    const omni_option *settings; /* further generation settings the client gave, by name, as text
                                  * (top_p, top_k, repetition_penalty, presence_penalty, seed,
                                  * listen_prob_scale, ...): the gateway checked the values of the
                                  * settings it knows; a backend applies those it lists in info() */
    size_t n_settings;
    /* since 1.3 (read only by a backend with OMNI_CAP_TOOLS) */
    omni_str tools;       /* the functions the model may call, a JSON array (empty: none):
                           * [{"name": "get_time", "description": "...", "parameters": {JSON Schema}}] */
    omni_str tool_choice; /* "auto" (also when empty), "none", "required", or one tool's name:
                           * the model calls that tool */
} omni_session_config;

/* ---- duplex steps ------------------------------------------------------ */
#define OMNI_STEP_FORCE_LISTEN (1u << 0) /* this step must listen; ends current speech */

typedef struct {
    uint32_t struct_size;
    uint32_t flags;          /* OMNI_STEP_* */
    omni_pcm audio;          /* one chunk, 16 kHz, at least 1 sample */
    const omni_bytes *frames; /* JPEG frames, n_frames of them (may be NULL when 0) */
    size_t n_frames;
    uint32_t max_slice_nums; /* 0 = session default */
} omni_duplex_input;

#define OMNI_OUTPUT_NONE 0u   /* drain(): nothing more in this step */
#define OMNI_OUTPUT_LISTEN 1u /* the model listens */
#define OMNI_OUTPUT_SPEAK 2u  /* the model speaks: text and/or audio */

typedef struct {
    uint32_t struct_size;
    /* set by the caller */
    char *text_buf;
    size_t text_cap; /* bytes */
    float *audio_buf;
    size_t audio_cap; /* samples */
    /* set by the backend */
    uint32_t kind;          /* OMNI_OUTPUT_* */
    uint32_t end_of_turn;   /* 1 on the last speaking output of a turn */
    size_t text_len;        /* bytes written (or needed, with BUFFER_TOO_SMALL) */
    size_t audio_len;       /* samples written at the output rate (or needed) */
    uint64_t kv_length;     /* KV cache length after this output */
    uint32_t input_tokens;  /* tokens this step added from the input */
    uint32_t output_tokens; /* tokens this output added */
    uint32_t prefill_us;    /* time spent in prefill for this step */
    uint32_t generate_us;   /* time spent producing this output */
    /* since 1.1 */
    char *transcript_buf;   /* set by the caller; NULL: it wants no transcript */
    size_t transcript_cap;  /* bytes; too small: OMNI_ERR_BUFFER_TOO_SMALL with transcript_len
                             * set to the size needed, as for text and audio */
    size_t transcript_len;  /* set by the backend: a finished transcript of what the user said,
                             * up to this step (0 = none now); with OMNI_CAP_TRANSCRIPTS */
    uint32_t input_audio_tokens;  /* of input_tokens, those from audio (OMNI_CAP_TOKEN_DETAILS) */
    uint32_t output_audio_tokens; /* speech tokens of this output; output_tokens counts text */
    /* since 1.3 (OMNI_CAP_TOOLS) */
    uint32_t call;          /* 1: this output is (a piece of) a function call, not speech: text
                             * holds a piece of its arguments (JSON), and no audio comes with it */
    uint32_t call_name_len; /* on a call's first piece: bytes of the tool's name in call_name (a
                             * new call begins); 0 on the pieces that continue it */
    char call_name[64];     /* UTF-8, not NUL-terminated */
} omni_step_output;

/* ---- turn mode --------------------------------------------------------- */
#define OMNI_ROLE_SYSTEM 0u
#define OMNI_ROLE_USER 1u
#define OMNI_ROLE_ASSISTANT 2u
#define OMNI_ROLE_TOOL_CALL 3u   /* since 1.3: the model called the tool `name`; text: the arguments (JSON) */
#define OMNI_ROLE_TOOL_RESULT 4u /* since 1.3: what the call `call_id` gave back; text: the result */

typedef struct {
    uint32_t struct_size;
    uint32_t role;            /* OMNI_ROLE_* */
    omni_str text;            /* may be empty */
    const omni_bytes *images; /* JPEG/PNG images */
    size_t n_images;
    const omni_pcm *audios;   /* 16 kHz clips */
    size_t n_audios;
    /* since 1.3 */
    omni_str call_id;         /* TOOL_CALL and TOOL_RESULT: the call's id, which pairs them */
    omni_str name;            /* TOOL_CALL: the tool's name */
} omni_message;

#define OMNI_TURN_SPEECH (1u << 0)       /* produce audio with the text      */
#define OMNI_TURN_THINKING (1u << 1)     /* enable thinking                  */
#define OMNI_TURN_TTS_TEMPLATE (1u << 2) /* use the TTS template             */
#define OMNI_TURN_OMNI (1u << 3)         /* omni (mixed-modality) input mode */
#define OMNI_TURN_CONTINUE (1u << 4)     /* since 1.1: the messages continue the conversation the
                                          * backend holds (they are appended to its context).
                                          * Without it they are the whole conversation and replace
                                          * it: the backend starts from the session's prompt, and
                                          * may reuse the part of its context that matches.
                                          * (A 1.0 backend appends always; the gateway resets and
                                          * prepares it again before a replacing turn.) */
#define OMNI_TURN_PREFILL_ONLY (1u << 5) /* since 1.3: take the messages into the context and answer
                                          * nothing: turn_generate's first piece is done and empty.
                                          * The gateway replays a conversation so (after a reset,
                                          * or when the client changed it: a truncated answer, a
                                          * deleted item). */

/* Since 1.3 a duplex session also answers turns: between two steps (after duplex_finalize),
 * turn_prefill and turn_generate answer a typed message, a tool's result or a request to
 * speak first; the messages and the answer join the session's context, and the next duplex
 * step goes on from there. A 1.3 turn may also bring no message (n_messages 0): the model
 * answers the context as it stands (it speaks first, or goes on after a pause), and its
 * newest message may be a tool's result rather than the user's. */

typedef struct {
    uint32_t struct_size;
    uint32_t flags; /* OMNI_TURN_* */
    const omni_message *messages;
    size_t n_messages;
    uint32_t max_new_tokens; /* 0 = session default */
    uint32_t max_slice_nums; /* 0 = session default */
    float length_penalty;    /* 0 = session default */
    float temperature;       /* negative = session default */
    omni_pcm tts_ref_audio;  /* may be empty: the session's */
    /* since 1.1 */
    const omni_option *settings; /* further generation settings for this answer, by name */
    size_t n_settings;
    /* since 1.3 (OMNI_CAP_TOOLS) */
    omni_str tools;       /* for this answer only, as in omni_session_config; empty: the session's */
    omni_str tool_choice; /* for this answer only; empty: the session's */
} omni_turn_input;

typedef struct {
    uint32_t struct_size;
    /* set by the caller */
    char *text_buf;
    size_t text_cap;
    float *audio_buf;
    size_t audio_cap;
    /* set by the backend */
    uint32_t done;          /* 1: this is the last piece of the answer */
    uint32_t output_tokens; /* tokens in this piece */
    size_t text_len;
    size_t audio_len;
    uint64_t kv_length;
    uint32_t input_tokens;  /* tokens of the prefilled conversation (first piece) */
    uint32_t generate_us;
    /* since 1.1 */
    char *transcript_buf;   /* set by the caller; NULL: it wants no transcript */
    size_t transcript_cap;
    size_t transcript_len;  /* set by the backend on the first piece: the transcript of the audio
                             * in the conversation's newest user message (0 = none) */
    uint32_t input_audio_tokens;  /* of input_tokens, those from audio (first piece) */
    uint32_t output_audio_tokens; /* speech tokens of this piece; output_tokens counts text */
    /* since 1.3 (OMNI_CAP_TOOLS): as in omni_step_output */
    uint32_t call;
    uint32_t call_name_len;
    char call_name[64];
} omni_turn_output;

/* ---- the function table ------------------------------------------------ */
typedef struct omni_backend_api {
    uint32_t struct_size; /* sizeof(omni_backend_api) as the backend was built */
    uint32_t abi_version; /* OMNI_BACKEND_ABI_VERSION */

    /* ANY THREAD. Creates a handle from key/value options (the worker's
     * [workers.options]); the calling thread becomes its owner. On failure
     * returns OMNI_ERR_OPEN_FAILED or OMNI_ERR_INVALID_ARGUMENT and writes a
     * reason into err_buf (at most err_cap bytes, NUL-terminated when it fits). */
    omni_status (*open)(const omni_option *options, size_t n_options, omni_backend **out,
                        char *err_buf, size_t err_cap);
    /* OWNER THREAD ONLY. Frees the handle; NULL is ignored. */
    void (*close)(omni_backend *b);
    /* OWNER THREAD ONLY. Fills *out (out->struct_size set by the caller). */
    omni_status (*info)(omni_backend *b, omni_backend_info *out);
    /* OWNER THREAD ONLY. Copies the last error text (UTF-8) into buf, returns its
     * full length in bytes (which may exceed cap). */
    size_t (*last_error)(omni_backend *b, char *buf, size_t cap);

    /* OWNER THREAD ONLY. Starts a session (duplex or turn). */
    omni_status (*prepare)(omni_backend *b, const omni_session_config *config);
    /* OWNER THREAD ONLY. Ends the session and forgets everything it held. */
    omni_status (*reset)(omni_backend *b);

    /* OWNER THREAD ONLY. One duplex step: prefill one chunk, generate the step's
     * first output, drain until OMNI_OUTPUT_NONE, then finalize. When generate or
     * drain fails with anything but OMNI_ERR_BUFFER_TOO_SMALL the step is over: the
     * next call is duplex_prefill (OMNI_ERR_CONTEXT_FULL ends the session: reset). */
    omni_status (*duplex_prefill)(omni_backend *b, const omni_duplex_input *in);
    omni_status (*duplex_generate)(omni_backend *b, omni_step_output *out);
    omni_status (*duplex_drain)(omni_backend *b, omni_step_output *out);
    omni_status (*duplex_finalize)(omni_backend *b);

    /* OWNER THREAD ONLY. Turn mode: prefill a conversation, then call
     * turn_generate until a piece has done == 1. An error other than
     * OMNI_ERR_BUFFER_TOO_SMALL ends the answer; the next call is turn_prefill.
     * turn_prefill before an answer is done abandons the rest of that answer; in a 1.3
     * duplex session, so does duplex_prefill (the caller stopped reading an answer its user
     * interrupted between two pieces). */
    omni_status (*turn_prefill)(omni_backend *b, const omni_turn_input *in);
    omni_status (*turn_generate)(omni_backend *b, omni_turn_output *out);

    /* ANY THREAD. Cuts the step or piece in flight short (it returns
     * OMNI_ERR_INTERRUPTED). Without a call in flight it does nothing. */
    omni_status (*interrupt)(omni_backend *b);
    /* ANY THREAD. on != 0: the current speech ends and the next duplex step listens. */
    omni_status (*set_force_listen)(omni_backend *b, int32_t on);
    /* ANY THREAD. The current KV cache length in tokens. */
    uint64_t (*kv_length)(omni_backend *b);
} omni_backend_api;

/* ---- the exported entry points ----------------------------------------- */
typedef uint32_t (*omni_backend_abi_version_fn)(void);
typedef const omni_backend_api *(*omni_backend_get_api_fn)(uint32_t abi_version);

#define OMNI_BACKEND_ABI_VERSION_SYMBOL "omni_backend_abi_version"
#define OMNI_BACKEND_GET_API_SYMBOL "omni_backend_get_api"

#ifdef __cplusplus
}
#endif

#endif /* OMNI_BACKEND_H */
