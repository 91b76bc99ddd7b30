//! The valid-input table: every optional field of the three blocks, both SOAP versions, and the
//! tolerated quirks of real peers (D12), each read into the exact values.

use chrono::{TimeZone, Utc};
use wsr_gateway::wsr::datetime::XsDuration;
use wsr_gateway::wsr::{
    Envelope, FaultCode, GroupLimit, Quirk, Reply, ReplyPattern, ReplyTo, SoapVersion,
    read_envelope, read_message,
};

use super::support::{WSRM, limits, request11, soap11, soap12};

const EXP: &str = "<r:ExpiryTime>2030-01-01T00:00:00Z</r:ExpiryTime>";
const RESP: &str = "<r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>";

fn read(input: &str) -> Envelope<'_> {
    read_envelope(input.as_bytes(), &limits()).unwrap_or_else(|d| panic!("{d}\n{input}"))
}

fn seq_request(attrs: &str, tail: &str) -> String {
    soap11(
        &request11(&format!(
            r#"<r:MessageId groupId="mid:g@test"><r:SequenceNum {attrs}/></r:MessageId>{EXP}{RESP}{tail}"#
        )),
        "",
    )
}

#[test]
fn singleton_with_every_marker() {
    let input = soap11(
        &request11(&format!(
            r#"<r:MessageId groupId="mid:g@test"/>{EXP}{RESP}<r:AckRequested/><r:DuplicateElimination/>"#
        )),
        r#"<p:Order xmlns:p="urn:p"><p:Line n="1"/></p:Order>"#,
    );
    let env = read(&input);
    assert_eq!(env.version, SoapVersion::Soap11);
    let r = env.request.expect("Request");
    assert_eq!(r.message_id.group_id.as_str(), "mid:g@test");
    assert_eq!(r.message_id.sequence, None);
    assert_eq!(
        r.expiry_time,
        Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
            .single()
            .expect("date")
    );
    assert_eq!(r.reply_pattern, ReplyPattern::Response);
    assert!(r.ack_requested && r.duplicate_elimination && !r.message_order);
    assert_eq!(
        env.body.content,
        r#"<p:Order xmlns:p="urn:p"><p:Line n="1"/></p:Order>"#
    );
    let root = env.body.root.expect("body root");
    assert_eq!(
        (root.namespace.as_deref(), root.local_name.as_str()),
        (Some("urn:p"), "Order")
    );
    assert!(env.quirks.is_empty());
}

