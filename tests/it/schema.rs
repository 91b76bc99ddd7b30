//! Our XSD (`schemas/`) against xmllint: the digest's §7 examples and everything our writer
//! emits validate; the schema-invalid cases of digest §2.7 are rejected.

use wsr_gateway::wsr::{
    FaultCode, GroupId, Headers, Reply, Response, SoapFault, SoapVersion, read_envelope,
    write_envelope, write_soap_fault,
};

use super::support::{WSRM, assert_schema_valid, limits, request11, schema_failures, soap11};

const S11: &str = "http://schemas.xmlsoap.org/soap/envelope/";

fn digest_7_1() -> String {
    format!(
        r#"<S11:Envelope xmlns:S11="{S11}" xmlns:r="{WSRM}">
  <S11:Header>
    <r:Request S11:mustUnderstand="1">
      <r:MessageId groupId="mid:5f2c9a@gw-a.example.org">
        <r:SequenceNum number="2" groupExpiryTime="2025-03-02T00:00:00Z"/>
      </r:MessageId>
      <r:ExpiryTime>2025-03-01T12:00:00Z</r:ExpiryTime>
      <r:ReplyPattern>
        <r:Value>Callback</r:Value>
        <r:ReplyTo><r:BareURI>https://gw-a.example.org/wsr/replies</r:BareURI></r:ReplyTo>
      </r:ReplyPattern>
      <r:AckRequested/>
      <r:DuplicateElimination/>
      <r:MessageOrder/>
    </r:Request>
  </S11:Header>
  <S11:Body><!-- application payload --></S11:Body>
</S11:Envelope>"#
    )
}

fn in_envelope(block: &str) -> String {
    format!(
        r#"<S11:Envelope xmlns:S11="{S11}" xmlns:r="{WSRM}"><S11:Header>{block}</S11:Header><S11:Body/></S11:Envelope>"#
    )
}

fn digest_examples() -> Vec<String> {
    vec![
        digest_7_1(),
        in_envelope(
            r#"<r:Response S11:mustUnderstand="1"><r:SequenceReplies groupId="mid:5f2c9a@gw-a.example.org"><r:ReplyRange from="0" to="2"/></r:SequenceReplies><r:NonSequenceReply groupId="mid:77e1@gw-a.example.org"/></r:Response>"#,
        ),
        in_envelope(
            r#"<r:Response S11:mustUnderstand="1"><r:SequenceReplies groupId="mid:5f2c9a@gw-a.example.org"><r:ReplyRange from="5" to="5" fault="r:GroupAborted"/></r:SequenceReplies><r:NonSequenceReply groupId="mid:9a01@gw-a.example.org" fault="r:InvalidReplyPattern"/></r:Response>"#,
        ),
        in_envelope(
            r#"<r:PollRequest S11:mustUnderstand="1"><r:RefToMessageIds groupId="mid:5f2c9a@gw-a.example.org"><r:SequenceNumRange from="0" to="9"/></r:RefToMessageIds><r:RefToMessageIds groupId="mid:77e1@gw-a.example.org"/></r:PollRequest>"#,
        ),
    ]
}

#[test]
fn digest_examples_validate_and_read() {
    let docs: Vec<_> = digest_examples()
        .into_iter()
        .map(|d| (SoapVersion::Soap11, d))
        .collect();
    assert_schema_valid(&docs);
    for (_, doc) in &docs {
        read_envelope(doc.as_bytes(), &limits()).unwrap_or_else(|d| panic!("{d}\n{doc}"));
    }
}

