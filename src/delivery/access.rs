//! Who may do what with a subscription (DESIGN §5 "Ownership"): the creator owns it; other
//! principals need a grant to join, fetch or settle. Operators may inspect, delete and manage
//! the dead letters of any subscription, but take messages only where they are owner or grantee
//! like anyone else. Every principal takes and sees messages only within its token's topics, so
//! a subscription whose filter reaches beyond them cannot be created, joined, fetched from or
//! inspected by it. Pure: the caller and the subscription come in as plain values, and the
//! answer is a `Denied` the HTTP surface renders.

use super::filter::Filter;

/// Who asks: a principal, whether it is an operator, and the topics its token may consume.
#[derive(Debug, Clone, Copy)]
pub struct Consumer<'a> {
    pub principal: &'a str,
    pub operator: bool,
    pub topics: &'a [Filter],
}

/// What access depends on of a subscription: its owner, its grantees, its filter and whether
/// the gateway itself is its only member (push).
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    pub owner: &'a str,
    pub grants: &'a [String],
    pub filter: &'a str,
    pub push: bool,
}

/// Why a consumer may not do what it asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// Neither the owner nor a grantee.
    NoGrant,
    /// The filter matches topics beyond the consumer's token's topics.
    BeyondTopics,
    /// A grantee asked for what only the owner (or an operator) may do.
    NotOwner,
    /// The session belongs to another principal.
    OthersSession,
    /// A push subscription: the gateway is its member, so it has no pull members or sessions.
    Push,
}

/// Whether `principal` owns the subscription or holds a grant on it.
pub fn admits(held: &Held<'_>, principal: &str) -> bool {
    held.owner == principal || held.grants.iter().any(|g| g == principal)
}

/// Whether every topic `filter` can match is within the consumer's topics (an unparseable
/// filter is within nothing).
pub fn within_topics(who: &Consumer<'_>, filter: &str) -> Result<(), Denied> {
    if Filter::parse(filter).is_ok_and(|f| f.within(who.topics)) {
        Ok(())
    } else {
        Err(Denied::BeyondTopics)
    }
}

/// Whether the consumer may take messages from the subscription: its owner or a grantee, and
/// only within its own topics (checked each time, so a token whose topics were narrowed takes
/// nothing beyond them). Being an operator changes nothing here.
pub fn may_take(who: &Consumer<'_>, held: &Held<'_>) -> Result<(), Denied> {
    if !admits(held, who.principal) {
        return Err(Denied::NoGrant);
    }
    within_topics(who, held.filter)
}

/// Whether the consumer may see the subscription (its rules, backlog, dead letters): an
/// operator, or one who may take from it.
pub fn visible(who: &Consumer<'_>, held: &Held<'_>) -> Result<(), Denied> {
    if who.operator {
        Ok(())
    } else {
        may_take(who, held)
    }
}

/// Whether the consumer may manage the subscription (delete it, grant and revoke, replay and
/// purge dead letters): its owner or an operator. Managing reads no messages, so an owner may
/// do it even beyond its topics (e.g. delete it).
pub fn managed(who: &Consumer<'_>, held: &Held<'_>) -> Result<(), Denied> {
    if who.operator || held.owner == who.principal {
        Ok(())
    } else if admits(held, who.principal) {
        Err(Denied::NotOwner)
    } else {
        Err(Denied::NoGrant)
    }
}

/// Whether the consumer may join the subscription as a pull member: it may take from it, and
/// the subscription is not pushed (the gateway is a push subscription's only member).
pub fn may_join(who: &Consumer<'_>, held: &Held<'_>) -> Result<(), Denied> {
    may_take(who, held)?;
    if held.push {
        return Err(Denied::Push);
    }
    Ok(())
}

