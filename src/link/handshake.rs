//! How a gateway (or a replica) and a node prove to each other that they hold the node's token
//! before either says anything that matters, without the token crossing the wire.
//!
//! 1. The gateway opens the connection with [`ToNode::Hello`]: the protocol and a fresh nonce.
//! 2. The node answers [`FromNode::Challenge`]: a fresh nonce of its own, and its proof,
//!    HMAC-SHA256 under the token over both nonces. The gateway checks it: a listener that is
//!    not the node (an address a store was made to name, a host that took the node's address)
//!    cannot make it, and hears nothing more: no token, no request, no audio.
//! 3. The gateway sends [`ToNode::Prove`]: its own proof over both nonces and the request it
//!    makes (discovery, an attach with its grant, a link kept open for grants). The node checks
//!    it before it reads the request.
//!
//! The proofs are made with distinct labels, and each side's nonce is fresh per connection: a
//! proof seen once is no use on another connection, nor as the other side's. Every frame until
//! then is at most [`MAX_UNPROVEN_FRAME`], read as it arrives (a length a stranger announces
//! never sizes a buffer).

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use super::LinkError;
use super::wire::{FromNode, MAX_UNPROVEN_FRAME, PROTOCOL, Request, ToNode, read_frame, write_frame};

/// Bytes of each side's nonce.
pub const NONCE_BYTES: usize = 32;

const NODE_LABEL: &[u8] = b"omni-gateway node proof v1";
const GATEWAY_LABEL: &[u8] = b"omni-gateway gateway proof v1";

type HmacSha256 = Hmac<Sha256>;

pub(super) fn mac(token: &str, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(token.as_bytes()).expect("HMAC takes a key of any length");
    mac.update(label);
    for part in parts {
        // Each part's length first: no two different lists of parts read the same.
        mac.update(&(part.len() as u32).to_le_bytes());
        mac.update(part);
    }
    mac
}

/// A fresh nonce.
pub fn nonce() -> Vec<u8> {
    let mut n = uuid::Uuid::new_v4().into_bytes().to_vec();
    n.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    n
}

/// The node's proof that it holds `token`.
pub fn node_proof(token: &str, gateway_nonce: &[u8], node_nonce: &[u8]) -> Vec<u8> {
    mac(token, NODE_LABEL, &[gateway_nonce, node_nonce]).finalize().into_bytes().to_vec()
}

/// The gateway's proof that it holds `token`, bound to what it asks for.
pub fn gateway_proof(token: &str, node_nonce: &[u8], gateway_nonce: &[u8], request: &Request) -> Vec<u8> {
    let request = postcard::to_stdvec(request).unwrap_or_default();
    mac(token, GATEWAY_LABEL, &[node_nonce, gateway_nonce, &request]).finalize().into_bytes().to_vec()
}

/// Whether `proof` is the node's proof for these nonces (compared in constant time).
pub fn node_proof_ok(token: &str, gateway_nonce: &[u8], node_nonce: &[u8], proof: &[u8]) -> bool {
    mac(token, NODE_LABEL, &[gateway_nonce, node_nonce]).verify_slice(proof).is_ok()
}

/// Whether `proof` is the gateway's proof for these nonces and this request.
pub fn gateway_proof_ok(token: &str, node_nonce: &[u8], gateway_nonce: &[u8], request: &Request, proof: &[u8]) -> bool {
    let request = postcard::to_stdvec(request).unwrap_or_default();
    mac(token, GATEWAY_LABEL, &[node_nonce, gateway_nonce, &request]).verify_slice(proof).is_ok()
}

/// The gateway's side: says hello, checks the node's proof, then proves itself with its
/// request. Nothing is sent after the hello to a peer whose proof fails, and nothing it says
/// before its proof is read past [`MAX_UNPROVEN_FRAME`].
pub async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
    request: Request,
) -> Result<(), LinkError> {
    let ours = nonce();
    write_frame(stream, &ToNode::Hello { protocol: PROTOCOL, nonce: ours.clone() })
        .await
        .map_err(LinkError::Handshake)?;
    let (theirs, proof) = match read_frame::<FromNode>(stream, MAX_UNPROVEN_FRAME).await {
        Ok(Some(FromNode::Challenge { nonce, proof })) => (nonce, proof),
        // Said before it proved anything: kept short and printable, and marked so.
        Ok(Some(FromNode::Refused(why))) => return Err(LinkError::Refused(unproven_words(&why))),
        Ok(Some(other)) => return Err(LinkError::Unexpected(other.kind())),
        Ok(None) => return Err(LinkError::Closed),
        Err(e) => return Err(LinkError::Unreadable(e)),
    };
    if theirs.len() != NONCE_BYTES || !node_proof_ok(token, &ours, &theirs, &proof) {
        return Err(LinkError::NotTheNode);
    }
    let proof = gateway_proof(token, &theirs, &ours, &request);
    write_frame(stream, &ToNode::Prove { proof, request }).await.map_err(LinkError::Handshake)
}

