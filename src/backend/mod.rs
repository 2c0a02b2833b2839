//! Backends at the edge: the C ABI (`include/omni_backend.h`) driven from Rust.

pub mod ffi;
mod sys;

use std::sync::Arc;

use omni_actors::backend::{Backend, BackendError};
use omni_actors::worker_thread::BackendFactory;

pub use ffi::{BackendApi, FfiBackend, FfiControl, LoadError};

use crate::config::{BackendSource, WorkerSpec};

/// The backend of one worker: where its table comes from and the options to open it with.
/// Called on the worker's own thread, which becomes the handle's owner.
pub fn factory(worker: &WorkerSpec) -> BackendFactory {
    let source = worker.source.clone();
    let options = worker.options.clone();
    Arc::new(move || {
        let api = match &source {
            BackendSource::Builtin => BackendApi::builtin(),
            BackendSource::Library(path) => BackendApi::load(path).map_err(|e| BackendError::Open(e.to_string()))?,
        };
        Ok(Box::new(api.open(&options)?) as Box<dyn Backend>)
    })
}
