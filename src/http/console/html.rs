//! The console's HTML: the escaping every dynamic value goes through, and the page layout.
//! Pages are plain strings built here and in `pages.rs`; nothing is fetched by the browser
//! but the one stylesheet, and no script runs.

use std::fmt::Write as _;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// An answer that ends a handler early (an error page, a refusal): boxed, since a whole
/// `Response` is too large to pass back through every `Result`.
pub struct Stop(Box<Response>);

impl From<Response> for Stop {
    fn from(response: Response) -> Stop {
        Stop(Box::new(response))
    }
}

impl IntoResponse for Stop {
    fn into_response(self) -> Response {
        *self.0
    }
}

/// Escapes text for an HTML element's content or a quoted attribute value.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a value for a URL query (then `esc` it when it goes into an attribute).
pub fn query_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A link whose URL and text are both escaped.
pub fn link(href: &str, text: &str) -> String {
    format!("<a href=\"{}\">{}</a>", esc(href), esc(text))
}

/// A link whose text is an id: kept on one line (a UUID wrapped mid-way reads as two).
pub fn id_link(href: &str, id: &str) -> String {
    format!("<a class=\"id\" href=\"{}\">{}</a>", esc(href), esc(id))
}

/// An id shown as text, kept on one line as `id_link`.
pub fn id_text(id: &str) -> String {
    format!("<span class=\"id\">{}</span>", esc(id))
}

/// A table: headings (`<th scope="col">`) and rows of cells already rendered as HTML; the
/// first cell of each row is its heading (`<th scope="row">`).
pub fn table(caption: &str, headings: &[&str], rows: &[Vec<String>]) -> String {
    if rows.is_empty() {
        return format!("<p>{}: none.</p>", esc(caption));
    }
    let mut out = format!("<table><caption>{}</caption><thead><tr>", esc(caption));
    for h in headings {
        let _ = write!(out, "<th scope=\"col\">{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for (i, cell) in row.iter().enumerate() {
            if i == 0 {
                let _ = write!(out, "<th scope=\"row\">{cell}</th>");
            } else {
                let _ = write!(out, "<td>{cell}</td>");
            }
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// A two-column table of names and values (values already HTML).
pub fn facts(caption: &str, rows: &[(&str, String)]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|(name, value)| vec![esc(name), value.clone()])
        .collect();
    table(caption, &["Field", "Value"], &rows)
}

/// A POST form with one button and hidden fields (names and values escaped here).
pub fn button_form(action: &str, label: &str, hidden: &[(&str, &str)]) -> String {
    post_form(action, label, hidden, None)
}

/// `button_form` for a destructive action: the button goes only with a ticked confirmation
/// (`confirm=yes`, which the action checks too) — no script, no second page.
pub fn confirmed_form(
    action: &str,
    label: &str,
    hidden: &[(&str, &str)],
    consequence: &str,
) -> String {
    post_form(action, label, hidden, Some(consequence))
}

/// A POST form: hidden fields, the confirmation of `consequence` if one is asked, a button.
fn post_form(
    action: &str,
    label: &str,
    hidden: &[(&str, &str)],
    consequence: Option<&str>,
) -> String {
    let mut out = format!(
        "<form method=\"post\" action=\"{}\" class=\"inline\">",
        esc(action)
    );
    for (name, value) in hidden {
        let _ = write!(
            out,
            "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
            esc(name),
            esc(value)
        );
    }
    if let Some(consequence) = consequence {
        let _ = write!(
            out,
            "<label><input type=\"checkbox\" name=\"confirm\" value=\"yes\" required> {}</label>",
            esc(consequence)
        );
    }
    let _ = write!(
        out,
        "<button type=\"submit\">{}</button></form>",
        esc(label)
    );
    out
}

/// A notice shown above a page's content (a fixed text chosen by the handler).
pub fn notice(text: &str) -> String {
    format!("<p class=\"notice\" role=\"status\">{}</p>", esc(text))
}

/// An error shown above a page's content.
pub fn error(text: &str) -> String {
    format!("<p class=\"error\" role=\"alert\">{}</p>", esc(text))
}

/// The console's sections, for the navigation bar.
const SECTIONS: &[(&str, &str)] = &[
    ("/console", "Overview"),
    ("/console/messages", "Outbound"),
    ("/console/partners", "Partners"),
    ("/console/groups", "Inbound groups"),
    ("/console/inbox", "Inbox"),
    ("/console/subscriptions", "Subscriptions"),
    ("/console/endpoints", "Endpoints"),
    ("/console/audit", "Audit"),
];

/// A whole page: `title` (escaped here) and `body` (HTML). `signed_in` adds the navigation
/// and the log-out button.
pub fn page(status: StatusCode, title: &str, body: &str, signed_in: bool) -> Response {
    page_refreshing(status, title, body, signed_in, None)
}

/// `page`, reloaded by the browser every `refresh` seconds when given (a meta refresh: no
/// script), so that a page of live counts stays live.
pub fn page_refreshing(
    status: StatusCode,
    title: &str,
    body: &str,
    signed_in: bool,
    refresh: Option<u32>,
) -> Response {
    let refresh = refresh.map_or(String::new(), |s| {
        format!("<meta http-equiv=\"refresh\" content=\"{s}\">")
    });
    let mut html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">{refresh}\
         <title>{} · wsr-gateway console</title>\
         <link rel=\"stylesheet\" href=\"/console/console.css\"></head><body><header>\
         <p class=\"brand\">wsr-gateway console</p>",
        esc(title)
    );
    if signed_in {
        html.push_str("<nav aria-label=\"Console sections\"><ul>");
        for (href, name) in SECTIONS {
            let _ = write!(html, "<li>{}</li>", link(href, name));
        }
        html.push_str("</ul></nav>");
        html.push_str(&button_form("/console/logout", "Log out", &[]));
    }
    let _ = write!(
        html,
        "</header><main><h1>{}</h1>{body}</main></body></html>",
        esc(title)
    );
    let mut response = (status, html).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    secure_headers(headers);
    response
}

/// A download: stored bytes as they are, `content_type` as stored (one that is no valid header
/// value is sent as opaque bytes). Never a page: `Content-Disposition: attachment` has the
/// browser save it, and the console's headers (`nosniff` above all, the policy that runs no
/// script) keep it from being taken for HTML even if opened. `filename` is reduced to
/// characters safe in the header.
pub fn attachment(content_type: &str, filename: &str, body: Body) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream")),
    );
    let safe: String = filename
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&format!("attachment; filename=\"{safe}\""))
            .unwrap_or(HeaderValue::from_static("attachment")),
    );
    secure_headers(headers);
    response
}

/// What every console answer carries: nothing but our own stylesheet may load, no script
/// runs, forms post only to us, no framing (clickjacking), nothing cached (pages hold
/// payloads), and the Referer stays same-origin (the CSRF check may need it).
pub fn secure_headers(headers: &mut axum::http::HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_and_quotes_are_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(query_value("mid:a b/c&d=é"), "mid%3Aa%20b%2Fc%26d%3D%C3%A9");
    }

    #[test]
    fn a_table_heads_its_rows_and_columns() {
        let t = table(
            "Things",
            &["Name", "Count"],
            &[vec!["a".into(), "1".into()]],
        );
        assert!(t.contains("<th scope=\"col\">Name</th>"));
        assert!(t.contains("<th scope=\"row\">a</th><td>1</td>"));
        assert_eq!(table("Things", &["Name"], &[]), "<p>Things: none.</p>");
    }
}
