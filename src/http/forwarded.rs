//! Who a request comes from when a trusted proxy stands in front of us: the client's address
//! and certificate as the proxy's headers say. Only the TCP peer decides whether those headers
//! count; from anyone else they are ignored.

use std::net::{IpAddr, SocketAddr};

use axum::http::HeaderMap;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;

use crate::config::TrustedProxy;
use crate::partners::ClientCertificate;

/// The host the client asked for, as a trusted proxy that rewrites `Host` tells it
/// (`host_header`: its last entry, the one the proxy added); `None` from anyone else, or
/// without the header.
pub fn host_of(
    headers: &HeaderMap,
    tcp_peer: SocketAddr,
    proxy: Option<&TrustedProxy>,
) -> Option<String> {
    let proxy = proxy.filter(|p| p.trusts(tcp_peer.ip()))?;
    let value = headers
        .get_all(proxy.host_header.as_ref()?)
        .iter()
        .next_back()?;
    let last = value.to_str().ok()?.rsplit(',').next()?.trim();
    (!last.is_empty()).then(|| last.to_ascii_lowercase())
}

/// The client's address and certificate for one request from `tcp_peer`, which presented
/// `handshake` in its own TLS handshake. A trusted proxy's headers take the place of both:
/// when the proxy is set up to pass certificates, the one in its handshake is its own, not
/// the client's, so only the header's counts.
pub fn client_of(
    headers: &HeaderMap,
    tcp_peer: SocketAddr,
    handshake: Option<&ClientCertificate>,
    proxy: Option<&TrustedProxy>,
) -> (SocketAddr, Option<ClientCertificate>) {
    let Some(proxy) = proxy.filter(|p| p.trusts(tcp_peer.ip())) else {
        return (tcp_peer, handshake.cloned());
    };
    let peer = proxy
        .peer_address_header
        .as_ref()
        .and_then(|name| headers.get_all(name).iter().next_back())
        .map_or(tcp_peer, |value| match forwarded_for(value.as_bytes()) {
            Some(addr) => addr,
            None => {
                tracing::debug!(
                    value = %String::from_utf8_lossy(value.as_bytes()),
                    "the trusted proxy's address header does not parse; using the proxy's address"
                );
                tcp_peer
            }
        });
    let certificate = match &proxy.client_cert_header {
        None => handshake.cloned(),
        Some(name) => headers.get(name).and_then(|value| {
            let certificate = escaped_pem_certificate(value.as_bytes());
            if certificate.is_none() && !value.as_bytes().is_empty() {
                tracing::debug!("the trusted proxy's certificate header holds no certificate");
            }
            certificate
        }),
    };
    (peer, certificate)
}

/// The last entry of an `X-Forwarded-For` value (the one our proxy added): an address, with a
/// port or without (then port 0: unknown).
fn forwarded_for(value: &[u8]) -> Option<SocketAddr> {
    let value = std::str::from_utf8(value).ok()?;
    let last = value.rsplit(',').next()?.trim();
    if let Ok(addr) = last.parse::<SocketAddr>() {
        return Some(addr);
    }
    let bare = last
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or(last);
    bare.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0))
}

/// The leaf certificate of a URL-encoded PEM chain (nginx `$ssl_client_escaped_cert`); `None`
/// when empty or unreadable.
fn escaped_pem_certificate(value: &[u8]) -> Option<ClientCertificate> {
    let pem = percent_decode(value)?;
    let leaf = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    Some(ClientCertificate {
        der: leaf.as_ref().to_vec(),
        chain_verified: true,
    })
}

