//! What a URL registered as an endpoint (a callback endpoint, a push webhook, a partner's
//! address) must look like. A leaf: it imports nothing of the crate, so the configuration, the
//! partners and the admin API can all check URLs with it without importing one another.

use anyhow::bail;

/// The longest URL that may be registered as an endpoint (callback, push) or used as a
/// destination: every registered URL fits in a request line, so it can also be unregistered.
pub const MAX_URL_BYTES: usize = 2048;

/// A callback endpoint must be an absolute http(s) URL of at most `MAX_URL_BYTES`.
pub fn check_endpoint(url: &str) -> anyhow::Result<()> {
    if url.len() > MAX_URL_BYTES {
        bail!(
            "endpoint URL of {} bytes is longer than {MAX_URL_BYTES} bytes",
            url.len()
        );
    }
    let ok = (url.starts_with("http://") || url.starts_with("https://"))
        && url.len() > "https://".len()
        && !url.chars().any(|c| c.is_whitespace() || c.is_control());
    if !ok {
        bail!("callback endpoint {url:?} is not an absolute http(s) URL");
    }
    Ok(())
}