#[test]
fn sequence_num_optional_attributes() {
    let input = seq_request(r#"number="0018446744073709551615" last="1""#, "");
    let env = read(&input);
    let s = env
        .request
        .expect("Request")
        .message_id
        .sequence
        .expect("SequenceNum");
    assert_eq!((s.number, s.last, s.group_limit), (u64::MAX, true, None));

    let input = seq_request(
        r#"number=" +3 " last="false" groupExpiryTime="2030-01-02T01:00:00+01:00""#,
        "",
    );
    let env = read(&input);
    let s = env
        .request
        .expect("Request")
        .message_id
        .sequence
        .expect("SequenceNum");
    assert_eq!(s.number, 3);
    assert!(!s.last);
    assert_eq!(
        s.group_limit,
        Some(GroupLimit::ExpiryTime(
            Utc.with_ymd_and_hms(2030, 1, 2, 0, 0, 0)
                .single()
                .expect("date")
        ))
    );

    let input = seq_request(
        r#"number="2" groupMaxIdleDuration="P1Y2M3DT4H5M6.5S""#,
        "<r:AckRequested/><r:DuplicateElimination/><r:MessageOrder/>",
    );
    let env = read(&input);
    let r = env.request.expect("Request");
    assert!(r.message_order);
    let expected = XsDuration::parse("P1Y2M3DT4H5M6.5S").expect("duration");
    assert_eq!(
        r.message_id.sequence.expect("SequenceNum").group_limit,
        Some(GroupLimit::MaxIdleDuration(expected))
    );
}

#[test]
fn reply_patterns_callback_poll_and_an_ignored_reply_to() {
    let cb = soap11(
        &request11(&format!(
            r#"<r:MessageId groupId="g"/>{EXP}<r:ReplyPattern><r:Value> Callback </r:Value><r:ReplyTo reference-scheme="urn:scheme"><r:BareURI> https://partner.example/acks?x=1&amp;y=2 </r:BareURI></r:ReplyTo></r:ReplyPattern>"#
        )),
        "",
    );
    assert_eq!(
        read(&cb).request.expect("Request").reply_pattern,
        ReplyPattern::Callback(ReplyTo {
            uri: "https://partner.example/acks?x=1&y=2".into(),
            reference_scheme: Some("urn:scheme".into()),
        })
    );
    let poll = soap11(
        &request11(&format!(
            r#"<r:MessageId groupId="g"/>{EXP}<r:ReplyPattern><r:Value>Poll</r:Value></r:ReplyPattern>"#
        )),
        "",
    );
    assert_eq!(
        read(&poll).request.expect("Request").reply_pattern,
        ReplyPattern::Poll
    );
    let response_with_reply_to = soap11(
        &request11(&format!(
            r#"<r:MessageId groupId="g"/>{EXP}<r:ReplyPattern><r:Value>Response</r:Value><r:ReplyTo><r:BareURI>http://x/</r:BareURI></r:ReplyTo></r:ReplyPattern>"#
        )),
        "",
    );
    let env = read(&response_with_reply_to);
    assert_eq!(
        env.request.expect("Request").reply_pattern,
        ReplyPattern::Response
    );
    assert_eq!(env.quirks, vec![Quirk::IgnoredReplyTo]);
}

#[test]
fn response_mixes_acks_and_faults_with_any_prefix() {
    let input = soap11(
        &format!(
            r#"<r:Response S:mustUnderstand="1" xmlns:q="{WSRM}">
                 <r:SequenceReplies groupId="mid:a"><r:ReplyRange from="0" to="3"/><r:ReplyRange from="5" to="5" fault="q:GroupAborted"/></r:SequenceReplies>
                 <r:NonSequenceReply groupId="mid:b"/>
                 <r:NonSequenceReply groupId="mid:c" fault="r:InvalidExpiryTime"/>
               </r:Response>"#
        ),
        "",
    );
    let replies = read(&input).response.expect("Response").replies;
    assert_eq!(replies.len(), 3);
    match &replies[0] {
        Reply::Sequence { group_id, ranges } => {
            assert_eq!(group_id.as_str(), "mid:a");
            assert_eq!(
                (
                    ranges[0].range.from(),
                    ranges[0].range.to(),
                    ranges[0].fault
                ),
                (0, 3, None)
            );
            assert_eq!(
                (ranges[1].range.from(), ranges[1].fault),
                (5, Some(FaultCode::GroupAborted))
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        &replies[1],
        Reply::NonSequence { fault: None, .. }
    ));
    assert!(matches!(
        &replies[2],
        Reply::NonSequence {
            fault: Some(FaultCode::InvalidExpiryTime),
            ..
        }
    ));
}

#[test]
fn poll_request_ranges_reply_to_and_holodeck_order() {
    let input = soap11(
        r#"<r:PollRequest S:mustUnderstand="1"><r:RefToMessageIds groupId="g1"><r:SequenceNumRange from="0" to="9"/><r:SequenceNumRange from="12" to="12"/></r:RefToMessageIds><r:RefToMessageIds groupId="g2"/><r:ReplyTo><r:BareURI>http://me/acks</r:BareURI></r:ReplyTo></r:PollRequest>"#,
        "",
    );
    let env = read(&input);
    let p = env.poll_request.expect("PollRequest");
    assert_eq!(p.refs.len(), 2);
    assert_eq!(
        p.refs[0]
            .ranges
            .iter()
            .map(|r| (r.from(), r.to()))
            .collect::<Vec<_>>(),
        vec![(0, 9), (12, 12)]
    );
    assert!(p.refs[1].ranges.is_empty());
    assert_eq!(p.reply_to, Some(ReplyTo::bare("http://me/acks")));
    assert!(env.quirks.is_empty());

    // Holodeck writes ReplyTo first (schema-invalid); accepted and noted.
    let holodeck = soap11(
        r#"<r:PollRequest S:mustUnderstand="1"><r:ReplyTo><r:BareURI>http://me/acks</r:BareURI></r:ReplyTo><r:RefToMessageIds groupId="g1"/></r:PollRequest>"#,
        "",
    );
    let env = read(&holodeck);
    assert_eq!(
        env.poll_request.expect("PollRequest").reply_to,
        Some(ReplyTo::bare("http://me/acks"))
    );
    assert_eq!(env.quirks, vec![Quirk::PollReplyToFirst]);
}

#[test]
fn tolerated_quirks_and_extensions() {
    // Foreign extensions anywhere inside the blocks, WS-Addressing headers beside them,
    // mustUnderstand="true" in SOAP 1.1, a zone-less ExpiryTime, comments and a CDATA value.
    let input = format!(
        r#"<S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:x="urn:ext">
  <S:Header>
    <wsa:To xmlns:wsa="http://www.w3.org/2005/08/addressing">http://gw/wsr/default</wsa:To>
    <wsrm:Request xmlns:wsrm="{WSRM}" S:mustUnderstand="true" x:signed="yes">
      <x:before/>
      <wsrm:MessageId groupId="mid://123@vm" x:id="1"><x:inside/><wsrm:SequenceNum number="4"/></wsrm:MessageId>
      <!-- a comment -->
      <wsrm:ExpiryTime><![CDATA[2026-12-28T19:44:33]]></wsrm:ExpiryTime>
      <x:between><x:nested>deep</x:nested></x:between>
      <wsrm:ReplyPattern><wsrm:Value>Response</wsrm:Value><x:after-value/></wsrm:ReplyPattern>
      <wsrm:AckRequested/>
      <x:last/>
    </wsrm:Request>
    <wsrm:Response xmlns:wsrm="{WSRM}" S:mustUnderstand="1"/>
  </S:Header>
  <S:Body/>
</S:Envelope>"#
    );
    let env = read(&input);
    let r = env.request.expect("Request");
    assert_eq!(r.message_id.group_id.as_str(), "mid://123@vm");
    assert_eq!(r.key().number, Some(4));
    assert_eq!(
        r.expiry_time,
        Utc.with_ymd_and_hms(2026, 12, 28, 19, 44, 33)
            .single()
            .expect("date")
    );
    assert!(r.ack_requested && !r.duplicate_elimination);
    assert_eq!(
        env.response.expect("empty Response tolerated").replies,
        vec![]
    );
    assert!(env.quirks.contains(&Quirk::ZonelessDateTime));
    assert!(env.quirks.contains(&Quirk::EmptyResponse));
    assert_eq!(env.body.content, "");
}

#[test]
fn default_namespace_and_soap12_must_understand_forms() {
    for mu in ["true", "1", "false", "0"] {
        let input = soap12(
            &format!(
                r#"<Request xmlns="{WSRM}" e:mustUnderstand="{mu}"><MessageId groupId="g"/><ExpiryTime>2030-01-01T00:00:00.5Z</ExpiryTime><ReplyPattern><Value>Response</Value></ReplyPattern></Request>"#
            ),
            "<payload xmlns=\"urn:p\">x</payload>",
        );
        let env = read(&input);
        assert_eq!(env.version, SoapVersion::Soap12);
        let r = env.request.expect("Request");
        assert_eq!(r.expiry_time.timestamp_subsec_millis(), 500);
        assert_eq!(
            env.body.root.expect("root").namespace.as_deref(),
            Some("urn:p")
        );
    }
}

#[test]
fn body_is_the_exact_input_slice() {
    let body = "\n  <p:Doc xmlns:p=\"urn:p\">a &amp; b<![CDATA[<raw>]]><!-- c --></p:Doc>\n";
    let input = soap11("", body);
    let env = read(&input);
    assert_eq!(env.body.content, body);
    let in_scope: Vec<(Option<&str>, &str)> = env
        .body
        .namespaces
        .iter()
        .map(|d| (d.prefix, d.uri.as_ref()))
        .collect();
    assert_eq!(
        in_scope,
        vec![
            (Some("S"), "http://schemas.xmlsoap.org/soap/envelope/"),
            (Some("r"), WSRM)
        ],
        "what the content may rely on without declaring it"
    );
    assert!(std::ptr::eq(
        env.body.content.as_ptr(),
        input[input.find(body).expect("in input")..].as_ptr()
    ));
    assert!(env.request.is_none() && env.response.is_none() && env.poll_request.is_none());
}

#[test]
fn mime_multipart_related_root_part() {
    let envelope = soap11(
        &request11(&format!(r#"<r:MessageId groupId="g"/>{EXP}{RESP}"#)),
        "<x/>",
    );
    let body = format!(
        "--MIMEBoundary_1\r\nContent-Type: text/xml; charset=UTF-8\r\nContent-Transfer-Encoding: 8bit\r\nContent-ID: <0.root@apache.org>\r\n\r\n{envelope}\r\n--MIMEBoundary_1\r\nContent-Type: application/octet-stream\r\nContent-ID: <att1>\r\n\r\nBINARY\r\n--MIMEBoundary_1--"
    );
    let ct = r#"multipart/related; boundary=MIMEBoundary_1; type="text/xml"; start="<0.root@apache.org>""#;
    let env = read_message(Some(ct), body.as_bytes(), &limits()).expect("multipart");
    assert_eq!(
        env.request.expect("Request").message_id.group_id.as_str(),
        "g"
    );
    assert_eq!(env.body.content, "<x/>");
    assert_eq!(
        env.attachments, 1,
        "attachments are counted, never silently dropped"
    );
}

#[test]
fn foreign_headers_that_must_be_understood_are_reported_not_skipped() {
    let headers = r#"<wsse:Security xmlns:wsse="urn:sec" S:mustUnderstand="1"/>
        <a:To xmlns:a="urn:addr">x</a:To>
        <o:Other xmlns:o="urn:o" S:mustUnderstand="1" S:actor="urn:someone-else"/>
        <n:Next xmlns:n="urn:n" S:mustUnderstand="true" S:actor="http://schemas.xmlsoap.org/soap/actor/next"/>"#;
    let input = soap11(headers, "");
    let env = read_envelope(input.as_bytes(), &limits()).expect("reads");
    assert_eq!(
        env.not_understood,
        vec!["wsse:Security".to_owned(), "n:Next".to_owned()]
    );

    let headers12 = r#"<s:Sec xmlns:s="urn:sec" e:mustUnderstand="true" e:role="http://www.w3.org/2003/05/soap-envelope/role/none"/>
        <s:Sec2 xmlns:s="urn:sec" e:mustUnderstand="1" e:role="http://www.w3.org/2003/05/soap-envelope/role/ultimateReceiver"/>"#;
    let input = soap12(headers12, "");
    let env = read_envelope(input.as_bytes(), &limits()).expect("reads");
    assert_eq!(env.not_understood, vec!["s:Sec2".to_owned()]);
}

#[test]
fn a_block_aimed_at_another_soap_node_is_not_ours() {
    let block = format!(
        r#"<r:Request S:actor="urn:some-intermediary" S:mustUnderstand="1"><r:MessageId groupId="g"/>{EXP}{RESP}</r:Request>"#
    );
    let input = soap11(&block, "");
    let env = read(&input);
    assert!(env.request.is_none());
    assert!(
        env.not_understood.is_empty(),
        "not addressed to us, so not ours to understand"
    );
}

#[test]
fn the_ws_r_code_of_a_soap_fault_body_is_read_with_any_prefix() {
    use wsr_gateway::wsr::{FaultCode, SoapFault, write_soap_fault};
    for version in [SoapVersion::Soap11, SoapVersion::Soap12] {
        for code in FaultCode::ALL {
            let xml = write_soap_fault(
                version,
                &SoapFault {
                    code,
                    reason: "r".into(),
                },
                None,
            );
            assert_eq!(read(&xml).body.fault, Some(code), "{xml}");
        }
    }
    // Another peer's prefix, declared on the detail entry itself.
    let other = soap11(
        "",
        r#"<S:Fault><faultcode>S:Client</faultcode><faultstring>wsrm:InvalidRequest is not the code</faultstring><detail><q:Code xmlns:q="http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd">q:GroupAborted</q:Code></detail></S:Fault>"#,
    );
    assert_eq!(read(&other).body.fault, Some(FaultCode::GroupAborted));
    // A generic fault (Holodeck's Java exceptions) has none.
    let generic = soap11(
        "",
        "<S:Fault><faultcode>S:Server</faultcode><faultstring>NullPointerException</faultstring></S:Fault>",
    );
    assert_eq!(read(&generic).body.fault, None);
}
