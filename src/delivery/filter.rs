//! Topics and subscription filters. A topic is `{channel}/{local name of the first Body child}`
//! (DESIGN §5); filters are MQTT-style: `+` matches one level, `#` (last, alone in its level)
//! the rest, including nothing. A shared subscription is named `$share/{share}/{filter}`; the
//! share name and the filter together identify it.

use std::fmt;

/// A checked topic filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Filter(String);

/// Why a filter or subscription name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FilterError(String);

impl Filter {
    pub fn parse(raw: &str) -> Result<Filter, FilterError> {
        let err = |why: &str| FilterError(format!("filter {raw:?}: {why}"));
        if raw.is_empty() {
            return Err(err("empty"));
        }
        if raw.len() > 512 {
            return Err(err("longer than 512 bytes"));
        }
        if raw.chars().any(char::is_control) {
            return Err(err("control characters"));
        }
        let levels: Vec<&str> = raw.split('/').collect();
        for (i, level) in levels.iter().enumerate() {
            match *level {
                "#" if i + 1 != levels.len() => return Err(err("'#' must be the last level")),
                "#" | "+" => {}
                other if other.contains(['#', '+']) => {
                    return Err(err("'+' and '#' must stand alone in their level"));
                }
                _ => {}
            }
        }
        Ok(Filter(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `topic` matches this filter.
    pub fn matches(&self, topic: &str) -> bool {
        let mut topic_levels = topic.split('/');
        for level in self.0.split('/') {
            match level {
                "#" => return true,
                "+" => {
                    if topic_levels.next().is_none() {
                        return false;
                    }
                }
                exact => {
                    if topic_levels.next() != Some(exact) {
                        return false;
                    }
                }
            }
        }
        topic_levels.next().is_none()
    }
}

impl Filter {
    /// Whether every topic this filter can match is matched by some filter of `allowed`: a
    /// subscription with this filter never delivers a topic outside the allow-list. Exact, not
    /// a per-filter approximation: `a/#` lies within `a` and `a/+/#` together.
    pub fn within(&self, allowed: &[Filter]) -> bool {
        let allowed: Vec<Vec<Level<'_>>> = allowed.iter().map(|f| levels(&f.0)).collect();
        let refs: Vec<&[Level<'_>]> = allowed.iter().map(Vec::as_slice).collect();
        covered(&refs, &levels(&self.0))
    }
}

/// One level of a filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level<'a> {
    Exact(&'a str),
    /// `+`: any one level.
    One,
    /// `#`: any number of levels, none included.
    Rest,
}

fn levels(filter: &str) -> Vec<Level<'_>> {
    filter
        .split('/')
        .map(|l| match l {
            "+" => Level::One,
            "#" => Level::Rest,
            exact => Level::Exact(exact),
        })
        .collect()
}

/// Whether every sequence of topic levels `filter` matches is matched by some of `allowed`
/// (both the rest of a filter, from the same level on). Each step strips one level off every
/// allowed filter, so it ends; a `#` among them covers everything that remains.
fn covered(allowed: &[&[Level<'_>]], filter: &[Level<'_>]) -> bool {
    if allowed.iter().any(|a| a.first() == Some(&Level::Rest)) {
        return true;
    }
    match filter.split_first() {
        // The topic ends here: an allowed filter that ends here too matches it.
        None => allowed.iter().any(|a| a.is_empty()),
        Some((Level::Exact(name), rest)) => {
            let next: Vec<&[Level<'_>]> = allowed
                .iter()
                .filter_map(|a| match a.split_first() {
                    Some((Level::Exact(n), tail)) if n == name => Some(tail),
                    Some((Level::One, tail)) => Some(tail),
                    _ => None,
                })
                .collect();
            covered(&next, rest)
        }
        // Any level, including one no allowed filter names: only `+` levels match it all.
        Some((Level::One, rest)) => {
            let next: Vec<&[Level<'_>]> = allowed
                .iter()
                .filter_map(|a| match a.split_first() {
                    Some((Level::One, tail)) => Some(tail),
                    _ => None,
                })
                .collect();
            covered(&next, rest)
        }
        // Nothing more, or one level (any) followed by anything.
        Some((Level::Rest, _)) => {
            covered(allowed, &[]) && covered(allowed, &[Level::One, Level::Rest])
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a subscription is identified: by a plain name with its own filter, or as a shared
/// subscription whose share name and filter together are its identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubscriptionId {
    Named { name: String, filter: Filter },
    Shared { share: String, filter: Filter },
}

impl fmt::Display for SubscriptionId {
    /// The stored identity: the name, or `$share/{share}/{filter}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubscriptionId::Named { name, .. } => f.write_str(name),
            SubscriptionId::Shared { share, filter } => write!(f, "$share/{share}/{filter}"),
        }
    }
}

impl SubscriptionId {
    /// `$share/{share}/{filter}` for a shared subscription; otherwise a name, with the filter
    /// given separately.
    pub fn parse(name: &str, filter: Option<&str>) -> Result<SubscriptionId, FilterError> {
        if let Some(rest) = name.strip_prefix("$share/") {
            let (share, filter_text) = rest.split_once('/').ok_or_else(|| {
                FilterError(format!("{name:?}: expected $share/{{share}}/{{filter}}"))
            })?;
            check_name(share, "share name")?;
            if filter.is_some_and(|f| f != filter_text) {
                return Err(FilterError(format!(
                    "{name:?}: a shared subscription's filter is the part after its share name"
                )));
            }
            return Ok(SubscriptionId::Shared {
                share: share.to_owned(),
                filter: Filter::parse(filter_text)?,
            });
        }
        check_name(name, "subscription name")?;
        let filter =
            filter.ok_or_else(|| FilterError(format!("subscription {name:?} needs a filter")))?;
        Ok(SubscriptionId::Named {
            name: name.to_owned(),
            filter: Filter::parse(filter)?,
        })
    }

    pub fn filter(&self) -> &Filter {
        match self {
            SubscriptionId::Named { filter, .. } | SubscriptionId::Shared { filter, .. } => filter,
        }
    }
}

fn check_name(name: &str, what: &str) -> Result<(), FilterError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('$')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(FilterError(format!(
            "{what} {name:?} must be 1-128 characters of letters, digits, '-', '_', '.', not starting with '$'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> Filter {
        Filter::parse(s).expect("valid filter")
    }

    #[test]
    fn matching() {
        let cases = [
            ("orders/PurchaseOrder", "orders/PurchaseOrder", true),
            ("orders/+", "orders/PurchaseOrder", true),
            ("orders/+", "orders", false),
            ("orders/+", "invoices/Invoice", false),
            ("+/Invoice", "billing/Invoice", true),
            ("orders/#", "orders/PurchaseOrder", true),
            ("orders/#", "orders", true),
            ("#", "anything/at/all", true),
            ("orders/PurchaseOrder", "orders/PurchaseOrderChange", false),
            ("orders", "orders/PurchaseOrder", false),
        ];
        for (filter, topic, expected) in cases {
            assert_eq!(f(filter).matches(topic), expected, "{filter} vs {topic}");
        }
    }

    fn within(filter: &str, allowed: &[&str]) -> bool {
        let allowed: Vec<Filter> = allowed.iter().map(|a| f(a)).collect();
        f(filter).within(&allowed)
    }

    #[test]
    fn filters_within_an_allow_list() {
        let cases: &[(&str, &[&str], bool)] = &[
            ("#", &["#"], true),
            ("orders/PurchaseOrder", &["#"], true),
            ("#", &["orders/#"], false),
            ("#", &["orders/#", "bob/#"], false),
            ("orders/#", &["orders/#"], true),
            ("orders/+", &["orders/#"], true),
            ("orders/PurchaseOrder", &["orders/#"], true),
            ("orders", &["orders/#"], true),
            ("orders/#", &["orders/+"], false),
            ("orders/+", &["orders/+"], true),
            ("orders/+/x", &["orders/+/#"], true),
            ("orders/+", &["orders/PurchaseOrder"], false),
            ("orders/PurchaseOrder", &["orders/Invoice"], false),
            (
                "orders/PurchaseOrder",
                &["orders/Invoice", "orders/PurchaseOrder"],
                true,
            ),
            ("+/Invoice", &["billing/#"], false),
            ("billing/Invoice", &["+/Invoice"], true),
            ("+/Invoice", &["+/Invoice"], true),
            ("+/Invoice", &["+/+"], true),
            ("+/+", &["+/Invoice"], false),
            ("orders/#", &["orders", "orders/+/#"], true),
            ("orders/#", &["orders/+/#"], false),
            ("orders/#", &["orders"], false),
            ("alice/#", &["bob/#"], false),
            ("bob", &["bob/#"], true),
            ("bob/x/y/z", &["bob/+/+/+"], true),
            ("bob/x/y/z", &["bob/+/+"], false),
            ("bob/#", &[], false),
        ];
        for (filter, allowed, expected) in cases {
            assert_eq!(
                within(filter, allowed),
                *expected,
                "{filter} within {allowed:?}"
            );
        }
    }

    /// `within` agrees with `matches` on sample topics: whatever a filter within the list
    /// matches, some allowed filter matches too.
    #[test]
    fn within_agrees_with_matching() {
        let filters = [
            "#", "a/#", "a/+", "a", "+/b", "a/b", "a/+/#", "+", "+/#", "b/#",
        ];
        let topics = ["a", "b", "a/b", "a/c", "b/b", "a/b/c", "c/b/a", "z"];
        for filter in filters {
            for a in filters {
                for b in filters {
                    let allowed = [f(a), f(b)];
                    if f(filter).within(&allowed) {
                        for topic in topics {
                            if f(filter).matches(topic) {
                                assert!(
                                    allowed.iter().any(|x| x.matches(topic)),
                                    "{filter} within [{a}, {b}] but {topic} is not allowed"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_filters() {
        for bad in ["", "orders/#/x", "orders/a+", "or#ders", "a\nb"] {
            assert!(Filter::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn subscription_identities() {
        assert_eq!(
            SubscriptionId::parse("$share/billing/orders/+", None),
            Ok(SubscriptionId::Shared {
                share: "billing".into(),
                filter: f("orders/+")
            })
        );
        assert_eq!(
            SubscriptionId::parse("audit", Some("#")),
            Ok(SubscriptionId::Named {
                name: "audit".into(),
                filter: f("#")
            })
        );
        for (name, filter) in [
            ("$share/billing", None),
            ("$share//orders/+", None),
            ("$share/billing/orders/+", Some("invoices/+")),
            ("audit", None),
            ("$other", Some("#")),
            ("has space", Some("#")),
        ] {
            assert!(
                SubscriptionId::parse(name, filter).is_err(),
                "{name} {filter:?}"
            );
        }
    }
}
