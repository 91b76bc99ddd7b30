//! The partners' guard (D14) in front of `/wsr/{channel}` and `/wsr/_callback`: the request is
//! identified from its `Authorization` header and its connection's client certificate before
//! any of its body is read, refused with 401 (`WWW-Authenticate`) or 403, and otherwise handed
//! on with its `Caller` (`guarded`). The same call writes the access log: one line per request,
//! with what the handler noted of it (`AccessNote`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::serve::PeerAddr;
use crate::partners::{self, Caller, ClientCertificate, Presented, Refused};

/// The challenge of a 401: both ways a partner can authenticate over HTTP.
const CHALLENGE: &str = "Basic realm=\"wsr-gateway\", Bearer realm=\"wsr-gateway\"";

/// Which `/wsr` route is guarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// `/wsr/{channel}`: reliable messages and polls.
    Channel,
    /// `/wsr/_callback`: acks and faults for our messages.
    Callback,
}

/// What the handler tells the access log about a request: the receiving services' `Note`.
pub use crate::inbound::Note as AccessNote;

/// The verdict as a metrics label: a bounded word, faults as one (`fault`).
fn verdict_label(note: &AccessNote) -> Option<&'static str> {
    if note.fault.is_some() {
        return Some("fault");
    }
    Some(match note.verdict.as_deref()? {
        "delivered" => "delivered",
        "buffered" => "buffered",
        "duplicate" => "duplicate",
        "poll" => "poll",
        "not stored" => "not_stored",
        _ => "other",
    })
}

/// The handler's handle on its request's `AccessNote` (a request extension).
#[derive(Debug, Clone, Default)]
pub struct Access(Arc<Mutex<AccessNote>>);

impl Access {
    pub fn note(&self, change: impl FnOnce(&mut AccessNote)) {
        if let Ok(mut note) = self.0.lock() {
            change(&mut note);
        }
    }

    fn taken(&self) -> AccessNote {
        self.0.lock().map(|n| n.clone()).unwrap_or_default()
    }
}

/// What the guard hands the handler of a request it let in.
pub struct Admitted {
    pub admission: Admission,
    /// Where the handler notes what it decided, for the access line.
    pub access: Access,
    /// The channel the path names ("" on the callback route), as the guard checked it.
    pub channel: String,
}

/// The guard (see the module comment) around `handler`, which runs only if the request is let
/// in. A plain call rather than a middleware layer: `/wsr` is the gateway's hot path, and a
/// layer costs a boxed future and a clone of the route beneath it on every request.
pub async fn guarded<F, Fut>(app: &AppState, door: Door, request: Request, handler: F) -> Response
where
    F: FnOnce(Request, Admitted) -> Fut,
    Fut: Future<Output = Response>,
{
    let started = Instant::now();
    let channel = channel_of(door, &request);
    let access = Access::default();
    // Taken out of the request, which is not `Sync` and so cannot be borrowed across awaits.
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let certificate = request.extensions().get::<ClientCertificate>().cloned();
    let presented = Presented {
        authorization: authorization.as_ref().map(HeaderValue::as_bytes),
        certificate: certificate.as_ref(),
    };
    let peer_addr = request.extensions().get::<PeerAddr>().map(|p| p.0);
    let decided = admit(app, door, &channel, presented, peer_addr).await;
    let (response, partner) = match decided {
        // Refused before its body was read: the connection cannot be reused for a next
        // request (its body would be read as one), so the answer says it is closed.
        Err(Stop {
            mut response,
            partner,
        }) => {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            (response, partner)
        }
        Ok((caller, token_required)) => {
            let partner = caller.partner.clone();
            let admitted = Admitted {
                admission: Admission {
                    caller,
                    token_required,
                },
                access: access.clone(),
                channel: channel.clone(),
            };
            (handler(request, admitted).await, partner)
        }
    };
    let note = access.taken();
    // A partner proved by a UsernameToken is known only once the handler read the envelope.
    let partner = note.partner.clone().or(partner);
    if door == Door::Channel
        && let Some(verdict) = verdict_label(&note)
    {
        // Only requests the handler decided reach here with a verdict, so the channel is a
        // configured one (an unknown channel is a 404 before): a bounded label.
        crate::metrics::received(
            &channel,
            crate::metrics::partner(partner.as_deref()),
            verdict,
            note.fault.map(crate::wsr::FaultCode::local_name),
        );
    }
    tracing::info!(
        target: "wsr_gateway::access",
        peer = peer_addr.map(tracing::field::display),
        partner = partner.as_deref().unwrap_or(crate::metrics::ANONYMOUS),
        route = match door { Door::Channel => "channel", Door::Callback => "callback" },
        channel = %channel,
        group_id = note.group_id.as_deref().unwrap_or("-"),
        number = note.number,
        verdict = note.verdict.as_deref().unwrap_or("-"),
        status = response.status().as_u16(),
        duration_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "wsr request"
    );
    response
}

