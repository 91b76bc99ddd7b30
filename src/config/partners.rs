//! The `[partners]` table of the file: each entry, in either form (`NAME = "URL"` or a
//! `[partners.NAME]` table), checked into a partner. What a partner is and how it proves
//! itself is `crate::partners`'; this section only reads the entries and checks what they name
//! elsewhere in the file (channels, agreements).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, bail};

use super::agreements::AgreementSpec;
use crate::endpoint::check_endpoint;
use crate::partners::{Partner, PartnerConfig, address_only};

/// Checks every partner. `base` is the config file's folder (relative `…_file` paths),
/// `channels` the configured channel names, `agreements` the named agreements.
pub(super) fn check(
    partners: BTreeMap<String, toml::Value>,
    base: Option<&Path>,
    channels: &BTreeSet<String>,
    agreements: &BTreeMap<String, AgreementSpec>,
) -> anyhow::Result<Vec<Partner>> {
    let mut checked = Vec::new();
    for (name, value) in partners {
        let partner = match value {
            toml::Value::String(url) => {
                check_endpoint(&url).with_context(|| format!("partners: {name}"))?;
                address_only(&name, url)
            }
            table @ toml::Value::Table(_) => table
                .try_into::<PartnerConfig>()
                .with_context(|| format!("partners.{name}"))?
                .check(&name, base, channels)?,
            _ => bail!("partners.{name}: give a URL or a [partners.{name}] table"),
        };
        if let Some(agreement) = &partner.outbound.agreement
            && !agreements.contains_key(agreement)
        {
            bail!("partner {name}: agreement: there is no agreement {agreement:?}");
        }
        checked.push(partner);
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn partner_names_that_stand_for_no_partner_are_reserved() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        for name in ["anonymous", "(none)", "(anonymous)"] {
            std::fs::write(
                &path,
                format!("[partners.\"{name}\"]\nchannels = [\"default\"]\nusername = \"u\"\n"),
            )
            .expect("write config");
            let err = Config::load(Some(&path), []).expect_err("reserved");
            assert!(
                format!("{err:#}").contains("is reserved"),
                "{name}: {err:#}"
            );
        }
    }

    #[test]
    fn partners_in_both_forms() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        std::fs::write(dir.path().join("our.pass"), "s3cret\n").expect("write secret");
        let hash = crate::secrets::hash_secret("pw").expect("hash");
        std::fs::write(
            &path,
            format!(
                r#"
listen = "0.0.0.0:8443"
[[channels]]
name = "orders"
[partners]
old = "https://old.example/wsr"
[partners.acme]
channels = ["orders"]
password_hash = "{hash}"
address = "https://acme.example/wsr/in"
send_window = 1
our_username = "us"
our_password_file = "our.pass"
"#
            ),
        )
        .expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        assert!(c.anonymous_channels.is_empty() && !c.anonymous_callbacks);
        let old = c.partners.get("old").expect("old form");
        assert_eq!(
            old.outbound.address.as_deref(),
            Some("https://old.example/wsr")
        );
        assert!(!old.inbound.has_credentials());
        let acme = c.partners.get("acme").expect("table form");
        assert!(acme.inbound.channels.contains("orders"));
        assert_eq!(acme.outbound.send_window, Some(1));
        assert_eq!(
            acme.outbound.credentials.as_ref().map(|c| c.header()),
            Some(format!(
                "Basic {}",
                crate::partners::base64_encode(b"us:s3cret")
            )),
            "the secret file is read relative to the config file, newline dropped"
        );
        for bad in [
            "[partners.x]\nchannels = [\"nope\"]\n",
            "[partners.x]\nunknown_key = 1\n",
            "[partners]\nx = 3\n",
            "[partners.x]\nagreement = \"missing\"\n",
        ] {
            std::fs::write(&path, bad).expect("write config");
            assert!(Config::load(Some(&path), []).is_err(), "{bad}");
        }
    }
}
