//! A push subscription's SOAP format (DESIGN §5), the pure part: the envelope a SOAP endpoint
//! gets for one inbox message, the HTTP headers naming the message (so the endpoint can tell a
//! retry from a new message), and what its answer means.
//!
//! The inbox keeps a message's Body children with the namespace declarations in scope at its
//! Body; the message's SOAP version is the envelope namespace among them (the Body element is
//! in it, so it is always in scope there). The envelope sent carries no Header: WS-R blocks are
//! not the endpoint's business, and the inbox does not keep other header blocks.

use crate::wsr::model::{SOAP11_NS, SOAP12_NS};
use crate::wsr::{Limits, SoapVersion, read_message, write_plain_envelope};

use super::lease::Outcome;
use crate::rmp::exchange::idempotency_headers;

/// One inbox message as a SOAP request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoapRequest {
    pub version: SoapVersion,
    pub envelope: String,
    /// Content-Type, SOAPAction (SOAP 1.1) and the idempotency headers; all values are
    /// visible ASCII.
    pub headers: Vec<(&'static str, String)>,
}

/// Builds the request for one message from its inbox fields. `namespaces` is the stored JSON
/// list of `[prefix or null, uri]`; an unreadable list (a damaged row) is an error.
pub fn soap_request(
    payload: &str,
    namespaces: &str,
    group_id: &str,
    number: Option<u64>,
) -> Result<SoapRequest, String> {
    let declarations: Vec<(Option<String>, String)> = serde_json::from_str(namespaces)
        .map_err(|e| format!("namespace declarations unreadable: {e}"))?;
    let version = version_of(&declarations);
    let used = used_by(payload, declarations);
    let envelope = write_plain_envelope(version, &used, payload);
    let mut headers = vec![("Content-Type", version.content_type().to_owned())];
    if let Some(action) = version.soap_action() {
        headers.push(("SOAPAction", action.to_owned()));
    }
    headers.extend(idempotency_headers(group_id, number));
    Ok(SoapRequest {
        version,
        envelope,
        headers,
    })
}

/// The SOAP version of a message whose Body had these declarations in scope: the one envelope
/// namespace among them. Should both be (an envelope declaring the other version's namespace
/// too, which no SOAP stack writes), SOAP 1.1.
pub fn version_of(declarations: &[(Option<String>, String)]) -> SoapVersion {
    let has = |ns: &str| declarations.iter().any(|(_, uri)| uri == ns);
    if has(SOAP12_NS) && !has(SOAP11_NS) {
        SoapVersion::Soap12
    } else {
        SoapVersion::Soap11
    }
}

/// The declarations the payload may use: the default namespace, and each prefix written
/// somewhere in it as `prefix:` not inside a longer name (in a name, or in a QName-valued
/// text: kept when in doubt). The rest — the partner's envelope and WS-R prefixes, typically —
/// are left out of the envelope sent.
fn used_by(
    payload: &str,
    declarations: Vec<(Option<String>, String)>,
) -> Vec<(Option<String>, String)> {
    declarations
        .into_iter()
        .filter(|(prefix, _)| prefix.as_deref().is_none_or(|p| mentions(payload, p)))
        .collect()
}

