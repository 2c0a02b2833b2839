//! A TCP proxy on a free loopback port that a test can cut (every connection through it is
//! closed, new ones are closed at once) and restore: a network partition between one process
//! and another, with no root and no network namespace.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub(crate) struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    /// Forwards every connection to `upstream`.
    pub(crate) fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (is_cut, sockets) = (cut.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().map_while(Result::ok) {
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                if is_cut.load(Ordering::SeqCst) {
                    continue; // both dropped: closed at once
                }
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else { continue };
                {
                    let mut held = sockets.lock().unwrap();
                    held.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                }
                std::thread::spawn(move || copy(client, s2));
                std::thread::spawn(move || copy(server, c2));
            }
        });
        Proxy { addr, cut, open }
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub(crate) fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16384];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}
