//! Twilio's request signature: `X-Twilio-Signature` is the base64 of the HMAC-SHA1 of the URL
//! Twilio requested (for a Media Stream's upgrade, a GET: the URL alone), keyed with the
//! account's auth token. Compared in constant time.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha1::Sha1;

/// Whether `signature` is Twilio's for `url` under `token`.
pub fn valid(token: &str, url: &str, signature: &str) -> bool {
    let Ok(given) = STANDARD.decode(signature.trim()) else { return false };
    let Ok(mut mac) = Hmac::<Sha1>::new_from_slice(token.as_bytes()) else { return false };
    mac.update(url.as_bytes());
    mac.verify_slice(&given).is_ok()
}

#[cfg(test)]
mod tests {
    use super::valid;

    #[test]
    fn the_signature_is_hmac_sha1_of_the_url() {
        // Computed independently: Python's base64(hmac.new(b"12345", url, sha1).digest()).
        let url = "wss://gateway.example.com/v1/telephony/twilio?model=omni";
        assert!(valid("12345", url, "SqGe0AivzAeVeFegAEdWE1x3eiA="));
        assert!(!valid("12346", url, "SqGe0AivzAeVeFegAEdWE1x3eiA="));
        assert!(!valid("12345", &format!("{url}&x=1"), "SqGe0AivzAeVeFegAEdWE1x3eiA="));
        assert!(!valid("12345", url, "not base64!"));
    }
}
