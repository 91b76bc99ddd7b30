//! TLS on the listener: the server certificate (reloaded in place, so renewing it drops no
//! connection) and partners' client certificates (chained to `client_ca_file` or pinned by a
//! partner's `cert_sha256`). It only decides who may finish a handshake; which partner a
//! certificate names is `partners`' business.
//!
//! What a client certificate may cost is bounded before it is verified: a chain of more than
//! `MAX_CLIENT_INTERMEDIATES` certificates after the leaf, of more than
//! `MAX_CLIENT_CHAIN_BYTES`, or with two issuers named alike but holding different keys, fails
//! the handshake unverified (`BoundedChains`). rustls itself takes a handshake message of up to
//! 64 KiB (fixed; no setting lowers it), so this is where a chain is cut down to size.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::config::TlsFileConfig;
use crate::partners::ClientCertificate;

/// The most certificates a client may send after its leaf. Building a path tries each one
/// whose subject names the issuer sought, a signature check apiece: a chain of 100 look-alike
/// issuers cost 8.4 ms of CPU, 15 times a normal handshake with a client certificate.
/// Partners' chains hold 0 to 2 intermediates (3 when the root is sent along).
pub const MAX_CLIENT_INTERMEDIATES: usize = 4;

/// The most bytes (DER, leaf and intermediates together) a client's chain may hold: a leaf and
/// four RSA-4096 intermediates fit with room to spare, the 58 KB of a look-alike chain do not.
pub const MAX_CLIENT_CHAIN_BYTES: usize = 16 * 1024;

/// Why the TLS files could not be used; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {what}", path.display())]
    Pem { path: PathBuf, what: String },
    #[error("{} holds no PEM certificate", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{} holds no usable private key (PKCS#8, PKCS#1 or SEC1 PEM): {what}", path.display())]
    Key { path: PathBuf, what: String },
    #[error("the key in {} does not match the certificate in {}: {what}", key.display(), cert.display())]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        what: String,
    },
    #[error("{}: {what}", path.display())]
    ClientCa { path: PathBuf, what: String },
    #[error("TLS settings: {0}")]
    Config(rustls::Error),
}

/// The listener's TLS: accepts handshakes and says which client certificate came with one.
/// Cheap to clone.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    /// Set when client certificates may chain to a CA: the handshake accepts pinned ones too,
    /// so whether this one chained is asked again after it.
    ca: Option<Arc<dyn ClientCertVerifier>>,
    reloader: TlsReloader,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.reloader.0.files)
            .field("client_ca", &self.ca.is_some())
            .finish()
    }
}

impl Tls {
    /// Reads the files. `pinned` are the client certificate fingerprints (lowercase hex
    /// SHA-256 of the DER) that are accepted without chaining to the client CA; with neither
    /// a CA nor a pin no client certificate is asked for.
    pub fn new(files: &TlsFileConfig, pinned: BTreeSet<String>) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        // Before reading, as in `reload`: a change while we read is seen at the next check.
        let seen = stamp(files);
        let current = load_certified_key(&files.cert_file, &files.key_file, &provider)?;
        let resolver = Arc::new(Reloading {
            files: files.clone(),
            provider: provider.clone(),
            stamp: Mutex::new(seen),
            current: RwLock::new(Arc::new(current)),
        });
        let ca = files
            .client_ca_file
            .as_deref()
            .map(|path| ca_verifier(path, &provider))
            .transpose()?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(TlsError::Config)?;
        let builder = if ca.is_some() || !pinned.is_empty() {
            builder.with_client_cert_verifier(Arc::new(BoundedChains(ClientVerifier {
                ca: ca.clone(),
                pinned,
                algorithms: provider.signature_verification_algorithms,
            })))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            ca,
            reloader: TlsReloader(resolver),
        })
    }

    /// The handle that reloads the server certificate.
    pub fn reloader(&self) -> TlsReloader {
        self.reloader.clone()
    }

    /// Runs the handshake on `io`; the client certificate it carried, if any.
    pub async fn accept<IO>(
        &self,
        io: IO,
    ) -> std::io::Result<(TlsStream<IO>, Option<ClientCertificate>)>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let stream = self.acceptor.accept(io).await?;
        let certificate = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| self.client_certificate(chain));
        Ok((stream, certificate))
    }

    fn client_certificate(&self, chain: &[CertificateDer<'_>]) -> Option<ClientCertificate> {
        let (leaf, intermediates) = chain.split_first()?;
        let chain_verified = self.ca.as_ref().is_some_and(|ca| {
            ca.verify_client_cert(leaf, intermediates, UnixTime::now())
                .is_ok()
        });
        Some(ClientCertificate {
            der: leaf.as_ref().to_vec(),
            chain_verified,
        })
    }
}