/// What a peer that has not proved the token said, for a log: its first 200 characters, each
/// control character as `?`, marked as unproven.
fn unproven_words(said: &str) -> String {
    let shown: String = said.chars().take(200).map(|c| if c.is_control() { '?' } else { c }).collect();
    format!("{shown} (said before it proved the token)")
}

/// Why a node refuses a peer's hello.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeRefused {
    #[error("the first message must be a Hello")]
    NotAHello,
    #[error("the gateway speaks node protocol {theirs}, this node {ours}: run the same release on both")]
    Protocol { theirs: u32, ours: u32 },
    #[error("a nonce of {0} bytes")]
    Nonce(usize),
    #[error("the second message must be the gateway's proof")]
    NoProof,
    #[error("wrong token (the gateway's [[nodes]] token must be the node's [node] token)")]
    WrongToken,
    #[error("unreadable: {0}")]
    Unreadable(String),
    /// Closed before its hello (a port probe, a health check).
    #[error("closed before its hello")]
    Closed,
    /// Closed once it had the node's proof: a gateway with another token (it could not check
    /// the proof), or a peer that is not a gateway.
    #[error("closed without proving the token (a gateway with another token?)")]
    ClosedUnproven,
}

/// The node's side: reads the hello, proves itself, and checks the gateway's proof. Answers the
/// request of a peer that holds the token.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
) -> Result<Request, HandshakeRefused> {
    let unreadable = |e: std::io::Error| HandshakeRefused::Unreadable(e.to_string());
    let theirs = match read_frame::<ToNode>(stream, MAX_UNPROVEN_FRAME).await.map_err(unreadable)? {
        Some(ToNode::Hello { protocol, nonce }) if protocol == PROTOCOL => nonce,
        Some(ToNode::Hello { protocol, .. }) => {
            return Err(HandshakeRefused::Protocol { theirs: protocol, ours: PROTOCOL });
        }
        Some(_) => return Err(HandshakeRefused::NotAHello),
        None => return Err(HandshakeRefused::Closed),
    };
    if theirs.len() != NONCE_BYTES {
        return Err(HandshakeRefused::Nonce(theirs.len()));
    }
    let ours = nonce();
    let proof = node_proof(token, &theirs, &ours);
    write_frame(stream, &FromNode::Challenge { nonce: ours.clone(), proof }).await.map_err(unreadable)?;
    match read_frame::<ToNode>(stream, MAX_UNPROVEN_FRAME).await.map_err(unreadable)? {
        Some(ToNode::Prove { proof, request }) if gateway_proof_ok(token, &ours, &theirs, &request, &proof) => {
            Ok(request)
        }
        Some(ToNode::Prove { .. }) => Err(HandshakeRefused::WrongToken),
        Some(_) => Err(HandshakeRefused::NoProof),
        None => Err(HandshakeRefused::ClosedUnproven),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn both_sides_prove_the_token_and_neither_sends_it() {
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let token = "node-token-0123456789";
        let request = Request::Standby { gateway: "g1".into() };
        let node_side = tokio::spawn(async move { accept(&mut node, token).await });
        open(&mut gateway, token, request.clone()).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Ok(request));
    }

    #[tokio::test]
    async fn a_peer_without_the_token_is_told_nothing_either_way() {
        // A gateway with another token cannot check the node's proof: it goes, having sent only
        // its hello.
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, "node-token-0123456789").await });
        let e = open(&mut gateway, "wrong-token-0123456789", Request::Discover).await.unwrap_err();
        assert!(matches!(e, LinkError::NotTheNode), "{e}");
        drop(gateway);
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::ClosedUnproven));
        // A peer that ignores the node's proof and proves a token it does not hold: refused.
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, "node-token-0123456789").await });
        write_frame(&mut peer, &ToNode::Hello { protocol: PROTOCOL, nonce: nonce() }).await.unwrap();
        let Ok(Some(FromNode::Challenge { nonce: theirs, .. })) = read_frame(&mut peer, MAX_UNPROVEN_FRAME).await
        else {
            panic!("no challenge")
        };
        let proof = gateway_proof("wrong-token-0123456789", &theirs, &nonce(), &Request::Discover);
        write_frame(&mut peer, &ToNode::Prove { proof, request: Request::Discover }).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::WrongToken));
        // A listener that is not the node: the gateway sends it the hello and nothing more.
        let (mut gateway, mut fake) = tokio::io::duplex(1 << 16);
        let fake_side = tokio::spawn(async move {
            let hello = read_frame::<ToNode>(&mut fake, MAX_UNPROVEN_FRAME).await.unwrap();
            assert!(matches!(hello, Some(ToNode::Hello { .. })));
            let forged = FromNode::Challenge { nonce: nonce(), proof: vec![0; 32] };
            write_frame(&mut fake, &forged).await.unwrap();
            let mut rest = Vec::new();
            fake.read_to_end(&mut rest).await.unwrap();
            rest
        });
        let e = open(&mut gateway, "node-token-0123456789", Request::Discover).await.unwrap_err();
        assert!(matches!(e, LinkError::NotTheNode), "{e}");
        drop(gateway);
        assert!(fake_side.await.unwrap().is_empty(), "nothing after the hello");
    }
}
