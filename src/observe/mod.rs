//! What observes sessions and workers in the server: every subscriber of session and worker
//! events, registered in one place ([`register`]): the recorder,
//! usage accounting and webhooks, each when the config turns it on. A new actor that
//! observes sessions is one more line here (docs/extending.md).

use std::sync::Arc;

use omni_actors::observe::Usage;
use omni_actors::observe::events::{Subscriber, Subscribers};
use omni_actors::observe::recording::{Recorder, RecorderSpawner};

use webhooks::Announcer;

pub(crate) mod recordings;
pub mod webhooks;

/// The subscribers a configuration turns on: the recorder, usage files in `usage` (`[usage]`),
/// and `webhooks` (started). Must run inside an actix system (they start their actors).
pub fn register(
    recorder: Option<&RecorderSpawner>,
    usage: Option<&std::path::PathBuf>,
    webhooks: &Announcer,
) -> Subscribers {
    let mut list: Vec<Arc<dyn Subscriber>> = Vec::new();
    if let Some(spawner) = recorder {
        list.push(Arc::new(Recorder::new(spawner.clone())));
    }
    if let Some(dir) = usage {
        list.push(Arc::new(Usage::start(dir.clone())));
    }
    for hook in webhooks.subscribers() {
        list.push(Arc::new(hook));
    }
    Subscribers::new(list)
}
