//! A node's signature of the grants its offers become. A replica dials only a grant its node
//! signed: the signature covers the worker, the address the node registered and the offer's
//! nonce, under the token the node and the cluster's replicas share (which the store never
//! holds). A store can reorder, replay or withhold grants; it cannot invent one, nor send a
//! replica to another address. The node admits an attach only under the worker's current
//! nonce, so a replayed grant attaches nothing.
//!
//! The ticket and the mode are not signed: the node offers a worker before the store chooses
//! the ticket it goes to. A grant moved to another ticket (or mode) of the same cluster sends
//! that replica to the same node, which checks the mode against the worker's.

use hmac::Mac;

use super::handshake::mac;

const GRANT_LABEL: &[u8] = b"omni-gateway grant v1";

/// The node's signature (hex) of the grant of its worker `slot`, reached at `addr`, offered
/// under `nonce`.
pub fn sign(token: &str, slot: &str, addr: &str, nonce: &str) -> String {
    hex::encode(mac(token, GRANT_LABEL, &[slot.as_bytes(), addr.as_bytes(), nonce.as_bytes()]).finalize().into_bytes())
}

/// Whether `signature` is the node's for this grant (compared in constant time).
pub fn verify(token: &str, slot: &str, addr: &str, nonce: &str, signature: &str) -> bool {
    let Ok(signature) = hex::decode(signature) else { return false };
    mac(token, GRANT_LABEL, &[slot.as_bytes(), addr.as_bytes(), nonce.as_bytes()]).verify_slice(&signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_covers_the_worker_the_address_and_the_nonce() {
        let s = sign("tok-0123456789abcdef", "n1/w-0", "10.0.0.5:7100", "n0nce");
        assert!(verify("tok-0123456789abcdef", "n1/w-0", "10.0.0.5:7100", "n0nce", &s));
        assert!(!verify("tok-0123456789abcdef", "n1/w-0", "10.6.6.6:7100", "n0nce", &s), "another address");
        assert!(!verify("tok-0123456789abcdef", "n1/w-1", "10.0.0.5:7100", "n0nce", &s), "another worker");
        assert!(!verify("tok-0123456789abcdef", "n1/w-0", "10.0.0.5:7100", "n1nce", &s), "another nonce");
        assert!(!verify("other-0123456789abcd", "n1/w-0", "10.0.0.5:7100", "n0nce", &s), "another token");
        assert!(!verify("tok-0123456789abcdef", "n1/w-0", "10.0.0.5:7100", "n0nce", "zz"), "not hex");
    }
}
