//! A connection's incoming messages, bounded by what its session has handled.
//!
//! The edge reads a client's messages as they arrive and hands them to its session, whose
//! work on each (parsing, decoding the audio, the dialect) costs more than reading it. A gateway
//! past its ceiling would read on while every session falls behind, holding what clients sent in
//! memory without a bound: at 10,000 sessions on two cores, 5 GB of unhandled messages in 30 s.
//! [`Backlog`] counts the bytes handed to the session and not yet handled by it; past
//! `max_bytes` the [`Gated`] request body stops yielding, so the HTTP layer stops reading the
//! socket (it buffers a few KB at most) and TCP's flow control makes the client wait. Nothing is
//! dropped; the client's sends slow down to what its session handles.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use actix::prelude::Stream;
use futures_util::task::AtomicWaker;
use omni_actors::edge::client::{FromClient, Handled, Receipt};
use omni_actors::observe::metrics::metrics;

use super::SessionPort;

/// What every connection's sessions have been handed and have not handled yet, together: past
/// `max_bytes` a connection with a message of its own waiting reads no more until it is handled
/// (one with none may always hand one, so that every session goes on).
#[derive(Debug)]
pub struct IncomingBudget {
    waiting: AtomicUsize,
    max_bytes: usize,
}

impl IncomingBudget {
    pub fn new(max_bytes: usize) -> Arc<IncomingBudget> {
        Arc::new(IncomingBudget { waiting: AtomicUsize::new(0), max_bytes })
    }

    fn full(&self) -> bool {
        self.waiting.load(Ordering::Acquire) >= self.max_bytes
    }
}

/// What one connection's session has been handed and has not handled yet.
#[derive(Debug)]
pub struct Backlog {
    waiting: AtomicUsize,
    max_bytes: usize,
    all: Arc<IncomingBudget>,
    /// The request body waiting for room.
    reader: AtomicWaker,
}

impl Backlog {
    pub fn new(max_bytes: usize, all: Arc<IncomingBudget>) -> Arc<Backlog> {
        Arc::new(Backlog { waiting: AtomicUsize::new(0), max_bytes, all, reader: AtomicWaker::new() })
    }

    /// Hands `session` a client's message (its text, or its voice as samples), counted until
    /// the session handled it (or is gone and its mailbox dropped it).
    pub fn hand(self: &Arc<Self>, session: &SessionPort, message: FromClient) {
        let bytes = match &message {
            FromClient::Text(text) => text.len(),
            FromClient::Audio(audio) => audio.bytes(),
            FromClient::Key(_)
            | FromClient::Configure(_)
            | FromClient::Playback(_)
            | FromClient::Refused(_)
            | FromClient::Ended(_)
            | FromClient::Lost(_) => 0,
        };
        self.handed(bytes);
        session.hand(message, Receipt::new(self.clone(), bytes));
    }

    /// The one gate of what an edge cannot hold back (a call's voice over UDP, a data channel's
    /// event): handed to `session` as [`Backlog::hand`] does, unless the session is `max_bytes`
    /// behind ([`Backlog::full`]); then it is dropped and counted
    /// (`omni_input_dropped_total{transport, what}`), and `false` says so. The message is made
    /// only when it is taken (a dropped voice is not decoded): `make` may find there is none.
    /// (An edge that can hold its client back, a WebSocket, never drops: its connection is not
    /// read past the bound.)
    pub fn offer(
        self: &Arc<Self>,
        session: &SessionPort,
        (transport, what): (&'static str, &'static str),
        make: impl FnOnce() -> Option<FromClient>,
    ) -> bool {
        if self.full() {
            metrics().input_dropped.with_label_values(&[transport, what]).inc();
            return false;
        }
        if let Some(message) = make() {
            self.hand(session, message);
        }
        true
    }

    /// A message of `bytes` goes to the session.
    fn handed(&self, bytes: usize) {
        self.waiting.fetch_add(bytes, Ordering::AcqRel);
        self.all.waiting.fetch_add(bytes, Ordering::AcqRel);
        metrics().incoming_bytes_waiting.add(bytes as i64);
    }

    /// The session handled a message of `bytes` (or is gone and never will): the body may
    /// read again.
    fn handled(&self, bytes: usize) {
        self.waiting.fetch_sub(bytes, Ordering::AcqRel);
        self.all.waiting.fetch_sub(bytes, Ordering::AcqRel);
        metrics().incoming_bytes_waiting.sub(bytes as i64);
        self.reader.wake();
    }

