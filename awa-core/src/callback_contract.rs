//! The HTTP callback ingress contract shared by whoever signs a callback id and whoever
//! checks it: `awa callbacks serve`, a receiver inside the application's own web framework
//! (Python's `awa.callback_contract`), and awa-pg's workers and clients.
//!
//! The signature is the lowercase hex of the BLAKE3 keyed hash of the callback id's UTF-8
//! bytes under a 32-byte secret, sent in the `X-Awa-Signature` header. That is awa-pg
//! 0.6.9's format (observed bit for bit, see `tests/test_callback_contract.py`): one format,
//! so a receiver of either implementation accepts what the other's senders sign. BLAKE3 is
//! already the engine's unique-key hash, so this adds no dependency.

/// The request header that carries the signature.
pub const SIGNATURE_HEADER: &str = "X-Awa-Signature";
/// Where the receiver routes live unless configured otherwise:
/// `<prefix>/<callback_id>/<action>`.
pub const DEFAULT_PATH_PREFIX: &str = "/api/callbacks";
/// The callback timeout a heartbeat extends to when none is given, in seconds.
pub const DEFAULT_HEARTBEAT_TIMEOUT_SECS: f64 = 3600.0;
/// The secret's exact length: BLAKE3's key size.
pub const SECRET_LEN: usize = blake3::KEY_LEN;

/// A secret of the wrong length, the only way signing can fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("callback secret must be exactly {SECRET_LEN} bytes (got {0})")]
pub struct SecretLength(pub usize);

fn key(secret: &[u8]) -> Result<&[u8; SECRET_LEN], SecretLength> {
    secret.try_into().map_err(|_| SecretLength(secret.len()))
}

/// The signature of `callback_id`: 64 lowercase hex characters.
pub fn sign(secret: &[u8], callback_id: &str) -> Result<String, SecretLength> {
    Ok(blake3::keyed_hash(key(secret)?, callback_id.as_bytes())
        .to_hex()
        .to_string())
}

/// Whether `signature` is `callback_id`'s signature. Hex of either case is accepted; anything
/// that is not exactly 64 hex characters (surrounding spaces, a `sha256=` prefix) is `false`.
/// The comparison is constant-time (`blake3::Hash`'s equality), so a caller probing with
/// guesses learns nothing from the timing. Only a wrong-length secret is an error.
pub fn verify(secret: &[u8], callback_id: &str, signature: &str) -> Result<bool, SecretLength> {
    let expected = blake3::keyed_hash(key(secret)?, callback_id.as_bytes());
    Ok(blake3::Hash::from_hex(signature).is_ok_and(|given| given == expected))
}

/// The receiver URL of one action: `base` without its trailing slashes, then `prefix` with
/// exactly one leading slash and no trailing ones (nothing when it is empty or only slashes),
/// then `/<callback_id>/<action>`. The id and action are inserted as given (callback ids are
/// UUIDs; actions are `complete`, `fail`, `heartbeat`): the same normalization awa-pg applies,
/// observed on its `build_callback_url`.
pub fn build_callback_url(base: &str, prefix: &str, callback_id: &str, action: &str) -> String {
    let base = base.trim_end_matches('/');
    let prefix = prefix.trim_end_matches('/');
    let slash = if prefix.is_empty() || prefix.starts_with('/') {
        ""
    } else {
        "/"
    };
    format!("{base}{slash}{prefix}/{callback_id}/{action}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_must_be_32_bytes() {
        assert_eq!(sign(b"short", "x"), Err(SecretLength(5)));
        assert_eq!(verify(&[0; 33], "x", ""), Err(SecretLength(33)));
        assert_eq!(
            SecretLength(5).to_string(),
            "callback secret must be exactly 32 bytes (got 5)"
        );
    }

    #[test]
    fn verify_round_trip_and_refusals() -> Result<(), SecretLength> {
        let secret = [7u8; 32];
        let sig = sign(&secret, "abc")?;
        assert_eq!(sig.len(), 64);
        assert!(verify(&secret, "abc", &sig)?);
        assert!(verify(&secret, "abc", &sig.to_uppercase())?);
        assert!(!verify(&secret, "abd", &sig)?);
        assert!(!verify(&secret, "abc", &format!(" {sig}"))?);
        assert!(!verify(&secret, "abc", &sig[..63])?);
        assert!(!verify(&secret, "abc", "")?);
        Ok(())
    }

    #[test]
    fn url_normalization() {
        let u = |b, p| build_callback_url(b, p, "id", "complete");
        assert_eq!(
            u("https://x.io/", "/api/callbacks/"),
            "https://x.io/api/callbacks/id/complete"
        );
        assert_eq!(u("https://x.io", "api"), "https://x.io/api/id/complete");
        assert_eq!(u("https://x.io", "//"), "https://x.io/id/complete");
        assert_eq!(u("", ""), "/id/complete");
    }
}
