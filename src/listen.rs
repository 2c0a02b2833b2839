//! Listening: why a server (or a node) could not start, an address that cannot be listened on
//! in words, and the TLS identity every listener loads.

use std::path::Path;
use std::sync::Arc;

/// Why the server (or a node) could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A TLS identity that does not load: its key (`server.tls.cert`...), and why.
    #[error("{key}: {why}")]
    Tls { key: String, why: String },
    #[error("{0}")]
    Listen(String),
    #[error("the cluster's store: {0}")]
    Store(#[from] crate::store::redis::StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The TLS settings from a PEM certificate chain and private key (also what
/// `check-config` loads, so that it refuses what the server would). `section` names the
/// keys in errors (`server.tls`, `node.tls`).
pub fn tls_config(section: &str, cert: &Path, key: &Path) -> Result<rustls::ServerConfig, ServeError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |key: &str, why: String| ServeError::Tls { key: format!("{section}{key}"), why };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| bad(".cert", format!("{}: {e}", cert.display())))?;
    if certs.is_empty() {
        return Err(bad(".cert", format!("{}: no certificate in the file", cert.display())));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(".key", format!("{}: {e}", key.display())))?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("", format!("the certificate and key do not make a TLS identity: {e}")))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tls)
}

/// Why an address cannot be listened on, in words.
pub fn listen_error(addr: std::net::SocketAddr, e: &std::io::Error) -> String {
    use std::io::ErrorKind;
    let cause = match e.kind() {
        ErrorKind::AddrInUse => "address already in use (another server is listening there)".to_string(),
        ErrorKind::AddrNotAvailable => "address not available (it is not an address of this machine)".to_string(),
        ErrorKind::PermissionDenied => "permission denied (ports below 1024 need privileges)".to_string(),
        _ => e.to_string(),
    };
    format!("cannot listen on {addr}: {cause}")
}
