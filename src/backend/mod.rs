//! Backends at the edge: the C ABI (`include/omni_backend.h`) driven from Rust, on the
//! worker's thread (`ffi.rs`) or in a child process (`process.rs` in the gateway,
//! `host.rs` in the child, `ipc.rs` between them).

pub mod ffi;
pub mod host;
mod ipc;
pub mod process;
mod sys;

use std::sync::Arc;
use std::time::Duration;

use omni_actors::backend::{Backend, BackendError};
use omni_actors::worker_thread::BackendFactory;

pub use ffi::{BackendApi, FfiBackend, FfiControl, LoadError};
pub use process::{HostSpec, ProcessBackend};

use crate::config::{BackendSource, Isolation, WorkerSpec};

/// The backend of one worker: where its table comes from and the options to open it with.
/// Called on the worker's own thread, which becomes the handle's owner (with process
/// isolation, the owner of the handle to the child that holds the backend). A child still
/// opening after `open_timeout` is killed.
pub fn factory(worker: &WorkerSpec, open_timeout: Duration) -> BackendFactory {
    let source = worker.source.clone();
    let options = worker.options.clone();
    match worker.isolation {
        Isolation::Thread => Arc::new(move || {
            let api = match &source {
                BackendSource::Builtin => BackendApi::builtin(),
                BackendSource::Library(path) => {
                    BackendApi::load(path).map_err(|e| BackendError::Open(e.to_string()))?
                }
            };
            Ok(Box::new(api.open(&options)?) as Box<dyn Backend>)
        }),
        Isolation::Process => {
            let spec = HostSpec {
                name: worker.name.clone(),
                library: match &source {
                    BackendSource::Builtin => None,
                    BackendSource::Library(path) => Some(path.clone()),
                },
                options,
                open_timeout,
            };
            Arc::new(move || {
                let exe = process::host_program().map_err(BackendError::Open)?;
                Ok(Box::new(ProcessBackend::spawn(&exe, &spec)?) as Box<dyn Backend>)
            })
        }
    }
}
