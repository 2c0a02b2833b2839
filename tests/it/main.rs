//! The integration tests, one binary: the real server binary on loopback ports, real clients,
//! and the real parts each area needs (Redis, Chromium, the CPU models, the official SDKs),
//! started by the tests. A test whose part the machine lacks says so once and passes
//! (`common::needs`); `./test.sh` sets `OMNI_REQUIRE_ALL=1`, which makes it fail instead.
//!
//! - the sessions: `realtime` (the MiniCPM-o dialect), `legacy`, `openai_dialect`,
//!   `sdk_clients`, `agents` (the voice-agent frameworks), `fidelity` (each documented
//!   behaviour), `docs` (the docs match the server), `resume` (dropped clients taking their
//!   sessions back);
//! - limits and abuse: `bounds`, `hostile`, `security`, `fuzz_decoders`, `allocations`;
//! - operating it: `operations`, `cli`, `tools`, `extending` (subscribers, usage, webhooks);
//! - the house rules the compiler does not keep: `house_rules`;
//! - backends: `backend_abi`, `isolation`, `minicpmo_worker`, `vllm_omni`, `cascade` (the CPU model);
//! - roles: `nodes`, `cluster` (replicas on Redis);
//! - WebRTC calls: `webrtc` (aiortc); phone calls: `telephony` (a Twilio Media Streams client),
//!   `sip` (baresip, a real SIP user agent);
//!   a second audio edge written in the test: `pcm_edge`;
//! - the pages: `browser` (Chromium).

mod common;

mod agents;
mod allocations;
mod backend_abi;
mod bounds;
mod browser;
mod cascade;
mod cli;
mod cluster;
mod delegation;
mod docs;
mod extending;
mod fidelity;
mod fuzz_decoders;
mod fuzz_sip;
mod hostile;
mod house_rules;
mod isolation;
mod legacy;
mod minicpmo_worker;
mod nodes;
mod openai_dialect;
mod operations;
mod pcm_edge;
mod realtime;
mod resume;
mod scale;
mod sdk_clients;
mod security;
mod sip;
mod sip_hostile;
mod telephony;
mod tools;
mod transcription;
mod vad;
mod vllm_omni;
mod webrtc;
