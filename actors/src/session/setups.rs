//! The setups a session asked its backend to take, and the last one it took, as a plain
//! struct: a reconfigure the backend refuses leaves the session on the setup it had (asked
//! again), never unprepared. Setups are taken or refused in the order they were asked.

use std::collections::VecDeque;

use crate::domain::SessionSetup;

#[derive(Debug, Default)]
pub(super) struct Setups {
    /// Asked and not yet answered, oldest first.
    asked: VecDeque<SessionSetup>,
    /// The last the backend took.
    taken: Option<SessionSetup>,
}

impl Setups {
    /// A setup is asked of the backend (the first prepare, or a reconfigure).
    pub(super) fn asked(&mut self, setup: SessionSetup) {
        self.asked.push_back(setup);
    }

    /// The oldest setup asked and not yet answered (asked again of the next worker when its
    /// worker had no room for it).
    pub(super) fn pending(&self) -> Option<&SessionSetup> {
        self.asked.front()
    }

    /// The backend took the oldest setup asked.
    pub(super) fn took(&mut self) {
        if let Some(setup) = self.asked.pop_front() {
            self.taken = Some(setup);
        }
    }

    /// The backend refused the oldest setup asked, and holds none now. Returns the setup to
    /// ask again: the last it took, unless a newer setup is already on its way (it decides)
    /// or it never took one (the first prepare failed: the client may try again).
    pub(super) fn refused(&mut self) -> Option<SessionSetup> {
        self.asked.pop_front();
        if !self.asked.is_empty() {
            return None;
        }
        let taken = self.taken.clone()?;
        self.asked.push_back(taken.clone());
        Some(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::SessionKind;

    fn setup(instructions: &str) -> SessionSetup {
        let mut s = SessionSetup::new(SessionKind::Duplex);
        s.system_prompt = instructions.into();
        s
    }

    #[test]
    fn a_refused_reconfigure_asks_again_for_the_setup_taken_before() {
        let mut s = Setups::default();
        s.asked(setup("a"));
        s.took();
        s.asked(setup("b"));
        assert_eq!(s.refused(), Some(setup("a")));
        // The restore is taken; a later refusal goes back to it again.
        s.took();
        s.asked(setup("c"));
        assert_eq!(s.refused().map(|x| x.system_prompt), Some("a".into()));
    }

    #[test]
    fn a_refusal_with_a_newer_setup_on_its_way_waits_for_that_one() {
        let mut s = Setups::default();
        s.asked(setup("a"));
        s.took();
        s.asked(setup("b"));
        s.asked(setup("c"));
        assert_eq!(s.refused(), None);
        s.took();
        s.asked(setup("d"));
        assert_eq!(s.refused(), Some(setup("c")));
    }

    #[test]
    fn a_refused_first_prepare_has_nothing_to_go_back_to() {
        let mut s = Setups::default();
        s.asked(setup("a"));
        assert_eq!(s.refused(), None);
    }
}
