//! A fetch inside one transaction, under its subscription's lock: renew the member, lapse
//! what is overdue, match new inbox messages against the filter, read the candidates page by
//! page, let `delivery::fetch` plan what each page hands out, and write the plan (leases,
//! group affinity) back.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use super::Fail;
use super::rows::{self, LeaseRow};
use super::sessions;
use crate::delivery::fetch::{self, Budget, HandOut, Take};
use crate::delivery::filter::Filter;
use crate::delivery::group;
use crate::delivery::lease::Lease;
use crate::delivery::pick::{Candidate, Members};
use crate::delivery::subscription::Ordering;
use crate::store::StoreError;
use crate::store::delivery::{DeliveryError, Handed, Subscription};
use crate::store::time::{from_millis, millis};

/// Inbox messages matched against one subscription's filter per pass.
const MATCH_BATCH: i64 = 2_000;

/// What a fetch handed out, and whether others may now take something (lapses, releases).
pub(super) async fn fetch(
    conn: &mut PgConnection,
    session_id: &str,
    take: Take,
    now: DateTime<Utc>,
) -> Result<(Vec<Handed>, bool), Fail> {
    // First, as it takes the subscription's lock that everything below decides under.
    let session = sessions::renew(conn, session_id, now).await?;
    let mut lapsed = sessions::lapse_sessions(conn, now).await?;
    let sub = rows::subscription_by_id(&mut *conn, session.subscription_id)
        .await?
        .ok_or_else(|| DeliveryError::NotFound("the subscription was deleted".into()))?;
    lapsed += sessions::lapse_leases(conn, Some(sub.id), now).await?;
    match_new_messages(conn, &sub).await?;

    let live: Vec<String> =
        sqlx::query_scalar("SELECT id FROM sessions WHERE subscription_id = $1")
            .bind(sub.id)
            .fetch_all(&mut *conn)
            .await?;
    let live: BTreeSet<String> = live.into_iter().collect();
    let members = Members::under(&sub.rules, session_id, &live);
    let page = fetch::page_size(take.max);
    let mut budget = Budget::new(take);
    let mut after = 0i64;
    let mut handed = Vec::new();
    let mut released = false;
    'pages: for _ in 0..fetch::CANDIDATE_PAGES {
        let (candidates, groups) = candidates(conn, &sub, now, after, page).await?;
        let want = budget.wanted();
        let plan = fetch::plan_page(
            sub.id,
            &sub.rules,
            &members,
            &candidates,
            &groups,
            want,
            now,
        );
        for out in plan {
            match hand_out(conn, sub.id, out, &mut budget, now).await? {
                HandedOut::Message(h, was_released) => {
                    released |= was_released;
                    handed.push(*h);
                }
                HandedOut::Missing => {}
                HandedOut::OverBudget => break 'pages,
            }
        }
        match fetch::next_page(&candidates, page, budget.count(), take.max) {
            Some(last) => after = last,
            None => break,
        }
    }
    Ok((handed, lapsed > 0 || released))
}

/// A waiting message with what `pick` needs beside its lease.
#[derive(sqlx::FromRow)]
struct CandidateRow {
    #[sqlx(flatten)]
    lease: LeaseRow,
    affinity: Option<String>,
    group_busy: bool,
}

/// One page of waiting messages due by `now` beyond `after`, in offset order, with their
/// groups. ordering = group: each group's head only, with its affinity and whether another
/// message of the group is leased (`pick` decides what that means).
async fn candidates(
    conn: &mut PgConnection,
    sub: &Subscription,
    now: DateTime<Utc>,
    after: i64,
    page: i64,
) -> Result<(Vec<Candidate>, Vec<Option<String>>), Fail> {
    let sql = if sub.rules.ordering == Ordering::Group {
        "SELECT d.\"offset\", d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, \
         d.reason, d.group_key, a.consumer AS affinity, EXISTS (SELECT 1 FROM deliveries e \
           WHERE e.subscription_id = $1 AND e.group_key = h.group_key \
           AND e.state = 'acquired') AS group_busy \
         FROM group_heads h \
         JOIN deliveries d ON d.subscription_id = h.subscription_id AND d.\"offset\" = h.head \
         LEFT JOIN group_affinity a \
         ON a.subscription_id = h.subscription_id AND a.group_key = h.group_key \
         WHERE h.subscription_id = $1 AND h.head > $4 AND d.state = 'available' \
         AND d.due <= $2 ORDER BY h.head LIMIT $3"
    } else {
        "SELECT d.\"offset\", d.state, d.attempt, d.failures, d.consumer, d.due, d.avoid, \
         d.reason, d.group_key, NULL::TEXT AS affinity, FALSE AS group_busy FROM deliveries d \
         WHERE d.subscription_id = $1 AND d.state = 'available' AND d.due <= $2 \
         AND d.\"offset\" > $4 ORDER BY d.\"offset\" LIMIT $3"
    };
    let rows: Vec<CandidateRow> = sqlx::query_as(sql)
        .bind(sub.id)
        .bind(millis(now))
        .bind(page)
        .bind(after)
        .fetch_all(&mut *conn)
        .await?;
    let mut candidates = Vec::with_capacity(rows.len());
    let mut groups = Vec::with_capacity(rows.len());
    for row in rows {
        candidates.push(Candidate {
            offset: row.lease.offset,
            lease: row.lease.lease()?,
            affinity: row.affinity,
            group_busy: row.group_busy,
        });
        groups.push(row.lease.group);
    }
    Ok((candidates, groups))
}

