//! The keyed hashes the link's proofs are made of: HMAC-SHA256 over a label and a list of
//! parts, each part's length first (no two different lists read the same).

use hmac::{Hmac, Mac};
use sha2::Sha256;

pub(super) type HmacSha256 = Hmac<Sha256>;

/// A proof keyed with `token`: see [`keyed`].
pub(super) fn mac(token: &str, label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    keyed(token.as_bytes(), label, parts)
}

pub(super) fn keyed(key: &[u8], label: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(label);
    for part in parts {
        // Each part's length first: no two different lists of parts read the same.
        mac.update(&(part.len() as u32).to_le_bytes());
        mac.update(part);
    }
    mac
}
