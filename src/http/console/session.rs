//! The console's sign-in cookie. It never holds the token: it names the principal, the
//! sign-in (a random nonce of its own) and when it ends, signed (HMAC-SHA256) together with
//! what the configuration holds for the token it was signed in with. The key is derived from
//! the store's secret (the one receipts are signed with), so every gateway of a cluster
//! accepts the cookie without a session table. A cookie is therefore worth nothing as an API
//! token, ends after `LIFETIME_HOURS`, and stops working at once when its token leaves the
//! configuration, changes, or loses the admin scope. Log out ends it too: its nonce is
//! recorded as signed out in the store (`ConsoleStore`), which every gateway reads before it
//! takes a cookie that verifies here.

use aws_lc_rs::hmac;
use chrono::{DateTime, Duration, Utc};

use crate::config::{ApiToken, Scope};
use crate::hex::{from_hex, lower_hex};
use crate::secrets::Stored;

/// How long a sign-in lasts, whatever the browser keeps.
pub const LIFETIME_HOURS: i64 = 12;

/// The longest principal a cookie names (configured principals are far shorter).
const MAX_PRINCIPAL_BYTES: usize = 256;

/// The random bytes naming one sign-in.
const NONCE_BYTES: usize = 16;

/// The console's signing key.
pub struct ConsoleKey(hmac::Key);

impl ConsoleKey {
    /// The key for the store's `secret`: derived from it, so that a console cookie and a
    /// delivery receipt are never signed with the same key.
    pub fn derive(secret: &[u8]) -> ConsoleKey {
        let root = hmac::Key::new(hmac::HMAC_SHA256, secret);
        let derived = hmac::sign(&root, b"wsr-gateway console sign-in v1");
        ConsoleKey(hmac::Key::new(hmac::HMAC_SHA256, derived.as_ref()))
    }
}

/// Why a cookie does not sign anyone in (shown on the login page).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignInError {
    #[error("the sign-in is not valid; sign in again")]
    Malformed,
    #[error("the sign-in ended after {LIFETIME_HOURS} hours; sign in again")]
    Expired,
    #[error("the token it was made with is no longer configured; sign in again")]
    TokenGone,
    #[error("the token it was made with no longer has the admin scope")]
    NotAdmin,
    /// Decided by the caller, from the store: the sign-in's nonce was signed out.
    #[error("the sign-in ended with Log out; sign in again")]
    SignedOut,
}

/// One sign-in's nonce: random, in lowercase hex. It names the sign-in in the store when it
/// is signed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Nonce(String);