/// `%XX` escapes decoded (`+` stays itself: nginx escapes a space as `%20`); `None` on a
/// broken escape.
fn percent_decode(text: &[u8]) -> Option<Vec<u8>> {
    let hex = |b: u8| {
        char::from(b)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let [h, l, tail @ ..] = tail else {
                return None;
            };
            out.push(hex(*h)? << 4 | hex(*l)?);
            rest = tail;
        } else {
            out.push(b);
            rest = tail;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue};

    fn proxy() -> TrustedProxy {
        TrustedProxy {
            networks: vec![("10.0.0.0".parse().unwrap(), 8)],
            client_cert_header: Some(HeaderName::from_static("x-client-cert")),
            peer_address_header: Some(HeaderName::from_static("x-forwarded-for")),
            host_header: Some(HeaderName::from_static("x-forwarded-host")),
        }
    }

    fn escape(text: &str) -> String {
        text.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    fn leaf() -> (Vec<u8>, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["client.example".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.der().to_vec(), cert.pem())
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::try_from(*k).unwrap(),
                HeaderValue::try_from(*v).unwrap(),
            );
        }
        h
    }

    const PROXY: &str = "10.1.2.3:40000";
    const OUTSIDER: &str = "192.0.2.9:40000";

    #[test]
    fn the_forwarded_host_counts_from_the_proxy_only_and_its_own_entry_is_taken() {
        let h = headers(&[("x-forwarded-host", "spoofed.example, GW.example")]);
        let proxy = proxy();
        let from = |peer: &str| host_of(&h, peer.parse().unwrap(), Some(&proxy));
        assert_eq!(from(PROXY).as_deref(), Some("gw.example"));
        assert_eq!(from(OUTSIDER), None, "not from a proxy");
        assert_eq!(
            host_of(&h, PROXY.parse().unwrap(), None),
            None,
            "no proxy set"
        );
        let without = headers(&[]);
        assert_eq!(
            host_of(&without, PROXY.parse().unwrap(), Some(&proxy)),
            None
        );
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode(b"a%20b%2Fc+d").unwrap(), b"a b/c+d");
        assert_eq!(percent_decode(b"%0a%0A").unwrap(), b"\n\n");
        assert_eq!(percent_decode(b"").unwrap(), b"");
        assert_eq!(percent_decode(b"%"), None);
        assert_eq!(percent_decode(b"ab%2"), None);
        assert_eq!(percent_decode(b"%zz"), None);
        assert_eq!(percent_decode("%é".as_bytes()), None);
    }

    #[test]
    fn forwarded_for_takes_the_last_entry() {
        let f = |v: &str| forwarded_for(v.as_bytes());
        assert_eq!(f("203.0.113.1"), Some("203.0.113.1:0".parse().unwrap()));
        assert_eq!(
            f("198.51.100.1, 203.0.113.1"),
            Some("203.0.113.1:0".parse().unwrap())
        );
        assert_eq!(f("2001:db8::1"), Some("[2001:db8::1]:0".parse().unwrap()));
        assert_eq!(f("[2001:db8::1]"), Some("[2001:db8::1]:0".parse().unwrap()));
        assert_eq!(
            f("203.0.113.1:1234"),
            Some("203.0.113.1:1234".parse().unwrap())
        );
        assert_eq!(f("unknown"), None);
        assert_eq!(f("203.0.113.1, "), None);
        assert_eq!(f(""), None);
    }

    #[test]
    fn a_trusted_proxy_names_the_client() {
        let (der, pem) = leaf();
        let h = headers(&[
            ("x-forwarded-for", "198.51.100.7"),
            ("x-forwarded-for", "6.6.6.6, 203.0.113.5"),
            ("x-client-cert", &escape(&pem)),
        ]);
        let (peer, cert) = client_of(&h, PROXY.parse().unwrap(), None, Some(&proxy()));
        assert_eq!(peer, "203.0.113.5:0".parse().unwrap());
        assert_eq!(
            cert,
            Some(ClientCertificate {
                der,
                chain_verified: true
            })
        );
    }

    #[test]
    fn an_untrusted_peer_is_not_believed() {
        let (_, pem) = leaf();
        let h = headers(&[
            ("x-forwarded-for", "203.0.113.5"),
            ("x-client-cert", &escape(&pem)),
        ]);
        let outsider: SocketAddr = OUTSIDER.parse().unwrap();
        assert_eq!(
            client_of(&h, outsider, None, Some(&proxy())),
            (outsider, None)
        );
        // Nor without a proxy configured at all.
        assert_eq!(client_of(&h, outsider, None, None), (outsider, None));
        // Its own handshake's certificate is what counts.
        let own = ClientCertificate {
            der: b"own".to_vec(),
            chain_verified: false,
        };
        assert_eq!(
            client_of(&h, outsider, Some(&own), Some(&proxy())),
            (outsider, Some(own))
        );
    }

    #[test]
    fn unreadable_headers_from_the_proxy_fall_back() {
        let h = headers(&[
            ("x-forwarded-for", "not-an-address"),
            ("x-client-cert", "-----BEGIN%20CERTIFICATE-----%0Agarbage"),
        ]);
        let tcp: SocketAddr = PROXY.parse().unwrap();
        // The proxy's own handshake certificate never stands in for its client's.
        let own = ClientCertificate {
            der: b"proxy".to_vec(),
            chain_verified: true,
        };
        assert_eq!(client_of(&h, tcp, Some(&own), Some(&proxy())), (tcp, None));
        assert_eq!(
            client_of(&headers(&[]), tcp, Some(&own), Some(&proxy())),
            (tcp, None)
        );
    }

    #[test]
    fn a_proxy_passing_only_addresses_keeps_the_handshake_certificate() {
        let mut p = proxy();
        p.client_cert_header = None;
        let own = ClientCertificate {
            der: b"client".to_vec(),
            chain_verified: false,
        };
        let (_, pem) = leaf();
        let h = headers(&[("x-client-cert", &escape(&pem))]);
        let tcp: SocketAddr = PROXY.parse().unwrap();
        assert_eq!(client_of(&h, tcp, Some(&own), Some(&p)), (tcp, Some(own)));
    }
}
