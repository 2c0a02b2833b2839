/* Sizes and offsets of the ABI structs as the C compiler lays them out. The server's
 * Rust bindings compare their own layout against this table in a unit test. */
#include "omni_backend.h"

#include <stddef.h>

static const size_t LAYOUT[] = {
    sizeof(omni_str), sizeof(omni_bytes), sizeof(omni_pcm), sizeof(omni_option),
    sizeof(omni_backend_info), offsetof(omni_backend_info, name),
    sizeof(omni_session_config), offsetof(omni_session_config, ref_audio), offsetof(omni_session_config, temperature),
    sizeof(omni_duplex_input), offsetof(omni_duplex_input, frames), offsetof(omni_duplex_input, max_slice_nums),
    sizeof(omni_step_output), offsetof(omni_step_output, kind), offsetof(omni_step_output, kv_length),
    offsetof(omni_step_output, generate_us),
    sizeof(omni_message), offsetof(omni_message, audios),
    sizeof(omni_turn_input), offsetof(omni_turn_input, max_new_tokens), offsetof(omni_turn_input, tts_ref_audio),
    sizeof(omni_turn_output), offsetof(omni_turn_output, done), offsetof(omni_turn_output, kv_length),
    offsetof(omni_turn_output, generate_us),
    sizeof(omni_backend_api), offsetof(omni_backend_api, open), offsetof(omni_backend_api, kv_length),
    /* since 1.1 */
    offsetof(omni_backend_info, abi_revision), offsetof(omni_backend_info, settings), offsetof(omni_session_config, settings),
    offsetof(omni_step_output, transcript_buf), offsetof(omni_step_output, output_audio_tokens),
    offsetof(omni_turn_input, settings), offsetof(omni_turn_output, transcript_buf),
    offsetof(omni_turn_output, output_audio_tokens),
    /* since 1.2 */
    offsetof(omni_backend_info, step_samples),
    /* since 1.3 */
    offsetof(omni_session_config, tools), offsetof(omni_session_config, tool_choice),
    offsetof(omni_step_output, call), offsetof(omni_step_output, call_name),
    offsetof(omni_message, call_id), offsetof(omni_message, name),
    offsetof(omni_turn_input, tools), offsetof(omni_turn_input, tool_choice),
    offsetof(omni_turn_output, call), offsetof(omni_turn_output, call_name),
};

size_t omni_abi_layout(size_t i) { return i < sizeof LAYOUT / sizeof LAYOUT[0] ? LAYOUT[i] : (size_t)-1; }
