//! Secrets the gateway checks (partners' passwords and bearer tokens, API tokens) and secrets it
//! presents (our credentials towards partners): where they come from (the config, a file, an
//! environment variable), how a presented one is matched (constant time; argon2 PHC hashes,
//! with a bounded cache so that a partner's every request does not cost a hash, computed on
//! two threads of their own that keep their memory), and the `hash-secret` helper. No secret
//! ever reaches a log: `Secret`'s `Debug` prints nothing of it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, mpsc};

use anyhow::{Context as _, bail};
use argon2::password_hash::{self, PasswordHash, PasswordHasher as _, SaltString};
use argon2::{Algorithm, Argon2, Block, Params, Version};
use aws_lc_rs::digest;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

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
        let argon = ArgonHash::parse(phc).map_err(|e| anyhow::anyhow!("{key}: {e}"))?;
        if argon.context.params().t_cost() > MAX_HASH_PASSES {
            bail!(
                "{key}: the hash asks for more than {MAX_HASH_PASSES} passes per check (t={}); \
                 one such check would hold a hashing thread for every login",
                argon.context.params().t_cost()
            );
        }
        if argon.context.params().block_count() > MAX_HASH_BLOCKS {
            bail!(
                "{key}: the hash asks for more than {} MiB of memory per check (m={})",
                MAX_HASH_BLOCKS / 1024,
                argon.context.params().m_cost()
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
/// a flood of wrong passwords may slow logins down but not exhaust memory or every core. It is
/// also the number of threads that compute them, each keeping its memory for the next.
const HASHING_AT_ONCE: usize = 2;

/// The most memory one configured hash may ask for, in argon2 blocks of 1 KiB (1 GiB; the
/// default parameters of `hash-secret` ask for 19 MiB). Each hashing thread keeps as much as
/// the largest configured hash asks for.
const MAX_HASH_BLOCKS: usize = 1024 * 1024;

/// The most passes one configured hash may ask for (`hash-secret` uses 2; OWASP's
/// recommendations stay below 10).
const MAX_HASH_PASSES: u32 = 64;

/// Matches presented secrets against stored ones. One per gateway, cheap to clone.
#[derive(Clone, Default)]
pub struct Verifier {
    /// SHA-256 of (stored hash, presented secret) pairs that verified.
    verified: Arc<Mutex<HashMap<[u8; 32], ()>>>,
    /// Argon2 hashes this verifier had computed (its tests' witness).
    hashed: Arc<AtomicU64>,
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
                let Some(permit) = Hashers::get().permit().await else {
                    return false;
                };
                // Many connections of one partner arrive at once with the same secret: those
                // that waited for a permit find it verified by the first, not hash it again.
                if self.remembered(&key) {
                    return true;
                }
                let ok = self.hash_check(permit, phc.clone(), presented).await;
                if ok {
                    self.remember(key);
                }
                ok
            }
        }
    }

    /// Spends on `presented` what a wrong secret for `like` (a configured one) costs, and
    /// refuses it: for a user name that matches nobody, so that its refusal takes as long as
    /// a wrong password's and the time taken does not tell which users exist. For a hash, the
    /// check runs against a fixed hash with the same parameters that nothing matches.
    pub async fn refuse_like(&self, like: &Stored, presented: &str) {
        match like {
            Stored::Hash(phc) => {
                let Some(dummy) = hash_like(phc) else {
                    return;
                };
                if let Some(permit) = Hashers::get().permit().await {
                    self.hash_check(permit, dummy, presented).await;
                }
            }
            // A comparison (after a SHA-256), whatever its outcome.
            Stored::Plain(_) | Stored::Sha256(_) => {
                std::hint::black_box(self.matches(like, presented).await);
            }
        }
    }

    /// The argon2 hashes this verifier (and its clones) had computed.
    pub fn hashes_computed(&self) -> u64 {
        self.hashed.load(Ordering::Relaxed)
    }

    /// Verifies on one of the hashing threads, holding `permit` until it is done (also when
    /// the caller stops waiting, so no more than `HASHING_AT_ONCE` are ever queued or run).
    async fn hash_check(&self, permit: OwnedSemaphorePermit, phc: String, presented: &str) -> bool {
        let (answer, answered) = oneshot::channel();
        let job = HashJob {
            phc,
            presented: Secret::new(presented),
            answer,
            _permit: permit,
        };
        if !Hashers::get().run(job) {
            return false;
        }
        let ok = answered.await;
        self.hashed.fetch_add(1, Ordering::Relaxed);
        ok.unwrap_or(false)
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

/// One argon2 check for a hashing thread.
struct HashJob {
    phc: String,
    presented: Secret,
    answer: oneshot::Sender<bool>,
    _permit: OwnedSemaphorePermit,
}

/// The process's argon2 checks: `HASHING_AT_ONCE` threads of their own, each with memory
/// blocks that it reuses from one check to the next. (`Argon2::verify_password` allocates its
/// ~19 MiB afresh per check; run on tokio's blocking threads, each thread's allocator arena
/// kept them, and a flood of wrong passwords grew the gateway by hundreds of MiB for good.)
/// One set for the whole process, whatever the number of gateways in it.
struct Hashers {
    permits: Arc<Semaphore>,
    jobs: mpsc::Sender<HashJob>,
}

impl Hashers {
    fn get() -> &'static Hashers {
        static HASHERS: OnceLock<Hashers> = OnceLock::new();
        HASHERS.get_or_init(|| {
            let (jobs, queue) = mpsc::channel::<HashJob>();
            let queue = Arc::new(Mutex::new(queue));
            for i in 0..HASHING_AT_ONCE {
                let queue = Arc::clone(&queue);
                let started = std::thread::Builder::new()
                    .name(format!("wsr-argon2-{i}"))
                    .spawn(move || hashing_thread(&queue));
                if let Err(e) = started {
                    tracing::error!("cannot start a password-hashing thread: {e}");
                }
            }
            Hashers {
                permits: Arc::new(Semaphore::new(HASHING_AT_ONCE)),
                jobs,
            }
        })
    }

    async fn permit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.permits).acquire_owned().await.ok()
    }

    /// Hands `job` to a hashing thread; false if none is left to take it.
    fn run(&self, job: HashJob) -> bool {
        self.jobs.send(job).is_ok()
    }
}

