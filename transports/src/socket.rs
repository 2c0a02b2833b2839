//! The one thing the gateway does to a client's socket behind actix-web's back: drop it.
//!
//! When a connection is accepted, [`on_connect`] keeps a duplicate of its descriptor in the
//! connection's data; a session whose client stopped reading (see
//! `crate::outgoing`) calls [`SocketCutter::disconnect`], which shuts the socket
//! down. The HTTP layer then sees the connection fail and drops it with everything it
//! buffered. The duplicate is owned by the connection's data, so it can never name another
//! socket; it is closed when the connection ends.

use std::any::Any;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};

use crate::outgoing::Disconnect;
use actix_web::dev::Extensions;
use actix_web::rt::net::TcpStream;

/// A duplicate of the connection's socket descriptor, in the connection's data.
pub struct ConnSocket(Arc<OwnedFd>);

impl ConnSocket {
    pub fn cutter(&self) -> SocketCutter {
        SocketCutter(Arc::downgrade(&self.0))
    }
}

/// For `HttpServer::on_connect`: plain TCP and TLS connections.
pub fn on_connect(conn: &dyn Any, data: &mut Extensions) {
    let tcp = if let Some(tcp) = conn.downcast_ref::<TcpStream>() {
        tcp
    } else if let Some(tls) = conn.downcast_ref::<actix_tls::accept::rustls_0_23::TlsStream<TcpStream>>() {
        tls.get_ref().0
    } else {
        return;
    };
    match tcp.as_fd().try_clone_to_owned() {
        Ok(fd) => {
            data.insert(ConnSocket(Arc::new(fd)));
        }
        Err(e) => log::warn!("cannot keep a handle on a new connection's socket: {e}"),
    }
}

/// Shuts a connection's socket down, if the connection still exists.
pub struct SocketCutter(Weak<OwnedFd>);

impl Disconnect for SocketCutter {
    fn disconnect(&self) {
        if let Some(fd) = self.0.upgrade() {
            // SAFETY: shutdown on a descriptor this process owns (kept open by `fd`).
            unsafe {
                libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
            }
        }
    }
}
