//! A blocking WebSocket to a model server (`minicpmo.rs`, `vllm_omni/`), opened on the backend's
//! own thread: resolved, connected within a timeout, with Nagle off and the timeouts given.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use tungstenite::WebSocket;
use tungstenite::client::IntoClientRequest;
use tungstenite::protocol::WebSocketConfig;

/// How the connection is held.
pub(crate) struct Dial {
    pub connect_timeout: Duration,
    /// Reads wait at most this long (a backend may set another per read).
    pub read_timeout: Duration,
    /// Sends wait at most this long (a server that stops reading fails the send); `None`: no bound.
    pub write_timeout: Option<Duration>,
    /// Bounds on the server's messages; `None`: tungstenite's defaults.
    pub config: Option<WebSocketConfig>,
}

/// `ws://HOST{path}` of the server at `base` (`http://HOST:PORT`); the error says why not.
pub(crate) fn connect(base: &str, path: &str, dial: &Dial) -> Result<WebSocket<TcpStream>, String> {
    let host = base.trim_start_matches("http://");
    let addr = host.to_socket_addrs().map_err(|e| e.to_string())?.next().ok_or("resolves to no address")?;
    let tcp = TcpStream::connect_timeout(&addr, dial.connect_timeout).map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    tcp.set_read_timeout(Some(dial.read_timeout)).map_err(|e| e.to_string())?;
    tcp.set_write_timeout(dial.write_timeout).map_err(|e| e.to_string())?;
    let request = format!("ws://{host}{path}").into_client_request().map_err(|e| e.to_string())?;
    let (socket, _) = tungstenite::client::client_with_config(request, tcp, dial.config).map_err(|e| e.to_string())?;
    Ok(socket)
}
