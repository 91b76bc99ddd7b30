//! `[[tokens]]`: the API's bearer tokens, their scopes and the topics each may consume, as the
//! file gives them and checked. Never keeps a token it cannot check in constant time, and
//! never logs one.

use std::path::{Path, PathBuf};

use anyhow::bail;
use serde::Deserialize;

use crate::secrets::{Secret, Stored, load_secret};

/// An API token: inline (`token`), in a file or an environment variable (`token_file`,
/// `token_env`), or only its hash (`token_hash`: PHC from `hash-secret`; `token_sha256`).
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token_env: Option<String>,
    #[serde(default)]
    pub token_hash: Option<String>,
    #[serde(default)]
    pub token_sha256: Option<String>,
    pub principal: String,
    pub scopes: Vec<Scope>,
    /// The topics this token may consume, as MQTT-style filters (`orders/#`): it may create,
    /// join and fetch only subscriptions whose filter lies within them. Default `["#"]`.
    #[serde(default = "all_topics")]
    pub topics: Vec<String>,
}

impl ApiToken {
    /// A token kept as given, as tests use them.
    pub fn plain(token: &str, principal: &str, scopes: Vec<Scope>) -> ApiToken {
        ApiToken {
            secret: Stored::Plain(Secret::new(token)),
            principal: principal.to_owned(),
            scopes,
            topics: all_topics(),
        }
    }
}

impl TokenConfig {
    /// A token given inline, as tests and `WSR_ADMIN_TOKEN` do.
    pub fn plain(token: &str, principal: &str, scopes: Vec<Scope>) -> TokenConfig {
        TokenConfig {
            token: Some(token.to_owned()),
            principal: principal.to_owned(),
            scopes,
            topics: all_topics(),
            ..TokenConfig::default()
        }
    }
}

/// A checked API token.
#[derive(Debug, Clone)]
pub struct ApiToken {
    pub secret: Stored,
    pub principal: String,
    pub scopes: Vec<Scope>,
    pub topics: Vec<String>,
}

/// Every topic: the allow-list of a token that names none.
pub fn all_topics() -> Vec<String> {
    vec!["#".to_owned()]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Admin,
    Produce,
    Consume,
}

/// Checks every `[[tokens]]` entry: exactly one source of its secret, an inline one at least 16
/// characters, valid topic filters. `base` is the config file's folder (`token_file`).
pub(super) fn check(
    tokens: Vec<TokenConfig>,
    base: Option<&Path>,
) -> anyhow::Result<Vec<ApiToken>> {
    tokens.into_iter().map(|t| check_one(t, base)).collect()
}

fn check_one(t: TokenConfig, base: Option<&Path>) -> anyhow::Result<ApiToken> {
    let who = format!("token of {}", t.principal);
    // The setting's own name after the token's, so that errors read "token of app:
    // token_env: … is not set".
    let inline = load_secret(
        &format!("{who}: token"),
        base,
        t.token.as_deref(),
        t.token_file.as_deref(),
        t.token_env.as_deref(),
    )?;
    let secret = match (inline, &t.token_hash, &t.token_sha256) {
        (Some(secret), None, None) => {
            if secret.expose().len() < 16 {
                bail!("{who} is shorter than 16 characters");
            }
            Stored::Plain(secret)
        }
        (None, Some(phc), None) => Stored::hash(&format!("{who}: token_hash"), phc)?,
        (None, None, Some(hex)) => Stored::sha256(&format!("{who}: token_sha256"), hex)?,
        _ => bail!(
            "{who}: give exactly one of token, token_file, token_env, token_hash, \
             token_sha256"
        ),
    };
    for topic in &t.topics {
        crate::delivery::filter::Filter::parse(topic)
            .map_err(|e| anyhow::anyhow!("{who}: topics: {e}"))?;
    }
    Ok(ApiToken {
        secret,
        principal: t.principal,
        scopes: t.scopes,
        topics: t.topics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn api_tokens_may_be_hashes_files_or_variables() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let sha = crate::secrets::sha256_hex(b"a-long-random-token-0123");
        std::fs::write(dir.path().join("tok"), "token-from-a-file-0123\n").expect("write");
        std::fs::write(
            &path,
            format!(
                "[[tokens]]\ntoken_sha256 = \"{sha}\"\nprincipal = \"a\"\nscopes = [\"admin\"]\n\
                 [[tokens]]\ntoken_file = \"tok\"\nprincipal = \"b\"\nscopes = [\"admin\"]\n"
            ),
        )
        .expect("write config");
        let c = Config::load(Some(&path), []).expect("valid");
        assert!(matches!(c.tokens[0].secret, Stored::Sha256(_)));
        assert_eq!(
            c.tokens[1].secret,
            Stored::Plain(crate::secrets::Secret::new("token-from-a-file-0123"))
        );
        std::fs::write(
            &path,
            "[[tokens]]\ntoken = \"0123456789abcdef\"\ntoken_sha256 = \"00\"\nprincipal = \"a\"\nscopes = []\n",
        )
        .expect("write config");
        assert!(Config::load(Some(&path), []).is_err(), "two sources");
    }

    #[test]
    fn token_topics_are_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("gw.toml");
        let token = "[[tokens]]\ntoken = \"0123456789abcdef\"\nprincipal = \"bob\"\n\
                     scopes = [\"consume\"]\n";
        std::fs::write(&path, token).expect("write config");
        let c = Config::load(Some(&path), []).expect("topics default");
        assert_eq!(c.tokens[0].topics, vec!["#"]);
        std::fs::write(&path, format!("{token}topics = [\"bob/#\"]")).expect("write config");
        let c = Config::load(Some(&path), []).expect("valid topics");
        assert_eq!(c.tokens[0].topics, vec!["bob/#"]);
        std::fs::write(&path, format!("{token}topics = [\"bob/#/x\"]")).expect("write config");
        assert!(Config::load(Some(&path), []).is_err(), "an invalid filter");
    }
}
