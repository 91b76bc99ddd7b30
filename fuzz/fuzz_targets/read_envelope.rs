//! Fuzzes the envelope reader, plain and MIME-packaged: it must never panic, and whatever it
//! accepts must survive a write→read round trip with the same header values.
//! Run: `cargo +nightly fuzz run read_envelope -- -max_total_time=600`

#![no_main]

use libfuzzer_sys::fuzz_target;
use wsr_gateway::wsr::{Headers, Limits, read_envelope, read_message, write_envelope};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    let _ = read_message(Some("multipart/related; boundary=b; start=\"<r>\""), data, &limits);
    let Ok(env) = read_envelope(data, &limits) else {
        return;
    };
    let written = write_envelope(
        env.version,
        Headers {
            request: env.request.as_ref(),
            response: env.response.as_ref(),
            poll_request: env.poll_request.as_ref(),
        },
        // The body may use prefixes declared on the original Envelope (see Body::namespaces),
        // so only the headers are compared here; the body slice has its own property tests.
        "",
    );
    let again = read_envelope(written.as_bytes(), &limits).expect("our own output reads back");
    assert_eq!(again.request, env.request);
    assert_eq!(again.poll_request, env.poll_request);
    // An empty Response is tolerated on input but never written.
    if env.response.as_ref().is_some_and(|r| !r.replies.is_empty()) {
        assert_eq!(again.response, env.response);
    }
});