/// Reloads the listener's certificate: on SIGHUP, when its files change, or when a test asks.
/// Connections already open keep the certificate they were set up with. Cheap to clone.
#[derive(Clone, Debug)]
pub struct TlsReloader(Arc<Reloading>);

impl TlsReloader {
    /// Reads the certificate and key again and serves them to new connections; on error the
    /// old ones stay.
    pub fn reload(&self) -> Result<(), TlsError> {
        let r = &self.0;
        // The stamp is taken first: a file replaced while we read it is then seen as changed
        // at the next check and read again.
        let seen = stamp(&r.files);
        *r.stamp.lock().unwrap_or_else(|p| p.into_inner()) = seen;
        let key = load_certified_key(&r.files.cert_file, &r.files.key_file, &r.provider)?;
        *r.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        Ok(())
    }

    /// `reload`, saying how it went in the log (SIGHUP, the file check).
    pub fn reload_logged(&self) {
        match self.reload() {
            Ok(()) => tracing::info!(
                certificate = %self.0.files.cert_file.display(),
                sha256 = %self.fingerprint(),
                not_after = ?self.not_after(),
                "TLS certificate reloaded"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "TLS certificate not reloaded; still serving the previous one"
            ),
        }
    }

    /// When the leaf certificate being served now expires (its `notAfter`), if it can be read.
    pub fn not_after(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let current = self.0.current();
        current
            .end_entity_cert()
            .ok()
            .and_then(|c| crate::x509::not_after(c.as_ref()))
    }

    /// The SHA-256 (lowercase hex) of the leaf certificate being served now.
    pub fn fingerprint(&self) -> String {
        let current = self.0.current();
        current
            .end_entity_cert()
            .map(|c| crate::secrets::sha256_hex(c.as_ref()))
            .unwrap_or_default()
    }

    /// Checks the files every `every` and reloads when one of them changed. Runs until
    /// dropped.
    pub async fn watch_files(self, every: Duration) {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let seen = stamp(&self.0.files);
            let changed = *self.0.stamp.lock().unwrap_or_else(|p| p.into_inner()) != seen;
            if changed {
                // A half-written pair fails here and is logged once; the write that completes
                // it changes the stamp again.
                self.reload_logged();
            }
        }
    }
}

/// The certificate new handshakes get, swapped whole on reload.
#[derive(Debug)]
struct Reloading {
    files: TlsFileConfig,
    provider: Arc<CryptoProvider>,
    /// The files' state when last read.
    stamp: Mutex<Stamp>,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Reloading {
    fn current(&self) -> Arc<CertifiedKey> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Modification time and length of the certificate and the key file (`None`: unreadable).
type Stamp = [Option<(SystemTime, u64)>; 2];

fn stamp(files: &TlsFileConfig) -> Stamp {
    let one = |path: &Path| {
        let meta = std::fs::metadata(path).ok()?;
        Some((meta.modified().ok()?, meta.len()))
    };
    [one(&files.cert_file), one(&files.key_file)]
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            what: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn load_certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert_file)?;
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?).map_err(|e| TlsError::Key {
        path: key_file.to_owned(),
        what: e.to_string(),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: key_file.to_owned(),
            what: e.to_string(),
        })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        // A key type that cannot tell its public key is left to the handshake.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(e) => Err(TlsError::KeyMismatch {
            cert: cert_file.to_owned(),
            key: key_file.to_owned(),
            what: e.to_string(),
        }),
    }
}

fn ca_verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(path)? {
        roots.add(cert).map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            what: format!("not a usable CA certificate: {e}"),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::ClientCa {
            path: path.to_owned(),
            what: e.to_string(),
        })
}

