//! How a gateway (or a replica) and a node prove to each other that they hold the node's token
//! before either says anything that matters, without the token crossing the wire, and without
//! giving anyone who lacks it a way to test guesses of it offline.
//!
//! The token is a password for SPAKE2 (crate `spake2`, Ed25519, the symmetric variant): each
//! side sends a message made from it and a random secret, and both derive the same key only if
//! both used the same token. Whoever talks to a node or a gateway without the token gets
//! messages and proofs under a key it cannot compute, and one guess per connection at most: a
//! recorded handshake cannot be tried against a dictionary.
//!
//! A replica of a cluster does not hold the token: it holds its own credential
//! ([`super::replica`]), and names itself in its hello; the node derives that name's password
//! from its token and runs the same exchange with it. What the replica proves is its name.
//!
//! 1. The gateway opens the connection with [`ToNode::Hello`]: the protocol, a fresh nonce, its
//!    SPAKE2 message, and, a replica, its name.
//! 2. The node answers [`FromNode::Challenge`]: its nonce, its SPAKE2 message, and its proof, an
//!    HMAC-SHA256 under the derived key over everything both said. The gateway checks it: a
//!    listener that is not the node (an address a store was made to name, a host that took the
//!    node's address) cannot make it, and hears nothing more: no request, no audio.
//! 3. The gateway sends [`ToNode::Prove`]: its own proof, over the same and the request it makes
//!    (discovery, an attach with its grant, a link kept open for grants). The node checks it
//!    before it reads the request.
//!
//! The proofs are made with distinct labels, and each side's nonce and secret are fresh per
//! connection: a proof seen once is no use on another connection, nor as the other side's. Every
//! frame until then is at most [`MAX_UNPROVEN_FRAME`], read as it arrives (a length a stranger
//! announces never sizes a buffer).

use hmac::Mac;
use spake2::{Ed25519Group, Identity, Password, Spake2};
use tokio::io::{AsyncRead, AsyncWrite};

use super::LinkError;
use super::mac::keyed;
use super::wire::{FromNode, MAX_UNPROVEN_FRAME, PROTOCOL, Request, ToNode, read_frame, read_frame_bytes, write_frame};

/// Bytes of each side's nonce.
pub const NONCE_BYTES: usize = 32;

const NODE_LABEL: &[u8] = b"omni-gateway node proof v2";
const GATEWAY_LABEL: &[u8] = b"omni-gateway gateway proof v2";
/// What both sides name the exchange (SPAKE2's identity).
const EXCHANGE: &[u8] = b"omni-gateway node link";

/// A fresh nonce.
pub fn nonce() -> Vec<u8> {
    let mut n = uuid::Uuid::new_v4().into_bytes().to_vec();
    n.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    n
}

/// One side's half of the exchange: its secret state and the message it sends.
pub fn exchange(token: &str) -> (Spake2<Ed25519Group>, Vec<u8>) {
    Spake2::<Ed25519Group>::start_symmetric(&Password::new(token.as_bytes()), &Identity::new(EXCHANGE))
}

/// What both sides said, in order: the proofs cover all of it.
pub struct Transcript<'a> {
    /// The replica the gateway says it is ("" for a gateway with the token).
    pub replica: &'a str,
    pub gateway_nonce: &'a [u8],
    pub gateway_pake: &'a [u8],
    pub node_nonce: &'a [u8],
    pub node_pake: &'a [u8],
}

impl Transcript<'_> {
    fn parts(&self) -> [&[u8]; 5] {
        [self.replica.as_bytes(), self.gateway_nonce, self.gateway_pake, self.node_nonce, self.node_pake]
    }
}

/// What a gateway proves: the node's token, or a replica's credential (its name and password).
#[derive(Clone, Copy)]
pub enum Secret<'a> {
    Token(&'a str),
    Replica { name: &'a str, password: &'a str },
}

impl Secret<'_> {
    fn replica(&self) -> Option<&str> {
        match self {
            Secret::Token(_) => None,
            Secret::Replica { name, .. } => Some(name),
        }
    }

    fn password(&self) -> &str {
        match self {
            Secret::Token(token) => token,
            Secret::Replica { password, .. } => password,
        }
    }
}

/// Who proved what on a node's connection.
#[derive(Debug, Clone, PartialEq)]
pub struct Proved {
    /// The replica whose credential the peer holds; None: the peer holds the node's token.
    pub replica: Option<String>,
    pub request: Request,
}

/// The node's proof that it derived `key` (it holds the token).
pub fn node_proof(key: &[u8], said: &Transcript<'_>) -> Vec<u8> {
    keyed(key, NODE_LABEL, &said.parts()).finalize().into_bytes().to_vec()
}

