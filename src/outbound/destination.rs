//! Which URLs an application may send to (D15): configured partners always; a URL given in a
//! submission only with `allow_url_destinations = true`, and even then never an internal
//! address (loopback, private, link-local, shared, unique-local, unspecified, multicast,
//! broadcast, reserved) unless the operator lists it in `allowed_destination_hosts`.
//!
//! Checked twice: at submit (the URL's literal host, `localhost`, and every address its name
//! resolves to — a refusal is a 400 before anything is stored or sent, so message fates cannot
//! probe the network), and at connect time by `GuardedResolver`, the DNS resolver of the client
//! that sends to URL destinations, so that a name re-pointed at an internal address after the
//! submit (DNS rebinding) is not connected to either.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// One entry of `allowed_destination_hosts`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    /// `10.1.0.0/16`, `fd00::/8`, or a bare address (`127.0.0.1`, `::1`): any port.
    Net { base: IpAddr, prefix: u8 },
    /// `127.0.0.1:9000`, `[::1]:9000`: that address and port only.
    Addr(SocketAddr),
    /// `partner.internal`, `localhost:9000`: URLs naming that host (on that port), whatever
    /// it resolves to.
    Host { name: String, port: Option<u16> },
}

/// The operator's rules for URL destinations (config `allow_url_destinations`,
/// `allowed_destination_hosts`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationRules {
    allow_urls: bool,
    allowed: Vec<Allowed>,
}

/// What the pure check of a URL leaves to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlCheck {
    /// Allowed as it is (a public or listed literal address, a listed name).
    Allowed,
    /// A name whose addresses must be checked (`DestinationRules::check_addresses`).
    Resolve { host: String, port: u16 },
}

impl DestinationRules {
    /// The rules from the configuration; an entry that is none of the forms above is an error
    /// naming it.
    pub fn new(allow_urls: bool, allowed: &[String]) -> Result<DestinationRules, String> {
        let allowed = allowed
            .iter()
            .map(|entry| parse_entry(entry).ok_or_else(|| format!("{entry:?}: {ENTRY_FORMS}")))
            .collect::<Result<_, _>>()?;
        Ok(DestinationRules {
            allow_urls,
            allowed,
        })
    }

    /// Whether submissions may name a URL instead of a configured partner.
    pub fn allow_urls(&self) -> bool {
        self.allow_urls
    }

    /// Checks a URL's form and literal host, without resolving anything.
    pub fn check_url(&self, url: &str) -> Result<UrlCheck, String> {
        let parsed = Url::parse(url).map_err(|e| format!("is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err("is not an http(s) URL".into());
        }
        let port = parsed
            .port_or_known_default()
            .ok_or_else(|| "has no port".to_owned())?;
        // The URL parser writes every IPv4 form (`2130706433`, `0x7f.1`) as dotted quads and
        // IPv6 in brackets.
        let host = parsed.host_str().ok_or_else(|| "has no host".to_owned())?;
        if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            let ip: Ipv6Addr = v6
                .parse()
                .map_err(|_| format!("has a bad address {host}"))?;
            return self.check_address(IpAddr::V6(ip), port);
        }
        if let Ok(ip) = host.parse::<Ipv4Addr>() {
            return self.check_address(IpAddr::V4(ip), port);
        }
        let name = normal_name(host);
        if self.host_listed(&name, Some(port)) {
            Ok(UrlCheck::Allowed)
        } else if name == "localhost" || name.ends_with(".localhost") {
            Err(format!(
                "names {name}, a loopback host; not allowed unless listed in \
                 allowed_destination_hosts"
            ))
        } else {
            Ok(UrlCheck::Resolve { host: name, port })
        }
    }

    fn check_address(&self, ip: IpAddr, port: u16) -> Result<UrlCheck, String> {
        match internal_kind(ip) {
            Some(kind) if !self.address_listed(ip, Some(port)) => Err(format!(
                "names {ip}, a {kind} address; not allowed unless listed in \
                 allowed_destination_hosts"
            )),
            _ => Ok(UrlCheck::Allowed),
        }
    }

    /// Checks the addresses a name resolved to: every one must be public or listed.
    pub fn check_addresses(&self, host: &str, port: u16, addrs: &[IpAddr]) -> Result<(), String> {
        if addrs.is_empty() {
            return Err(format!("{host} resolves to no address"));
        }
        for ip in addrs {
            if let Some(kind) = internal_kind(*ip)
                && !self.address_listed(*ip, Some(port))
            {
                return Err(format!(
                    "{host} resolves to {ip}, a {kind} address; not allowed unless \
                         listed in allowed_destination_hosts"
                ));
            }
        }
        Ok(())
    }