/// Client certificates are optional (partners may use Basic or a token instead); one that is
/// sent must chain to the CA or be pinned, else the handshake fails.
#[derive(Debug)]
struct ClientVerifier {
    ca: Option<Arc<dyn ClientCertVerifier>>,
    pinned: BTreeSet<String>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientVerifier {
    fn is_pinned(&self, cert: &CertificateDer<'_>) -> bool {
        self.pinned
            .contains(&crate::secrets::sha256_hex(cert.as_ref()))
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Pinned certificates are named by no CA: listing only the CA's subjects could make a
        // client holding a pinned one decide not to send it, so without a CA none are listed.
        self.ca.as_ref().map_or(&[], |ca| ca.root_hint_subjects())
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let by_ca = match &self.ca {
            Some(ca) => ca.verify_client_cert(end_entity, intermediates, now),
            None => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer,
            )),
        };
        match by_ca {
            Ok(verified) => Ok(verified),
            Err(_) if self.is_pinned(end_entity) => Ok(ClientCertVerified::assertion()),
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Why a client's chain was refused before verification. rustls shows it by `Debug`, which
/// therefore says what `Display` says.
#[derive(thiserror::Error)]
enum ChainRefused {
    /// Over `MAX_CLIENT_INTERMEDIATES` or `MAX_CLIENT_CHAIN_BYTES`.
    #[error(
        "client certificate chain of {certificates} certificates and {bytes} bytes refused \
         unverified (at most {} after the leaf and {MAX_CLIENT_CHAIN_BYTES} bytes)",
        MAX_CLIENT_INTERMEDIATES
    )]
    TooLarge { certificates: usize, bytes: usize },
    /// Two issuers named alike with different keys (`look_alikes`).
    #[error(
        "client certificate chain refused unverified: two of its issuers share a name but not a \
         key"
    )]
    LookAlikes,
}

impl std::fmt::Debug for ChainRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// Whether two of `intermediates` share a subject but not a public key. Path building tries
/// every certificate named like the issuer it seeks, and below each the others again: four
/// look-alikes make 64 paths to check (3.8 ms of CPU, against 0.3 ms for a whole normal
/// handshake). A real chain names each issuer once (a cross-signed one twice, with one key).
/// Certificates that do not parse are left to the verifier, which rejects them as cheaply.
fn look_alikes(intermediates: &[CertificateDer<'_>]) -> bool {
    let parsed: Vec<webpki::EndEntityCert<'_>> = intermediates
        .iter()
        .filter_map(|c| webpki::EndEntityCert::try_from(c).ok())
        .collect();
    parsed.iter().enumerate().any(|(i, a)| {
        parsed[..i].iter().any(|b| {
            a.subject() == b.subject() && a.subject_public_key_info() != b.subject_public_key_info()
        })
    })
}

/// Refuses a chain over the bounds, or with look-alike issuers, before `V` spends any work on
/// it, pinned or not; otherwise `V` decides.
#[derive(Debug)]
struct BoundedChains<V>(V);

impl<V> BoundedChains<V> {
    fn check(
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<(), rustls::Error> {
        let bytes = intermediates
            .iter()
            .fold(end_entity.as_ref().len(), |sum, c| {
                sum.saturating_add(c.as_ref().len())
            });
        let refused =
            if intermediates.len() > MAX_CLIENT_INTERMEDIATES || bytes > MAX_CLIENT_CHAIN_BYTES {
                ChainRefused::TooLarge {
                    certificates: intermediates.len() + 1,
                    bytes,
                }
            } else if look_alikes(intermediates) {
                ChainRefused::LookAlikes
            } else {
                return Ok(());
            };
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::Other(rustls::OtherError(Arc::new(refused))),
        ))
    }
}

impl<V: ClientCertVerifier> ClientCertVerifier for BoundedChains<V> {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Self::check(end_entity, intermediates)?;
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.0.requires_raw_public_keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Pki {
        dir: tempfile::TempDir,
        ca: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    }

    struct Leaf {
        cert_pem: String,
        key_pem: String,
        der: CertificateDer<'static>,
    }

