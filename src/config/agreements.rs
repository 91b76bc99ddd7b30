//! `[agreements.NAME]` and `[default_agreement]`: the terms our own messages are sent on, as the
//! file (or a submission's inline agreement) gives them. Only the shape lives here: how terms
//! combine and what they must satisfy is the sending rule's (`rmp::agreement::SendTerms`).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::rmp::agreement::SendTerms;

/// How our own messages are sent (DESIGN §6): named in the config or given inline per
/// submission. Fields left out come from `default_agreement`, then from the built-in defaults
/// (acknowledged, duplicate elimination, Response, one hour, 8 attempts 2 s apart doubling).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgreementSpec {
    pub ack_requested: Option<bool>,
    pub duplicate_elimination: Option<bool>,
    pub message_order: Option<bool>,
    /// "Response", "Callback" or "Poll".
    pub reply_pattern: Option<String>,
    /// ExpiryTime = submission time + this.
    pub expiry_seconds: Option<u64>,
    /// Either max_attempts + interval_ms + backoff, or an explicit list of waits.
    pub max_attempts: Option<u32>,
    pub interval_ms: Option<u64>,
    pub backoff: Option<u32>,
    pub waits_ms: Option<Vec<u64>>,
}

impl AgreementSpec {
    /// The terms as given, for the sending rule to combine and check.
    pub fn into_terms(self) -> SendTerms {
        SendTerms {
            ack_requested: self.ack_requested,
            duplicate_elimination: self.duplicate_elimination,
            message_order: self.message_order,
            reply_pattern: self.reply_pattern,
            expiry_seconds: self.expiry_seconds,
            max_attempts: self.max_attempts,
            interval_ms: self.interval_ms,
            backoff: self.backoff,
            waits_ms: self.waits_ms,
        }
    }
}

/// The named agreements and the default one as terms, each named one checked over the default
/// and the default alone, so that a submission naming one can only fail on its own fields.
pub(super) fn check(
    named: BTreeMap<String, AgreementSpec>,
    default: AgreementSpec,
) -> anyhow::Result<(BTreeMap<String, SendTerms>, SendTerms)> {
    let named: BTreeMap<String, SendTerms> = named
        .into_iter()
        .map(|(name, spec)| (name, spec.into_terms()))
        .collect();
    let default = default.into_terms();
    let merged = named.iter().map(|(n, t)| (n.as_str(), t.over(&default)));
    for (name, terms) in merged.chain([("default_agreement", default.clone())]) {
        terms
            .check()
            .map_err(|(field, why)| anyhow::anyhow!("agreement {name}: {field}: {why}"))?;
    }
    Ok((named, default))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn agreements_are_checked_over_the_default() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let text = "[default_agreement]\nreply_pattern = \"Poll\"\n\
                    [agreements.orders]\nmessage_order = true\n";
        std::fs::write(&path, text).expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        let orders = c.agreements["orders"].over(&c.default_agreement);
        assert_eq!(orders.reply_pattern.as_deref(), Some("Poll"));
        assert_eq!(orders.message_order, Some(true));
        for bad in [
            "[agreements.x]\nreply_pattern = \"Pigeon\"\n",
            "[default_agreement]\nexpiry_seconds = 0\n",
            "[default_agreement]\nack_requested = false\n[agreements.x]\nmessage_order = true\n",
            "[agreements.x]\nwaits_ms = [1]\nbackoff = 2\n",
        ] {
            std::fs::write(&path, bad).expect("write config");
            let err = Config::load(Some(&path), []).expect_err(bad);
            assert!(
                format!("{err:#}").starts_with("agreement "),
                "{bad}: {err:#}"
            );
        }
    }
}