impl Nonce {
    /// A new sign-in's nonce; `None` when the system has no randomness to give.
    pub fn fresh() -> Option<Nonce> {
        let mut bytes = [0u8; NONCE_BYTES];
        aws_lc_rs::rand::fill(&mut bytes).ok()?;
        Some(Nonce(lower_hex(&bytes)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A cookie that verified: the configured token it was signed for, its sign-in and when
/// that ends.
pub struct SignIn<'a> {
    pub token: &'a ApiToken,
    pub nonce: Nonce,
    pub expires: DateTime<Utc>,
}

/// What is signed: the cookie's own text, then the configured form of its token.
fn signed_bytes(body: &str, token: &Stored) -> Vec<u8> {
    let mut bytes = body.as_bytes().to_vec();
    bytes.push(0);
    match token {
        Stored::Plain(secret) => {
            bytes.extend_from_slice(b"plain\0");
            bytes.extend_from_slice(secret.expose().as_bytes());
        }
        Stored::Hash(phc) => {
            bytes.extend_from_slice(b"hash\0");
            bytes.extend_from_slice(phc.as_bytes());
        }
        Stored::Sha256(digest) => {
            bytes.extend_from_slice(b"sha256\0");
            bytes.extend_from_slice(digest);
        }
    }
    bytes
}

/// The cookie value for `token` (the configured token just used to sign in) and the new
/// sign-in `nonce`, valid until `now + LIFETIME_HOURS`:
/// `v2.{expiry ms}.{nonce}.{hex principal}.{hex mac}`.
pub fn sign(key: &ConsoleKey, token: &ApiToken, nonce: &Nonce, now: DateTime<Utc>) -> String {
    let expires = (now + Duration::hours(LIFETIME_HOURS)).timestamp_millis();
    let body = format!(
        "v2.{expires}.{}.{}",
        nonce.as_str(),
        lower_hex(token.principal.as_bytes())
    );
    let mac = hmac::sign(&key.0, &signed_bytes(&body, &token.secret));
    format!("{body}.{}", lower_hex(mac.as_ref()))
}

/// The sign-in a cookie value holds, if we signed it for a configured token and it has not
/// ended by `now` (whatever that token's scopes are now). Log out revokes what this returns.
/// (A cookie of the first format, without a nonce, is `Malformed`: it could not be signed
/// out, so it is not taken either.)
pub fn genuine<'a>(
    key: &ConsoleKey,
    value: &str,
    tokens: &'a [ApiToken],
    now: DateTime<Utc>,
) -> Result<SignIn<'a>, SignInError> {
    let (body, mac) = value.rsplit_once('.').ok_or(SignInError::Malformed)?;
    let mac = from_hex(mac, 32).ok_or(SignInError::Malformed)?;
    let mut parts = body.split('.');
    let (Some("v2"), Some(expires), Some(nonce), Some(principal), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Err(SignInError::Malformed);
    };
    let expires: i64 = expires.parse().map_err(|_| SignInError::Malformed)?;
    let nonce = from_hex(nonce, NONCE_BYTES)
        .filter(|b| b.len() == NONCE_BYTES)
        .map(|b| Nonce(lower_hex(&b)))
        .ok_or(SignInError::Malformed)?;
    let principal = from_hex(principal, MAX_PRINCIPAL_BYTES)
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or(SignInError::Malformed)?;
    let signed_for = tokens
        .iter()
        .filter(|t| t.principal == principal)
        .find(|t| hmac::verify(&key.0, &signed_bytes(body, &t.secret), &mac).is_ok())
        .ok_or(SignInError::TokenGone)?;
    if now.timestamp_millis() >= expires {
        return Err(SignInError::Expired);
    }
    let expires = DateTime::from_timestamp_millis(expires).ok_or(SignInError::Malformed)?;
    Ok(SignIn {
        token: signed_for,
        nonce,
        expires,
    })
}

/// The sign-in a cookie value holds, if it still signs an admin in at `now`, as far as the
/// cookie and the configuration tell: whether it was signed out is the store's to say.
pub fn verify<'a>(
    key: &ConsoleKey,
    value: &str,
    tokens: &'a [ApiToken],
    now: DateTime<Utc>,
) -> Result<SignIn<'a>, SignInError> {
    let signed_in = genuine(key, value, tokens, now)?;
    if !signed_in.token.scopes.contains(&Scope::Admin) {
        return Err(SignInError::NotAdmin);
    }
    Ok(signed_in)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::all_topics;
    use crate::secrets::Secret;

    fn token(secret: &str, principal: &str, scopes: Vec<Scope>) -> ApiToken {
        ApiToken {
            secret: Stored::Plain(Secret::new(secret)),
            principal: principal.to_owned(),
            scopes,
            topics: all_topics(),
        }
    }

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_900_000_000, 0).unwrap_or_default()
    }

    fn nonce() -> Nonce {
        Nonce::fresh().expect("randomness")
    }

    #[test]
    fn a_cookie_names_its_token_without_holding_it_and_ends_with_its_lifetime() {
        let key = ConsoleKey::derive(b"the store's secret");
        let ops = token("ops-token-0123456789", "ops", vec![Scope::Admin]);
        let tokens = vec![token("app-token", "app", vec![Scope::Produce]), ops.clone()];
        let signed_in = nonce();
        let cookie = sign(&key, &ops, &signed_in, t0());
        assert!(!cookie.contains("ops-token"), "{cookie}");
        assert!(
            !cookie.contains(&lower_hex(b"ops-token-0123456789")),
            "{cookie}"
        );
        let found = verify(&key, &cookie, &tokens, t0()).expect("signs in");
        assert_eq!(found.token.principal, "ops");
        assert_eq!(found.nonce, signed_in, "the sign-in it names");
        let later = t0() + Duration::hours(LIFETIME_HOURS);
        assert_eq!(found.expires, later);
        assert_eq!(
            verify(&key, &cookie, &tokens, later).err(),
            Some(SignInError::Expired)
        );
    }

    #[test]
    fn every_sign_in_has_a_nonce_of_its_own() {
        let key = ConsoleKey::derive(b"the store's secret");
        let ops = token("ops-token-0123456789", "ops", vec![Scope::Admin]);
        let (a, b) = (nonce(), nonce());
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 2 * NONCE_BYTES);
        assert_ne!(sign(&key, &ops, &a, t0()), sign(&key, &ops, &b, t0()));
    }

    #[test]
    fn a_cookie_fails_once_its_token_changes_or_loses_admin_and_cannot_be_forged() {
        let key = ConsoleKey::derive(b"the store's secret");
        let ops = token("ops-token-0123456789", "ops", vec![Scope::Admin]);
        let cookie = sign(&key, &ops, &nonce(), t0());
        let rotated = vec![token("ops-token-rotated", "ops", vec![Scope::Admin])];
        assert_eq!(
            verify(&key, &cookie, &rotated, t0()).err(),
            Some(SignInError::TokenGone)
        );
        let demoted = vec![token("ops-token-0123456789", "ops", vec![Scope::Consume])];
        assert_eq!(
            verify(&key, &cookie, &demoted, t0()).err(),
            Some(SignInError::NotAdmin)
        );
        // Still a genuine sign-in, which Log out can end (or the scope would bring it back).
        assert!(genuine(&key, &cookie, &demoted, t0()).is_ok());
        let tokens = vec![ops.clone()];
        let other_store = ConsoleKey::derive(b"another store");
        assert_eq!(
            verify(&other_store, &cookie, &tokens, t0()).err(),
            Some(SignInError::TokenGone)
        );
        // A later expiry, another sign-in, or another principal, under the old MAC.
        let (body, mac) = cookie.rsplit_once('.').unwrap_or_default();
        let later = (t0() + Duration::days(365)).timestamp_millis().to_string();
        let other = nonce();
        for (at, value) in [(1, later.as_str()), (2, other.as_str())] {
            let mut parts: Vec<&str> = body.split('.').collect();
            parts[at] = value;
            let changed = format!("{}.{mac}", parts.join("."));
            assert_eq!(
                verify(&key, &changed, &tokens, t0()).err(),
                Some(SignInError::TokenGone),
                "{changed}"
            );
        }
        // The first format (no nonce, so no sign-out) is not taken.
        let parts: Vec<&str> = body.split('.').collect();
        let v1 = format!("v1.{}.{}.{mac}", parts[1], parts[3]);
        assert_eq!(
            verify(&key, &v1, &tokens, t0()).err(),
            Some(SignInError::Malformed)
        );
        let short_nonce = format!("v2.{}.00.{}.{mac}", parts[1], parts[3]);
        for junk in [
            "",
            "v1",
            "v1.1.2.3",
            "v2.1.2.3.4",
            "v2.1.6f7073.00",
            &short_nonce,
            &format!("{cookie}.00"),
        ] {
            assert!(verify(&key, junk, &tokens, t0()).is_err(), "{junk}");
        }
    }
}