/// What became of one hand-out of the plan.
enum HandedOut {
    /// Leased (or released at once: true) and answered with its message.
    Message(Box<Handed>, bool),
    /// Gone from the inbox: nothing written.
    Missing,
    /// Beyond the fetch's byte budget: nothing written, and the fetch ends.
    OverBudget,
}

/// Writes one hand-out of the plan (its lease, and the group it binds to the member) if the
/// fetch's `budget` admits its message.
async fn hand_out(
    conn: &mut PgConnection,
    subscription: i64,
    out: HandOut,
    budget: &mut Budget,
    now: DateTime<Utc>,
) -> Result<HandedOut, Fail> {
    let offset = out.offset;
    let Some(message) = rows::inbox_entry(&mut *conn, offset).await? else {
        tracing::error!(
            offset,
            subscription,
            "a leased message is missing from the inbox"
        );
        return Ok(HandedOut::Missing);
    };
    if !budget.admit(message.payload.len()) {
        return Ok(HandedOut::OverBudget);
    }
    rows::save_leases(conn, subscription, &[(offset, &out.lease)], now).await?;
    if let Some(group) = &out.binds_group {
        sqlx::query(
            "INSERT INTO group_affinity (subscription_id, group_key, consumer) \
             VALUES ($1, $2, $3) \
             ON CONFLICT (subscription_id, group_key) DO UPDATE SET consumer = excluded.consumer",
        )
        .bind(subscription)
        .bind(group)
        .bind(&out.receipt.consumer)
        .execute(&mut *conn)
        .await?;
    }
    let handed = Handed {
        receipt: out.receipt,
        deadline: out.deadline,
        message,
    };
    Ok(HandedOut::Message(Box::new(handed), out.released))
}

/// Matches inbox messages beyond the subscription's cursor against its filter and gives each
/// match a lease (and, ordering = group, its group a head), then moves the cursor past them.
/// The inbox becomes visible in offset order (gap-free, in commit order), so no message
/// committed late lies behind the cursor.
async fn match_new_messages(conn: &mut PgConnection, sub: &Subscription) -> Result<(), Fail> {
    let filter = Filter::parse(&sub.filter)
        .map_err(|e| StoreError::Corrupt(format!("subscription {} filter: {e}", sub.id)))?;
    let grouped = sub.rules.ordering == Ordering::Group;
    let cursor: i64 = sqlx::query_scalar("SELECT cursor FROM subscriptions WHERE id = $1")
        .bind(sub.id)
        .fetch_one(&mut *conn)
        .await?;
    let rows: Vec<(i64, String, String, String, i64)> = sqlx::query_as(
        "SELECT \"offset\", topic, partner, group_id, received_at FROM inbox \
         WHERE \"offset\" > $1 ORDER BY \"offset\" LIMIT $2",
    )
    .bind(cursor)
    .bind(MATCH_BATCH)
    .fetch_all(&mut *conn)
    .await?;
    let Some(last) = rows.last().map(|r| r.0) else {
        return Ok(());
    };
    let mut leases = Vec::new();
    for (offset, topic, partner, group_id, received_at) in &rows {
        if filter.matches(topic) {
            // The ordering group is the sender's: (partner, group id), as one opaque key,
            // written as SQLite's json_array writes it.
            let group = if grouped {
                Some(serde_json::to_string(&[partner, group_id]).map_err(|e| {
                    StoreError::Failed(format!("cannot encode the group at offset {offset}: {e}"))
                })?)
            } else {
                None
            };
            let received = from_millis(*received_at);
            leases.push((*offset, group, Lease::new(received), received));
        }
    }
    rows::insert_leases(conn, sub.id, &leases).await?;
    // A group with nothing pending gets its first new message as head.
    let matched = leases
        .iter()
        .filter_map(|(offset, group, _, _)| Some((*offset, group.as_deref()?)));
    for (group, first) in group::first_of_each(matched) {
        let head = group::head_with(rows::head(conn, sub.id, group).await?, first);
        rows::set_head(conn, sub.id, group, head).await?;
    }
    sqlx::query("UPDATE subscriptions SET cursor = $2 WHERE id = $1")
        .bind(sub.id)
        .bind(last)
        .execute(&mut *conn)
        .await?;
    Ok(())
}
