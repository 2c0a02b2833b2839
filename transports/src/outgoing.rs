//! A connection's outgoing buffer, bounded.
//!
//! A WebSocket actor writes frames into its context at once; they leave as fast as the
//! client reads them. A client that never reads would make that buffer grow for as long as
//! the model talks. [`Metered`] wraps the response body and counts the bytes the HTTP layer
//! takes; [`OutgoingMeter`] compares them with what the session wrote. Over the limit the
//! session ends with `slow_consumer` and the edge's [`Disconnect`] drops the connection
//! (the buffer cannot drain, so no close frame would ever leave).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use actix::prelude::Stream;
use actix_web::web::Bytes;
use omni_actors::observe::metrics::metrics;

/// Bytes written by the session and bytes taken by the connection, and what of the backlog
/// is counted in `omni_outgoing_bytes_waiting`.
#[derive(Debug, Default)]
pub struct OutgoingMeter {
    written: AtomicU64,
    pulled: AtomicU64,
    /// What of the backlog is in the gauge, and whether the connection is gone (then nothing
    /// more is: a session on another thread may still write after the body was dropped).
    counted: parking_lot::Mutex<(u64, bool)>,
}

impl OutgoingMeter {
    /// The session wrote a frame of `bytes`; returns what now waits to be sent.
    pub fn wrote(&self, bytes: usize) -> u64 {
        self.written.fetch_add(bytes as u64, Ordering::Relaxed);
        self.count()
    }

    /// Brings the gauge to this connection's backlog (while it is open); returns the backlog.
    fn count(&self) -> u64 {
        let backlog = self.backlog();
        let mut counted = self.counted.lock();
        if !counted.1 {
            metrics().outgoing_bytes_waiting.add(backlog as i64 - counted.0 as i64);
            counted.0 = backlog;
        }
        backlog
    }

    /// The connection is gone: its backlog leaves the gauge, for good.
    fn close(&self) {
        let mut counted = self.counted.lock();
        metrics().outgoing_bytes_waiting.sub(counted.0 as i64);
        *counted = (0, true);
    }

    /// What waits to be sent (frame headers make it a slight underestimate).
    pub fn backlog(&self) -> u64 {
        self.written.load(Ordering::Relaxed).saturating_sub(self.pulled.load(Ordering::Relaxed))
    }
}

/// Drops a client's connection at once, whatever is buffered (implemented at the edge,
/// which owns the socket).
pub trait Disconnect: Send + Sync {
    fn disconnect(&self);
}

/// A session's outgoing limit: the meter, the bound, and how to cut the connection.
pub struct OutgoingLimit {
    pub meter: Arc<OutgoingMeter>,
    pub max_bytes: u64,
    pub disconnect: Box<dyn Disconnect>,
}

impl OutgoingLimit {
    /// A frame of `bytes` is written: what waits, past the bound, as the error.
    pub fn wrote(&self, bytes: usize) -> Result<(), u64> {
        let waiting = self.meter.wrote(bytes);
        if waiting > self.max_bytes { Err(waiting) } else { Ok(()) }
    }

    /// Cuts the connection of a peer that does not read (`slow_consumer`, counted).
    pub fn cut(&self) {
        metrics().slow_consumers.inc();
        self.disconnect.disconnect();
    }
}

/// A response body that counts the bytes taken from it.
pub struct Metered<S> {
    /// `None` once dropped (see `Drop`).
    inner: Option<Pin<Box<S>>>,
    meter: Arc<OutgoingMeter>,
}

impl<S> Metered<S> {
    pub fn new(inner: S, meter: Arc<OutgoingMeter>) -> Metered<S> {
        Metered { inner: Some(Box::pin(inner)), meter }
    }
}

impl<S, E> Stream for Metered<S>
where
    S: Stream<Item = Result<Bytes, E>>,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Some(inner) = self.inner.as_mut() else { return Poll::Ready(None) };
        let polled = inner.as_mut().poll_next(cx);
        if let Poll::Ready(Some(Ok(bytes))) = &polled {
            self.meter.pulled.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            self.meter.count();
        }
        polled
    }
}

impl<S> Drop for Metered<S> {
    /// The connection is gone: what waited for it is no longer held, nor what a session writes
    /// after (from its own thread, it may not know yet).
    fn drop(&mut self) {
        drop(self.inner.take());
        self.meter.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_is_written_minus_taken() {
        let meter = Arc::new(OutgoingMeter::default());
        assert_eq!(meter.wrote(100), 100);
        assert_eq!(meter.wrote(50), 150);
        let chunks: Vec<Result<Bytes, ()>> = vec![Ok(Bytes::from_static(&[0; 120])), Err(())];
        let mut body = Metered::new(futures_util::stream::iter(chunks), meter.clone());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(Ok(_)))));
        assert_eq!(meter.backlog(), 30);
        assert!(matches!(Pin::new(&mut body).poll_next(&mut cx), Poll::Ready(Some(Err(())))));
        assert_eq!(meter.backlog(), 30, "errors take nothing");
    }

    /// A session writes from its own thread and may do so after the connection's body was
    /// dropped: what it writes then is never counted as waiting (it never could leave).
    #[test]
    fn a_write_after_the_connection_is_gone_is_not_counted() {
        let meter = Arc::new(OutgoingMeter::default());
        meter.wrote(100);
        assert_eq!(*meter.counted.lock(), (100, false));
        drop(Metered::new(futures_util::stream::empty::<Result<Bytes, ()>>(), meter.clone()));
        assert_eq!(*meter.counted.lock(), (0, true));
        meter.wrote(5000);
        assert_eq!(*meter.counted.lock(), (0, true), "nothing more in the gauge");
    }
}
