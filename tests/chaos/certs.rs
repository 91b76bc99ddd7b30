//! The run's certificates, made fresh in the run's directory with the `openssl` CLI: a CA,
//! server certificates for both gateways and both proxies (subjectAltName 127.0.0.1 and
//! localhost), and client certificates for the gateways (gateway-a.example,
//! gateway-b.example), which the other side's `cert_names` identify.
//!
//! The CLI rather than a crate: `wsr-chaos` is a normal binary and rcgen only a
//! dev-dependency; openssl is present wherever the run is (here and in CI). The extensions go
//! through `-extfile` so that OpenSSL 1.1.1 works as well as 3.x.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// Where one run's certificates are: `{name}.pem` and `{name}.key` in `dir`.
#[derive(Debug, Clone)]
pub struct Certs {
    dir: PathBuf,
}

/// The server certificates: both gateways and both proxies.
pub const SERVERS: [&str; 4] = ["a", "b", "proxy-to-a", "proxy-to-b"];
/// The client certificates and the name each carries.
pub const CLIENTS: [(&str, &str); 2] = [
    ("a-client", "gateway-a.example"),
    ("b-client", "gateway-b.example"),
];

impl Certs {
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// The CA as PEM, for the harness's and the consumers' HTTPS clients.
    pub fn ca_pem(&self) -> Result<Vec<u8>> {
        std::fs::read(self.ca()).with_context(|| format!("read {}", self.ca().display()))
    }
}

/// Makes the CA and every certificate in `dir` (created if missing).
pub fn make(dir: &Path) -> Result<Certs> {
    match Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => bail!("`openssl version` failed ({status}); the run needs the openssl CLI"),
        Err(e) => bail!(
            "the chaos run makes its TLS certificates with the openssl CLI, which could not be \
             started ({e}); install openssl (e.g. apt-get install openssl) and put it on PATH"
        ),
    }
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let certs = Certs {
        dir: dir.to_owned(),
    };
    // Two days: long enough for any run, short enough that a left-behind key is worthless.
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=wsr-chaos CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    )?;
    for name in SERVERS {
        issue(dir, name, "IP:127.0.0.1,DNS:localhost", "serverAuth")?;
    }
    for (name, dns) in CLIENTS {
        issue(dir, name, &format!("DNS:{dns}"), "clientAuth")?;
    }
    Ok(certs)
}

/// A key and a certificate for `name`, signed by the CA.
fn issue(dir: &Path, name: &str, san: &str, usage: &str) -> Result<()> {
    let (key, csr, pem, ext) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&ext),
        format!(
            "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n\
             extendedKeyUsage = {usage}\nsubjectAltName = {san}\n"
        ),
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &key,
            "-out",
            &csr,
        ],
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &pem,
        ],
    )?;
    let _ = std::fs::remove_file(dir.join(csr));
    let _ = std::fs::remove_file(dir.join(ext));
    Ok(())
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .context("run openssl")?;
    if !output.status.success() {
        bail!(
            "openssl {} failed ({}): {}",
            args.first().copied().unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
