//! omni-backend-host: what a worker runs, behind the actors' [`Backend`] trait. The C ABI
//! (`include/omni_backend.h`) driven from Rust, on the worker's thread (`ffi.rs`) or in a child
//! process (`process.rs` in the gateway, `host.rs` in the child, `ipc.rs` between them); a worker
//! on a node (`remote.rs`, over the [`link`]); a MiniCPM-o model worker over its own protocol
//! (`minicpmo.rs`); a session slot of a vLLM-Omni server (`vllm_omni/`). Its sections of
//! `config.toml` are its own: `[[workers]]` ([`workers`]) and `[[nodes]]` ([`link::config`]);
//! [`capacity`] checks what the workers ask of the host; [`decider`] is `[delegation]`, the
//! text model that calls tools for a voice that calls none. It depends on the actors crate and the
//! ABI's Rust mirror only. (The links a cluster's replica keeps open to its nodes, on which they
//! push their grants, are [`link::standby`].)

pub mod capacity;
mod chunk_text;
pub mod decider;
pub mod ffi;
pub mod host;
pub mod ipc;
pub mod link;
pub mod minicpmo;
pub mod process;
pub mod remote;
pub mod vllm_omni;
pub mod workers;

mod sys;
mod ws_client;

use std::sync::Arc;
use std::time::Duration;

use omni_actors::edge::backend::{Backend, BackendError};
use omni_actors::edge::backend::{BackendFactory, Opener};
use omni_actors::observe::metrics::metrics;

pub use ffi::{BackendApi, FfiBackend, FfiControl, LoadError};
pub use process::{HostSpec, ProcessBackend};

use crate::link::config::NodeLink;
use crate::workers::{BackendSource, Isolation, WorkerSpec};

/// The backend of one worker: where its table comes from and the options to open it with.
/// Called on the worker's own thread, which becomes the handle's owner (with process
/// isolation, the owner of the handle to the child that holds the backend). A child still
/// opening after `open_timeout` is killed.
pub fn factory(worker: &WorkerSpec, open_timeout: Duration) -> BackendFactory {
    let source = worker.source.clone();
    let options = worker.options.clone();
    if let BackendSource::MinicpmoWorker(url) = &source {
        let (url, name, options) = (url.clone(), worker.name.clone(), options.clone());
        return BackendFactory::new(move || {
            Ok(Box::new(minicpmo::MinicpmoBackend::open(&name, &url, &options)?) as Box<dyn Backend>)
        });
    }
    if let BackendSource::VllmOmni(url) = &source {
        let (url, name) = (url.clone(), worker.name.clone());
        return BackendFactory::new(move || {
            Ok(Box::new(vllm_omni::VllmOmniBackend::open(&name, &url, &options)?) as Box<dyn Backend>)
        });
    }
    match worker.isolation {
        Isolation::Thread => {
            let quick = runs_inline(worker);
            let factory = BackendFactory::new(move || {
                let api = match &source {
                    BackendSource::Library(path) => {
                        BackendApi::load(path).map_err(|e| BackendError::Open(e.to_string()))?
                    }
                    _ => BackendApi::builtin(),
                };
                Ok(Box::new(api.open(&options)?) as Box<dyn Backend>)
            });
            if quick { factory.quick() } else { factory }
        }
        Isolation::Process => {
            let spec = HostSpec {
                name: worker.name.clone(),
                library: match &source {
                    BackendSource::Library(path) => Some(path.clone()),
                    _ => None,
                },
                options,
                open_timeout,
            };
            BackendFactory::new(move || {
                let exe = process::host_program()?;
                Ok(Box::new(ProcessBackend::spawn(&exe, &spec)?) as Box<dyn Backend>)
            })
        }
    }
}