    /// Bytes handed and not handled.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// No more is read: this session is `max_bytes` behind, or every session together is past
    /// their budget and this one has a message of its own waiting.
    pub fn full(&self) -> bool {
        let waiting = self.waiting();
        waiting >= self.max_bytes || (waiting > 0 && self.all.full())
    }
}

/// A message in a session's mailbox is out of the backlog once handled, or dropped unhandled
/// (its receipt says so: no task waits on it).
impl Handled for Backlog {
    fn handled(&self, bytes: usize) {
        Backlog::handled(self, bytes);
    }
}

/// A request body read only while its connection's [`Backlog`] has room: one message may
/// take it past `max_bytes`, the next waits.
pub struct Gated<S> {
    inner: Pin<Box<S>>,
    backlog: Arc<Backlog>,
}

impl<S> Gated<S> {
    pub fn new(inner: S, backlog: Arc<Backlog>) -> Gated<S> {
        Gated { inner: Box::pin(inner), backlog }
    }
}

impl<S: Stream> Stream for Gated<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.backlog.full() {
            self.backlog.reader.register(cx.waker());
            // The session may have caught up in between.
            if self.backlog.full() {
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_body_waits_while_the_session_is_behind_and_goes_on_when_it_catches_up() {
        let backlog = Backlog::new(1000, IncomingBudget::new(1 << 20));
        let mut body = Gated::new(futures_util::stream::iter(0..3), backlog.clone());
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(0)));
        // One message may take it past the bound...
        backlog.handed(600);
        assert_eq!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(1)));
        backlog.handed(600);
        // ...the next waits, and is woken when the session is back under it.
        assert_eq!(Pin::new(&mut body).poll_next(&mut cx), Poll::Pending);
        backlog.handled(100);
        assert_eq!(Pin::new(&mut body).poll_next(&mut cx), Poll::Pending, "still 1,100 bytes behind");
        backlog.handled(600);
        assert!(flag.0.load(Ordering::SeqCst), "woken");
        assert_eq!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(2)));
        assert_eq!(backlog.waiting(), 500);
    }

    /// A session that holds on to what it is handed (never done with it).
    struct Holding(Vec<FromClient>);

    impl actix::Actor for Holding {
        type Context = actix::Context<Self>;
    }

    impl actix::Handler<omni_actors::edge::client::FromLine> for Holding {
        type Result = actix::ResponseFuture<()>;
        fn handle(&mut self, msg: omni_actors::edge::client::FromLine, _: &mut Self::Context) -> Self::Result {
            self.0.push(msg.msg);
            Box::pin(std::future::pending())
        }
    }

    #[actix::test]
    async fn the_gate_drops_and_counts_what_a_session_behind_cannot_take_and_makes_nothing_for_it() {
        use actix::Actor;
        let session = SessionPort::new(Holding(Vec::new()).start().recipient(), 0);
        let backlog = Backlog::new(100, IncomingBudget::new(1 << 20));
        let dropped = || metrics().input_dropped.with_label_values(&["test", "audio"]).get();
        let before = dropped();
        let voice =
            || Some(FromClient::Audio(omni_actors::edge::client::CallerAudio { samples: vec![0.0; 40], rate: 8000 }));
        assert!(backlog.offer(&session, ("test", "audio"), voice), "taken: 160 bytes now wait");
        let mut made = false;
        assert!(!backlog.offer(&session, ("test", "audio"), || {
            made = true;
            voice()
        }));
        assert!(!made, "a dropped message is not made");
        assert_eq!(dropped(), before + 1);
        assert_eq!(backlog.waiting(), 160);
    }

    #[test]
    fn past_the_total_a_session_with_a_message_waiting_reads_no_more_and_one_without_may() {
        let all = IncomingBudget::new(1000);
        let (a, b) = (Backlog::new(800, all.clone()), Backlog::new(800, all.clone()));
        a.handed(700);
        assert!(!a.full() && !b.full());
        b.handed(400); // 1,100 of 1,000 together
        assert!(a.full() && b.full(), "each has a message of its own waiting");
        let c = Backlog::new(800, all.clone());
        assert!(!c.full(), "a session with nothing waiting may always hand one");
        a.handled(700);
        assert!(!a.full() && !b.full(), "back under the total");
        assert_eq!(all.waiting.load(Ordering::SeqCst), 400);
    }
}
