//! Secrets: comparing them without leaking where they differ, per-application credentials and
//! the handshake's proof (`docs/security.md`), and the rules for the admin API's token (a key of
//! both the server's and the coordinator's configuration).

/// Compares secrets without an early exit on the first differing byte (the length still shows).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Domain-separation prefix of an application's credential.
const CREDENTIAL_CONTEXT: &[u8] = b"sluice-app-credential-v1\0";
/// Domain-separation prefix of a handshake proof.
const PROOF_CONTEXT: &[u8] = b"sluice-handshake-proof-v1\0";

fn hmac_hex(key: &[u8], parts: &[&[u8]]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any size");
    for p in parts {
        mac.update(p);
    }
    hex::encode(mac.finalize().into_bytes())
}

/// The credential of application `app_id` in a cluster whose key is `cluster_key`: lower-case
/// hex of HMAC-SHA256(cluster key, context ‖ app id). Any holder of the cluster key derives it,
/// so servers and coordinators keep no table of credentials; an application that holds its own
/// learns nothing about another's (`docs/security.md`).
pub fn app_credential(cluster_key: &str, app_id: &str) -> String {
    hmac_hex(cluster_key.as_bytes(), &[CREDENTIAL_CONTEXT, app_id.as_bytes()])
}

/// What a client answers an `AuthChallenge` with: lower-case hex of HMAC-SHA256(credential,
/// context ‖ app id ‖ 0 ‖ server nonce ‖ 0 ‖ client nonce). The server's fresh nonce makes a
/// recorded proof worthless on any other connection.
pub fn handshake_proof(
    credential: &str,
    app_id: &str,
    server_nonce: &str,
    client_nonce: &str,
) -> String {
    let parts: [&[u8]; 6] = [
        PROOF_CONTEXT,
        app_id.as_bytes(),
        b"\0",
        server_nonce.as_bytes(),
        b"\0",
        client_nonce.as_bytes(),
    ];
    hmac_hex(credential.as_bytes(), &parts)
}

/// A fresh nonce: 16 bytes from the thread's CSPRNG, as 32 hex characters.
pub fn nonce() -> String {
    let mut b = [0u8; 16];
    rand::Rng::fill(&mut rand::rng(), &mut b);
    hex::encode(b)
}

/// Shortest cluster key taken (`secret` of servers and coordinators): every credential is
/// derived from it.
pub const CLUSTER_KEY_MIN_CHARS: usize = 16;

/// Shortest `admin_token` taken: the token is all that stands between the network and a drain.
pub const ADMIN_TOKEN_MIN_CHARS: usize = 16;

/// Checks an `admin_token` setting (`None`: no token, write endpoints open).
pub fn validate_admin_token(token: Option<&str>) -> Result<(), String> {
    let Some(t) = token else { return Ok(()) };
    let n = t.chars().count();
    if n < ADMIN_TOKEN_MIN_CHARS {
        return Err(format!("admin_token: {n} characters, need at least {ADMIN_TOKEN_MIN_CHARS}"));
    }
    if t.trim() != t || t.chars().any(|c| c.is_control() || !c.is_ascii()) {
        return Err("admin_token: printable ASCII with no leading or trailing whitespace \
                    (it travels in an HTTP header)"
            .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_only_when_equal() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn credentials_differ_per_app_and_key() {
        let a = app_credential("cluster-key-0123456789", "app-a");
        assert_eq!(a.len(), 64);
        assert_eq!(a, app_credential("cluster-key-0123456789", "app-a"));
        assert_ne!(a, app_credential("cluster-key-0123456789", "app-b"));
        assert_ne!(a, app_credential("cluster-key-9876543210", "app-a"));
        // RFC 4231 test case 2 pins the HMAC-SHA256 underneath (key "Jefe").
        assert_eq!(
            hmac_hex(b"Jefe", &[b"what do ya want ", b"for nothing?"]),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    /// The same values are pinned in the Java client's `CredentialsTest` (computed independently
    /// with Python's `hmac`): both sides derive and prove alike.
    #[test]
    fn pinned_values_shared_with_java() {
        let c = app_credential("cluster-key-0123456789", "app-a");
        assert_eq!(c, "07e1880a6f34bdd006df7a7384e71b1811e88777fb726d5184b0948d631fae41");
        assert_eq!(
            handshake_proof(&c, "app-a", "server-nonce", "client-nonce"),
            "f1d9f5399f7b645da4c2c75e51556d752e927d4e09db8d63756d789196f7c101"
        );
    }

    #[test]
    fn proofs_bind_both_nonces_and_the_app() {
        let p = handshake_proof("cred", "app", "s1", "c1");
        assert_eq!(p, handshake_proof("cred", "app", "s1", "c1"));
        assert_ne!(p, handshake_proof("cred", "app", "s2", "c1"));
        assert_ne!(p, handshake_proof("cred", "app", "s1", "c2"));
        assert_ne!(p, handshake_proof("cred", "app2", "s1", "c1"));
        assert_ne!(p, handshake_proof("cred2", "app", "s1", "c1"));
        assert_ne!(nonce(), nonce());
        assert_eq!(nonce().len(), 32);
    }

    #[test]
    fn admin_token_rules() {
        assert!(validate_admin_token(None).is_ok());
        assert!(validate_admin_token(Some("0123456789abcdef")).is_ok());
        let short = validate_admin_token(Some("short")).unwrap_err();
        assert!(short.contains("5 characters"), "{short}");
        assert!(validate_admin_token(Some(" 0123456789abcdef")).is_err());
        assert!(validate_admin_token(Some("0123456789abcdef\n")).is_err());
        assert!(validate_admin_token(Some("0123456789abcdéf")).is_err());
    }
}
