//! The operator's reads beyond `stats` (the console's overview, members and message search):
//! traffic by channel and partner, the members of a subscription, and the inbox searched.
//! The inbox, which grows with traffic, is only read through bounded index ranges; the other
//! counts are GROUP BYs over tables as large as what waits (groups, outbound messages, the
//! ordered buffer, callbacks owed), as `stats` reads them for `/metrics`. The SQL is one text
//! for both backends (`"offset"` quoted, `$n` placeholders: sqlx's SQLite driver
//! binds `$n` by number too), written once in the macros below.

use chrono::{DateTime, Utc};

use super::received::InboxEntry;

/// How many inbox rows a traffic read counts at most: at the limit, the figure is a floor.
pub const RECENT_ROWS_COUNTED: i64 = 100_000;

/// How many offsets one inbox search page looks through at most (matches or not).
pub const SEARCH_SPAN: i64 = 100_000;

/// What arrived lately and what waits, by channel and partner, and what we send, by partner.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Traffic {
    /// By (channel, partner), in name order; partner "" is an anonymous sender.
    pub receiving: Vec<Receiving>,
    /// Callback acks and faults owed, by partner.
    pub callbacks_owed: Vec<(String, u64)>,
    /// Our messages by destination partner ("" when the destination is not a configured
    /// partner) and state.
    pub sending: Vec<Sending>,
    /// The received counts stopped at `RECENT_ROWS_COUNTED`: they are floors.
    pub received_capped: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receiving {
    pub channel: String,
    pub partner: String,
    /// Messages that reached the inbox since the read's `since`.
    pub received: u64,
    /// Ordered messages held for a gap.
    pub buffered: u64,
    /// Groups still open.
    pub open_groups: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sending {
    pub partner: String,
    /// By state name (`queued`, `sent`, `acked`, `faulted`, `failed`), in name order.
    pub states: Vec<(String, u64)>,
}

/// A live member (session) of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub session: String,
    pub principal: String,
    pub expires_at: DateTime<Utc>,
    /// Deliveries it holds now.
    pub in_flight: u64,
    /// Groups bound to it (`ordering = group`).
    pub groups: u64,
}

/// What an inbox search keeps; `None` matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxFilter {
    pub channel: Option<String>,
    /// "" is an anonymous sender.
    pub partner: Option<String>,
    pub group_id: Option<String>,
    /// Received at or after.
    pub since: Option<DateTime<Utc>>,
}

/// One message of an inbox search: the message without its payload (`payload` is empty, so
/// that a page of large messages is not read whole), and the payload's size in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub entry: InboxEntry,
    pub size: u64,
}

/// One page of an inbox search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxPage {
    pub entries: Vec<Listed>,
    /// Where the next page starts (`after`), while any of the inbox is left to look through.
    /// A page may be short, even empty, and still have a next one: it looked through
    /// `SEARCH_SPAN` offsets.
    pub next_after: Option<i64>,
}

fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// Puts the per-table counts of `read_traffic!` together.
pub(in crate::store) fn traffic_of(
    received: Vec<(String, String, i64)>,
    buffered: Vec<(String, String, i64)>,
    open_groups: Vec<(String, String, i64)>,
    callbacks_owed: Vec<(String, i64)>,
    sending: Vec<(String, String, i64)>,
) -> Traffic {
    use std::collections::BTreeMap;
    let mut rows: BTreeMap<(String, String), Receiving> = BTreeMap::new();
    let total: i64 = received.iter().map(|(_, _, n)| n).sum();
    for (c, p, n) in received {
        row(&mut rows, c, p).received = count(n);
    }
    for (c, p, n) in buffered {
        row(&mut rows, c, p).buffered = count(n);
    }
    for (c, p, n) in open_groups {
        row(&mut rows, c, p).open_groups = count(n);
    }
    let mut by_partner: BTreeMap<String, Vec<(String, u64)>> = BTreeMap::new();
    for (partner, state, n) in sending {
        by_partner
            .entry(partner)
            .or_default()
            .push((state, count(n)));
    }
    Traffic {
        receiving: rows.into_values().collect(),
        callbacks_owed: callbacks_owed
            .into_iter()
            .map(|(p, n)| (p, count(n)))
            .collect(),
        sending: by_partner
            .into_iter()
            .map(|(partner, states)| Sending { partner, states })
            .collect(),
        received_capped: total >= RECENT_ROWS_COUNTED,
    }
}

