//! `[[channels]]`: what each channel offers and requires, its horizons, and who may post to it
//! without credentials. Decides which channels are anonymous; never who a partner is
//! (`partners.rs` checks those, and only their channel names reach here).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::bail;
use serde::Deserialize;

use super::bounds::horizon;
use crate::partners::Partner;
use crate::rmp::agreement::{Agreement, Feature};
use crate::rmp::quota::SourceQuota;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub name: String,
    /// Whether requests without credentials may post here. Unset: only on a loopback
    /// listener, and only while no partner lists the channel (as the built-in `default`
    /// channel); `false`: never.
    #[serde(default)]
    pub anonymous: Option<bool>,
    /// Features offered; absent = all.
    pub offers: Option<Vec<String>>,
    #[serde(default)]
    pub requires: Vec<String>,
    /// Overrides the top-level `max_expiry_horizon_seconds` for this channel.
    pub max_expiry_horizon_seconds: Option<u64>,
    /// Overrides the top-level `max_group_lifetime_seconds` for this channel.
    pub max_group_lifetime_seconds: Option<u64>,
    /// Override the top-level storage quota per source (D13) for this channel.
    pub max_stored_bytes_per_source: Option<u64>,
    pub max_messages_per_second_per_source: Option<u64>,
    /// `one-way` (default) or `request-response` (D16, `operations.rs`).
    pub operation: Option<String>,
    /// A request-response channel's SOAP service; without one, applications answer through
    /// the API.
    pub backend: Option<BackendConfig>,
    /// `retry` (default) or `fail`: what a request whose call had an unknown outcome gets.
    pub on_unknown: Option<String>,
    /// How long a partner's exchange waits for an application's answer (default 30 s).
    pub respond_within_ms: Option<u64>,
}

/// `[channels.backend]`: the SOAP service behind a request-response channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub url: String,
    /// The whole call, answer read included (default 30 s).
    pub timeout_ms: Option<u64>,
    /// Calls out at once (default 16); a request beyond waits up to the hold.
    pub max_concurrency: Option<usize>,
    /// Only this CA bundle's roots verify the service (default: the system roots).
    pub ca_file: Option<PathBuf>,
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// What we present to the service, as towards a partner: Basic (`our_username` with
    /// `our_password[_file|_env]`) or Bearer (`our_token[_file|_env]`).
    pub our_username: Option<String>,
    pub our_password: Option<String>,
    pub our_password_file: Option<PathBuf>,
    pub our_password_env: Option<String>,
    pub our_token: Option<String>,
    pub our_token_file: Option<PathBuf>,
    pub our_token_env: Option<String>,
}

/// The top-level horizons and source quota, for every channel that sets none of its own.
#[derive(Debug, Clone, Copy)]
pub(super) struct Horizons {
    pub expiry: chrono::Duration,
    pub group_lifetime: chrono::Duration,
    pub quota: SourceQuota,
}

/// Where the listener is, and whether the operator lets anonymous callers in beyond loopback.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reach {
    pub listen: SocketAddr,
    pub allow_anonymous_beyond_loopback: bool,
}

impl Reach {
    pub fn new(listen: SocketAddr, allow_anonymous_beyond_loopback: bool) -> Reach {
        Reach {
            listen,
            allow_anonymous_beyond_loopback,
        }
    }

    pub fn loopback(self) -> bool {
        self.listen.ip().is_loopback()
    }
}

/// The checked channels: each one's agreement, and those anonymous callers may post to.
pub(super) struct Channels {
    pub agreements: BTreeMap<String, Agreement>,
    pub anonymous: BTreeSet<String>,
}

impl Channels {
    /// Checks every channel; with none configured, the built-in `default` offers everything.
    pub fn check(
        configured: &[ChannelConfig],
        horizons: Horizons,
        reach: Reach,
    ) -> anyhow::Result<Channels> {
        let mut agreements = BTreeMap::new();
        let mut anonymous = BTreeSet::new();
        for c in configured {
            if c.anonymous == Some(true) {
                anonymous.insert(c.name.clone());
            }
            let agreement = channel_agreement(c, horizons)?;
            if agreements.insert(c.name.clone(), agreement).is_some() {
                bail!("channel {} is defined twice", c.name);
            }
        }
        if agreements.is_empty() {
            agreements.insert(
                "default".to_owned(),
                Agreement {
                    expiry_horizon: horizons.expiry,
                    group_lifetime: horizons.group_lifetime,
                    quota: horizons.quota,
                    ..Agreement::everything()
                },
            );
            // Anyone who can reach a loopback listener is on this machine already; beyond
            // it, the built-in channel takes nobody until partners or `anonymous` say so.
            if reach.loopback() || reach.allow_anonymous_beyond_loopback {
                anonymous.insert("default".to_owned());
            }
        }
        if !reach.loopback()
            && !reach.allow_anonymous_beyond_loopback
            && let Some(c) = anonymous.first()
        {
            bail!(
                "channel {c} is anonymous but the listener {} is not loopback: give its \
                 partners credentials, or set allow_anonymous_beyond_loopback = true",
                reach.listen
            );
        }
        Ok(Channels {
            agreements,
            anonymous,
        })
    }

