//! The links replicas keep open to this node for grants ([`super::wire::ToNode::Standby`]),
//! by replica: when the store grants a freed worker to a ticket of a replica that keeps one,
//! the node attaches the worker to that link and tells the replica there
//! ([`super::wire::FromNode::Granted`]), instead of the grant going through the store's list
//! for that replica and the replica attaching with it (two hops fewer in a hand-over).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, oneshot};

use super::worker::NodeWorker;
use crate::link::wire::{AttachGrant, PushedGrant};

/// A grant for the link that takes it: attach `worker` with `grant`, tell the replica
/// `pushed`, and answer on `done` whether the replica was told.
pub struct Push {
    pub worker: Arc<NodeWorker>,
    pub grant: AttachGrant,
    pub pushed: PushedGrant,
    pub done: oneshot::Sender<bool>,
}

/// Each replica's idle links: (link id, where its grants go), oldest first.
type Links = HashMap<String, Vec<(u64, mpsc::Sender<Push>)>>;

/// The idle links kept open for grants, by replica name.
#[derive(Default)]
pub struct Pushes {
    links: Mutex<Links>,
}

/// A link's place in [`Pushes`], given up when dropped.
pub struct Registered<'a> {
    pushes: &'a Pushes,
    replica: String,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut links = self.pushes.lock();
        if let Some(list) = links.get_mut(&self.replica) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                links.remove(&self.replica);
            }
        }
    }
}

impl Pushes {
    fn lock(&self) -> MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Link `id` of `replica` is idle and takes grants from `rx` until the guard is dropped.
    pub fn register(&self, replica: &str, id: u64) -> (Registered<'_>, mpsc::Receiver<Push>) {
        let (tx, rx) = mpsc::channel(1);
        self.lock().entry(replica.to_string()).or_default().push((id, tx));
        (Registered { pushes: self, replica: replica.to_string(), id }, rx)
    }

    /// The replicas with an idle link, comma-separated (what the offer script is told).
    pub fn replicas(&self) -> Vec<String> {
        let links = self.lock();
        let mut names: Vec<String> = links.iter().filter(|(_, l)| !l.is_empty()).map(|(n, _)| n.clone()).collect();
        names.sort_unstable();
        names
    }

    /// Takes an idle link of `replica` out of the registry (the oldest: the others stay for
    /// the next grants).
    fn take(&self, replica: &str) -> Option<mpsc::Sender<Push>> {
        let mut links = self.lock();
        let list = links.get_mut(replica)?;
        let (_, tx) = (!list.is_empty()).then(|| list.remove(0))?;
        if list.is_empty() {
            links.remove(replica);
        }
        Some(tx)
    }

    /// Pushes a grant on an idle link of `replica`, trying the next when one has just ended or
    /// refuses; false when none took it (the caller hands the grant to the store instead).
    pub async fn push(&self, replica: &str, worker: &Arc<NodeWorker>, grant: AttachGrant, pushed: PushedGrant) -> bool {
        while let Some(tx) = self.take(replica) {
            let (done, answer) = oneshot::channel();
            let push = Push { worker: worker.clone(), grant: grant.clone(), pushed: pushed.clone(), done };
            if tx.send(push).await.is_ok() && matches!(answer.await, Ok(true)) {
                return true;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omni_actors::domain::Mode;
    use omni_actors::edge::backend::BackendError;

    fn grant() -> (AttachGrant, PushedGrant) {
        let attach = AttachGrant { ticket: 7, nonce: "n".into(), mode: Mode::Audio };
        let pushed =
            PushedGrant { ticket: 7, slot: "n1/w".into(), addr: "a:1".into(), nonce: "n".into(), mode: Mode::Audio };
        (attach, pushed)
    }

    #[tokio::test]
    async fn a_grant_goes_to_the_next_link_when_one_refuses_or_ended_and_fails_when_none_is_left() {
        let factory: omni_actors::worker::thread::BackendFactory =
            std::sync::Arc::new(|| Err(BackendError::Open("no backend in this test".into())));
        let worker = NodeWorker::start("w".into(), vec![Mode::Audio], "test".into(), factory);
        let pushes = Pushes::default();
        // Link 1 ended (its receiver dropped), link 2 refuses the grant, link 3 takes it.
        let (r1, rx1) = pushes.register("g1", 1);
        drop(rx1);
        let (r2, mut rx2) = pushes.register("g1", 2);
        let (r3, mut rx3) = pushes.register("g1", 3);
        tokio::spawn(async move {
            let push = rx2.recv().await.unwrap();
            let _ = push.done.send(false);
        });
        let taken = tokio::spawn(async move {
            let push = rx3.recv().await.unwrap();
            let _ = push.done.send(true);
            push.pushed.ticket
        });
        let (attach, pushed) = grant();
        assert!(pushes.push("g1", &worker, attach.clone(), pushed.clone()).await);
        assert_eq!(taken.await.unwrap(), 7);
        assert!(pushes.replicas().is_empty(), "every link of g1 was taken");
        // None left (and none for another replica): the caller hands the grant to the store.
        assert!(!pushes.push("g1", &worker, attach.clone(), pushed.clone()).await);
        assert!(!pushes.push("g2", &worker, attach, pushed).await);
        drop((r1, r2, r3));
    }

    #[test]
    fn links_are_listed_by_replica_while_registered_and_taken_oldest_first() {
        let pushes = Pushes::default();
        assert!(pushes.replicas().is_empty());
        let (g2, _rx2) = pushes.register("g2", 2);
        let (first, _rx1) = pushes.register("g1", 1);
        let (second, _rx3) = pushes.register("g1", 3);
        assert_eq!(pushes.replicas(), ["g1", "g2"]);
        drop(first);
        // Link 3 is what is left of g1; taking it empties g1.
        assert!(pushes.take("g1").is_some());
        assert!(pushes.take("g1").is_none());
        assert_eq!(pushes.replicas(), ["g2"]);
        drop(second);
        drop(g2);
        assert!(pushes.replicas().is_empty());
    }
}