fn hashing_thread(queue: &Mutex<mpsc::Receiver<HashJob>>) {
    let mut memory: Vec<Block> = Vec::new();
    loop {
        let next = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(_) => return,
        };
        let Ok(job) = next else {
            return;
        };
        if job.answer.is_closed() {
            continue; // Nobody waits for it (the request went away).
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            verify_phc(&mut memory, &job.phc, job.presented.expose().as_bytes())
        }))
        .unwrap_or(false);
        let _ = job.answer.send(ok);
    }
}

/// A PHC string taken apart for argon2.
struct ArgonHash {
    context: Argon2<'static>,
    salt: Vec<u8>,
    expected: Vec<u8>,
}

impl ArgonHash {
    /// As `PasswordVerifier::verify_password` reads it: the algorithm, version (default
    /// 0x13), parameters, salt and hash of the string.
    fn parse(phc: &str) -> Result<ArgonHash, String> {
        let hash = PasswordHash::new(phc).map_err(|e| format!("not a PHC-format hash ({e})"))?;
        let unusable = |e: &dyn std::fmt::Display| format!("not a usable argon2 hash ({e})");
        let algorithm = Algorithm::try_from(hash.algorithm).map_err(|e| unusable(&e))?;
        let version = match hash.version {
            Some(v) => Version::try_from(v).map_err(|e| unusable(&e))?,
            None => Version::default(),
        };
        let params = Params::try_from(&hash).map_err(|e| unusable(&e))?;
        let (Some(salt), Some(expected)) = (hash.salt, hash.hash) else {
            return Err("not a usable argon2 hash (no salt or no hash)".into());
        };
        let mut salt_bytes = [0u8; 64];
        let salt = salt.decode_b64(&mut salt_bytes).map_err(|e| unusable(&e))?;
        Ok(ArgonHash {
            context: Argon2::new(algorithm, version, params),
            salt: salt.to_vec(),
            expected: expected.as_bytes().to_vec(),
        })
    }
}