/// The built-in reference backend's options that make a call wait: pacing (`step_ms`,
/// `token_ms`), a slow open (`open_ms`) and the hangs of fault injection. Without them every call
/// returns in microseconds, and its BackendActor runs them itself
/// ([`omni_actors::worker::WorkerThread::here`]) instead of two threads per worker.
const REFERENCE_WAITS: [&str; 5] = ["step_ms", "token_ms", "open_ms", "hang_at_step", "interrupt_hang_ms"];

/// The worker's backend is quick: the built-in reference backend, on a thread, with none of the
/// options that make it wait. Its BackendActor opens it and runs its calls inline.
pub fn runs_inline(worker: &WorkerSpec) -> bool {
    matches!(worker.source, BackendSource::Builtin)
        && matches!(worker.isolation, Isolation::Thread)
        && worker.options.iter().all(|(key, value)| !REFERENCE_WAITS.contains(&key.as_str()) || value.trim() == "0")
}

/// Worker `worker` of a node, attached over the network (see [`remote`]). `gateway` names
/// this gateway in the node's logs.
pub fn node_factory(link: NodeLink, worker: String, gateway: String) -> BackendFactory {
    BackendFactory::new(move || {
        Ok(Box::new(remote::RemoteBackend::attach(&link, &worker, &gateway, None)?) as Box<dyn Backend>)
    })
}

/// The worker a cluster's store granted to ticket `grant.ticket`: the link the node pushed the
/// grant on (one `standby` keeps open to it), open already; or a factory that attaches a link
/// to its node with the grant's nonce (`link` carries the token, TLS and heartbeat settings).
pub fn grant_opener(
    link: NodeLink,
    grant: &omni_actors::edge::coordinator::Grant,
    gateway: String,
    standby: Arc<crate::link::standby::Standby>,
) -> Opener {
    let mut link = link;
    link.name = grant.slot.split_once('/').map_or(grant.slot.as_str(), |(node, _)| node).to_string();
    link.address = grant.addr.clone();
    if link.server_name.is_empty() {
        let host = grant.addr.rsplit_once(':').map_or(grant.addr.as_str(), |(host, _)| host);
        link.server_name = host.trim_start_matches('[').trim_end_matches(']').to_string();
    }
    let worker = grant.worker().to_string();
    let signed = link.replica.as_ref().is_some_and(|replica| {
        crate::link::grant::verify(replica.grant_key(), &grant.slot, &grant.addr, &grant.nonce, &grant.sig)
    });
    if !signed {
        // Whatever put it there (a forged entry in the store) learns nothing: nothing is dialled.
        metrics().grants_refused.inc();
        // Said once in a while at most, its fields clipped (whoever wrote it chose them); the
        // ticket's worker hears the reason without them.
        if let Some(more) = omni_actors::observe::gated("cluster_unsigned_grant") {
            let clip = |s: &str| s.chars().take(64).collect::<String>().escape_debug().to_string();
            log::warn!(
                "cluster: ticket {}: the grant of {} at {} is not signed by its node: not dialled (a node whose \
                 [node] token did not issue this replica's [cluster] credential, or a grant someone else wrote into \
                 the store){more}",
                grant.ticket,
                clip(&grant.slot),
                clip(&grant.addr)
            );
        }
        let why = format!("ticket {}: its grant is not signed by its node: not dialled", grant.ticket);
        return Opener::Factory(BackendFactory::new(move || Err(BackendError::Unavailable(why.clone()))));
    }
    if let Some(backend) = remote::RemoteBackend::pushed(&link, &worker, &grant.nonce, &standby) {
        return Opener::Open(Box::new(backend));
    }
    let attach = crate::link::wire::AttachGrant { ticket: grant.ticket, nonce: grant.nonce.clone(), mode: grant.mode };
    // Through the store: links are kept open to the node (watched above) for the next ones.
    Opener::Factory(BackendFactory::new(move || {
        let backend = remote::RemoteBackend::attach(&link, &worker, &gateway, Some(attach.clone()))?;
        Ok(Box::new(backend) as Box<dyn Backend>)
    }))
}
