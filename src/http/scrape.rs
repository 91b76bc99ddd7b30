//! `GET /metrics`: the recorder's counters and histograms (`crate::metrics`), then the store's
//! gauges read at this scrape. The `wsr_store_*` gauges are the whole cluster's truth (take
//! the max over gateways, never the sum): they are written here rather than kept in the
//! recorder, so that a deleted subscription's series disappears and two gateways in one
//! process (the tests) cannot overwrite each other's.

use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::store::{StoreStats, SubscriptionStats};

/// Above this many subscriptions the per-subscription gauges are summed into one series
/// (`subscription="_all"`), so that an application creating subscriptions cannot grow the
/// scrape without bound.
pub const MAX_SUBSCRIPTION_SERIES: usize = 100;

/// The Prometheus text format's content type.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The handler. With `metrics_token` set, only `Authorization: Bearer <metrics_token>` may
/// scrape (401 otherwise); without it, like `/healthz`, anyone who reaches the listener may.
pub async fn scrape(State(app): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(token) = &app.config.metrics_token {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !crate::secrets::constant_time_eq(presented.as_bytes(), token.expose().as_bytes()) {
            return (
                StatusCode::UNAUTHORIZED,
                [(
                    header::WWW_AUTHENTICATE,
                    "Bearer realm=\"wsr-gateway metrics\"",
                )],
                "metrics_token required\n",
            )
                .into_response();
        }
    }
    let stats = match app.store.stats().await {
        Ok(s) => Some(s),
        Err(e) => {
            crate::store::health::log_store_failure("the store's gauges could not be read", &e);
            None
        }
    };
    let mut text = render(stats.as_ref());
    // What /readyz would answer now (its probe is rate-limited in the store), for the alert
    // on a gateway that answers but cannot take messages.
    let ready = app.store.readiness().await.is_ok();
    gauge(
        &mut text,
        "wsr_ready",
        "1 when this gateway is ready (/readyz: its store can commit)",
        u8::from(ready),
    );
    let not_after = app.server_certificate.as_ref().and_then(|c| c.not_after());
    if let Some(not_after) = not_after {
        gauge_head(
            &mut text,
            "wsr_tls_certificate_not_after_seconds",
            "When the listener's TLS certificate expires (its notAfter), in Unix seconds",
        );
        let _ = writeln!(
            text,
            "wsr_tls_certificate_not_after_seconds{{certificate=\"server\"}} {}",
            not_after.timestamp()
        );
    }
    ([(header::CONTENT_TYPE, TEXT_FORMAT)], text).into_response()
}

/// The text of `/metrics`: the recorder's series, then the store's gauges (`None`: the store
/// could not be read; `wsr_store_up` says so).
fn render(stats: Option<&StoreStats>) -> String {
    let mut out = match crate::metrics::handle() {
        Some(h) => {
            // Without the exporter's own listener nobody else runs its upkeep (histogram
            // buckets drained into the snapshot); the scrape does.
            h.run_upkeep();
            h.render()
        }
        None => String::new(),
    };
    render_store(&mut out, stats);
    out
}

/// Appends the store's gauges in the Prometheus text format.
fn render_store(out: &mut String, stats: Option<&StoreStats>) {
    gauge(
        out,
        "wsr_store_up",
        "1 when the store's gauges below could be read at this scrape",
        u8::from(stats.is_some()),
    );
    let Some(s) = stats else {
        return;
    };
    gauge(
        out,
        "wsr_store_pending_callbacks",
        "Callback acks owed to partners, not yet taken (cluster-wide)",
        s.pending_callbacks,
    );
    gauge(
        out,
        "wsr_store_buffered_messages",
        "Ordered messages held for a gap (cluster-wide)",
        s.buffered_messages,
    );
    by_state(
        out,
        "wsr_store_groups",
        "Received groups by state (cluster-wide)",
        &s.groups,
    );
    by_state(
        out,
        "wsr_store_outbound_messages",
        "Our messages by state (cluster-wide)",
        &s.outbound,
    );
    gauge(
        out,
        "wsr_store_subscriptions",
        "Subscriptions (cluster-wide)",
        s.subscriptions.len(),
    );
    subscription_messages(out, &s.subscriptions);
}

