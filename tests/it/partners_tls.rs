//! Partners over real TLS (D14): a client certificate identifies its partner, who may post
//! to its channel and not to another; a wrong certificate, none, a wrong Basic password and a
//! missing bearer token are all refused before the body is read. A client certificate chain
//! over the bounds fails the handshake.

use std::collections::BTreeSet;
use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use wsr_gateway::partners::{PartnerConfig, base64_encode};
use wsr_gateway::rmp::agreement::Agreement;
use wsr_gateway::secrets::{hash_secret, sha256_hex};

use super::support::{TestApp, TestCert, TestPki, spawn_app_with};

const GLOBEX_PASSWORD: &str = "globex-password-0123";
const INITECH_TOKEN: &str = "initech-token-0123456789abcdef";

/// Channels `orders` and `billing`; acme is known by its client certificate (under the CA),
/// globex by Basic, initech by a bearer token; only acme may use billing.
async fn gateway(pki: &TestPki) -> TestApp {
    pki.write_server(&pki.server_cert());
    let tls = pki.tls_config(true);
    let hash = hash_secret(GLOBEX_PASSWORD).expect("hash");
    spawn_app_with(move |c| {
        c.tls = Some(tls);
        c.channels.clear();
        c.anonymous_channels.clear();
        for name in ["orders", "billing"] {
            c.channels.insert(name.into(), Agreement::everything());
        }
        let names: BTreeSet<String> = c.channels.keys().cloned().collect();
        let partners = [
            (
                "acme",
                PartnerConfig {
                    channels: vec!["orders".into()],
                    cert_names: vec!["acme.example".into()],
                    ..PartnerConfig::default()
                },
            ),
            (
                "globex",
                PartnerConfig {
                    channels: vec!["orders".into(), "billing".into()],
                    password_hash: Some(hash),
                    ..PartnerConfig::default()
                },
            ),
            (
                "initech",
                PartnerConfig {
                    channels: vec!["orders".into()],
                    token_sha256: Some(sha256_hex(INITECH_TOKEN.as_bytes())),
                    ..PartnerConfig::default()
                },
            ),
        ];
        for (name, config) in partners {
            c.partners
                .insert(config.check(name, None, &names).expect("valid partner"));
        }
    })
    .await
}

fn client(pki: &TestPki, identity: Option<&TestCert>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(pki.ca_pem().as_bytes()).expect("CA");
    let mut builder = reqwest::Client::builder().tls_certs_only([ca]);
    if let Some(cert) = identity {
        let pem = format!("{}{}", cert.cert_pem, cert.key_pem);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).expect("identity"));
    }
    builder.build().expect("client")
}

fn message(n: u32) -> String {
    super::partners_auth::singleton(
        &format!("mid:tls-{n}@test"),
        wsr_gateway::wsr::ReplyPattern::Response,
    )
}

