//! Secrets the gateway checks (partners' passwords and bearer tokens, API tokens) and secrets it
//! presents (our credentials towards partners): where they come from (the config, a file, an
//! environment variable), how a presented one is matched (constant time; argon2 PHC hashes,
//! with a bounded cache so that a partner's every request does not cost a hash), and the
//! `hash-secret` helper. No secret ever reaches a log: `Secret`'s `Debug` prints nothing of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, bail};
use argon2::password_hash::{PasswordHash, PasswordHasher as _, PasswordVerifier as _, SaltString};
use aws_lc_rs::digest;
use tokio::sync::Semaphore;

/// A secret value: compared and sent, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that sends it (an `Authorization` header).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// A secret given inline, in a file (`…_file`, trailing newline removed; relative to `base`,
/// the config file's folder) or in an environment variable (`…_env`): at most one of the
/// three. `key` names the setting in errors.
pub fn load_secret(
    key: &str,
    base: Option<&Path>,
    inline: Option<&str>,
    file: Option<&Path>,
    env: Option<&str>,
) -> anyhow::Result<Option<Secret>> {
    let file = file.map(|p| relative_to(base, p));
    let file = file.as_deref();
    let given = [inline.is_some(), file.is_some(), env.is_some()];
    if given.iter().filter(|g| **g).count() > 1 {
        bail!("{key}: give at most one of {key}, {key}_file and {key}_env");
    }
    let value = if let Some(v) = inline {
        v.to_owned()
    } else if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("{key}_file: cannot read {}", path.display()))?;
        text.trim_end_matches(['\r', '\n']).to_owned()
    } else if let Some(var) = env {
        std::env::var(var).with_context(|| format!("{key}_env: {var} is not set"))?
    } else {
        return Ok(None);
    };
    if value.is_empty() {
        bail!("{key}: the secret is empty");
    }
    Ok(Some(Secret(value)))
}

/// How a configured secret is kept: as given (compared in constant time), as a PHC hash
/// (`$argon2id$…`, from `wsr-gateway hash-secret`), or as the SHA-256 of a long random token
/// (`hash-secret --sha256`: as safe for such a token, and no hashing cost per request).
#[derive(Clone, PartialEq, Eq)]
pub enum Stored {
    Plain(Secret),
    Hash(String),
    Sha256([u8; 32]),
}

impl std::fmt::Debug for Stored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stored::Plain(_) => f.write_str("Plain(…)"),
            Stored::Hash(_) => f.write_str("Hash(…)"),
            Stored::Sha256(_) => f.write_str("Sha256(…)"),
        }
    }
}

impl Stored {
    /// A PHC string, checked now so that a typo fails the start, not every request.
    pub fn hash(key: &str, phc: &str) -> anyhow::Result<Stored> {
        let parsed = PasswordHash::new(phc)
            .map_err(|e| anyhow::anyhow!("{key}: not a PHC-format hash ({e})"))?;
        if !parsed.algorithm.as_str().starts_with("argon2") {
            bail!(
                "{key}: hash algorithm {} is not supported (use argon2id: wsr-gateway hash-secret)",
                parsed.algorithm
            );
        }
        Ok(Stored::Hash(phc.to_owned()))
    }

    /// A SHA-256 digest in hex (colons allowed).
    pub fn sha256(key: &str, hex: &str) -> anyhow::Result<Stored> {
        let hex = normal_fingerprint(hex)
            .ok_or_else(|| anyhow::anyhow!("{key}: not 64 hex digits of a SHA-256 digest"))?;
        let digest = crate::hex::from_hex(&hex, 32)
            .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
            .ok_or_else(|| anyhow::anyhow!("{key}: not hex"))?;
        Ok(Stored::Sha256(digest))
    }
}

/// Most distinct presented secrets remembered as verified. Beyond it the cache is emptied:
/// it only saves hashing work, and an attacker filling it gains nothing (failures are never
/// remembered).
const VERIFIED_CACHE_ENTRIES: usize = 4096;

/// Argon2 verifications at once: each costs ~20 MiB and tens of milliseconds of a core, so
/// a flood of wrong passwords may slow logins down but not exhaust memory or every core.
const HASHING_AT_ONCE: usize = 2;

/// Matches presented secrets against stored ones. One per gateway, cheap to clone.
#[derive(Clone)]
pub struct Verifier {
    /// SHA-256 of (stored hash, presented secret) pairs that verified.
    verified: Arc<Mutex<HashMap<[u8; 32], ()>>>,
    hashing: Arc<Semaphore>,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier {
            verified: Arc::default(),
            hashing: Arc::new(Semaphore::new(HASHING_AT_ONCE)),
        }
    }
}

impl Verifier {
    /// Whether `presented` is the secret `stored` keeps.
    pub async fn matches(&self, stored: &Stored, presented: &str) -> bool {
        match stored {
            Stored::Plain(secret) => constant_time_eq(secret.0.as_bytes(), presented.as_bytes()),
            Stored::Sha256(digest) => constant_time_eq(
                digest,
                aws_lc_rs::digest::digest(&digest::SHA256, presented.as_bytes()).as_ref(),
            ),
            Stored::Hash(phc) => {
                let key = cache_key(phc, presented);
                if self.remembered(&key) {
                    return true;
                }
                let Ok(_permit) = self.hashing.acquire().await else {
                    return false;
                };
                // Many connections of one partner arrive at once with the same secret: those
                // that waited for a permit find it verified by the first, not hash it again.
                if self.remembered(&key) {
                    return true;
                }
                let (phc, presented) = (phc.clone(), presented.to_owned());
                let ok = tokio::task::spawn_blocking(move || verify_phc(&phc, &presented))
                    .await
                    .unwrap_or(false);
                if ok {
                    self.remember(key);
                }
                ok
            }
        }
    }