fn row(
    rows: &mut std::collections::BTreeMap<(String, String), Receiving>,
    channel: String,
    partner: String,
) -> &mut Receiving {
    rows.entry((channel.clone(), partner.clone()))
        .or_insert_with(|| Receiving {
            channel,
            partner,
            ..Receiving::default()
        })
}

/// What happened per minute since a time (`Backend::rates`), from the store — every gateway of
/// a cluster shows the same: messages received, sent (each attempt), and ended acked, failed
/// or faulted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rates {
    /// The minute (Unix ms of its start) each series starts at.
    pub since_minute: i64,
    /// Per series (`RATE_SERIES`' order), the count of each minute from `since_minute` on.
    pub series: Vec<Vec<u64>>,
    /// Some series stopped counting at `RECENT_ROWS_COUNTED` rows: their oldest minutes are
    /// floors.
    pub capped: bool,
}

/// The series of `Rates`, in order.
pub const RATE_SERIES: &[&str] = &[
    "received",
    "delivered",
    "sent",
    "acked",
    "failed",
    "faulted",
];

/// Adds `$4` to the `minute_counts` row of minute `$1`, series `$2`, gateway `$3` (one
/// statement for both backends; SQLite reads `$n` as `?n`).
pub(in crate::store) const COUNT_MINUTE_SQL: &str = "INSERT INTO minute_counts \
     (minute, series, gateway, n) VALUES ($1, $2, $3, $4) ON CONFLICT (minute, series, gateway) \
     DO UPDATE SET n = minute_counts.n + excluded.n";

/// Minute counts older than this are deleted by the sweeper (the chart shows one hour).
pub(in crate::store) const MINUTE_COUNTS_KEPT_MS: i64 = 2 * 3600 * 1000;

/// The start (Unix ms) of the minute `at_ms` falls in.
pub(in crate::store) fn minute_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(60_000) * 60_000
}

/// How many minutes a rate series spans.
pub const RATE_MINUTES: usize = 60;

/// Puts the per-minute counts of `read_rates!` together: `counts[i]` are (minute, count)
/// rows of series `i`, each cut at `RECENT_ROWS_COUNTED` rows.
pub(in crate::store) fn rates_of(since_minute: i64, counts: Vec<(Vec<(i64, i64)>, bool)>) -> Rates {
    let mut rates = Rates {
        since_minute,
        ..Rates::default()
    };
    for (rows, capped) in counts {
        let mut minutes = vec![0u64; RATE_MINUTES];
        for (minute, n) in rows {
            let at = minute.saturating_mul(60_000).saturating_sub(since_minute) / 60_000;
            if let Some(slot) = usize::try_from(at).ok().and_then(|i| minutes.get_mut(i)) {
                *slot = u64::try_from(n).unwrap_or(0);
            }
        }
        rates.capped |= capped;
        rates.series.push(minutes);
    }
    rates
}

/// `Backend::rates` on either backend's sqlx pool: one GROUP BY per series over the rows of
/// the last `RATE_MINUTES` minutes, each through its time index and at most
/// `RECENT_ROWS_COUNTED` rows.
macro_rules! read_rates {
    ($pool:expr, $now:expr) => {{
        let pool = $pool;
        let now = $crate::store::time::millis($now);
        let since_minute = (now / 60_000 - ($crate::store::overview::RATE_MINUTES as i64 - 1)) * 60_000;
        let per_minute = |sql| async move {
            let rows: Vec<(i64, i64)> = sqlx::query_as(sql)
                .bind(since_minute)
                .bind($crate::store::overview::RECENT_ROWS_COUNTED)
                .fetch_all(pool)
                .await?;
            let counted: i64 = rows.iter().map(|(_, n)| n).sum();
            Ok::<_, $crate::store::StoreError>((
                rows,
                counted >= $crate::store::overview::RECENT_ROWS_COUNTED,
            ))
        };
        let received = per_minute(
            "SELECT at / 60000, COUNT(*) FROM (SELECT received_at AS at FROM inbox \
             WHERE received_at >= $1 ORDER BY received_at DESC LIMIT $2) recent GROUP BY 1",
        )
        .await?;
        // Counted as they happen (`minute_counts`), summed over the gateways.
        let delivered: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT minute / 60000, CAST(SUM(n) AS BIGINT) FROM minute_counts \
             WHERE series = 'delivered' AND minute >= $1 GROUP BY minute",
        )
        .bind(since_minute)
        .fetch_all(pool)
        .await?;
        let sent = per_minute(
            "SELECT at / 60000, COUNT(*) FROM (SELECT at FROM out_attempts \
             WHERE kind = 'send' AND at >= $1 ORDER BY at DESC LIMIT $2) recent GROUP BY 1",
        )
        .await?;
        let ended = |state| {
            per_minute(match state {
                "acked" => "SELECT at / 60000, COUNT(*) FROM (SELECT at FROM out_events \
                     WHERE state = 'acked' AND at >= $1 ORDER BY at DESC LIMIT $2) recent GROUP BY 1",
                "failed" => "SELECT at / 60000, COUNT(*) FROM (SELECT at FROM out_events \
                     WHERE state = 'failed' AND at >= $1 ORDER BY at DESC LIMIT $2) recent GROUP BY 1",
                _ => "SELECT at / 60000, COUNT(*) FROM (SELECT at FROM out_events \
                     WHERE state = 'faulted' AND at >= $1 ORDER BY at DESC LIMIT $2) recent GROUP BY 1",
            })
        };
        let acked = ended("acked").await?;
        let failed = ended("failed").await?;
        let faulted = ended("faulted").await?;
        Ok($crate::store::overview::rates_of(
            since_minute,
            vec![received, (delivered, false), sent, acked, failed, faulted],
        ))
    }};
}
pub(in crate::store) use read_rates;

