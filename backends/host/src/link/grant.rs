//! A node's signature of the grants its offers become. A replica dials only a grant its node
//! signed: the signature covers the worker, the address the node registered and the offer's
//! nonce, made with the cluster's grant key (Ed25519, derived from the nodes' token: see
//! [`super::replica`]). Replicas hold only its public half, in their credentials: neither a
//! store nor a replica can make one. A store can reorder, replay or withhold grants; it cannot
//! invent one, nor send a replica to another address. The node admits an attach only under the
//! worker's current nonce, so a replayed grant attaches nothing.
//!
//! The ticket and the mode are not signed: the node offers a worker before the store chooses
//! the ticket it goes to. A grant moved to another ticket (or mode) of the same cluster sends
//! that replica to the same node, which checks the mode against the worker's.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};

const GRANT_LABEL: &[u8] = b"omni-gateway grant v2";

/// What is signed: each part's length first, so no two different grants read the same.
fn signed(slot: &str, addr: &str, nonce: &str) -> Vec<u8> {
    let mut bytes = GRANT_LABEL.to_vec();
    for part in [slot, addr, nonce] {
        bytes.extend_from_slice(&(part.len() as u32).to_le_bytes());
        bytes.extend_from_slice(part.as_bytes());
    }
    bytes
}

/// The node's signature (hex) of the grant of its worker `slot`, reached at `addr`, offered
/// under `nonce`.
pub fn sign(key: &SigningKey, slot: &str, addr: &str, nonce: &str) -> String {
    hex::encode(key.sign(&signed(slot, addr, nonce)).to_bytes())
}

/// Whether `signature` is the cluster's nodes' for this grant.
pub fn verify(key: &VerifyingKey, slot: &str, addr: &str, nonce: &str, signature: &str) -> bool {
    let Some(signature) = hex::decode(signature).ok().and_then(|s| Signature::from_slice(&s).ok()) else {
        return false;
    };
    key.verify_strict(&signed(slot, addr, nonce), &signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::replica::grant_signer;

    #[test]
    fn a_signature_covers_the_worker_the_address_and_the_nonce() {
        let key = grant_signer("tok-0123456789abcdef0123456789abcdef");
        let public = key.verifying_key();
        let other = grant_signer("other-0123456789abcd0123456789abcdef").verifying_key();
        let s = sign(&key, "n1/w-0", "10.0.0.5:7100", "n0nce");
        assert!(verify(&public, "n1/w-0", "10.0.0.5:7100", "n0nce", &s));
        assert!(!verify(&public, "n1/w-0", "10.6.6.6:7100", "n0nce", &s), "another address");
        assert!(!verify(&public, "n1/w-1", "10.0.0.5:7100", "n0nce", &s), "another worker");
        assert!(!verify(&public, "n1/w-0", "10.0.0.5:7100", "n1nce", &s), "another nonce");
        assert!(!verify(&other, "n1/w-0", "10.0.0.5:7100", "n0nce", &s), "another cluster");
        assert!(!verify(&public, "n1/w-0", "10.0.0.5:7100", "n0nce", "zz"), "not hex");
        assert!(!verify(&public, "n1/w-0", "10.0.0.5:7100", "n0nce", &"00".repeat(64)), "not a signature");
    }
}