fn mentions(payload: &str, prefix: &str) -> bool {
    let qualified = format!("{prefix}:");
    payload.match_indices(&qualified).any(|(at, _)| {
        payload[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    })
}

/// Whether an endpoint's answer is a SOAP Fault (of either version): its Body's first child.
pub fn is_fault(content_type: Option<&str>, body: &[u8]) -> bool {
    if body.is_empty() {
        return false;
    }
    read_message(content_type, body, &Limits::default())
        .ok()
        .and_then(|env| env.body.root)
        .is_some_and(|root| {
            root.local_name == "Fault"
                && matches!(root.namespace.as_deref(), Some(SOAP11_NS | SOAP12_NS))
        })
}

/// What a SOAP endpoint's answer means for the lease: a SOAP Fault rejects, whatever the status
/// (SOAP 1.1 faults come with 500, SOAP 1.2 ones with 400 or 500); otherwise as a JSON
/// webhook's status (`status_outcome`): 2xx accepted, 4xx rejected, the rest retried.
pub fn outcome(fault: bool, status_outcome: Outcome) -> Outcome {
    if fault {
        Outcome::Rejected
    } else {
        status_outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rmp::exchange::{GROUP_ID_HEADER, SEQUENCE_NUMBER_HEADER};
    use crate::wsr::read_envelope;

    const ORDER: &str =
        r#"<o:Order xmlns:x="urn:x"><o:Id>1</o:Id><Note>a &amp; b</Note></o:Order>"#;

    fn declarations(version: SoapVersion, soap_prefix: &str) -> String {
        serde_json::json!([
            [soap_prefix, version.envelope_namespace()],
            ["o", "urn:orders"],
            [null, "urn:default"],
            ["xml", "http://www.w3.org/XML/1998/namespace"],
            ["wsrm", crate::wsr::model::WSRM_NS],
        ])
        .to_string()
    }

    #[test]
    fn the_envelope_is_the_messages_version_around_its_body_with_its_declarations() {
        for version in [SoapVersion::Soap11, SoapVersion::Soap12] {
            let ns = declarations(version, "s");
            let req = soap_request(ORDER, &ns, "urn:g", Some(7)).expect("built");
            assert_eq!(req.version, version);
            let env = read_envelope(req.envelope.as_bytes(), &Limits::default()).expect("reads");
            assert_eq!(env.version, version);
            assert!(env.request.is_none() && env.response.is_none());
            assert_eq!(env.body.content, ORDER, "children as received");
            let root = env.body.root.expect("a root");
            assert_eq!(root.namespace.as_deref(), Some("urn:orders"));
            assert_eq!(root.local_name, "Order");
            assert!(!req.envelope.contains("wsrm"));
            assert!(
                !req.envelope.contains("xmlns:s="),
                "the partner's envelope prefix, unused by the payload, is left out"
            );
            let header = |name: &str| {
                req.headers
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(header("Content-Type"), Some(version.content_type()));
            assert_eq!(header("SOAPAction"), version.soap_action());
            assert_eq!(header(GROUP_ID_HEADER), Some("urn:g"));
            assert_eq!(header(SEQUENCE_NUMBER_HEADER), Some("7"));
        }
    }

    #[test]
    fn a_payload_prefix_never_clashes_with_the_envelopes() {
        // The payload binds `soap` (and `env`) to its own namespace: the envelope takes another.
        let ns = serde_json::json!([
            [null, SOAP11_NS],
            ["soap", "urn:app"],
            ["soap0", "urn:app0"],
        ])
        .to_string();
        let body = "<soap:Item soap0:a=\"1\"/>";
        let req = soap_request(body, &ns, "g", None).expect("built");
        assert!(
            req.envelope.starts_with("<soap1:Envelope"),
            "{}",
            req.envelope
        );
        let env = read_envelope(req.envelope.as_bytes(), &Limits::default()).expect("reads");
        assert_eq!(env.version, SoapVersion::Soap11);
        assert_eq!(
            env.body.root.and_then(|r| r.namespace).as_deref(),
            Some("urn:app")
        );
        assert!(
            !req.headers
                .iter()
                .any(|(n, _)| *n == SEQUENCE_NUMBER_HEADER),
            "unsequenced: no number"
        );
    }

    #[test]
    fn damaged_declarations_are_an_error_and_odd_group_ids_are_encoded() {
        assert!(soap_request("<a/>", "not json", "g", None).is_err());
        let request = soap_request("<a/>", "[]", "urn:g 1/é%", None).expect("request");
        let group = request.headers.iter().find(|(n, _)| *n == GROUP_ID_HEADER);
        assert_eq!(group.map(|(_, v)| v.as_str()), Some("urn:g%201/%C3%A9%25"));
    }

    #[test]
    fn a_fault_of_either_version_is_told_apart_from_a_response() {
        let fault11 = format!(
            r#"<s:Envelope xmlns:s="{SOAP11_NS}"><s:Body><s:Fault><faultcode>s:Client</faultcode><faultstring>no</faultstring></s:Fault></s:Body></s:Envelope>"#
        );
        let fault12 = format!(
            r#"<e:Envelope xmlns:e="{SOAP12_NS}"><e:Body><e:Fault><e:Code><e:Value>e:Sender</e:Value></e:Code><e:Reason><e:Text xml:lang="en">no</e:Text></e:Reason></e:Fault></e:Body></e:Envelope>"#
        );
        let ok = format!(
            r#"<s:Envelope xmlns:s="{SOAP11_NS}"><s:Body><r:Ok xmlns:r="urn:r"/></s:Body></s:Envelope>"#
        );
        assert!(is_fault(Some("text/xml"), fault11.as_bytes()));
        assert!(is_fault(Some("application/soap+xml"), fault12.as_bytes()));
        assert!(!is_fault(Some("text/xml"), ok.as_bytes()));
        assert!(!is_fault(None, b""));
        assert!(!is_fault(
            Some("text/html"),
            b"<html>Service Unavailable</html>"
        ));
        let retried = Outcome::Modified {
            delivery_failed: true,
            undeliverable_here: false,
            delay: None,
        };
        assert_eq!(outcome(true, retried.clone()), Outcome::Rejected);
        assert_eq!(outcome(false, retried.clone()), retried);
    }
}
