//! The roles one binary plays. The pool and its BackendActors run in every role; a gateway and a
//! replica add a queue and one SessionActor per client, a node a Lender (its pool's queue) and one
//! actor per gateway link:
//!
//! - [`gateway`]: one gateway on its own: its queue in memory, its workers here and on the
//!   nodes it lists (`[[nodes]]`);
//! - [`replica`]: one of several gateways sharing a queue and their nodes' workers through a
//!   store (`[cluster]`);
//! - [`node`]: a host serving its workers to gateways (`omni-gateway node`).
//!
//! A gateway and a replica both serve clients over HTTP ([`crate::http`]); what they hand it
//! is a [`Serving`].

pub(crate) mod gateway;
pub mod node;
pub(crate) mod replica;

use std::sync::Arc;

use omni_actors::messages::pool::PoolPort;
use omni_actors::messages::queue::QueuePort;
use omni_actors::observe::events::Subscribers;
use omni_actors::observe::recording::{RecorderSpawner, RecordingLimits};
use omni_actors::session::Registry;
use omni_actors::status::StatusQuery;
use omni_actors::worker::BackendLimits;

use crate::auth::Keys;
use crate::config::Config;
use omni_transports::incoming::IncomingBudget;
use omni_transports::limits::FragmentBudget;

/// What a role that serves clients gives the HTTP server: its actors, and what every
/// connection shares. Cheap to clone.
#[derive(Clone)]
pub struct Serving {
    pub config: Arc<Config>,
    /// The queue sessions and routes reach: this process's, or the cluster's.
    pub queue: QueuePort,
    /// The role's status port: its workers as every role shows them, and whether it can serve
    /// (a gateway's pool; a replica's cluster queue, which adds the store's view).
    pub status: actix::Recipient<StatusQuery>,
    pub pool: PoolPort,
    pub registry: Arc<Registry>,
    pub recorder: Option<RecorderSpawner>,
    /// Every subscriber of session and worker events (the recorder among them).
    pub subscribers: Subscribers,
    pub keys: Keys,
    /// What every connection's unfinished fragmented messages may hold together.
    pub fragments: Arc<FragmentBudget>,
    /// What every connection's session may have read and not handled, together.
    pub incoming: Arc<IncomingBudget>,
    /// The voice activity detectors of the OpenAI-shaped dialects' sessions (`[vad]`).
    pub voice: omni_actors::edge::vad::SharedDetectors,
    /// The gateway's recogniser (`[transcription]`), when on.
    pub transcription: Option<omni_actors::messages::transcribe::TranscriptionPort>,
    /// The decider beside voices that call no tools (`[delegation]`), when on.
    pub delegation: Option<omni_actors::messages::delegate::DelegationPort>,
    /// WebRTC calls in progress (`[webrtc]`), when on.
    pub calls: Option<Arc<omni_transports::webrtc::Calls>>,
    /// The webhooks, for what is told to them outside a session (`realtime.call.incoming`).
    pub webhooks: crate::observe::webhooks::Announcer,
    /// SIP calls offered to the app and not yet accepted, and those it accepted (`[sip]`).
    pub sip_calls: Arc<omni_transports::sip::offers::Offers>,
    /// Whether the SIP edge reads its port (`[sip]`; not started with SIP off).
    pub sip: Arc<omni_transports::sip::SipLiveness>,
}

/// Starts the actors of the role the configuration names: a replica with `[cluster]`, else a
/// single gateway. Must run inside an actix system.
pub fn serve(config: Arc<Config>) -> Result<Serving, crate::store::redis::StoreError> {
    match &config.cluster {
        Some(_) => replica::start(config),
        None => Ok(gateway::start(config)),
    }
}

/// What every serving role shares: the recorder, the subscribers, the keys, the registry.
struct Common {
    recorder: Option<RecorderSpawner>,
    subscribers: Subscribers,
    webhooks: crate::observe::webhooks::Announcer,
    keys: Keys,
    fragments: Arc<FragmentBudget>,
    incoming: Arc<IncomingBudget>,
    registry: Arc<Registry>,
    voice: omni_actors::edge::vad::SharedDetectors,
    transcription: Option<omni_actors::messages::transcribe::TranscriptionPort>,
}

impl Common {
    fn start(config: &Config) -> Common {
        let recorder = config.recording.enabled.then(|| {
            let r = &config.recording;
            let limits = RecordingLimits {
                max_lag: (r.max_lag_mb * 1048576.0) as usize,
                max_total_lag: (r.max_total_lag_mb * 1048576.0) as usize,
                max_session: (r.max_session_mb * 1048576.0) as u64,
                max_rate: (r.max_rate_mb_s * 1048576.0) as usize,
                min_free: (r.min_free_gb * 1073741824.0) as u64,
            };
            RecorderSpawner::new(r.dir.clone(), limits)
        });
        let webhooks = crate::observe::webhooks::Announcer::start(&config.webhooks);
        let subscribers = crate::observe::register(recorder.as_ref(), config.usage.as_ref(), &webhooks);
        let keys = Keys::new(config.api_keys.clone(), config.admin_key.clone())
            .with_client_secrets(config.webrtc.max_client_secrets, config.webrtc.max_client_secrets_per_key);
        let fragments = FragmentBudget::new((config.server.max_fragment_buffer_mb * 1048576.0) as usize);
        let incoming = IncomingBudget::new((config.server.max_incoming_total_mb * 1048576.0) as usize);
        let voice = omni_dialects::vad::detectors(&config.vad);
        let transcription = config.transcription.as_ref().map(omni_dialects::transcription::start);
        let registry = Registry::new();
        Common { recorder, subscribers, webhooks, keys, fragments, incoming, registry, voice, transcription }
    }

    fn serving(
        self,
        config: Arc<Config>,
        queue: QueuePort,
        pool: PoolPort,
        status: actix::Recipient<StatusQuery>,
    ) -> Serving {
        // A pool decider's sessions wait in this role's queue.
        let delegation = config.delegation.as_ref().map(|d| {
            log::info!("{}", d.describe());
            omni_backend_host::decider::start(d, &queue)
        });
        Serving {
            queue,
            status,
            pool,
            registry: self.registry,
            recorder: self.recorder,
            subscribers: self.subscribers,
            keys: self.keys,
            fragments: self.fragments,
            incoming: self.incoming,
            voice: self.voice,
            transcription: self.transcription,
            delegation,
            calls: config.webrtc.enabled.then(|| omni_transports::webrtc::Calls::new(config.webrtc.clone())),
            webhooks: self.webhooks,
            sip_calls: Default::default(),
            sip: Default::default(),
            config,
        }
    }
}

/// The pool's setups of this host's `[[workers]]`.
pub fn worker_setups(config: &Config) -> Vec<omni_actors::messages::pool::WorkerSetup> {
    let open_timeout = std::time::Duration::from_secs_f64(config.limits.open_timeout_s);
    config
        .workers
        .iter()
        .map(|w| omni_actors::messages::pool::WorkerSetup {
            name: w.name.clone(),
            backend: w.source.label(),
            modes: w.modes.clone(),
            factory: omni_backend_host::factory(w, open_timeout),
            node: None,
        })
        .collect()
}

/// The limits every BackendActor runs under.
pub fn backend_limits(config: &Config) -> BackendLimits {
    BackendLimits {
        max_pending_chunks: config.limits.max_pending_chunks,
        step_timeout: config.step_timeout(),
        open_timeout: std::time::Duration::from_secs_f64(config.limits.open_timeout_s),
    }
}
