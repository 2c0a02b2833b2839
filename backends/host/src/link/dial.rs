//! Reaching a node: TCP to an address in the link's networks, TLS when the link has a CA, and the
//! handshake; on a small runtime of its own (`node-io`) that serves every node link's socket.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use super::LinkError;
use super::config::NodeLink;
use super::handshake;
use super::wire::Request;

/// How long connecting (TCP, TLS, the handshake and the answer) may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The runtime that serves every node link's socket.
pub(crate) fn io() -> &'static tokio::runtime::Runtime {
    static IO: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    IO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("node-io")
            .enable_all()
            .build()
            .expect("a tokio runtime for node links")
    })
}

pub(crate) trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

/// TCP (and TLS when the link has a `ca`) to the node, in the link's networks, and the
/// handshake: the node proved it holds the token, and has `request` with the gateway's proof.
pub(crate) async fn connect(link: &NodeLink, request: Request) -> Result<Box<dyn Stream>, LinkError> {
    let tcp = dial(link).await?;
    let _ = tcp.set_nodelay(true);
    let mut stream: Box<dyn Stream> = match &link.ca {
        None => Box::new(tcp),
        Some(ca) => {
            let connector = tls_connector(ca)?;
            let name = rustls::pki_types::ServerName::try_from(link.server_name.clone())
                .map_err(|e| LinkError::ServerName { name: link.server_name.clone(), why: e.to_string() })?;
            Box::new(connector.connect(name, tcp).await.map_err(LinkError::Tls)?)
        }
    };
    handshake::open(&mut stream, link.secret(), request).await?;
    Ok(stream)
}

/// TCP to the first of the addresses the node's address resolves to that is in the link's
/// networks (any, when it names none).
async fn dial(link: &NodeLink) -> Result<tokio::net::TcpStream, LinkError> {
    if link.networks.is_empty() {
        return tokio::net::TcpStream::connect(&link.address).await.map_err(LinkError::Connect);
    }
    let resolved = tokio::net::lookup_host(&link.address).await.map_err(LinkError::Connect)?;
    let allowed: Vec<_> = resolved.filter(|a| omni_actors::net::in_any(a.ip(), &link.networks)).collect();
    if allowed.is_empty() {
        return Err(LinkError::OutsideNetworks(link.address.clone()));
    }
    tokio::net::TcpStream::connect(&allowed[..]).await.map_err(LinkError::Connect)
}

fn tls_connector(ca: &std::path::Path) -> Result<tokio_rustls::TlsConnector, LinkError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let bad = |e: &dyn std::fmt::Display| LinkError::Ca { path: ca.to_path_buf(), why: e.to_string() };
    let mut roots = rustls::RootCertStore::empty();
    let certs =
        CertificateDer::pem_file_iter(ca).and_then(|it| it.collect::<Result<Vec<_>, _>>()).map_err(|e| bad(&e))?;
    for cert in certs {
        roots.add(cert).map_err(|e| bad(&e))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}
