//! Criterion benchmarks of the wire codec on a typical reliable message: about 1 KiB, SOAP 1.1,
//! a sequenced Request (Response pattern, AckRequested + DuplicateElimination) and a business
//! body. Run: `cargo bench --bench codec`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wsr_gateway::wsr::{
    GroupId, Headers, Limits, Reply, ReplyRange, Response, SeqRange, SoapVersion, read_envelope,
    read_message, write_envelope,
};

fn typical_message() -> String {
    let lines: String = (0..8)
        .map(|i| {
            format!(
                r#"<po:Line no="{i}"><po:Sku>SKU-{i:05}</po:Sku><po:Qty>{}</po:Qty></po:Line>"#,
                i + 1
            )
        })
        .collect();
    let body = format!(
        r#"<po:PurchaseOrder xmlns:po="urn:example:po" id="PO-2026-000123"><po:Buyer>ACME GmbH</po:Buyer>{lines}</po:PurchaseOrder>"#
    );
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?><S:Envelope xmlns:S="http://schemas.xmlsoap.org/soap/envelope/" xmlns:wsrm="http://docs.oasis-open.org/wsrm/2004/06/ws-reliability-1.1.xsd"><S:Header><wsrm:Request S:mustUnderstand="1"><wsrm:MessageId groupId="mid:7d9a1c2e-4b5f-4c8a-9e21-0f3b5a6c7d8e@partner.example.org"><wsrm:SequenceNum number="41" groupMaxIdleDuration="PT30M"/></wsrm:MessageId><wsrm:ExpiryTime>2026-12-01T12:00:00Z</wsrm:ExpiryTime><wsrm:ReplyPattern><wsrm:Value>Response</wsrm:Value></wsrm:ReplyPattern><wsrm:AckRequested/><wsrm:DuplicateElimination/></wsrm:Request></S:Header><S:Body>{body}</S:Body></S:Envelope>"#
    )
}

fn codec(c: &mut Criterion) {
    let message = typical_message();
    let limits = Limits::default();
    let parsed = read_envelope(message.as_bytes(), &limits).expect("typical message reads");
    let request = parsed.request.clone().expect("has a Request");
    let body = parsed.body.content.to_owned();

    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(message.len() as u64));
    group.bench_function(format!("parse {} B reliable message", message.len()), |b| {
        b.iter(|| read_envelope(black_box(message.as_bytes()), &limits).expect("reads"))
    });
    // The floor: quick-xml's namespace-aware reader alone, resolving every element, doing nothing
    // with the events. Our reader's cost above this is validation and building the values.
    group.bench_function("floor: quick-xml NsReader events only", |b| {
        b.iter(|| {
            let text = std::str::from_utf8(black_box(message.as_bytes())).expect("utf-8");
            let mut reader = quick_xml::NsReader::from_str(text);
            let mut elements = 0usize;
            loop {
                match reader.read_resolved_event().expect("well-formed") {
                    (_, quick_xml::events::Event::Eof) => break,
                    (
                        _,
                        quick_xml::events::Event::Start(_) | quick_xml::events::Event::Empty(_),
                    ) => elements += 1,
                    _ => {}
                }
            }
            elements
        })
    });
    group.bench_function("floor: quick-xml Reader events only (no namespaces)", |b| {
        b.iter(|| {
            let text = std::str::from_utf8(black_box(message.as_bytes())).expect("utf-8");
            let mut reader = quick_xml::Reader::from_str(text);
            let mut elements = 0usize;
            loop {
                match reader.read_event().expect("well-formed") {
                    quick_xml::events::Event::Eof => break,
                    quick_xml::events::Event::Start(_) | quick_xml::events::Event::Empty(_) => {
                        elements += 1
                    }
                    _ => {}
                }
            }
            elements
        })
    });
    group.bench_function("parse via read_message (text/xml)", |b| {
        b.iter(|| {
            read_message(
                Some("text/xml; charset=utf-8"),
                black_box(message.as_bytes()),
                &limits,
            )
            .expect("reads")
        })
    });
    group.bench_function("write the same message", |b| {
        b.iter(|| {
            write_envelope(
                SoapVersion::Soap11,
                Headers {
                    request: Some(black_box(&request)),
                    ..Headers::default()
                },
                black_box(&body),
            )
        })
    });
    let ack = Response {
        replies: vec![Reply::Sequence {
            group_id: GroupId::parse(
                "mid:7d9a1c2e-4b5f-4c8a-9e21-0f3b5a6c7d8e@partner.example.org",
            )
            .expect("group"),
            ranges: vec![ReplyRange {
                range: SeqRange::single(41),
                fault: None,
            }],
        }],
    };
    group.bench_function("write an ack (Response header, empty body)", |b| {
        b.iter(|| {
            write_envelope(
                SoapVersion::Soap11,
                Headers {
                    response: Some(black_box(&ack)),
                    ..Headers::default()
                },
                "",
            )
        })
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