/// The gateway's proof that it derived `key`, bound to what it asks for.
pub fn gateway_proof(key: &[u8], said: &Transcript<'_>, request: &Request) -> Vec<u8> {
    let request = postcard::to_stdvec(request).unwrap_or_default();
    let [r, a, b, c, d] = said.parts();
    keyed(key, GATEWAY_LABEL, &[r, a, b, c, d, &request]).finalize().into_bytes().to_vec()
}

fn node_proof_ok(key: &[u8], said: &Transcript<'_>, proof: &[u8]) -> bool {
    keyed(key, NODE_LABEL, &said.parts()).verify_slice(proof).is_ok()
}

fn gateway_proof_ok(key: &[u8], said: &Transcript<'_>, request: &Request, proof: &[u8]) -> bool {
    let request = postcard::to_stdvec(request).unwrap_or_default();
    let [r, a, b, c, d] = said.parts();
    keyed(key, GATEWAY_LABEL, &[r, a, b, c, d, &request]).verify_slice(proof).is_ok()
}

/// The gateway's side: says hello, checks the node's proof, then proves itself with its
/// request. Nothing is sent after the hello to a peer whose proof fails, and nothing it says
/// before its proof is read past [`MAX_UNPROVEN_FRAME`].
pub async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    secret: Secret<'_>,
    request: Request,
) -> Result<(), LinkError> {
    let ours = nonce();
    let (state, our_pake) = exchange(secret.password());
    let replica = secret.replica().map(str::to_string);
    let hello = ToNode::Hello { protocol: PROTOCOL, nonce: ours.clone(), pake: our_pake.clone(), replica };
    write_frame(stream, &hello).await.map_err(LinkError::Handshake)?;
    let (theirs, their_pake, proof) = match read_frame::<FromNode>(stream, MAX_UNPROVEN_FRAME).await {
        Ok(Some(FromNode::Challenge { nonce, pake, proof })) => (nonce, pake, proof),
        // Said before it proved anything: kept short and printable, and marked so.
        Ok(Some(FromNode::Refused(why))) => return Err(LinkError::Refused(unproven_words(&why))),
        Ok(Some(other)) => return Err(LinkError::Unexpected(other.kind())),
        Ok(None) => return Err(LinkError::Closed),
        Err(e) => return Err(LinkError::Unreadable(e)),
    };
    let said = Transcript {
        replica: secret.replica().unwrap_or(""),
        gateway_nonce: &ours,
        gateway_pake: &our_pake,
        node_nonce: &theirs,
        node_pake: &their_pake,
    };
    let key = state.finish(&their_pake).map_err(|_| LinkError::NotTheNode)?;
    if theirs.len() != NONCE_BYTES || !node_proof_ok(&key, &said, &proof) {
        return Err(LinkError::NotTheNode);
    }
    let proof = gateway_proof(&key, &said, &request);
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
    /// A replica whose credential does not prove its name: issued under another token, or for
    /// another name.
    #[error(
        "replica '{0}' did not prove its name (its [cluster] credential must be issued for that name by \
         `omni-gateway replica-credential` under this node's token)"
    )]
    WrongCredential(String),
    #[error("the name a replica claims is not a name ({0} bytes)")]
    BadName(usize),
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
/// request of a peer that holds the token, or the credential of the replica it names.
pub async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &str,
) -> Result<Proved, HandshakeRefused> {
    let unreadable = |e: std::io::Error| HandshakeRefused::Unreadable(e.to_string());
    let Some(first) = read_frame_bytes(stream, MAX_UNPROVEN_FRAME).await.map_err(unreadable)? else {
        return Err(HandshakeRefused::Closed);
    };
    let (theirs, their_pake, replica) = match postcard::from_bytes::<ToNode>(&first) {
        Ok(ToNode::Hello { protocol, nonce, pake, replica }) if protocol == PROTOCOL => (nonce, pake, replica),
        Ok(ToNode::Hello { protocol, .. }) => {
            return Err(HandshakeRefused::Protocol { theirs: protocol, ours: PROTOCOL });
        }
        Ok(_) => return Err(HandshakeRefused::NotAHello),
        // Another release's hello (its fields differ): its protocol comes first all the same.
        Err(e) => match postcard::take_from_bytes::<(u32, u32)>(&first) {
            Ok(((0, protocol), _)) if protocol != PROTOCOL => {
                return Err(HandshakeRefused::Protocol { theirs: protocol, ours: PROTOCOL });
            }
            _ => return Err(HandshakeRefused::Unreadable(e.to_string())),
        },
    };
    if theirs.len() != NONCE_BYTES {
        return Err(HandshakeRefused::Nonce(theirs.len()));
    }
    if let Some(name) = &replica
        && !super::replica::name_ok(name)
    {
        return Err(HandshakeRefused::BadName(name.len()));
    }
    // A replica's password is its name's, derived from the token; whether the name is revoked
    // is the caller's business once it is proved.
    let password = match &replica {
        Some(name) => super::replica::password(token, name),
        None => token.to_string(),
    };
    let wrong = || match &replica {
        Some(name) => HandshakeRefused::WrongCredential(name.clone()),
        None => HandshakeRefused::WrongToken,
    };
    let ours = nonce();
    let (state, our_pake) = exchange(&password);
    let said = Transcript {
        replica: replica.as_deref().unwrap_or(""),
        gateway_nonce: &theirs,
        gateway_pake: &their_pake,
        node_nonce: &ours,
        node_pake: &our_pake,
    };
    // A message that is no point of the curve derives nothing: that peer is refused as one
    // without the token.
    let Ok(key) = state.finish(&their_pake) else { return Err(wrong()) };
    let proof = node_proof(&key, &said);
    write_frame(stream, &FromNode::Challenge { nonce: ours.clone(), pake: our_pake.clone(), proof })
        .await
        .map_err(unreadable)?;
    match read_frame::<ToNode>(stream, MAX_UNPROVEN_FRAME).await.map_err(unreadable)? {
        Some(ToNode::Prove { proof, request }) if gateway_proof_ok(&key, &said, &request, &proof) => {
            Ok(Proved { replica, request })
        }
        Some(ToNode::Prove { .. }) => Err(wrong()),
        Some(_) => Err(HandshakeRefused::NoProof),
        None => Err(HandshakeRefused::ClosedUnproven),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const TOKEN: &str = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=";
    const OTHER: &str = "Wm0Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7l=";

    /// A peer that takes the node's proof on trust and proves `password` (naming `replica`),
    /// asking for discovery: what the node then answers is the caller's to check.
    async fn prove_regardless(peer: &mut tokio::io::DuplexStream, password: &str, replica: Option<&str>) {
        let (state, pake) = exchange(password);
        let hello = nonce();
        let said_hello = ToNode::Hello {
            protocol: PROTOCOL,
            nonce: hello.clone(),
            pake: pake.clone(),
            replica: replica.map(Into::into),
        };
        write_frame(peer, &said_hello).await.unwrap();
        let Ok(Some(FromNode::Challenge { nonce: theirs, pake: their_pake, .. })) =
            read_frame(peer, MAX_UNPROVEN_FRAME).await
        else {
            panic!("no challenge")
        };
        let key = state.finish(&their_pake).unwrap();
        let said = Transcript {
            replica: replica.unwrap_or(""),
            gateway_nonce: &hello,
            gateway_pake: &pake,
            node_nonce: &theirs,
            node_pake: &their_pake,
        };
        let proof = gateway_proof(&key, &said, &Request::Discover);
        write_frame(peer, &ToNode::Prove { proof, request: Request::Discover }).await.unwrap();
    }

    #[tokio::test]
    async fn both_sides_prove_the_token_and_neither_sends_it() {
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let request = Request::Standby { gateway: "g1".into() };
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await.map(|p| p.request) });
        open(&mut gateway, Secret::Token(TOKEN), request.clone()).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Ok(request));
    }

    /// What a stranger gets from a node cannot be checked against a guess of the token: the
    /// node's proof is under a key the stranger cannot derive without the token, and the same
    /// hello answered twice gives unrelated proofs (no oracle to replay a guess against).
    #[tokio::test]
    async fn a_stranger_gets_nothing_to_test_guesses_against() {
        let (state, pake) = exchange(OTHER);
        let hello = nonce();
        let mut proofs = Vec::new();
        for _ in 0..2 {
            let (mut peer, mut node) = tokio::io::duplex(1 << 16);
            let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await.map(|p| p.request) });
            write_frame(
                &mut peer,
                &ToNode::Hello { protocol: PROTOCOL, nonce: hello.clone(), pake: pake.clone(), replica: None },
            )
            .await
            .unwrap();
            let Ok(Some(FromNode::Challenge { nonce: n, pake: p, proof })) =
                read_frame(&mut peer, MAX_UNPROVEN_FRAME).await
            else {
                panic!("no challenge")
            };
            proofs.push((n, p, proof));
            drop(peer);
            assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::ClosedUnproven));
        }
        assert_ne!(proofs[0].2, proofs[1].2, "a fresh secret each time");
        // The stranger's guess (OTHER) derives a key; the node's proof does not check under it.
        let (n, p, proof) = &proofs[0];
        let key = state.finish(p).unwrap();
        let said = Transcript { replica: "", gateway_nonce: &hello, gateway_pake: &pake, node_nonce: n, node_pake: p };
        assert!(!node_proof_ok(&key, &said, proof), "a wrong guess is told apart only online, once a connection");
    }

    /// A gateway of the release before (node protocol 8, whose hello had no SPAKE2 message) is
    /// told which protocol this node speaks.
    #[tokio::test]
    async fn an_older_gateways_hello_is_told_the_protocol() {
        #[derive(serde::Serialize)]
        enum Older {
            Hello { protocol: u32, nonce: Vec<u8> },
        }
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await.map(|p| p.request) });
        write_frame(&mut gateway, &Older::Hello { protocol: 8, nonce: nonce() }).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::Protocol { theirs: 8, ours: PROTOCOL }));
    }

    #[tokio::test]
    async fn a_peer_without_the_token_is_told_nothing_either_way() {
        // A gateway with another token cannot check the node's proof: it goes, having sent only
        // its hello.
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await.map(|p| p.request) });
        let e = open(&mut gateway, Secret::Token(OTHER), Request::Discover).await.unwrap_err();
        assert!(matches!(e, LinkError::NotTheNode), "{e}");
        drop(gateway);
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::ClosedUnproven));
        // A peer that ignores the node's proof and proves a token it does not hold: refused.
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await.map(|p| p.request) });
        prove_regardless(&mut peer, OTHER, None).await;
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::WrongToken));
        // A listener that is not the node: the gateway sends it the hello and nothing more.
        let (mut gateway, mut fake) = tokio::io::duplex(1 << 16);
        let fake_side = tokio::spawn(async move {
            let hello = read_frame::<ToNode>(&mut fake, MAX_UNPROVEN_FRAME).await.unwrap();
            assert!(matches!(hello, Some(ToNode::Hello { .. })));
            let (_, pake) = exchange(OTHER);
            let forged = FromNode::Challenge { nonce: nonce(), pake, proof: vec![0; 32] };
            write_frame(&mut fake, &forged).await.unwrap();
            let mut rest = Vec::new();
            fake.read_to_end(&mut rest).await.unwrap();
            rest
        });
        let e = open(&mut gateway, Secret::Token(TOKEN), Request::Discover).await.unwrap_err();
        assert!(matches!(e, LinkError::NotTheNode), "{e}");
        drop(gateway);
        assert!(fake_side.await.unwrap().is_empty(), "nothing after the hello");
    }

    /// A replica proves its own name with its credential; with it, it cannot pass for another
    /// replica, and a credential issued under another token proves nothing.
    #[tokio::test]
    async fn a_replica_proves_its_own_name_and_no_other() {
        use crate::link::replica::{Credential, issue};
        let r1 = Credential::parse(&issue(TOKEN, "r1")).unwrap();
        let as_r1 = Secret::Replica { name: "r1", password: r1.password() };
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let request = Request::Standby { gateway: "r1".into() };
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await });
        open(&mut gateway, as_r1, request.clone()).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Ok(Proved { replica: Some("r1".into()), request }));

        // r1's credential, claiming r2's name: the node's proof does not check, nothing more is
        // sent, and the node sees a replica that did not prove its name.
        let as_r2 = Secret::Replica { name: "r2", password: r1.password() };
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await });
        let e = open(&mut gateway, as_r2, Request::Standby { gateway: "r2".into() }).await.unwrap_err();
        assert!(matches!(e, LinkError::NotTheNode), "{e}");
        drop(gateway);
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::ClosedUnproven));

        // r1's own name, with a credential of another cluster: refused as r1's wrong credential.
        let foreign = Credential::parse(&issue(OTHER, "r1")).unwrap();
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await });
        prove_regardless(&mut peer, foreign.password(), Some("r1")).await;
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::WrongCredential("r1".into())));

        // The node's token is not a replica's credential either: a token holder that names a
        // replica must hold that replica's credential.
        let (mut gateway, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await });
        let posing = Secret::Replica { name: "r1", password: TOKEN };
        assert!(matches!(open(&mut gateway, posing, Request::Discover).await, Err(LinkError::NotTheNode)));
        drop(gateway);
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::ClosedUnproven));
    }

    #[tokio::test]
    async fn a_name_that_is_no_name_is_refused_before_anything_is_derived() {
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let node_side = tokio::spawn(async move { accept(&mut node, TOKEN).await });
        let (_, pake) = exchange(TOKEN);
        let hello = ToNode::Hello { protocol: PROTOCOL, nonce: nonce(), pake, replica: Some("x".repeat(65)) };
        write_frame(&mut peer, &hello).await.unwrap();
        assert_eq!(node_side.await.unwrap(), Err(HandshakeRefused::BadName(65)));
    }
}
