//! Each replica of a cluster has an identity of its own at the nodes: a credential issued for
//! its name from the cluster's secret (the nodes' `[node] token`), which the replica holds
//! instead of the secret.
//!
//! - The credential's key is `HMAC-SHA256(secret, label, name)`. A node derives it again from
//!   the name a replica claims in its hello and runs the handshake with it as the password
//!   ([`super::handshake`]): a replica proves its own name, and holding one replica's
//!   credential proves nothing about another's (nor the secret).
//! - The nodes sign their grants with an Ed25519 key derived from the secret; the credential
//!   carries its public half, so a replica checks a grant it could not have made
//!   ([`super::grant`]).
//! - A node refuses the names in its `[cluster] revoked_replicas` (read again on SIGHUP) and
//!   closes the links they keep open for grants; the other replicas are not touched.
//!
//! `omni-gateway --config node.toml replica-credential NAME` issues one; it reads like
//! `ogr1:NAME:KEY:GRANTS` (base64url), and is a secret of that replica alone.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{SigningKey, VerifyingKey};
use hmac::Mac;

use super::mac::mac;

const KEY_LABEL: &[u8] = b"omni-gateway replica key v1";
const GRANT_KEY_LABEL: &[u8] = b"omni-gateway grant signing key v1";
const PREFIX: &str = "ogr1";

/// What a replica holds: its name, the key it proves that name with, and the key the nodes'
/// grants are checked against.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub name: String,
    /// The handshake's password for this name (base64url of the key).
    password: String,
    grants: VerifyingKey,
}

impl std::fmt::Debug for Credential {
    /// The name only: the key is a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({} ...)", self.name)
    }
}

/// Whether `name` can name a replica: up to 64 letters, digits, '_', '.' and '-'.
pub fn name_ok(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && omni_actors::settings::name_ok(name)
}

/// The handshake's password of replica `name` under the cluster's `secret` (a node derives it
/// from the name a hello claims).
pub fn password(secret: &str, name: &str) -> String {
    B64.encode(mac(secret, KEY_LABEL, &[name.as_bytes()]).finalize().into_bytes())
}

/// The key the nodes of the cluster sign their grants with.
pub fn grant_signer(secret: &str) -> SigningKey {
    let seed: [u8; 32] = mac(secret, GRANT_KEY_LABEL, &[]).finalize().into_bytes().into();
    SigningKey::from_bytes(&seed)
}

/// The credential of replica `name` in the cluster whose secret is `secret`.
pub fn issue(secret: &str, name: &str) -> String {
    let grants = B64.encode(grant_signer(secret).verifying_key().as_bytes());
    format!("{PREFIX}:{name}:{}:{grants}", password(secret, name))
}

/// What is wrong with a text given as a credential (never the text itself: it may be a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("is not a replica credential (ogr1:NAME:KEY:GRANTS, from `omni-gateway replica-credential`)")]
    NotACredential,
    #[error("is a credential of another kind, not {PREFIX}")]
    OtherKind,
    #[error("names no replica")]
    NoName,
    #[error("has a damaged key (32 bytes, base64url)")]
    Key,
    #[error("has a damaged grant key (32 bytes of an Ed25519 key, base64url)")]
    GrantKey,
}

impl Credential {
    /// Reads an issued credential; says what is wrong with anything else.
    pub fn parse(text: &str) -> Result<Credential, CredentialError> {
        let parts: Vec<&str> = text.trim().split(':').collect();
        let [prefix, name, key, grants] = parts[..] else { return Err(CredentialError::NotACredential) };
        if prefix != PREFIX {
            return Err(CredentialError::OtherKind);
        }
        if !name_ok(name) {
            return Err(CredentialError::NoName);
        }
        match B64.decode(key) {
            Ok(bytes) if bytes.len() == 32 => {}
            _ => return Err(CredentialError::Key),
        }
        let grants: [u8; 32] =
            B64.decode(grants).ok().and_then(|b| b.try_into().ok()).ok_or(CredentialError::GrantKey)?;
        let grants = VerifyingKey::from_bytes(&grants).map_err(|_| CredentialError::GrantKey)?;
        Ok(Credential { name: name.to_string(), password: key.to_string(), grants })
    }

    /// The password this replica proves its name with.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The key the nodes' grants are checked against.
    pub fn grant_key(&self) -> &VerifyingKey {
        &self.grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use CredentialError as E;

    const SECRET: &str = "Jx2d9Kp4TzY6bN1cHs5fGa8uE0iO2wRkMq3V8r7lWm0=";

    #[test]
    fn a_credential_is_its_names_alone_and_reads_back() {
        let r1 = Credential::parse(&issue(SECRET, "r1")).unwrap();
        let r2 = Credential::parse(&issue(SECRET, "r2")).unwrap();
        assert_eq!(r1.name, "r1");
        assert_eq!(r1.password(), password(SECRET, "r1"), "what the node derives for r1");
        assert_ne!(r1.password(), r2.password(), "r1's key says nothing of r2's");
        assert_ne!(r1.password(), password("another-secret-0123456789abcdefghij", "r1"));
        assert_eq!(r1.grant_key(), r2.grant_key(), "one cluster, one grant key");
        assert!(!r1.password().contains(SECRET) && !issue(SECRET, "r1").contains(SECRET));
        assert!(!format!("{r1:?}").contains(r1.password()), "Debug shows the name only");
    }

    #[test]
    fn anything_else_is_refused_with_what_is_wrong() {
        let good = issue(SECRET, "r1");
        assert_eq!(Credential::parse(SECRET), Err(E::NotACredential));
        assert_eq!(Credential::parse(&good.replacen("ogr1", "ogr9", 1)), Err(E::OtherKind));
        assert_eq!(Credential::parse(&good.replacen(":r1:", ":r 1:", 1)), Err(E::NoName));
        let parts: Vec<&str> = good.split(':').collect();
        let short = format!("ogr1:r1:{}:{}", &parts[2][..10], parts[3]);
        assert_eq!(Credential::parse(&short), Err(E::Key));
        let bad = format!("ogr1:r1:{}:{}", parts[2], &parts[3][..10]);
        assert_eq!(Credential::parse(&bad), Err(E::GrantKey));
    }
}
