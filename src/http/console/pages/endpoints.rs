//! The registered callback and push endpoints (read-only: the API and CLI change them).

use axum::extract::State;

use super::super::Operator;
use super::super::html::{esc, table};
use super::{Page, shown, store};
use crate::http::AppState;
use crate::store::Endpoints;

pub async fn endpoints(Operator(_): Operator, State(app): State<AppState>) -> Page {
    let callbacks = store(app.store.callback_endpoints().await)?;
    let push = store(app.store.endpoints(Endpoints::Push).await)?;
    let rows: Vec<Vec<String>> = callbacks
        .iter()
        .map(|(partner, url)| {
            vec![
                esc(url),
                esc(if partner.is_empty() {
                    "(anonymous callers)"
                } else {
                    partner
                }),
            ]
        })
        .collect();
    let mut body = table(
        "Callback endpoints (ReplyTo addresses partners may name)",
        &["URL", "Who may name it"],
        &rows,
    );
    let rows: Vec<Vec<String>> = push.iter().map(|url| vec![esc(url)]).collect();
    body.push_str(&table(
        "Push endpoints (webhooks of push subscriptions)",
        &["URL"],
        &rows,
    ));
    body.push_str(
        "<p>Register and remove endpoints with the admin API or <code>wsr-gateway endpoints</code>.</p>",
    );
    shown("Endpoints", &body)
}