/// A gauge with one unlabelled series.
fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    gauge_head(out, name, help);
    let _ = writeln!(out, "{name} {value}");
}

/// A gauge with one series per state (the `state` label), as the store counted them.
fn by_state(out: &mut String, name: &str, help: &str, counts: &[(String, u64)]) {
    gauge_head(out, name, help);
    for (state, n) in counts {
        let _ = writeln!(out, "{name}{{state=\"{}\"}} {n}", escape(state));
    }
}

/// `wsr_store_subscription_messages`: three series per subscription, or one summed set when
/// there are more than `MAX_SUBSCRIPTION_SERIES` of them.
fn subscription_messages(out: &mut String, subscriptions: &[SubscriptionStats]) {
    gauge_head(
        out,
        "wsr_store_subscription_messages",
        "Messages of each subscription: waiting, in_flight, dead_letter, and unmatched (in the \
         inbox past its cursor, not matched against its filter yet: matching is lazy, and some \
         may not match; counted up to 100000) (cluster-wide)",
    );
    let mut write = |name: &str, w: u64, f: u64, d: u64, u: u64| {
        let name = escape(name);
        for (state, n) in [
            ("waiting", w),
            ("in_flight", f),
            ("dead_letter", d),
            ("unmatched", u),
        ] {
            let _ = writeln!(
                out,
                "wsr_store_subscription_messages{{subscription=\"{name}\",state=\"{state}\"}} {n}"
            );
        }
    };
    if subscriptions.len() > MAX_SUBSCRIPTION_SERIES {
        let sum = |f: fn(&SubscriptionStats) -> u64| subscriptions.iter().map(f).sum::<u64>();
        write(
            "_all",
            sum(|x| x.waiting),
            sum(|x| x.in_flight),
            sum(|x| x.dead_letters),
            sum(|x| x.unmatched),
        );
    } else {
        for sub in subscriptions {
            write(
                &sub.name,
                sub.waiting,
                sub.in_flight,
                sub.dead_letters,
                sub.unmatched,
            );
        }
    }
}

fn gauge_head(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
}

/// A label value in the text format: backslash, double quote and line feed escaped.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(name: &str, waiting: u64) -> SubscriptionStats {
        SubscriptionStats {
            name: name.to_owned(),
            waiting,
            in_flight: 1,
            dead_letters: 0,
            unmatched: 5,
        }
    }

    #[test]
    fn store_gauges_escape_names_and_cap_subscriptions() {
        let mut stats = StoreStats {
            pending_callbacks: 3,
            groups: vec![("open".into(), 2)],
            subscriptions: vec![sub("a\"b\\c\nd", 4)],
            ..StoreStats::default()
        };
        let mut text = String::new();
        render_store(&mut text, Some(&stats));
        assert!(text.contains("wsr_store_up 1\n"));
        assert!(text.contains("wsr_store_pending_callbacks 3\n"));
        assert!(text.contains("wsr_store_groups{state=\"open\"} 2\n"));
        assert!(text.contains(
            "wsr_store_subscription_messages{subscription=\"a\\\"b\\\\c\\nd\",state=\"waiting\"} 4\n"
        ));
        assert!(text.contains(
            "wsr_store_subscription_messages{subscription=\"a\\\"b\\\\c\\nd\",state=\"unmatched\"} 5\n"
        ));
        stats.subscriptions = (0..=MAX_SUBSCRIPTION_SERIES)
            .map(|i| sub(&format!("s{i}"), 2))
            .collect();
        let mut text = String::new();
        render_store(&mut text, Some(&stats));
        assert!(!text.contains("subscription=\"s1\""), "aggregated");
        let all = 2 * (MAX_SUBSCRIPTION_SERIES as u64 + 1);
        assert!(text.contains(&format!(
            "wsr_store_subscription_messages{{subscription=\"_all\",state=\"waiting\"}} {all}\n"
        )));
        let mut text = String::new();
        render_store(&mut text, None);
        assert_eq!(text.lines().last(), Some("wsr_store_up 0"));
    }
}
