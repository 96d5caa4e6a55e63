//! Secrets: comparing them without leaking where they differ, and the rules for the admin API's
//! token (a key of both the server's and the coordinator's configuration).

/// Compares secrets without an early exit on the first differing byte (the length still shows).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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
