//! The session's configuration over its life: what the client asked, what the backend was
//! last asked to take, what it took (what a refused reconfigure goes back to), the
//! reconfigures on their way, and which settings the client was told the model ignores.

use std::collections::VecDeque;

use omni_actors::domain::{BackendInfo, SessionSetup};
use omni_actors::protocol::{Inbound, ProtocolError};

use super::events::{Event, SessionView};
use super::{Conf, Driver, Phase};

pub struct Setup {
    /// The configuration asked for last.
    pub conf: Conf,
    /// The setup the backend was last asked to take.
    prepared: Option<SessionSetup>,
    /// The configuration the backend last took.
    in_force: Conf,
    /// The reconfigures in flight, oldest first.
    reconfigures: VecDeque<Reconf>,
    /// An update came before the session was created: `session.updated` follows `created`.
    update_pending: bool,
    /// Settings already reported to the client as not applied.
    reported: Vec<String>,
}

/// A reconfigure on its way to the backend.
struct Reconf {
    /// It owes the client a `session.updated`.
    announce: bool,
    /// The configuration it carries.
    conf: Conf,
    /// The session's own restore of the configuration in force after a refusal: the
    /// conversation is replayed once the backend took it.
    restore: bool,
}

impl Setup {
    pub fn new(conf: Conf) -> Setup {
        Setup {
            in_force: conf.clone(),
            conf,
            prepared: None,
            reconfigures: VecDeque::new(),
            update_pending: false,
            reported: Vec::new(),
        }
    }

    /// The backend must take a new setup: it differs from what it was last asked. Answers it.
    fn changed(&mut self) -> Option<SessionSetup> {
        let setup = self.conf.setup();
        if self.prepared.as_ref() == Some(&setup) {
            return None;
        }
        self.prepared = Some(setup.clone());
        Some(setup)
    }

    /// Whether a reconfigure is on its way to the backend.
    pub fn reconfigures_in_flight(&self) -> bool {
        !self.reconfigures.is_empty()
    }

    /// Settings of the configuration the backend does not apply and the client was not told of.
    fn unreported(&mut self, backend: &BackendInfo) -> Vec<String> {
        let fresh: Vec<String> =
            self.conf.unsupported(backend).into_iter().filter(|s| !self.reported.contains(s)).collect();
        self.reported.extend(fresh.iter().cloned());
        fresh
    }
}

impl Driver {
    fn session_view(&self) -> Box<SessionView> {
        let id = self.life.session_id.clone().unwrap_or_default();
        Box::new(SessionView { id, conf: self.setup.conf.clone(), backend: None })
    }

    /// The configuration from now on. The backend follows it if it must know (a reconfigure,
    /// and `session.updated` once it took it); else it is confirmed at once.
    pub(super) fn update(&mut self, conf: Conf) -> Result<(), ProtocolError> {
        self.setup.conf = conf;
        if self.life.phase != Phase::Active {
            self.setup.update_pending = true;
        } else if !self.reconfigure_if_changed(true) {
            let view = self.session_view();
            self.say(Event::SessionUpdated(view));
            self.report_unsupported();
        }
        Ok(())
    }

    /// The backend follows the configuration (mode, instructions, voice, tools...): when it
    /// changed, a reconfigure goes out (a response in progress ends, its output void) and the
    /// conversation is replayed; `announce` owes the client a `session.updated` once it took.
    pub(super) fn reconfigure_if_changed(&mut self, announce: bool) -> bool {
        let Some(setup) = self.setup.changed() else { return false };
        self.cut_response("client_cancelled");
        // Decisions asked under the old tools and instructions are void.
        self.forget_decisions();
        // A voice a decider serves keeps the conversation in its prompt (a handoff goes on).
        let setup = self.briefed(setup);
        self.reconfigure(setup, announce);
        self.resync();
        true
    }

    /// The backend is prepared again with the configuration as it is (its context was full).
    pub(super) fn prepare_again(&mut self) {
        let setup = self.setup.conf.setup();
        self.setup.prepared = Some(setup.clone());
        let setup = self.briefed(setup);
        self.reconfigure(setup, false);
    }

    pub(super) fn reconfigure(&mut self, setup: omni_actors::domain::SessionSetup, announce: bool) {
        self.intake.drop_step();
        let conf = self.setup.conf.clone();
        self.setup.reconfigures.push_back(Reconf { announce, conf, restore: false });
        self.commands.push(Inbound::Reconfigure(setup));
    }

    /// Tells the client, once per setting, which of its settings the model does not apply
    /// (they are passed on, and the model ignores them).
    pub(super) fn report_unsupported(&mut self) {
        let Some(backend) = self.life.backend.clone() else { return };
        for setting in self.setup.unreported(&backend) {
            if setting == "tools" && self.delegates() {
                // A decider calls them for this model.
                continue;
            }
            self.say(Event::Unsupported { setting, model: backend.name.clone() });
        }
    }

    /// The session has a worker: the backend is prepared with the configuration so far (its
    /// clients never initialise).
    pub fn queue_done(&mut self) {
        self.life.phase = Phase::Preparing;
        let setup = self.setup.conf.setup();
        self.setup.prepared = Some(setup.clone());
        self.commands.push(Inbound::Init(setup));
    }

    /// The session is created: `session.created` (and `session.updated` for an update that came
    /// before), then everything held, in order.
    pub fn created(&mut self, session_id: &str, backend: &BackendInfo) {
        self.life.session_id = Some(session_id.to_string());
        self.life.backend = Some(backend.clone());
        self.life.phase = Phase::Active;
        self.delegate_for(backend.tools);
        let mut view = self.session_view();
        view.backend = Some(backend.name.clone());
        self.events.push(Event::SessionCreated(view));
        if std::mem::take(&mut self.setup.update_pending) {
            let view = self.session_view();
            self.events.push(Event::SessionUpdated(view));
        }
        self.report_unsupported();
        let held = self.held.events.take();
        self.events.extend(held);
        let held = self.held.commands.take();
        self.commands.extend(held);
        self.setup.in_force = self.setup.conf.clone();
        self.reconfigure_if_changed(false);
        self.run_deferred(std::time::Instant::now());
    }

    /// The backend took the oldest reconfigure.
    pub fn reconfigured(&mut self, backend: &BackendInfo) {
        self.life.backend = Some(backend.clone());
        self.delegate_for(backend.tools);
        if let Some(Reconf { announce, conf, restore }) = self.setup.reconfigures.pop_front() {
            self.setup.in_force = conf;
            if announce {
                let view = self.session_view();
                self.events.push(Event::SessionUpdated(view));
                self.report_unsupported();
            }
            if restore {
                self.resync();
            }
        }
    }

    /// The backend refused the oldest reconfigure: the client hears the error, no
    /// `session.updated`, and the configuration in force is the previous one, which the session
    /// asks the backend for again (unless a newer reconfigure is on its way).
    pub fn reconfigure_failed(&mut self, e: &ProtocolError) {
        self.events.push(Event::Error(e.clone()));
        self.setup.reconfigures.pop_front();
        if !self.setup.reconfigures.is_empty() {
            return;
        }
        self.setup.conf = self.setup.in_force.clone();
        self.setup.prepared = Some(self.setup.conf.setup());
        // The session's restore answers like any reconfigure.
        let conf = self.setup.conf.clone();
        self.setup.reconfigures.push_back(Reconf { announce: false, conf, restore: true });
    }
}