    /// The configured channel names, for the partners' `channels`.
    pub fn names(&self) -> BTreeSet<String> {
        self.agreements.keys().cloned().collect()
    }

    /// Every channel must take someone: a partner that lists it, or anonymous callers. On a
    /// loopback listener a configured channel no partner lists and that does not say
    /// `anonymous = false` becomes anonymous.
    pub fn check_reached(
        &mut self,
        configured: &[ChannelConfig],
        partners: &[Partner],
        reach: Reach,
    ) -> anyhow::Result<()> {
        let loopback = reach.loopback();
        let explicit: BTreeMap<&str, Option<bool>> = configured
            .iter()
            .map(|c| (c.name.as_str(), c.anonymous))
            .collect();
        for name in self.agreements.keys() {
            let listed = partners.iter().any(|p| p.inbound.channels.contains(name));
            if self.anonymous.contains(name) || listed {
                continue;
            }
            // A configured channel no partner lists, on a listener only this machine
            // reaches, takes anyone here, as the built-in channel does (and as every channel
            // did before partners existed). Beyond loopback it would take no one: a mistake.
            if loopback && explicit.get(name.as_str()) == Some(&None) {
                self.anonymous.insert(name.clone());
                continue;
            }
            let beyond = if loopback {
                ""
            } else {
                "; a channel no partner lists is anonymous only on a loopback listener, and \
                 this one listens beyond it"
            };
            bail!(
                "channel {name} takes no one: it is not anonymous and no partner lists it in \
                 its channels{beyond} (add a partner for it, or make it anonymous with \
                 anonymous = true and allow_anonymous_beyond_loopback = true)"
            );
        }
        Ok(())
    }
}

/// One channel's agreement: its name allowed, its features known, what it requires offered.
fn channel_agreement(c: &ChannelConfig, horizons: Horizons) -> anyhow::Result<Agreement> {
    // No '%': the guard matches the path as sent, and no escape may name a channel.
    if c.name.is_empty() || c.name.starts_with('_') || c.name.contains(['/', '%']) {
        bail!(
            "channel name {:?} is not allowed (empty, '/', '%', or a leading '_')",
            c.name
        );
    }
    let features = |names: &[String]| -> anyhow::Result<Vec<Feature>> {
        names
            .iter()
            .map(|n| {
                Feature::parse(n)
                    .ok_or_else(|| anyhow::anyhow!("channel {}: unknown feature {n:?}", c.name))
            })
            .collect()
    };
    let agreement = Agreement {
        offers: match &c.offers {
            None => Feature::ALL.to_vec(),
            Some(names) => features(names)?,
        },
        requires: features(&c.requires)?,
        expiry_horizon: match c.max_expiry_horizon_seconds {
            None => horizons.expiry,
            Some(s) => horizon(
                &format!("channel {}: max_expiry_horizon_seconds", c.name),
                s,
            )?,
        },
        group_lifetime: match c.max_group_lifetime_seconds {
            None => horizons.group_lifetime,
            Some(s) => horizon(
                &format!("channel {}: max_group_lifetime_seconds", c.name),
                s,
            )?,
        },
        quota: horizons.quota.overridden(
            c.max_stored_bytes_per_source,
            c.max_messages_per_second_per_source,
        ),
    };
    if let Some(f) = agreement
        .requires
        .iter()
        .find(|f| !agreement.offers.contains(f))
    {
        bail!(
            "channel {} requires {} but does not offer it",
            c.name,
            f.name()
        );
    }
    Ok(agreement)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn anonymous_channels_only_on_loopback_unless_allowed() {
        let env = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let c = Config::load(None, []).expect("loopback default");
        assert!(c.anonymous_channels.contains("default") && c.anonymous_callbacks);
        let outside = env(&[("WSR_LISTEN", "0.0.0.0:8080")]);
        let err = Config::load(None, outside.clone()).expect_err("no partner, not loopback");
        assert!(format!("{err:#}").contains("takes no one"), "{err:#}");
        let mut allowed = outside;
        allowed.push(("WSR_ALLOW_ANONYMOUS_BEYOND_LOOPBACK".into(), "true".into()));
        let c = Config::load(None, allowed).expect("the operator said so");
        assert!(c.anonymous_channels.contains("default") && c.anonymous_callbacks);

        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(
            &path,
            "listen = \"0.0.0.0:8080\"\n[[channels]]\nname = \"open\"\nanonymous = true\n",
        )
        .expect("write config");
        let err = Config::load(Some(&path), []).expect_err("anonymous beyond loopback");
        assert!(format!("{err:#}").contains("not loopback"), "{err:#}");
        // On loopback, a channel no partner lists takes anyone unless it says otherwise.
        for (text, anonymous) in [
            ("[[channels]]\nname = \"open\"\n", Some(true)),
            ("[[channels]]\nname = \"shut\"\nanonymous = false\n", None),
        ] {
            std::fs::write(&path, text).expect("write config");
            let loaded = Config::load(Some(&path), []);
            assert_eq!(
                loaded.ok().map(|c| c.anonymous_channels.contains("open")),
                anonymous,
                "{text}"
            );
        }
    }
}