/// `Backend::traffic` on either backend's sqlx pool: one GROUP BY per table; the inbox only
/// through its `received_at` index, at most `RECENT_ROWS_COUNTED` rows.
macro_rules! read_traffic {
    ($pool:expr, $since:expr) => {{
        let pool = $pool;
        let since = $crate::store::time::millis($since);
        let received: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT channel, partner, COUNT(*) FROM \
             (SELECT channel, partner FROM inbox WHERE received_at >= $1 \
              ORDER BY received_at DESC LIMIT $2) recent \
             GROUP BY channel, partner",
        )
        .bind(since)
        .bind($crate::store::overview::RECENT_ROWS_COUNTED)
        .fetch_all(pool)
        .await?;
        let counts = |sql| async move {
            let rows: Vec<(String, String, i64)> = sqlx::query_as(sql).fetch_all(pool).await?;
            Ok::<_, $crate::store::StoreError>(rows)
        };
        let buffered =
            counts("SELECT channel, partner, COUNT(*) FROM buffered GROUP BY channel, partner")
                .await?;
        let open_groups = counts(
            "SELECT channel, partner, COUNT(*) FROM groups WHERE status = 'open' \
             GROUP BY channel, partner",
        )
        .await?;
        let sending = counts(
            "SELECT partner, state, COUNT(*) FROM out_messages GROUP BY partner, state \
             ORDER BY partner, state",
        )
        .await?;
        let callbacks_owed: Vec<(String, i64)> = sqlx::query_as(
            "SELECT partner, COUNT(*) FROM pending_callbacks GROUP BY partner ORDER BY partner",
        )
        .fetch_all(pool)
        .await?;
        Ok($crate::store::overview::traffic_of(
            received,
            buffered,
            open_groups,
            callbacks_owed,
            sending,
        ))
    }};
}
pub(in crate::store) use read_traffic;

/// `Backend::members` on either backend's sqlx pool: the live sessions of a subscription
/// with what each holds (the in-flight count through the `deliveries_waiting` index).
macro_rules! read_members {
    ($pool:expr, $subscription_id:expr, $now:expr, $limit:expr) => {{
        let rows: Vec<(String, String, i64, i64, i64)> = sqlx::query_as(
            "SELECT s.id, s.principal, s.expires_at, \
             (SELECT COUNT(*) FROM deliveries d WHERE d.subscription_id = s.subscription_id \
              AND d.state = 'acquired' AND d.consumer = s.id), \
             (SELECT COUNT(*) FROM group_affinity g WHERE g.subscription_id = s.subscription_id \
              AND g.consumer = s.id) \
             FROM sessions s WHERE s.subscription_id = $1 AND s.expires_at > $2 \
             ORDER BY s.expires_at DESC, s.id LIMIT $3",
        )
        .bind($subscription_id)
        .bind($crate::store::time::millis($now))
        .bind($limit)
        .fetch_all($pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(session, principal, expires, in_flight, groups)| {
                $crate::store::overview::Member {
                    session,
                    principal,
                    expires_at: $crate::store::time::from_millis(expires),
                    in_flight: u64::try_from(in_flight).unwrap_or(0),
                    groups: u64::try_from(groups).unwrap_or(0),
                }
            })
            .collect())
    }};
}
pub(in crate::store) use read_members;