    /// `port: None` (the connect-time resolver does not know it): only entries for any port.
    fn address_listed(&self, ip: IpAddr, port: Option<u16>) -> bool {
        let ip = ip.to_canonical();
        self.allowed.iter().any(|a| match a {
            Allowed::Net { base, prefix } => in_net(ip, *base, *prefix),
            Allowed::Addr(sa) => sa.ip().to_canonical() == ip && port == Some(sa.port()),
            Allowed::Host { .. } => false,
        })
    }

    fn host_listed(&self, name: &str, port: Option<u16>) -> bool {
        self.allowed.iter().any(|a| match a {
            Allowed::Host { name: n, port: p } => n == name && (p.is_none() || *p == port),
            _ => false,
        })
    }

    /// Whether the connect-time resolver lets `name` through unfiltered: listed for some port
    /// (the submit check held it to that port).
    fn host_listed_any_port(&self, name: &str) -> bool {
        self.allowed
            .iter()
            .any(|a| matches!(a, Allowed::Host { name: n, .. } if n == name))
    }
}

const ENTRY_FORMS: &str = "expected an address (127.0.0.1, ::1), an address and port \
     (127.0.0.1:9000, [::1]:9000), a prefix (10.0.0.0/8, fd00::/8) or a host name \
     (partner.internal, localhost:9000)";

/// A prefix (`10.0.0.0/8`, `fd00::/8`) or a bare address (a prefix of its full length), as
/// (network, prefix length); `None` for anything else. Also what `[trusted_proxy]` lists.
pub fn parse_network(entry: &str) -> Option<(IpAddr, u8)> {
    let entry = entry.trim();
    let (base, prefix) = match entry.split_once('/') {
        Some((base, prefix)) => (base.trim().parse::<IpAddr>().ok()?, Some(prefix.trim())),
        None => (entry.parse::<IpAddr>().ok()?, None),
    };
    let base = base.to_canonical();
    let max = if base.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max)?,
    };
    Some((base, prefix))
}

fn parse_entry(entry: &str) -> Option<Allowed> {
    let entry = entry.trim();
    if entry.contains('/') {
        let (base, prefix) = parse_network(entry)?;
        return Some(Allowed::Net { base, prefix });
    }
    if let Ok(sa) = entry.parse::<SocketAddr>() {
        return Some(Allowed::Addr(sa));
    }
    if let Some((base, prefix)) = parse_network(entry) {
        return Some(Allowed::Net { base, prefix });
    }
    let (name, port) = match entry.rsplit_once(':') {
        Some((name, port)) => (name, Some(port.parse::<u16>().ok()?)),
        None => (entry, None),
    };
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    valid.then(|| Allowed::Host {
        name: normal_name(name),
        port,
    })
}

fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `ip` lies in the network `base`/`prefix` (same address family only).
pub fn in_net(ip: IpAddr, base: IpAddr, prefix: u8) -> bool {
    match (ip, base) {
        (IpAddr::V4(ip), IpAddr::V4(base)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(base) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(base)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(base) & mask
        }
        _ => false,
    }
}

/// What kind of internal address `ip` is; `None` for a public one.
pub fn internal_kind(ip: IpAddr) -> Option<&'static str> {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4_kind(v4),
        IpAddr::V6(v6) => v6_kind(v6),
    }
}

fn v4_kind(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    Some(if ip.is_unspecified() || a == 0 {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private"
    } else if ip.is_link_local() {
        "link-local"
    } else if a == 100 && (64..128).contains(&b) {
        "shared (carrier-grade NAT)"
    } else if ip.is_broadcast() {
        "broadcast"
    } else if ip.is_multicast() {
        "multicast"
    } else if a == 198 && (18..20).contains(&b) {
        "benchmarking (198.18/15)"
    } else if a >= 240 {
        "reserved"
    } else {
        return None;
    })
}

fn v6_kind(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    // NAT64 (64:ff9b::/96) carries an IPv4 address in its last 32 bits.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let [.., a, b, c, d] = ip.octets();
        return v4_kind(Ipv4Addr::new(a, b, c, d));
    }
    // The deprecated IPv4-compatible form (::a.b.c.d, ::/96 beyond :: and ::1) and 6to4
    // (2002:a.b.c.d::/48) carry an IPv4 address too.
    if s[..6] == [0; 6] && !ip.is_unspecified() && !ip.is_loopback() {
        let [.., a, b, c, d] = ip.octets();
        return v4_kind(Ipv4Addr::new(a, b, c, d)).or(Some("IPv4-compatible"));
    }
    if s[0] == 0x2002 {
        let [_, _, a, b, c, d, ..] = ip.octets();
        return v4_kind(Ipv4Addr::new(a, b, c, d));
    }
    Some(if ip.is_unspecified() {
        "unspecified"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_multicast() {
        "multicast"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "unique local"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local"
    } else {
        return None;
    })
}

