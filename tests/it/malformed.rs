//! The malformed-input table: each input with the exact WS-R fault code and whether only a
//! synchronous SOAP Fault can carry it (D4) or the message's own reply pattern can.

use wsr_gateway::wsr::{FaultCode, FaultRoute, Limits, ReplyPattern, read_envelope, read_message};

use super::support::{WSRM, limits, request11, soap11, soap12};
use FaultCode::*;

const MID: &str = r#"<r:MessageId groupId="mid:g1@test"/>"#;
const EXP: &str = "<r:ExpiryTime>2030-01-01T00:00:00Z</r:ExpiryTime>";
const RESP: &str = "<r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>";
const GD_DE: &str = "<r:AckRequested/><r:DuplicateElimination/>";

fn mid_seq(attrs: &str) -> String {
    format!(r#"<r:MessageId groupId="mid:g1@test"><r:SequenceNum {attrs}/></r:MessageId>"#)
}

fn callback(reply_to_children: &str) -> String {
    format!(
        "<r:ReplyPattern><r:Value>Callback</r:Value><r:ReplyTo>{reply_to_children}</r:ReplyTo></r:ReplyPattern>"
    )
}

/// A SOAP 1.1 message whose only header is a Request with these children.
fn req(children: &str) -> String {
    soap11(&request11(children), "<p:Order xmlns:p=\"urn:p\"/>")
}

fn poll(children: &str) -> String {
    soap11(
        &format!("<r:PollRequest S:mustUnderstand=\"1\">{children}</r:PollRequest>"),
        "",
    )
}

fn response(children: &str) -> String {
    soap11(
        &format!("<r:Response S:mustUnderstand=\"1\">{children}</r:Response>"),
        "",
    )
}

/// (name, input, code, synchronous only)
fn table() -> Vec<(&'static str, String, FaultCode, bool)> {
    let singleton = format!("{MID}{EXP}{RESP}{GD_DE}");
    let deep = format!("{}{}", "<a>".repeat(100), "</a>".repeat(100));
    let many_attrs: String = (0..100).map(|i| format!(" a{i}=\"x\"")).collect();
    let long_value = "v".repeat(20_000);
    let long_name = "n".repeat(600);
    vec![
        // The envelope itself: never attributable, always a SOAP Fault.
        ("not XML", "hello, partner".into(), InvalidRequest, true),
        ("empty", String::new(), InvalidRequest, true),
        ("non-UTF-8 encoding declared", format!(r#"<?xml version="1.0" encoding="ISO-8859-1"?>{}"#, req(&singleton).split_once("?>").expect("decl").1), InvalidRequest, true),
        ("DOCTYPE with entity declarations", format!(r#"<!DOCTYPE S:Envelope [<!ENTITY lol "lol">]>{}"#, soap11("", "&lol;")), InvalidRequest, true),
        ("undeclared entity in the body", soap11("", "<p:x xmlns:p=\"urn:p\">&lol;</p:x>"), InvalidRequest, true),
        ("root is not an Envelope", request11(&singleton).replace("S:mustUnderstand=\"1\"", &format!("xmlns:r=\"{WSRM}\"")), InvalidRequest, true),
        ("unknown envelope namespace", r#"<E:Envelope xmlns:E="urn:not-soap"><E:Body/></E:Envelope>"#.into(), InvalidRequest, true),
        ("Envelope without Body", r#"<S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/"><S:Header/></S:Envelope>"#.into(), InvalidRequest, true),
        ("two Bodies", soap11("", "").replace("</S:Body>", "</S:Body><S:Body/>"), InvalidRequest, true),
        ("Header after Body", soap11("", "").replace("</S:Body>", "</S:Body><S:Header/>"), InvalidRequest, true),
        ("truncated document", req(&singleton).replace("</S:Envelope>", ""), InvalidRequest, true),
        ("mismatched end tag", req(&singleton).replace("</S:Body>", "</S:Bodi>"), InvalidRequest, true),
        ("unbound prefix in the body", soap11("", "<x:order/>"), InvalidRequest, true),
        ("nesting deeper than the limit", soap11("", &deep), InvalidRequest, true),
        ("more attributes than the limit", soap11("", &format!("<p{many_attrs}/>")), InvalidRequest, true),
        ("attribute value over the limit", soap11("", &format!("<p a=\"{long_value}\"/>")), InvalidRequest, true),
        ("element name over the limit", soap11("", &format!("<{long_name}/>")), InvalidRequest, true),
        ("duplicate attribute", soap11("", "<p a=\"1\" a=\"2\"/>"), InvalidRequest, true),
        ("content after the Envelope", format!("{}<junk/>", req(&singleton)), InvalidRequest, true),
        ("prefix undeclared (not allowed in XML 1.0)", soap11("", "<p:x xmlns:p=\"urn:p\"><p:y xmlns:p=\"\"/></p:x>"), InvalidRequest, true),
        ("xml prefix rebound", soap11("", "<x xmlns:xml=\"urn:other\"/>"), InvalidRequest, true),
        ("prefix declared on a sibling is out of scope", response(&format!(r#"<r:NonSequenceReply xmlns:z="{WSRM}" groupId="a" fault="z:GroupAborted"/><r:NonSequenceReply groupId="b" fault="z:GroupAborted"/>"#)), InvalidRequest, true),
        ("a Request defect does not hide an ill-formed rest", req(&format!("{MID}<r:ExpiryTime>never</r:ExpiryTime>{RESP}")).replace("</S:Envelope>", "<junk>"), InvalidRequest, true),
        ("a Request defect does not hide a depth bomb in the body", soap11(&request11(&format!("{MID}{RESP}")), &deep), InvalidRequest, true),
        ("character reference to a control character", req(&format!("<r:MessageId groupId=\"a&#1;b\"/>{EXP}{RESP}")), InvalidRequest, true),
        ("character reference to a non-character", req(&format!("<r:MessageId groupId=\"a&#xFFFE;b\"/>{EXP}{RESP}")), InvalidRequest, true),
        ("raw control character", soap11("", "<p:x xmlns:p=\"urn:p\">\u{1}</p:x>"), InvalidRequest, true),
        ("'<' in an attribute value", soap11("", "<p:x xmlns:p=\"urn:p\" a=\"<\"/>"), InvalidRequest, true),
        ("']]>' in text", soap11("", "<p:x xmlns:p=\"urn:p\">a ]]> b</p:x>"), InvalidRequest, true),
        ("'--' inside a comment", soap11("", "<!-- a -- b --><p:x xmlns:p=\"urn:p\"/>"), InvalidRequest, true),
        ("XML declaration inside the body", soap11("", "<?xml version=\"1.0\"?><p:x xmlns:p=\"urn:p\"/>"), InvalidRequest, true),
        ("port beyond what validators accept", req(&format!("<r:MessageId groupId=\"http://h:2147483648/\"/>{EXP}{RESP}")), InvalidMessageId, true),
        ("number with a non-XML space", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"\u{2003}5\""))), InvalidMessageId, true),
        ("Value with a non-XML space", req(&format!("{MID}{EXP}<r:ReplyPattern><r:Value>\u{A0}Response</r:Value></r:ReplyPattern>")), InvalidReplyPattern, true),
        ("two Request blocks", soap11(&format!("{0}{0}", request11(&singleton)), ""), InvalidRequest, true),
        ("unknown WS-R header block", soap11("<r:Acknowledgement/>", ""), InvalidRequest, true),
        // Request: identity or reply pattern cannot be recovered — SOAP Fault.
        ("no MessageId", req(&format!("{EXP}{RESP}")), InvalidRequest, true),
        ("MessageId without groupId", req(&format!("<r:MessageId/>{EXP}{RESP}")), InvalidMessageId, true),
        ("empty groupId", req(&format!("<r:MessageId groupId=\"  \"/>{EXP}{RESP}")), InvalidMessageId, true),
        ("groupId not an anyURI", req(&format!("<r:MessageId groupId=\"mid:50%off\"/>{EXP}{RESP}")), InvalidMessageId, true),
        ("non-numeric number", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"abc\""))), InvalidMessageId, true),
        ("negative number", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"-1\""))), InvalidMessageId, true),
        ("number above 2^64-1", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"18446744073709551616\""))), InvalidMessageId, true),
        ("SequenceNum without number", req(&format!("{}{EXP}{RESP}", mid_seq("last=\"true\""))), InvalidMessageId, true),
        ("no ReplyPattern", req(&format!("{MID}{EXP}{GD_DE}")), InvalidRequest, true),
        ("Value in lower case", req(&format!("{MID}{EXP}<r:ReplyPattern><r:Value>callback</r:Value><r:ReplyTo><r:BareURI>http://x/</r:BareURI></r:ReplyTo></r:ReplyPattern>")), InvalidReplyPattern, true),
        ("unknown Value", req(&format!("{MID}{EXP}<r:ReplyPattern><r:Value>Fax</r:Value></r:ReplyPattern>")), InvalidReplyPattern, true),
        ("ReplyPattern without Value", req(&format!("{MID}{EXP}<r:ReplyPattern/>")), InvalidReplyPattern, true),
        ("Callback without ReplyTo", req(&format!("{MID}{EXP}<r:ReplyPattern><r:Value>Callback</r:Value></r:ReplyPattern>")), InvalidReplyPattern, true),
        ("Callback ReplyTo with two children", req(&format!("{MID}{EXP}{}", callback("<r:BareURI>http://a/</r:BareURI><r:BareURI>http://b/</r:BareURI>"))), InvalidReplyPattern, true),
        ("Callback ReplyTo in another scheme", req(&format!("{MID}{EXP}{}", callback("<wsa:EndpointReference xmlns:wsa=\"http://www.w3.org/2005/08/addressing\"><wsa:Address>http://a/</wsa:Address></wsa:EndpointReference>"))), FeatureNotSupported, true),
        ("Callback with an empty BareURI", req(&format!("{MID}{EXP}{}", callback("<r:BareURI> </r:BareURI>"))), InvalidReplyPattern, true),
        // Request: identified, reply pattern usable — the fault travels by the reply pattern.
        ("no ExpiryTime", req(&format!("{MID}{RESP}{GD_DE}")), InvalidRequest, false),
        ("ExpiryTime not a dateTime", req(&format!("{MID}<r:ExpiryTime>tomorrow</r:ExpiryTime>{RESP}")), InvalidExpiryTime, false),
        ("ExpiryTime on no such date", req(&format!("{MID}<r:ExpiryTime>2030-02-30T00:00:00Z</r:ExpiryTime>{RESP}")), InvalidExpiryTime, false),
        ("children out of order", req(&format!("{EXP}{MID}{RESP}")), InvalidRequest, false),
        ("AckRequested twice", req(&format!("{MID}{EXP}{RESP}<r:AckRequested/><r:AckRequested/>")), InvalidRequest, false),
        ("unknown WS-R child", req(&format!("{MID}{EXP}{RESP}<r:Priority/>")), InvalidRequest, false),
        ("unqualified child", req(&format!("{MID}{EXP}{RESP}<Priority/>")), InvalidRequest, false),
        ("text inside Request", req(&format!("{MID}{EXP}{RESP}stray")), InvalidRequest, false),
        ("mustUnderstand not a boolean", soap11(&format!("<r:Request S:mustUnderstand=\"maybe\">{singleton}</r:Request>"), ""), InvalidRequest, false),
        ("foreign element in a marker's place is fine, a WS-R child in a marker is not", req(&format!("{MID}{EXP}{RESP}<r:AckRequested><r:Value/></r:AckRequested>")), InvalidRequest, false),
        ("unknown attribute on SequenceNum", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" status=\"start\""))), InvalidMessageId, false),
        ("both group limits", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" groupExpiryTime=\"2030-01-02T00:00:00Z\" groupMaxIdleDuration=\"PT5M\""))), InvalidMessageParameters, false),
        ("negative idle duration", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" groupMaxIdleDuration=\"-PT5M\""))), InvalidMessageParameters, false),
        ("idle duration not a duration", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" groupMaxIdleDuration=\"PT\""))), InvalidMessageParameters, false),
        ("groupExpiryTime not a dateTime", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" groupExpiryTime=\"soon\""))), InvalidMessageParameters, false),
        ("last not a boolean", req(&format!("{}{EXP}{RESP}", mid_seq("number=\"0\" last=\"yes\""))), InvalidMessageParameters, false),
        ("MessageOrder without SequenceNum", req(&format!("{MID}{EXP}{RESP}{GD_DE}<r:MessageOrder/>")), InvalidMessageParameters, false),
        ("MessageOrder without AckRequested", req(&format!("{}{EXP}{RESP}<r:DuplicateElimination/><r:MessageOrder/>", mid_seq("number=\"0\""))), InvalidMessageParameters, false),
        ("MessageOrder without DuplicateElimination", req(&format!("{}{EXP}{RESP}<r:AckRequested/><r:MessageOrder/>", mid_seq("number=\"0\""))), InvalidMessageParameters, false),
        ("Response pattern with a malformed ReplyTo", req(&format!("{MID}{EXP}<r:ReplyPattern><r:Value>Response</r:Value><r:ReplyTo/></r:ReplyPattern>")), InvalidReplyPattern, false),
        // PollRequest: no reply route of its own — SOAP Fault.
        ("PollRequest without RefToMessageIds", poll(""), InvalidPollRequest, true),
        ("poll range from > to", poll(r#"<r:RefToMessageIds groupId="g"><r:SequenceNumRange from="5" to="1"/></r:RefToMessageIds>"#), InvalidPollRequest, true),
        ("poll range without to", poll(r#"<r:RefToMessageIds groupId="g"><r:SequenceNumRange from="5"/></r:RefToMessageIds>"#), InvalidPollRequest, true),
        ("poll range not numeric", poll(r#"<r:RefToMessageIds groupId="g"><r:SequenceNumRange from="a" to="2"/></r:RefToMessageIds>"#), InvalidPollRequest, true),
        ("RefToMessageIds without groupId", poll("<r:RefToMessageIds/>"), InvalidPollRequest, true),
        ("unknown WS-R child in PollRequest", poll(r#"<r:RefToMessageIds groupId="g"/><r:MessageId groupId="g"/>"#), InvalidPollRequest, true),
        ("two ReplyTo in PollRequest", poll(r#"<r:RefToMessageIds groupId="g"/><r:ReplyTo><r:BareURI>http://a/</r:BareURI></r:ReplyTo><r:ReplyTo><r:BareURI>http://a/</r:BareURI></r:ReplyTo>"#), InvalidPollRequest, true),
        ("PollRequest ReplyTo in another scheme", poll(r#"<r:RefToMessageIds groupId="g"/><r:ReplyTo><x:Ref xmlns:x="urn:x"/></r:ReplyTo>"#), FeatureNotSupported, true),
        // Response (acks we receive): refused as a whole.
        ("fault QName outside the ten", response(r#"<r:NonSequenceReply groupId="g" fault="r:MessageStoreOverflow"/>"#), InvalidRequest, true),
        ("fault QName with an unbound prefix", response(r#"<r:NonSequenceReply groupId="g" fault="zz:GroupAborted"/>"#), InvalidRequest, true),
        ("fault QName in another namespace", response(r#"<r:NonSequenceReply groupId="g" fault="S:Client"/>"#), InvalidRequest, true),
        ("fault compared as text, not resolved", response(r#"<r:NonSequenceReply xmlns:wsrm="urn:other" groupId="g" fault="wsrm:GroupAborted"/>"#), InvalidRequest, true),
        ("ReplyRange from > to", response(r#"<r:SequenceReplies groupId="g"><r:ReplyRange from="3" to="2"/></r:SequenceReplies>"#), InvalidRequest, true),
        ("SequenceReplies without ReplyRange", response(r#"<r:SequenceReplies groupId="g"/>"#), InvalidRequest, true),
        ("NonSequenceReply without groupId", response("<r:NonSequenceReply/>"), InvalidRequest, true),
        // SOAP 1.2 where the version matters.
        ("SOAP 1.2 Callback without ReplyTo", soap12(&format!("<r:Request e:mustUnderstand=\"true\">{MID}{EXP}<r:ReplyPattern><r:Value>Callback</r:Value></r:ReplyPattern></r:Request>"), ""), InvalidReplyPattern, true),
        ("SOAP 1.2 mustUnderstand not a boolean", soap12(&format!("<r:Request e:mustUnderstand=\"yes\">{singleton}</r:Request>"), ""), InvalidRequest, false),
        ("SOAP 1.2 missing ExpiryTime", soap12(&format!("<r:Request e:mustUnderstand=\"1\">{MID}{RESP}</r:Request>"), ""), InvalidRequest, false),
    ]
}

#[test]
fn each_malformed_input_gets_its_exact_fault_and_route() {
    let table = table();
    assert!(table.len() >= 40, "the table must keep at least 40 cases");
    let mut failures = Vec::new();
    for (name, input, code, synchronous) in &table {
        match read_envelope(input.as_bytes(), &limits()) {
            Ok(env) => failures.push(format!("{name}: accepted as {env:?}")),
            Err(defect) => {
                if defect.code != *code || defect.is_synchronous() != *synchronous {
                    failures.push(format!(
                        "{name}: got {} ({}), want {code} ({}) — {}",
                        defect.code,
                        if defect.is_synchronous() {
                            "SOAP Fault"
                        } else {
                            "reply pattern"
                        },
                        if *synchronous {
                            "SOAP Fault"
                        } else {
                            "reply pattern"
                        },
                        defect.reason
                    ));
                }
                assert!(
                    !defect.reason.is_empty(),
                    "{name}: a defect explains itself"
                );
                assert!(defect.reason.len() < 400, "{name}: reasons stay bounded");
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        table.len(),
        failures.join("\n")
    );
}

#[test]
fn reply_channel_defects_name_the_message_and_its_pattern() {
    let input = req(&format!("{}{RESP}", mid_seq("number=\"7\"")));
    let defect = read_envelope(input.as_bytes(), &limits()).expect_err("no ExpiryTime");
    match defect.route {
        FaultRoute::ReplyPattern { key, reply } => {
            assert_eq!(key.group_id.as_str(), "mid:g1@test");
            assert_eq!(key.number, Some(7));
            assert_eq!(reply, ReplyPattern::Response);
        }
        FaultRoute::SoapFault => panic!("identified message routed to a SOAP Fault"),
    }
    let cb = req(&format!(
        "{MID}<r:ExpiryTime>never</r:ExpiryTime>{}",
        callback("<r:BareURI>http://127.0.0.1:9/cb</r:BareURI>")
    ));
    let defect = read_envelope(cb.as_bytes(), &limits()).expect_err("bad ExpiryTime");
    assert!(
        matches!(defect.route, FaultRoute::ReplyPattern { reply: ReplyPattern::Callback(ref to), .. } if to.uri == "http://127.0.0.1:9/cb")
    );
}

#[test]
fn raw_bytes_that_are_not_utf8_or_too_large_are_refused() {
    let defect = read_envelope(&[0x3c, 0xff, 0xfe, 0x3e], &limits()).expect_err("not UTF-8");
    assert_eq!(
        (defect.code, defect.is_synchronous()),
        (InvalidRequest, true)
    );

    let small = Limits {
        max_bytes: 64,
        ..Limits::default()
    };
    let big = soap11("", &"<p/>".repeat(100));
    let defect = read_message(Some("text/xml"), big.as_bytes(), &small).expect_err("too large");
    assert_eq!(
        (defect.code, defect.is_synchronous()),
        (InvalidRequest, true)
    );
    assert!(defect.reason.contains("exceeds"), "{}", defect.reason);
}

#[test]
fn hostile_nesting_is_refused_early_not_after_reading_it_all() {
    // A million levels would cost memory if held; the depth limit stops at the 65th.
    let bomb = soap11("", &"<a>".repeat(1_000_000));
    let defect = read_envelope(bomb.as_bytes(), &limits()).expect_err("depth bomb");
    assert_eq!(defect.code, InvalidRequest);
    assert!(defect.reason.contains("deeper"), "{}", defect.reason);
}