/// `Backend::search_inbox` on either backend's sqlx pool. `$select` is the backend's inbox
/// column list for a listing (an empty payload in column 5, the payload's size as BIGINT in
/// column 10) and `$entry` maps one of its rows (`Result<InboxEntry, sqlx::Error>`). A time
/// bound starts the page where the messages received since then begin (the `received_at`
/// index, at most `SEARCH_SPAN` rows of it); each page looks through at most `SEARCH_SPAN`
/// offsets.
macro_rules! search_inbox {
    ($pool:expr, $select:expr, $entry:expr, $filter:expr, $after:expr, $limit:expr) => {{
        let pool = $pool;
        let filter: &$crate::store::overview::InboxFilter = $filter;
        let since = filter.since.map($crate::store::time::millis);
        let mut after: i64 = $after;
        if let Some(since) = since {
            // Offsets follow the order messages reached the inbox, not the order they were
            // received: one held for a gap is received before messages that get lower
            // offsets. So the page starts at the lowest offset among the first
            // `SEARCH_SPAN` messages received since then, not at the first one's.
            let first: Option<i64> = sqlx::query_scalar(
                "SELECT MIN(\"offset\") FROM (SELECT \"offset\" FROM inbox \
                 WHERE received_at >= $1 ORDER BY received_at LIMIT $2) first_received",
            )
            .bind(since)
            .bind($crate::store::overview::SEARCH_SPAN)
            .fetch_one(pool)
            .await?;
            match first {
                Some(first) => after = after.max(first - 1),
                None => return Ok($crate::store::overview::InboxPage::default()),
            }
        }
        let high: Option<i64> = sqlx::query_scalar("SELECT MAX(\"offset\") FROM inbox")
            .fetch_one(pool)
            .await?;
        let end = after.saturating_add($crate::store::overview::SEARCH_SPAN);
        let sql = format!(
            "{} FROM inbox WHERE \"offset\" > $1 AND \"offset\" <= $2 \
             AND ($3 IS NULL OR channel = $3) AND ($4 IS NULL OR partner = $4) \
             AND ($5 IS NULL OR group_id = $5) AND ($6 IS NULL OR received_at >= $6) \
             ORDER BY \"offset\" LIMIT $7",
            $select
        );
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(after)
            .bind(end)
            .bind(filter.channel.as_deref())
            .bind(filter.partner.as_deref())
            .bind(filter.group_id.as_deref())
            .bind(since)
            .bind($limit)
            .fetch_all(pool)
            .await?;
        let entries = rows
            .iter()
            .map(|r| {
                use sqlx::Row as _;
                Ok($crate::store::overview::Listed {
                    entry: $entry(r)?,
                    size: u64::try_from(r.try_get::<i64, _>(10)?).unwrap_or(0),
                })
            })
            .collect::<Result<Vec<$crate::store::overview::Listed>, sqlx::Error>>()?;
        let next_after = match entries.last() {
            Some(last) if entries.len() as i64 >= $limit => Some(last.entry.offset),
            _ if high.is_some_and(|high| high > end) => Some(end),
            _ => None,
        };
        Ok($crate::store::overview::InboxPage {
            entries,
            next_after,
        })
    }};
}
pub(in crate::store) use search_inbox;

/// The functions behind `Backend::traffic`, `members` and `search_inbox` on one backend: its
/// pool type, its inbox column list and its inbox row mapper (`Result<InboxEntry, _>`).
macro_rules! operator_reads {
    ($pool:ty, $select:expr, $entry:expr) => {
        async fn traffic(
            pool: &$pool,
            since: chrono::DateTime<chrono::Utc>,
        ) -> Result<$crate::store::Traffic, $crate::store::StoreError> {
            $crate::store::overview::read_traffic!(pool, since)
        }

        async fn rates(
            pool: &$pool,
            now: chrono::DateTime<chrono::Utc>,
        ) -> Result<$crate::store::Rates, $crate::store::StoreError> {
            $crate::store::overview::read_rates!(pool, now)
        }

        async fn members(
            pool: &$pool,
            subscription_id: i64,
            now: chrono::DateTime<chrono::Utc>,
            limit: i64,
        ) -> Result<Vec<$crate::store::Member>, $crate::store::StoreError> {
            $crate::store::overview::read_members!(pool, subscription_id, now, limit)
        }

        async fn search_inbox(
            pool: &$pool,
            filter: &$crate::store::InboxFilter,
            after: i64,
            limit: i64,
        ) -> Result<$crate::store::InboxPage, $crate::store::StoreError> {
            $crate::store::overview::search_inbox!(pool, $select, $entry, filter, after, limit)
        }
    };
}
pub(in crate::store) use operator_reads;