/// Checks a submitted URL destination in full: form, literal host, and the addresses its name
/// resolves to now. Err: why it is refused (for a 400 naming `destination`).
pub async fn check_destination(rules: &DestinationRules, url: &str) -> Result<(), String> {
    match rules.check_url(url)? {
        UrlCheck::Allowed => Ok(()),
        UrlCheck::Resolve { host, port } => {
            let addrs: Vec<IpAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|e| format!("{host} cannot be resolved: {e}"))?
                .map(|sa| sa.ip())
                .collect();
            rules.check_addresses(&host, port, &addrs)
        }
    }
}

/// The DNS resolver of the client that sends to URL destinations: the system's answer without
/// the internal addresses the rules do not list. A name resolving only to such addresses
/// fails to connect (an unreached attempt) — nothing is sent to it.
pub struct GuardedResolver(pub Arc<DestinationRules>);

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let rules = self.0.clone();
        let host = normal_name(name.as_str());
        Box::pin(async move {
            let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let unfiltered = rules.host_listed_any_port(&host);
            let kept: Vec<SocketAddr> = found
                .filter(|sa| {
                    unfiltered
                        || internal_kind(sa.ip()).is_none()
                        || rules.address_listed(sa.ip(), None)
                })
                .collect();
            if kept.is_empty() {
                let why = format!(
                    "{host} resolves only to internal addresses not listed in \
                     allowed_destination_hosts"
                );
                return Err(why.into());
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(allowed: &[&str]) -> DestinationRules {
        let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
        DestinationRules::new(true, &allowed).expect("valid entries")
    }

    #[test]
    fn internal_literals_are_refused_unless_listed() {
        let none = rules(&[]);
        for url in [
            "http://127.0.0.1:9000/wsr",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[64:ff9b::a00:1]/",
            "http://10.1.2.3/",
            "http://172.16.0.1/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest/meta-data",
            "http://100.64.0.1/",
            "http://0.0.0.0/",
            "http://[::]/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[ff02::1]/",
            "http://localhost:8080/",
            "http://LOCALHOST./",
            "http://api.localhost/",
            "http://[::127.0.0.1]/",
            "http://[::8.8.8.8]/",
            "http://[2002:7f00:1::]/",
            "http://[2002:a00:1::1]/",
            "http://198.18.0.1/",
        ] {
            assert!(none.check_url(url).is_err(), "{url}");
        }
        assert_eq!(
            none.check_url("https://93.184.215.14/wsr"),
            Ok(UrlCheck::Allowed)
        );
        assert_eq!(
            none.check_url("https://Partner.Example/wsr"),
            Ok(UrlCheck::Resolve {
                host: "partner.example".into(),
                port: 443
            })
        );
        assert!(none.check_url("ftp://93.184.215.14/").is_err());
        assert!(none.check_url("not a url").is_err());

        let listed = rules(&["127.0.0.1:9000", "10.0.0.0/8", "::1", "localhost:8080"]);
        assert_eq!(
            listed.check_url("http://127.0.0.1:9000/wsr"),
            Ok(UrlCheck::Allowed)
        );
        assert!(
            listed.check_url("http://127.0.0.1:9001/wsr").is_err(),
            "another port"
        );
        assert_eq!(listed.check_url("http://10.9.8.7/"), Ok(UrlCheck::Allowed));
        assert!(listed.check_url("http://11.0.0.1/").is_ok(), "public");
        assert_eq!(listed.check_url("http://[::1]:7/"), Ok(UrlCheck::Allowed));
        assert_eq!(
            listed.check_url("http://localhost:8080/"),
            Ok(UrlCheck::Allowed)
        );
        assert!(listed.check_url("http://localhost:8081/").is_err());
    }

    #[test]
    fn resolved_addresses_must_be_public_or_listed() {
        let r = rules(&["10.0.0.0/8"]);
        let public: IpAddr = "93.184.215.14".parse().expect("ip");
        let private: IpAddr = "192.168.0.9".parse().expect("ip");
        let listed: IpAddr = "10.2.3.4".parse().expect("ip");
        assert!(
            r.check_addresses("p.example", 443, &[public, listed])
                .is_ok()
        );
        let refused = r
            .check_addresses("p.example", 443, &[public, private])
            .expect_err("one internal address is enough");
        assert!(refused.contains("192.168.0.9") && refused.contains("private"));
        assert!(r.check_addresses("p.example", 443, &[]).is_err());
    }

    #[test]
    fn entries_are_checked() {
        assert!(DestinationRules::new(true, &["10.0.0.0/33".into()]).is_err());
        assert!(DestinationRules::new(true, &["http://x/".into()]).is_err());
        assert!(DestinationRules::new(true, &["host:port".into()]).is_err());
        assert!(
            DestinationRules::new(
                false,
                &["fd00::/8".into(), "[::1]:80".into(), "a-b.example:1".into()]
            )
            .is_ok()
        );
    }
}