    fn remembered(&self, key: &[u8; 32]) -> bool {
        self.verified
            .lock()
            .map(|cache| cache.contains_key(key))
            .unwrap_or(false)
    }

    fn remember(&self, key: [u8; 32]) {
        if let Ok(mut cache) = self.verified.lock() {
            if cache.len() >= VERIFIED_CACHE_ENTRIES {
                cache.clear();
            }
            cache.insert(key, ());
        }
    }
}

fn cache_key(phc: &str, presented: &str) -> [u8; 32] {
    let mut ctx = digest::Context::new(&digest::SHA256);
    // Length-prefixed, so that no (hash, secret) pair can be shifted into another.
    ctx.update(&(phc.len() as u64).to_be_bytes());
    ctx.update(phc.as_bytes());
    ctx.update(presented.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

fn verify_phc(phc: &str, presented: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(hash) => argon2::Argon2::default()
            .verify_password(presented.as_bytes(), &hash)
            .is_ok(),
        Err(_) => false,
    }
}

/// Compares without an early exit, so the time taken does not tell how much matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The PHC string (argon2id, default parameters, a random salt) for `secret`.
pub fn hash_secret(secret: &str) -> anyhow::Result<String> {
    let mut salt = [0u8; 16];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| anyhow::anyhow!("no random salt"))?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| anyhow::anyhow!("salt: {e}"))?;
    let hash = argon2::Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map_err(|e| anyhow::anyhow!("cannot hash: {e}"))?;
    Ok(hash.to_string())
}

/// The lowercase hex SHA-256 of `bytes` (a certificate's fingerprint, a secret's digest, a
/// submit request's fingerprint).
pub fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex::lower_hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

/// A configured fingerprint in any usual spelling (`AB:CD:…`, `abcd…`, `sha256:…`) as
/// lowercase hex; `None` if it is not 32 bytes of hex.
pub fn normal_fingerprint(given: &str) -> Option<String> {
    let hex: String = given
        .trim()
        .trim_start_matches("sha256:")
        .trim_start_matches("SHA256:")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase();
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit())).then_some(hex)
}

/// A path relative to the configuration file's folder, as operators expect of `…_file` keys.
pub fn relative_to(base: Option<&Path>, path: &Path) -> PathBuf {
    match base {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_hash_verifies_its_secret_only_and_is_remembered() {
        let phc = hash_secret("correct horse").expect("hash");
        assert!(phc.starts_with("$argon2id$"), "{phc}");
        let stored = Stored::hash("password_hash", &phc).expect("valid PHC");
        let verifier = Verifier::default();
        assert!(!verifier.matches(&stored, "wrong horse").await);
        assert!(verifier.matches(&stored, "correct horse").await);
        assert!(verifier.remembered(&cache_key(&phc, "correct horse")));
        assert!(!verifier.remembered(&cache_key(&phc, "wrong horse")));
        assert!(
            verifier.matches(&stored, "correct horse").await,
            "from the cache"
        );
        let plain = Stored::Plain(Secret::new("abc"));
        assert!(verifier.matches(&plain, "abc").await);
        assert!(!verifier.matches(&plain, "abd").await);
        assert!(!verifier.matches(&plain, "ab").await);
    }

    #[test]
    fn bad_hashes_fail_at_load() {
        assert!(Stored::hash("k", "not a hash").is_err());
        assert!(Stored::hash("k", "$5$rounds=1000$salt$hash").is_err());
    }

    #[test]
    fn secrets_come_from_one_place_and_never_print() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("s");
        std::fs::write(&file, "from-file\n").expect("write");
        let s = load_secret("token", None, None, Some(&file), None).expect("file");
        assert_eq!(s.as_ref().map(Secret::expose), Some("from-file"));
        assert_eq!(format!("{s:?}"), "Some(Secret(…))");
        assert!(load_secret("token", None, Some("a"), Some(&file), None).is_err());
        assert!(load_secret("token", None, None, None, Some("WSR_SURELY_UNSET_VAR")).is_err());
        assert!(load_secret("token", None, Some(""), None, None).is_err());
        assert!(
            load_secret("token", None, None, None, None)
                .expect("none")
                .is_none()
        );
    }

    #[test]
    fn fingerprints_in_any_spelling() {
        let hex = sha256_hex(b"x");
        let colons: Vec<String> = hex
            .as_bytes()
            .chunks(2)
            .map(|c| String::from_utf8_lossy(c).to_uppercase())
            .collect();
        assert_eq!(normal_fingerprint(&colons.join(":")), Some(hex.clone()));
        assert_eq!(normal_fingerprint(&format!("sha256:{hex}")), Some(hex));
        assert_eq!(normal_fingerprint("abcd"), None);
    }
}
