//! Helpers shared by the integration tests: envelope builders with non-default prefixes (to
//! prove prefix independence), xmllint validation, and paths to shared test data.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;

use wsr_gateway::wsr::{Limits, SoapVersion};

pub const WSRM: &str = "http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd";

pub fn limits() -> Limits {
    Limits::default()
}

/// A SOAP 1.1 envelope with prefixes `S` (envelope) and `r` (WS-R).
pub fn soap11(headers: &str, body: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:r="{WSRM}"><S:Header>{headers}</S:Header><S:Body>{body}</S:Body></S:Envelope>"#
    )
}

/// A SOAP 1.2 envelope with prefixes `e` (envelope) and `r` (WS-R).
pub fn soap12(headers: &str, body: &str) -> String {
    format!(
        r#"<e:Envelope xmlns:e="http://www.w3.org/2003/05/soap-envelope" xmlns:r="{WSRM}"><e:Header>{headers}</e:Header><e:Body>{body}</e:Body></e:Envelope>"#
    )
}

/// `<r:Request mustUnderstand>` around the given children, for SOAP 1.1 (`S:` prefix).
pub fn request11(children: &str) -> String {
    format!(r#"<r:Request S:mustUnderstand="1">{children}</r:Request>"#)
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `../shared/interop/holodeck` beside the checkout (CI lays shared/ there too);
/// `WSR_SHARED_DIR` overrides the location of `shared/`.
pub fn holodeck_dir() -> PathBuf {
    let shared = std::env::var_os("WSR_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared"));
    shared.join("interop/holodeck")
}

/// Validates each document against our schema for its SOAP version, in one xmllint run per
/// version. Returns the documents that failed, with xmllint's complaint.
pub fn schema_failures(docs: &[(SoapVersion, String)]) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for (version, schema) in [
        (SoapVersion::Soap11, "soap11-envelope.xsd"),
        (SoapVersion::Soap12, "soap12-envelope.xsd"),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut files = Vec::new();
        for (i, (_, doc)) in docs.iter().enumerate().filter(|(_, (v, _))| *v == version) {
            let path = dir.path().join(format!("doc{i}.xml"));
            let mut f = std::fs::File::create(&path).expect("create temp file");
            f.write_all(doc.as_bytes()).expect("write temp file");
            files.push((path, doc.clone()));
        }
        if files.is_empty() {
            continue;
        }
        // Batches keep the command line short.
        for chunk in files.chunks(200) {
            let out = Command::new("xmllint")
                .arg("--noout")
                .arg("--nonet")
                .arg("--schema")
                .arg(repo_root().join("schemas").join(schema))
                .args(chunk.iter().map(|(p, _)| p))
                .output()
                .expect("xmllint must be installed (.ci/run installs libxml2-utils)");
            let stderr = String::from_utf8_lossy(&out.stderr);
            for (path, doc) in chunk {
                let name = path.to_string_lossy();
                if !stderr.contains(&format!("{name} validates")) {
                    let complaint: Vec<&str> = stderr
                        .lines()
                        .filter(|l| l.contains(name.as_ref()))
                        .collect();
                    failures.push((doc.clone(), complaint.join("\n")));
                }
            }
        }
    }
    failures
}

pub fn assert_schema_valid(docs: &[(SoapVersion, String)]) {
    let failures = schema_failures(docs);
    let shown: Vec<String> = failures
        .iter()
        .take(5)
        .map(|(doc, why)| format!("{doc}\n{why}"))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} documents fail the schema; the first ones:\n{}",
        failures.len(),
        docs.len(),
        shown.join("\n\n")
    );
}
