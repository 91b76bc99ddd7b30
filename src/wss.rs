//! WS-Security UsernameToken (OASIS UsernameToken Profile 1.0/1.1) as a partner credential
//! (D14), the pure rules: the PasswordDigest, the freshness window of `Created`, and the
//! token we send. No I/O and no clock: time is passed in. Who a token names and whether its
//! password is right are the partners' (`partners.rs`); a nonce's single use is the store's.

use chrono::{DateTime, Duration, Utc};

use crate::secrets::{base64_decode, base64_encode};
use crate::wsr::UsernameToken;
use crate::wsr::datetime::{date_time_string, parse_date_time};

/// How far a token's `Created` may lie from our clock, either way (the profile's advice is
/// "a few minutes"); its nonce is remembered this long past `Created`.
pub const WINDOW: Duration = Duration::minutes(5);

/// Longest username, password, nonce and `Created` read from a token: beyond them it proves
/// nothing (and costs nothing to refuse).
const MAX_FIELD: usize = 1024;

/// `Base64(SHA-1(nonce + created + password))`, the nonce as decoded bytes; `None` when the
/// nonce is not base64.
pub fn password_digest(nonce: &str, created: &str, password: &str) -> Option<String> {
    let nonce = base64_decode(nonce)?;
    let mut input = Vec::with_capacity(nonce.len() + created.len() + password.len());
    input.extend_from_slice(&nonce);
    input.extend_from_slice(created.as_bytes());
    input.extend_from_slice(password.as_bytes());
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    Some(base64_encode(digest.as_ref()))
}

/// What a token must carry to be checked at all, and whether its `Created` is within the
/// window of `now`: `Ok(Some((nonce, until)))` when it has a nonce that must be used only
/// once, until `until`. A digest needs a nonce and a `Created`.
pub fn check_form(
    token: &UsernameToken,
    now: DateTime<Utc>,
) -> Result<Option<(String, DateTime<Utc>)>, &'static str> {
    let fields = [
        Some(&token.username),
        token.password.as_ref(),
        token.nonce.as_ref(),
        token.created.as_ref(),
    ];
    if fields.into_iter().flatten().any(|f| f.len() > MAX_FIELD) {
        return Err("a UsernameToken field is too long");
    }
    if token.username.is_empty() || token.password.is_none() {
        return Err("the UsernameToken has no Username or no Password");
    }
    if token.digest && (token.nonce.is_none() || token.created.is_none()) {
        return Err("a PasswordDigest needs a Nonce and a Created");
    }
    let created = match &token.created {
        None => None,
        Some(text) => {
            let (created, _) =
                parse_date_time(text).map_err(|_| "the UsernameToken's Created is no dateTime")?;
            if created > now + WINDOW || created < now - WINDOW {
                return Err("the UsernameToken's Created is outside the accepted window");
            }
            Some(created)
        }
    };
    Ok(match (&token.nonce, created) {
        (Some(nonce), Some(created)) => Some((nonce.clone(), created + WINDOW)),
        // A nonce without a time is remembered for the window from now.
        (Some(nonce), None) => Some((nonce.clone(), now + WINDOW)),
        (None, _) => None,
    })
}

/// The token we present to a partner that requires one: a fresh nonce and `Created` each
/// time, the password as a digest or as text.
pub fn our_token(
    username: &str,
    password: &str,
    digest: bool,
    now: DateTime<Utc>,
) -> UsernameToken {
    let mut bytes = [0u8; 16];
    // The system's random source; a failure leaves a nonce of zeros, which the partner's
    // replay check refuses the second time (never a silent reuse on our side).
    let _ = aws_lc_rs::rand::fill(&mut bytes);
    let nonce = base64_encode(&bytes);
    let created = date_time_string(&now);
    let password = match digest {
        true => password_digest(&nonce, &created, password).unwrap_or_default(),
        false => password.to_owned(),
    };
    UsernameToken {
        username: username.to_owned(),
        password: Some(password),
        digest,
        nonce: Some(nonce),
        created: Some(created),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("time")
    }

    #[test]
    fn the_digest_is_the_profiles_example() {
        // The nonce and time of the UsernameToken Profile 1.0's example (§3.1); the digest
        // computed apart (Python's hashlib over the decoded nonce), so the nonce's bytes,
        // not its base64 text, are what is hashed.
        let ours = password_digest(
            "WScqanjCEAC4mQoBE07sAQ==",
            "2003-07-16T01:24:32Z",
            "taadtaadpstcsm",
        );
        assert_eq!(ours.as_deref(), Some("AtYMdWClJo7PIuTpqmhmEEoEZyc="));
        assert_eq!(password_digest("not base64!", "x", "y"), None);
    }

    #[test]
    fn a_token_is_checked_for_form_and_freshness() {
        let now = t0();
        let ours = our_token("acme", "secret", true, now);
        let (nonce, until) = check_form(&ours, now).expect("fresh").expect("a nonce");
        assert_eq!(Some(nonce), ours.nonce);
        assert_eq!(until, now + WINDOW);
        assert!(
            check_form(&ours, now + WINDOW + Duration::seconds(1)).is_err(),
            "stale"
        );
        assert!(
            check_form(&ours, now - WINDOW - Duration::seconds(1)).is_err(),
            "future"
        );
        let no_nonce = UsernameToken {
            nonce: None,
            ..ours.clone()
        };
        assert!(
            check_form(&no_nonce, now).is_err(),
            "a digest needs a nonce"
        );
        let text = UsernameToken {
            digest: false,
            nonce: None,
            created: None,
            ..ours
        };
        assert_eq!(
            check_form(&text, now),
            Ok(None),
            "plain text, nothing to remember"
        );
    }
}