/// Whether `presented` hashes to `phc`, computed in `memory` (grown to what the hash asks
/// for, and kept), compared in constant time.
fn verify_phc(memory: &mut Vec<Block>, phc: &str, presented: &[u8]) -> bool {
    let Ok(hash) = ArgonHash::parse(phc) else {
        return false;
    };
    let blocks = hash.context.params().block_count();
    if blocks > MAX_HASH_BLOCKS {
        return false;
    }
    if memory.len() < blocks {
        memory.resize(blocks, Block::default());
    }
    let mut computed = vec![0u8; hash.expected.len()];
    hash.context
        .hash_password_into_with_memory(presented, &hash.salt, &mut computed, &mut memory[..blocks])
        .is_ok()
        && constant_time_eq(&computed, &hash.expected)
    // (The blocks are not cleared: the first pass of the next check overwrites every one.)
}

/// A PHC string with the algorithm, version, parameters, salt length and hash length of
/// `phc`, but a fixed salt and a hash of zeros: what a user name nobody has is checked
/// against. Nothing is known to hash to it, and a match would be refused anyway.
fn hash_like(phc: &str) -> Option<String> {
    const SALT: &[u8; 64] = b"wsr-gateway: the hash a user name that matches nobody is checked";
    let hash = PasswordHash::new(phc).ok()?;
    let mut salt_bytes = [0u8; 64];
    let salt_len = hash.salt?.decode_b64(&mut salt_bytes).ok()?.len();
    let salt = SaltString::encode_b64(&SALT[..salt_len]).ok()?;
    let zeros = [0u8; password_hash::Output::MAX_LENGTH];
    let output = password_hash::Output::new(&zeros[..hash.hash?.len()]).ok()?;
    let dummy = PasswordHash {
        algorithm: hash.algorithm,
        version: hash.version,
        params: hash.params.clone(),
        salt: Some(salt.as_salt()),
        hash: Some(output),
    };
    Some(dummy.to_string())
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

/// Standard base64 with padding (HTTP Basic, RFC 7617).
pub fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The inverse of `base64_encode`; `None` for anything that is not standard padded base64,
/// or longer than any credentials we accept.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    if text.len() > 8192 {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(text).ok()
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

    /// A PHC string for `secret` with other parameters than `hash-secret`'s.
    fn hash_with(secret: &str, algorithm: Algorithm, version: Version, params: Params) -> String {
        let salt = SaltString::encode_b64(b"some salt, 20 bytes").expect("salt");
        Argon2::new(algorithm, version, params)
            .hash_password(secret.as_bytes(), &salt)
            .expect("hash")
            .to_string()
    }

    /// The hashing threads' check gives argon2's own verdict (`verify_password`) for the
    /// parameters of `hash-secret` and others, in one memory reused throughout (small, big,
    /// small and big again: what a check leaves in it never changes the next one's verdict).
    #[tokio::test]
    async fn pooled_checks_agree_with_argon2_in_reused_memory() {
        use argon2::PasswordVerifier as _;
        let default = hash_secret("correct horse").expect("hash");
        let small = hash_with(
            "correct horse",
            Algorithm::Argon2i,
            Version::V0x10,
            Params::new(64, 3, 2, Some(16)).expect("params"),
        );
        let argon2d = hash_with(
            "correct horse",
            Algorithm::Argon2d,
            Version::V0x13,
            Params::new(256, 1, 4, Some(64)).expect("params"),
        );
        let mut memory = Vec::new();
        for phc in [&small, &default, &argon2d, &small, &default] {
            // (argon2's own check of the default hash is left out: it is slow without
            // optimisation, and its verdict is known.)
            let presenteds: &[&str] = if phc == &default {
                &["correct horse", "wrong horse"]
            } else {
                &["correct horse", "wrong horse", "", "correct horse "]
            };
            for presented in presenteds {
                let expected = *presented == "correct horse";
                if phc != &default {
                    let theirs = Argon2::default().verify_password(
                        presented.as_bytes(),
                        &PasswordHash::new(phc).expect("phc"),
                    );
                    assert_eq!(theirs.is_ok(), expected, "{phc} {presented:?}");
                }
                assert_eq!(
                    verify_phc(&mut memory, phc, presented.as_bytes()),
                    expected,
                    "{phc} {presented:?}"
                );
            }
        }
        assert_eq!(
            memory.len(),
            Params::DEFAULT.block_count(),
            "the memory grew once, to the largest hash"
        );

        // On the threads, 8 at once, each verdict is right; a verdict found is remembered.
        let verifier = Verifier::default();
        let stored = Stored::hash("token_hash", &default).expect("valid PHC");
        let checks = (0..8).map(|i| {
            let (verifier, stored) = (verifier.clone(), stored.clone());
            let presented = if i % 4 == 0 {
                "correct horse"
            } else {
                "wrong horse"
            };
            async move { (verifier.matches(&stored, presented).await, presented) }
        });
        for (verdict, presented) in futures_util::future::join_all(checks).await {
            assert_eq!(verdict, presented == "correct horse", "{presented}");
        }
        let hashed = verifier.hashes_computed();
        assert!((7..=8).contains(&hashed), "{hashed}");
        assert!(verifier.matches(&stored, "correct horse").await);
        assert!(!verifier.matches(&stored, "wrong horse").await);
        assert_eq!(
            verifier.hashes_computed(),
            hashed + 1,
            "the right one remembered"
        );
    }

    /// A user name nobody has is checked against a fixed hash with the parameters of a
    /// configured one: one argon2 check, as a wrong password costs, and always refused.
    #[tokio::test]
    async fn an_unknown_user_costs_one_check_with_the_same_parameters() {
        let phc = hash_secret("correct horse").expect("hash");
        let dummy = hash_like(&phc).expect("a dummy hash");
        assert_ne!(dummy, phc);
        let (real, fake) = (
            PasswordHash::new(&phc).expect("phc"),
            PasswordHash::new(&dummy).expect("dummy phc"),
        );
        assert_eq!(real.algorithm, fake.algorithm);
        assert_eq!(real.version, fake.version);
        assert_eq!(real.params, fake.params);
        assert_eq!(real.salt.map(|s| s.len()), fake.salt.map(|s| s.len()));
        assert_eq!(real.hash.map(|h| h.len()), fake.hash.map(|h| h.len()));
        assert_eq!(hash_like(&phc), Some(dummy.clone()), "fixed");
        let like = Stored::hash("password_hash", &phc).expect("valid PHC");
        let verifier = Verifier::default();
        verifier.refuse_like(&like, "correct horse").await;
        assert_eq!(verifier.hashes_computed(), 1);
        assert!(!verifier.matches(&like, "wrong horse").await);
        assert_eq!(verifier.hashes_computed(), 2, "as a wrong password");
        let mut memory = Vec::new();
        assert!(!verify_phc(&mut memory, &dummy, b"correct horse"));
        assert_eq!(
            memory.len(),
            Params::DEFAULT.block_count(),
            "the same memory"
        );
    }

    #[test]
    fn bad_hashes_fail_at_load() {
        assert!(Stored::hash("k", "not a hash").is_err());
        assert!(Stored::hash("k", "$5$rounds=1000$salt$hash").is_err());
        let phc = hash_secret("x").expect("hash");
        let m = format!(",t={},", Params::DEFAULT_T_COST);
        let greedy = phc.replacen(
            &format!("m={}{m}", Params::DEFAULT_M_COST),
            &format!("m={}{m}", 2 * 1024 * 1024),
            1,
        );
        assert_ne!(greedy, phc);
        let refused = Stored::hash("k", &greedy).expect_err("2 GiB per check");
        assert!(refused.to_string().contains("1024 MiB"), "{refused}");
        let odd = phc.replacen("$v=19$", "$v=7$", 1);
        assert!(Stored::hash("k", &odd).is_err(), "no argon2 version 7");
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
