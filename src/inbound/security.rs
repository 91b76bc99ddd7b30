//! A WS-Security UsernameToken in the envelope (D14): who the request is, when it proves it
//! there rather than over HTTP. Checked after the envelope is read and before anything of the
//! message is acted on; a token's nonce is used once within its window, on every gateway of
//! the store. Never axum: the refusal is a domain value (`http/wsr.rs` answers it).

use std::net::SocketAddr;

use super::Inbound;
use crate::partners::{self, Caller, Refused};
use crate::wsr::UsernameToken;

/// Why a request's envelope credentials do not let it in: answered like the same refusal of
/// HTTP credentials (401, or 403 for a channel the partner may not post to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// No partner proved (or two different ones, or a replay): 401.
    Unauthorized(String),
    /// A partner proved itself, for a channel it may not post to: 403.
    Forbidden { partner: String, why: String },
    /// The nonce store could not be asked: nothing was acted on, the sender may try again.
    Unavailable(String),
}

/// Who the request to `channel` (`None`: the callback route) from `peer` is, given what HTTP
/// proved (`caller`), whether only a token could let it in (`token_required`: the route takes
/// no anonymous requests, and a token partner may reach it) and the envelope's UsernameToken.
pub async fn caller_of(
    ctx: Inbound<'_>,
    channel: Option<&str>,
    peer: Option<SocketAddr>,
    caller: Caller,
    token_required: bool,
    token: Option<&UsernameToken>,
) -> Result<Caller, TokenRefusal> {
    let Some(token) = token else {
        return match token_required {
            true => Err(TokenRefusal::Unauthorized(
                "credentials required: authenticate as a configured partner (HTTP or a \
                 WS-Security UsernameToken)"
                    .into(),
            )),
            false => Ok(caller),
        };
    };
    // A PasswordText only where it cannot have been read on its way: a TLS listener, or a
    // client on this host.
    let text_allowed = ctx.config.tls.is_some() || peer.is_some_and(|p| p.ip().is_loopback());
    let now = ctx.clock.now();
    let refused = |why: &str| TokenRefusal::Unauthorized(why.to_owned());
    let nonce = crate::wss::check_form(token, now).map_err(refused)?;
    let partner = ctx
        .config
        .partners
        .by_username_token(token, text_allowed)
        .await
        .map_err(|why| {
            let (partner, username) = (why.partner.as_deref(), why.username.as_deref());
            crate::metrics::auth_refused(partner, username, why.why, now);
            refused(why.why)
        })?;
    if let Some(http) = &caller.partner
        && *http != partner.name
    {
        return Err(refused(
            "the HTTP credentials and the UsernameToken name different partners",
        ));
    }
    if let Some((nonce, until)) = nonce {
        let scope = super::partner_source(&partner.name);
        let fresh = ctx
            .store
            .use_nonce(&scope, &nonce, until, now)
            .await
            .map_err(|e| TokenRefusal::Unavailable(e.to_string()))?;
        if !fresh {
            const REPLAY: &str = "the UsernameToken's Nonce was used already (a replay)";
            let username = Some(token.username.as_str());
            crate::metrics::auth_refused(Some(&partner.name), username, REPLAY, now);
            return Err(refused(REPLAY));
        }
    }
    let anonymous_ok = match channel {
        Some(channel) => ctx.config.anonymous_channels.contains(channel),
        None => ctx.config.anonymous_callbacks,
    };
    partners::admit(Some(partner), channel, anonymous_ok).map_err(|r| match r {
        Refused::ChannelNotAllowed { partner } => TokenRefusal::Forbidden {
            why: format!(
                "partner {partner} may not post to channel {}",
                channel.unwrap_or_default()
            ),
            partner,
        },
        Refused::CredentialsRequired => refused("credentials required"),
    })
}