#[test]
fn schema_rejects_the_schema_invalid_cases_of_digest_2_7() {
    let request = |children: &str| soap11(&request11(children), "");
    let mid = r#"<r:MessageId groupId="g"/>"#;
    let exp = "<r:ExpiryTime>2030-01-01T00:00:00Z</r:ExpiryTime>";
    let resp = "<r:ReplyPattern><r:Value>Response</r:Value></r:ReplyPattern>";
    let cases = vec![
        (
            "empty Response",
            soap11(r#"<r:Response S:mustUnderstand="1"/>"#, ""),
        ),
        (
            "PollRequest with ReplyTo first",
            soap11(
                r#"<r:PollRequest S:mustUnderstand="1"><r:ReplyTo><r:BareURI>http://a/</r:BareURI></r:ReplyTo><r:RefToMessageIds groupId="g"/></r:PollRequest>"#,
                "",
            ),
        ),
        (
            "foreign element after MessageId",
            request(&format!(r#"{mid}<x:ext xmlns:x="urn:x"/>{exp}{resp}"#)),
        ),
        (
            "foreign attribute on MessageId",
            request(&format!(
                r#"<r:MessageId xmlns:x="urn:x" x:a="1" groupId="g"/>{exp}{resp}"#
            )),
        ),
        (
            "foreign attribute on SequenceNum",
            request(&format!(
                r#"<r:MessageId groupId="g"><r:SequenceNum xmlns:x="urn:x" x:a="1" number="0"/></r:MessageId>{exp}{resp}"#
            )),
        ),
        (
            "foreign attribute on a marker",
            request(&format!(
                r#"{mid}{exp}{resp}<r:AckRequested xmlns:x="urn:x" x:a="1"/>"#
            )),
        ),
        (
            "Value in lower case",
            request(&format!(
                "{mid}{exp}<r:ReplyPattern><r:Value>response</r:Value></r:ReplyPattern>"
            )),
        ),
        (
            "Value with spaces",
            request(&format!(
                "{mid}{exp}<r:ReplyPattern><r:Value> Response </r:Value></r:ReplyPattern>"
            )),
        ),
        (
            "fault QName outside the ten",
            soap11(
                r#"<r:Response S:mustUnderstand="1"><r:NonSequenceReply groupId="g" fault="r:MessageStoreOverflow"/></r:Response>"#,
                "",
            ),
        ),
        (
            "two children in ReplyTo",
            request(&format!(
                "{mid}{exp}<r:ReplyPattern><r:Value>Callback</r:Value><r:ReplyTo><r:BareURI>http://a/</r:BareURI><r:BareURI>http://b/</r:BareURI></r:ReplyTo></r:ReplyPattern>"
            )),
        ),
        (
            "number above 2^64-1",
            request(&format!(
                r#"<r:MessageId groupId="g"><r:SequenceNum number="18446744073709551616"/></r:MessageId>{exp}{resp}"#
            )),
        ),
    ];
    let docs: Vec<_> = cases
        .iter()
        .map(|(_, d)| (SoapVersion::Soap11, d.clone()))
        .collect();
    let failures = schema_failures(&docs);
    for (name, doc) in &cases {
        assert!(
            failures.iter().any(|(failed, _)| failed == doc),
            "the schema accepts '{name}':\n{doc}"
        );
    }
}

#[test]
fn soap_faults_for_every_code_validate_in_both_versions() {
    let mut docs = Vec::new();
    for version in [SoapVersion::Soap11, SoapVersion::Soap12] {
        for code in FaultCode::ALL {
            let fault = SoapFault {
                code,
                reason: format!("because <{code}> & \"why\" \u{1}\u{FFFE}"),
            };
            docs.push((version, write_soap_fault(version, &fault, None)));
            let header = Response {
                replies: vec![Reply::NonSequence {
                    group_id: GroupId::parse("mid:x").expect("group"),
                    fault: Some(code),
                }],
            };
            docs.push((version, write_soap_fault(version, &fault, Some(&header))));
        }
        // Nothing to report: the Response header is left out, never written empty.
        docs.push((
            version,
            write_envelope(
                version,
                Headers {
                    response: Some(&Response::default()),
                    ..Headers::default()
                },
                "",
            ),
        ));
    }
    assert_schema_valid(&docs);
}

#[test]
fn soap_fault_shape_and_http_status() {
    let fault = |code| SoapFault {
        code,
        reason: "r".into(),
    };
    let f11 = write_soap_fault(SoapVersion::Soap11, &fault(FaultCode::InvalidRequest), None);
    assert!(f11.contains("<faultcode>soap:Client</faultcode>"), "{f11}");
    assert!(
        f11.contains("<wsrm:FaultCode>wsrm:InvalidRequest</wsrm:FaultCode>"),
        "{f11}"
    );
    assert_eq!(
        fault(FaultCode::InvalidRequest).http_status(SoapVersion::Soap11),
        500
    );
    let f11 = write_soap_fault(SoapVersion::Soap11, &fault(FaultCode::GroupAborted), None);
    assert!(f11.contains("<faultcode>soap:Server</faultcode>"), "{f11}");

    let f12 = write_soap_fault(
        SoapVersion::Soap12,
        &fault(FaultCode::InvalidMessageId),
        None,
    );
    assert!(f12.contains("<env:Value>env:Sender</env:Value><env:Subcode><env:Value>wsrm:InvalidMessageId</env:Value>"), "{f12}");
    assert_eq!(
        fault(FaultCode::InvalidMessageId).http_status(SoapVersion::Soap12),
        400
    );
    let f12 = write_soap_fault(
        SoapVersion::Soap12,
        &fault(FaultCode::MessageProcessingFailure),
        None,
    );
    assert!(f12.contains("<env:Value>env:Receiver</env:Value>"), "{f12}");
    assert_eq!(
        fault(FaultCode::MessageProcessingFailure).http_status(SoapVersion::Soap12),
        500
    );

    // Our own faults read back: a SOAP Fault body with the header correlating it.
    let header = Response {
        replies: vec![Reply::NonSequence {
            group_id: GroupId::parse("mid:x").expect("group"),
            fault: Some(FaultCode::GroupAborted),
        }],
    };
    for version in [SoapVersion::Soap11, SoapVersion::Soap12] {
        let xml = write_soap_fault(version, &fault(FaultCode::GroupAborted), Some(&header));
        let env = read_envelope(xml.as_bytes(), &limits()).expect("our fault reads");
        assert_eq!(env.response.as_ref(), Some(&header));
        assert_eq!(
            env.body.root.as_ref().map(|r| r.local_name.as_str()),
            Some("Fault")
        );
    }
}

/// Every groupId the reader accepts can be echoed in a schema-valid acknowledgment: our anyURI
/// check agrees with the validator on a few hundred URI-like strings.
#[test]
fn accepted_group_ids_are_schema_valid_any_uris() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = "(mid:|mid://|http://|urn:|//|)[a-z0-9@:%/?#\\[\\]&=._-]{0,16}";
    let mut docs = Vec::new();
    let mut rejected = 0;
    for _ in 0..1000 {
        let candidate = strategy.new_tree(&mut runner).expect("generate").current();
        if let Ok(group_id) = GroupId::parse(&candidate) {
            let ack = Response {
                replies: vec![Reply::NonSequence {
                    group_id,
                    fault: None,
                }],
            };
            docs.push((
                SoapVersion::Soap11,
                write_envelope(
                    SoapVersion::Soap11,
                    Headers {
                        response: Some(&ack),
                        ..Headers::default()
                    },
                    "",
                ),
            ));
        } else {
            rejected += 1;
        }
    }
    assert!(
        docs.len() > 100 && rejected > 100,
        "accepted {} rejected {rejected}",
        docs.len()
    );
    assert_schema_valid(&docs);
}