/// The channel a request to `door` names ("" on the callback route).
fn channel_of(door: Door, request: &Request) -> String {
    match door {
        Door::Channel => request
            .uri()
            .path()
            .strip_prefix("/wsr/")
            .map(str::to_owned)
            .unwrap_or_default(),
        Door::Callback => String::new(),
    }
}

/// Who the guard let in: the caller HTTP proved, and whether only a WS-Security
/// UsernameToken in the envelope can let it in after all (it presented no credentials, on a
/// channel that takes no anonymous requests but that a partner proving itself by token may
/// reach, D14). The handler checks that once it has read the envelope.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    pub caller: Caller,
    pub token_required: bool,
}

/// A request stopped by the guard: its answer, and the partner it proved to be, if any (the
/// access line names it).
struct Stop {
    response: Response,
    partner: Option<String>,
}

impl Stop {
    fn anonymous(response: Response) -> Stop {
        Stop {
            response,
            partner: None,
        }
    }
}

/// Who may go on, or the answer that stops the request here: an unknown channel is 404 (a
/// route, not a rule); who it is and whether it may post are the partners' rules.
async fn admit(
    app: &AppState,
    door: Door,
    channel: &str,
    presented: Presented<'_>,
    peer: Option<std::net::SocketAddr>,
) -> Result<(Caller, bool), Stop> {
    if door == Door::Channel && !app.config.channels.contains_key(channel) {
        return Err(Stop::anonymous(
            (
                StatusCode::NOT_FOUND,
                format!("no channel named {channel:?}\n"),
            )
                .into_response(),
        ));
    }
    let peer = peer.map(tracing::field::display);
    let partner = match app.config.partners.identify(presented).await {
        Ok(p) => p,
        Err(why) => {
            let (partner, username) = (why.partner.as_deref(), why.username.as_deref());
            crate::metrics::auth_refused(partner, username, why.why, app.clock.now());
            // The username tried (not a secret; bounded, as the partners view shows it).
            let username = username.map(crate::metrics::username_shown);
            tracing::warn!(peer, channel, partner, username, reason = %why, "refused: not a partner");
            return Err(Stop::anonymous(unauthorized(why.why)));
        }
    };
    let (route, anonymous_ok) = match door {
        Door::Channel => (
            Some(channel),
            app.config.anonymous_channels.contains(channel),
        ),
        Door::Callback => (None, app.config.anonymous_callbacks),
    };
    match partners::admit(partner, route, anonymous_ok) {
        Ok(caller) => Ok((caller, false)),
        // Its envelope may prove it: read on, and the handler checks.
        Err(Refused::CredentialsRequired) if app.config.partners.token_may_reach(route) => {
            Ok((Caller::default(), true))
        }
        Err(Refused::ChannelNotAllowed { partner }) => {
            tracing::warn!(peer, partner = %partner, channel, "refused: channel not allowed for this partner");
            let response = (
                StatusCode::FORBIDDEN,
                format!("partner {partner} may not post to channel {channel}\n"),
            )
                .into_response();
            Err(Stop {
                response,
                partner: Some(partner),
            })
        }
        Err(Refused::CredentialsRequired) => {
            tracing::warn!(peer, channel, "refused: no credentials");
            Err(Stop::anonymous(unauthorized("credentials required")))
        }
    }
}

pub(super) fn unauthorized(why: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(CHALLENGE),
        )],
        format!("{why}: authenticate as a configured partner\n"),
    )
        .into_response()
}
