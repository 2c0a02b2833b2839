//! A request body read within bounds: at most so many bytes, within so many seconds, whatever
//! the client declares or sends. Every handler that reads a body before it knows the client
//! (a call's offer, a client secret's request) reads it this way, after the key was checked.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use actix_web::error::PayloadError;
use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, web};
use futures_util::{Stream, StreamExt};

/// Why a body was not read whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the request's body is over {0} bytes")]
    TooLarge(usize),
    #[error("the request's body did not arrive within {} s", .0.as_secs())]
    TooSlow(Duration),
    #[error("the request's body could not be read: {0}")]
    Read(String),
}

impl BodyError {
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Read(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// A body's bounds.
#[derive(Clone, Copy)]
pub(crate) struct Bounds {
    pub max_bytes: usize,
    pub deadline: Duration,
}

impl Bounds {
    /// Refused at once when the declared length is over the bound.
    pub(crate) fn check_declared(&self, req: &HttpRequest) -> Result<(), BodyError> {
        let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        match declared {
            Some(n) if n > self.max_bytes as u64 => Err(BodyError::TooLarge(self.max_bytes)),
            _ => Ok(()),
        }
    }

    /// `read` over the body as a stream that ends in an error past the bound, within the
    /// deadline: its result, or why the body was refused.
    pub(crate) async fn read<T, E, F, Fut>(&self, req: &HttpRequest, payload: web::Payload, read: F) -> Result<T, E>
    where
        E: From<BodyError>,
        F: FnOnce(Bounded) -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        self.check_declared(req)?;
        let over = Rc::new(Cell::new(false));
        let body = Bounded { payload, total: 0, max: self.max_bytes, over: over.clone() };
        let result = actix_web::rt::time::timeout(self.deadline, read(body)).await;
        match result {
            _ if over.get() => Err(BodyError::TooLarge(self.max_bytes).into()),
            Ok(r) => r,
            Err(_) => Err(BodyError::TooSlow(self.deadline).into()),
        }
    }

    /// The whole body, as bytes.
    pub(crate) async fn bytes(&self, req: &HttpRequest, payload: web::Payload) -> Result<Vec<u8>, BodyError> {
        self.read(req, payload, |mut body| async move {
            let mut bytes = Vec::new();
            while let Some(chunk) = body.next().await {
                bytes.extend_from_slice(&chunk.map_err(|e| BodyError::Read(e.to_string()))?);
            }
            Ok(bytes)
        })
        .await
    }
}

/// A body that ends in an error once it passed its bound.
pub(crate) struct Bounded {
    payload: web::Payload,
    total: usize,
    max: usize,
    over: Rc<Cell<bool>>,
}

impl Stream for Bounded {
    type Item = Result<web::Bytes, PayloadError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.over.get() {
            return std::task::Poll::Ready(None);
        }
        let polled = self.payload.poll_next_unpin(cx);
        if let std::task::Poll::Ready(Some(Ok(chunk))) = &polled {
            self.total += chunk.len();
            if self.total > self.max {
                self.over.set(true);
                return std::task::Poll::Ready(Some(Err(PayloadError::Overflow)));
            }
        }
        polled
    }
}