    fn pki() -> Pki {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "unit CA");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap())
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Pki { dir, ca }
    }

    fn leaf(pki: Option<&Pki>, name: &str) -> Leaf {
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = match pki {
            Some(pki) => params.signed_by(&key, &pki.ca).unwrap(),
            None => params.self_signed(&key).unwrap(),
        };
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    fn files(pki: &Pki, server: &Leaf, client_ca: bool) -> TlsFileConfig {
        let path = |n: &str| pki.dir.path().join(n);
        std::fs::write(path("cert.pem"), &server.cert_pem).unwrap();
        std::fs::write(path("key.pem"), &server.key_pem).unwrap();
        TlsFileConfig {
            cert_file: path("cert.pem"),
            key_file: path("key.pem"),
            client_ca_file: client_ca.then(|| path("ca.pem")),
            reload_check_seconds: 0,
        }
    }

    fn verifier(pki: &Pki, ca: bool, pinned: &[&Leaf]) -> ClientVerifier {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        ClientVerifier {
            ca: ca.then(|| ca_verifier(&pki.dir.path().join("ca.pem"), &provider).unwrap()),
            pinned: pinned
                .iter()
                .map(|l| crate::secrets::sha256_hex(l.der.as_ref()))
                .collect(),
            algorithms: provider.signature_verification_algorithms,
        }
    }

    #[test]
    fn the_verifier_takes_chained_or_pinned_certificates_only() {
        let pki = pki();
        let chained = leaf(Some(&pki), "acme.example");
        let pinned = leaf(None, "globex.example");
        let stranger = leaf(None, "initech.example");
        let now = UnixTime::now();
        let with_ca = verifier(&pki, true, &[&pinned]);
        assert!(with_ca.verify_client_cert(&chained.der, &[], now).is_ok());
        assert!(with_ca.verify_client_cert(&pinned.der, &[], now).is_ok());
        assert!(with_ca.verify_client_cert(&stranger.der, &[], now).is_err());
        assert!(!with_ca.root_hint_subjects().is_empty());
        assert!(with_ca.offer_client_auth() && !with_ca.client_auth_mandatory());
        let pins_only = verifier(&pki, false, &[&pinned]);
        assert!(
            pins_only
                .verify_client_cert(&chained.der, &[], now)
                .is_err()
        );
        assert!(pins_only.verify_client_cert(&pinned.der, &[], now).is_ok());
        assert!(pins_only.root_hint_subjects().is_empty());
    }

    #[test]
    fn chains_over_the_bounds_are_refused_before_verification() {
        let pki = pki();
        let chained = leaf(Some(&pki), "acme.example");
        let pinned = leaf(None, "globex.example");
        let now = UnixTime::now();
        let bounded = BoundedChains(verifier(&pki, true, &[&pinned]));
        let ca = CertificateDer::from(pki.ca.der().to_vec());
        let some = |n: usize| vec![ca.clone(); n];
        let within = some(MAX_CLIENT_INTERMEDIATES);
        assert!(
            bounded
                .verify_client_cert(&chained.der, &within, now)
                .is_ok(),
            "as many as allowed, and the root sent along, still chain"
        );
        let over = some(MAX_CLIENT_INTERMEDIATES + 1);
        for leaf in [&chained, &pinned] {
            let why = bounded
                .verify_client_cert(&leaf.der, &over, now)
                .expect_err("one too many")
                .to_string();
            assert!(why.contains("refused unverified"), "{why}");
        }
        let big = CertificateDer::from(vec![0u8; MAX_CLIENT_CHAIN_BYTES]);
        let why = bounded
            .verify_client_cert(&pinned.der, &[big], now)
            .expect_err("too many bytes")
            .to_string();
        assert!(why.contains("bytes refused unverified"), "{why}");
        assert!(
            bounded.verify_client_cert(&pinned.der, &[], now).is_ok(),
            "a pinned certificate alone passes"
        );
        // Two issuers named like the CA, with keys of their own: look-alikes, however few.
        let look_alike = || {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "unit CA");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().unwrap();
            params.self_signed(&key).unwrap().der().clone()
        };
        let fakes = [look_alike(), look_alike()];
        let why = bounded
            .verify_client_cert(&chained.der, &fakes, now)
            .expect_err("look-alikes")
            .to_string();
        assert!(why.contains("share a name but not a key"), "{why}");
        assert!(
            bounded
                .verify_client_cert(&chained.der, &fakes[..1], now)
                .is_ok(),
            "one alone is no look-alike (and unused)"
        );
        assert!(bounded.offer_client_auth() && !bounded.client_auth_mandatory());
        assert!(!bounded.root_hint_subjects().is_empty());
    }

    #[test]
    fn chain_verified_is_true_only_for_the_ca_s_certificates() {
        let pki = pki();
        let server = leaf(Some(&pki), "localhost");
        let chained = leaf(Some(&pki), "acme.example");
        let pinned = leaf(None, "globex.example");
        let pins = BTreeSet::from([crate::secrets::sha256_hex(pinned.der.as_ref())]);
        let tls = Tls::new(&files(&pki, &server, true), pins.clone()).unwrap();
        let seen = tls
            .client_certificate(std::slice::from_ref(&chained.der))
            .unwrap();
        assert!(seen.chain_verified);
        assert_eq!(seen.der, chained.der.as_ref());
        let seen = tls
            .client_certificate(std::slice::from_ref(&pinned.der))
            .unwrap();
        assert!(!seen.chain_verified);
        assert_eq!(tls.client_certificate(&[]), None);
        // Without a client CA nothing is chain-verified, even a certificate of that CA.
        let tls = Tls::new(&files(&pki, &server, false), pins).unwrap();
        let seen = tls
            .client_certificate(std::slice::from_ref(&chained.der))
            .unwrap();
        assert!(!seen.chain_verified);
    }

    #[test]
    fn unusable_files_are_named() {
        let pki = pki();
        let server = leaf(Some(&pki), "localhost");
        let good = files(&pki, &server, true);
        let error = |f: &TlsFileConfig| Tls::new(f, BTreeSet::new()).unwrap_err().to_string();

        let missing = TlsFileConfig {
            cert_file: pki.dir.path().join("nope.pem"),
            ..good.clone()
        };
        let why = error(&missing);
        assert!(
            why.starts_with("cannot read") && why.contains("nope.pem"),
            "{why}"
        );

        std::fs::write(pki.dir.path().join("empty.pem"), "no PEM here\n").unwrap();
        let empty = TlsFileConfig {
            cert_file: pki.dir.path().join("empty.pem"),
            ..good.clone()
        };
        let why = error(&empty);
        assert!(why.contains("empty.pem holds no PEM certificate"), "{why}");

        let no_key = TlsFileConfig {
            key_file: good.cert_file.clone(),
            ..good.clone()
        };
        let why = error(&no_key);
        assert!(
            why.contains("cert.pem holds no usable private key"),
            "{why}"
        );

        let other = leaf(Some(&pki), "localhost");
        std::fs::write(&good.key_file, &other.key_pem).unwrap();
        let why = error(&good);
        assert!(why.contains("does not match"), "{why}");
        assert!(why.contains("key.pem") && why.contains("cert.pem"), "{why}");

        let bad_ca = TlsFileConfig {
            client_ca_file: Some(pki.dir.path().join("empty.pem")),
            ..files(&pki, &server, true)
        };
        let why = error(&bad_ca);
        assert!(why.contains("empty.pem"), "{why}");
    }

    #[test]
    fn reload_swaps_only_a_good_pair() {
        let pki = pki();
        let first = leaf(Some(&pki), "localhost");
        let f = files(&pki, &first, false);
        let tls = Tls::new(&f, BTreeSet::new()).unwrap();
        let reloader = tls.reloader();
        let fingerprint = |l: &Leaf| crate::secrets::sha256_hex(l.der.as_ref());
        assert_eq!(reloader.fingerprint(), fingerprint(&first));
        let second = leaf(Some(&pki), "localhost");
        files(&pki, &second, false);
        reloader.reload().unwrap();
        assert_eq!(reloader.fingerprint(), fingerprint(&second));
        std::fs::remove_file(&f.key_file).unwrap();
        assert!(matches!(reloader.reload(), Err(TlsError::Read { .. })));
        assert_eq!(reloader.fingerprint(), fingerprint(&second));
    }
}