async fn post(
    app: &TestApp,
    client: &reqwest::Client,
    channel: &str,
    authorization: Option<&str>,
    n: u32,
) -> Result<u16, String> {
    let mut request = client
        .post(format!("https://{}/wsr/{channel}", app.addr))
        .header("Content-Type", "text/xml; charset=utf-8")
        .body(message(n));
    if let Some(value) = authorization {
        request = request.header("Authorization", value);
    }
    request
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test]
async fn a_client_certificate_is_its_partner_on_its_channels_only() {
    let pki = TestPki::new();
    let app = gateway(&pki).await;
    let acme = client(&pki, Some(&pki.client_cert("acme")));
    assert_eq!(post(&app, &acme, "orders", None, 1).await, Ok(200));
    assert_eq!(post(&app, &acme, "billing", None, 2).await, Ok(403));

    let nobody = client(&pki, None);
    let basic = |pw: &str| format!("Basic {}", base64_encode(format!("globex:{pw}").as_bytes()));
    assert_eq!(
        post(&app, &nobody, "billing", Some(&basic(GLOBEX_PASSWORD)), 3).await,
        Ok(200),
        "Basic over TLS"
    );
    let bearer = format!("Bearer {INITECH_TOKEN}");
    assert_eq!(
        post(&app, &nobody, "orders", Some(&bearer), 4).await,
        Ok(200)
    );
    for (what, auth) in [
        ("no certificate, no credentials", None),
        ("a wrong Basic password", Some(basic("wrong"))),
        ("no bearer token", Some("Bearer".to_owned())),
    ] {
        assert_eq!(
            post(&app, &nobody, "orders", auth.as_deref(), 5).await,
            Ok(401),
            "{what}"
        );
    }
    // A certificate from the CA that no partner owns is no way in either.
    let mallory = client(&pki, Some(&pki.client_cert("mallory")));
    assert_eq!(post(&app, &mallory, "orders", None, 6).await, Ok(401));
    // One from nowhere fails the handshake.
    let stranger = client(&pki, Some(&TestPki::self_signed_client("stranger")));
    assert!(post(&app, &stranger, "orders", None, 7).await.is_err());

    let delivered: Vec<String> = app
        .inbox()
        .await
        .iter()
        .map(|e| format!("{}:{}", e.partner, e.group_id))
        .collect();
    assert_eq!(
        delivered,
        [
            "acme:mid:tls-1@test",
            "globex:mid:tls-3@test",
            "initech:mid:tls-4@test"
        ]
    );
    app.stop().await;
}

/// Over TLS too, a refusal is answered from the request head: the 10 MB the client announces
/// are never waited for.
#[tokio::test]
async fn refusals_over_tls_come_before_the_body() {
    let pki = TestPki::new();
    let app = gateway(&pki).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from(pki.ca_der()))
        .expect("CA");
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for auth in [
        String::new(),
        format!(
            "Authorization: Basic {}\r\n",
            base64_encode(b"globex:wrong")
        ),
    ] {
        let tcp = tokio::net::TcpStream::connect(app.addr)
            .await
            .expect("connect");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = connector.connect(name, tcp).await.expect("handshake");
        let head = format!(
            "POST /wsr/orders HTTP/1.1\r\nHost: gw\r\nContent-Type: text/xml\r\n{auth}\
             Content-Length: 10000000\r\n\r\n"
        );
        tls.write_all(head.as_bytes()).await.expect("head");
        let mut answer = vec![0u8; 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), tls.read(&mut answer))
            .await
            .expect("answered without the body")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
        assert!(answer.contains("www-authenticate"), "{answer}");
    }
    app.stop().await;
}

/// `n` look-alike issuers: CA certificates named like the test CA, each made with its own
/// serial number (one key will do), as PEM.
fn look_alike_issuers(n: u64) -> String {
    let key = rcgen::KeyPair::generate().expect("key");
    (0..n)
        .map(|serial| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "wsr-gateway test CA");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.serial_number = Some(rcgen::SerialNumber::from(serial + 1));
            params.self_signed(&key).expect("self-sign").pem()
        })
        .collect()
}

/// A client certificate with 50 look-alike issuers behind it is refused at the handshake
/// (before any of them is looked at: the leaf itself would chain), and the partner's own
/// certificate sent alone is still served and acked.
#[tokio::test]
async fn a_long_look_alike_chain_fails_the_handshake_and_a_partner_s_certificate_still_acks() {
    let pki = TestPki::new();
    let app = gateway(&pki).await;
    let acme = pki.client_cert("acme");
    let long_chain = TestCert {
        cert_pem: format!("{}{}", acme.cert_pem, look_alike_issuers(50)),
        ..acme.clone()
    };
    let flooding = client(&pki, Some(&long_chain));
    let refused = post(&app, &flooding, "orders", None, 1).await;
    assert!(refused.is_err(), "{refused:?}");

    let acme = client(&pki, Some(&acme));
    assert_eq!(post(&app, &acme, "orders", None, 2).await, Ok(200));
    let delivered: Vec<String> = app
        .inbox()
        .await
        .iter()
        .map(|e| format!("{}:{}", e.partner, e.group_id))
        .collect();
    assert_eq!(delivered, ["acme:mid:tls-2@test"]);
    app.stop().await;
}