/// Whether the consumer may use a session (fetch, heartbeat, leave) owned by `session_owner`:
/// only its own, not even an operator another's. Using it also needs `may_join` on the
/// session's subscription, checked after this (a grant withdrawn or topics narrowed since the
/// join make the session useless).
pub fn owns_session(who: &Consumer<'_>, session_owner: &str) -> Result<(), Denied> {
    if session_owner == who.principal {
        Ok(())
    } else {
        Err(Denied::OthersSession)
    }
}

/// Whether the consumer may settle or extend a delivery of the subscription: its owner or a
/// grantee. A receipt is proof of a delivery the holder was given, so its topics are not
/// checked again here.
pub fn may_settle(who: &Consumer<'_>, held: &Held<'_>) -> Result<(), Denied> {
    if admits(held, who.principal) {
        Ok(())
    } else {
        Err(Denied::NoGrant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topics(filters: &[&str]) -> Vec<Filter> {
        filters
            .iter()
            .map(|f| Filter::parse(f).expect("valid filter"))
            .collect()
    }

    fn who<'a>(principal: &'a str, operator: bool, topics: &'a [Filter]) -> Consumer<'a> {
        Consumer {
            principal,
            operator,
            topics,
        }
    }

    const GRANTS: &[String] = &[];

    fn held<'a>(grants: &'a [String], filter: &'a str, push: bool) -> Held<'a> {
        Held {
            owner: "owner",
            grants,
            filter,
            push,
        }
    }

    #[test]
    fn admits_owner_and_grantees_only() {
        let grants = vec!["friend".to_owned()];
        let sub = held(&grants, "orders/#", false);
        assert!(admits(&sub, "owner"));
        assert!(admits(&sub, "friend"));
        assert!(!admits(&sub, "stranger"));
        assert!(!admits(&held(GRANTS, "orders/#", false), "friend"));
    }

    #[test]
    fn within_topics_allows_only_filters_inside_the_allow_list() {
        let all = topics(&["#"]);
        let orders = topics(&["orders/#"]);
        assert_eq!(within_topics(&who("a", false, &all), "orders/+"), Ok(()));
        assert_eq!(within_topics(&who("a", false, &orders), "orders/+"), Ok(()));
        assert_eq!(
            within_topics(&who("a", false, &orders), "#"),
            Err(Denied::BeyondTopics)
        );
        assert_eq!(
            within_topics(&who("a", false, &orders), "invoices/+"),
            Err(Denied::BeyondTopics)
        );
        // Not a filter: within nothing, so nothing is taken through it.
        assert_eq!(
            within_topics(&who("a", false, &all), "orders/a#"),
            Err(Denied::BeyondTopics)
        );
        // No topics at all: nothing.
        assert_eq!(
            within_topics(&who("a", false, &[]), "orders/+"),
            Err(Denied::BeyondTopics)
        );
    }

    #[test]
    fn may_take_needs_a_grant_and_the_topics() {
        let all = topics(&["#"]);
        let orders = topics(&["orders/#"]);
        let grants = vec!["friend".to_owned()];
        let sub = held(&grants, "orders/+", false);
        assert_eq!(may_take(&who("owner", false, &all), &sub), Ok(()));
        assert_eq!(may_take(&who("friend", false, &orders), &sub), Ok(()));
        assert_eq!(
            may_take(&who("stranger", false, &all), &sub),
            Err(Denied::NoGrant)
        );
        // An operator takes only where it is owner or grantee.
        assert_eq!(
            may_take(&who("root", true, &all), &sub),
            Err(Denied::NoGrant)
        );
        // Topics narrowed after the subscription was made: nothing beyond them.
        let invoices = topics(&["invoices/#"]);
        assert_eq!(
            may_take(&who("owner", false, &invoices), &sub),
            Err(Denied::BeyondTopics)
        );
        // The grant is checked before the topics: a stranger learns nothing about the filter.
        assert_eq!(
            may_take(&who("stranger", false, &invoices), &sub),
            Err(Denied::NoGrant)
        );
    }

    #[test]
    fn visible_to_operators_and_to_who_may_take() {
        let all = topics(&["#"]);
        let invoices = topics(&["invoices/#"]);
        let sub = held(GRANTS, "orders/+", false);
        assert_eq!(visible(&who("root", true, &invoices), &sub), Ok(()));
        assert_eq!(visible(&who("owner", false, &all), &sub), Ok(()));
        assert_eq!(
            visible(&who("stranger", false, &all), &sub),
            Err(Denied::NoGrant)
        );
        assert_eq!(
            visible(&who("owner", false, &invoices), &sub),
            Err(Denied::BeyondTopics)
        );
    }

    #[test]
    fn managed_by_the_owner_or_an_operator() {
        let invoices = topics(&["invoices/#"]);
        let grants = vec!["friend".to_owned()];
        let sub = held(&grants, "orders/+", false);
        assert_eq!(managed(&who("root", true, &[]), &sub), Ok(()));
        // Managing reads no messages: the owner may even beyond its topics.
        assert_eq!(managed(&who("owner", false, &invoices), &sub), Ok(()));
        assert_eq!(
            managed(&who("friend", false, &invoices), &sub),
            Err(Denied::NotOwner)
        );
        assert_eq!(
            managed(&who("stranger", false, &invoices), &sub),
            Err(Denied::NoGrant)
        );
    }

    #[test]
    fn may_join_a_pull_subscription_one_may_take_from() {
        let all = topics(&["#"]);
        let pull = held(GRANTS, "orders/+", false);
        let push = held(GRANTS, "orders/+", true);
        assert_eq!(may_join(&who("owner", false, &all), &pull), Ok(()));
        assert_eq!(
            may_join(&who("owner", false, &all), &push),
            Err(Denied::Push)
        );
        // Access first: a stranger is refused as such, push or not.
        assert_eq!(
            may_join(&who("stranger", false, &all), &push),
            Err(Denied::NoGrant)
        );
        assert_eq!(
            may_join(&who("root", true, &all), &pull),
            Err(Denied::NoGrant)
        );
    }

    #[test]
    fn owns_session_only_its_own() {
        let all = topics(&["#"]);
        assert_eq!(owns_session(&who("friend", false, &all), "friend"), Ok(()));
        assert_eq!(
            owns_session(&who("owner", false, &all), "friend"),
            Err(Denied::OthersSession)
        );
        // Not even an operator uses another principal's session.
        assert_eq!(
            owns_session(&who("root", true, &all), "friend"),
            Err(Denied::OthersSession)
        );
    }

    #[test]
    fn a_session_is_of_no_use_once_its_access_is_gone() {
        // What using a session checks after `owns_session`: `may_join` of its subscription.
        let all = topics(&["#"]);
        let invoices = topics(&["invoices/#"]);
        let grants = vec!["friend".to_owned()];
        let pull = held(&grants, "orders/+", false);
        assert_eq!(may_join(&who("friend", false, &all), &pull), Ok(()));
        // A grant withdrawn or topics narrowed since the join.
        assert_eq!(
            may_join(&who("gone", false, &all), &pull),
            Err(Denied::NoGrant)
        );
        assert_eq!(
            may_join(&who("friend", false, &invoices), &pull),
            Err(Denied::BeyondTopics)
        );
    }

    #[test]
    fn may_settle_with_a_grant_regardless_of_topics() {
        let invoices = topics(&["invoices/#"]);
        let grants = vec!["friend".to_owned()];
        let sub = held(&grants, "orders/+", false);
        assert_eq!(may_settle(&who("owner", false, &invoices), &sub), Ok(()));
        assert_eq!(may_settle(&who("friend", false, &[]), &sub), Ok(()));
        assert_eq!(
            may_settle(&who("stranger", false, &invoices), &sub),
            Err(Denied::NoGrant)
        );
        assert_eq!(
            may_settle(&who("root", true, &invoices), &sub),
            Err(Denied::NoGrant)
        );
    }
}
