//! Request text the store cannot hold, refused at the door: a NUL character (U+0000) in any
//! value a request hands on towards a query. PostgreSQL's `text` and `jsonb` cannot hold one
//! and fail the whole statement, which would read as a store failure (503 and an ERROR
//! logged) although the store is fine; SQLite would take it. Refused here, before either
//! backend sees it, it is the same 400 naming the field on both, and the store's failures
//! stay real ones. The API's extractors and `json_body` (`api.rs`) and the console's text
//! parameters run these checks; a handler that reads a body or query itself calls them too.
//! A leaf of `http/`: it imports no handler file.

use std::fmt::{self, Write as _};

use axum::extract::Query;
use axum::http::Uri;
use serde_json::Value;

/// A request value the store cannot hold, and which field it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unstorable {
    /// A query, path or form parameter's name, or a JSON field's path (`settlements[0].receipt`).
    pub field: String,
}

impl Unstorable {
    /// Why, after the field's name.
    pub const REASON: &'static str =
        "contains a NUL character (U+0000), which the gateway cannot store";
}

impl fmt::Display for Unstorable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, Unstorable::REASON)
    }
}

impl std::error::Error for Unstorable {}

/// Whether the store can hold `value`: the one rule, for every input.
pub fn storable(value: &str) -> bool {
    !value.contains('\0')
}

/// One text value, named `field`.
pub fn text(field: &str, value: &str) -> Result<(), Unstorable> {
    if storable(value) {
        Ok(())
    } else {
        Err(Unstorable {
            field: field.to_owned(),
        })
    }
}

/// Every parameter of a URI's query, as `Query` decodes it. A NUL reaches a query string
/// only percent-encoded (the request line cannot carry a raw one), so a query without `%00`
/// is passed without decoding it twice.
pub fn query(uri: &Uri) -> Result<(), Unstorable> {
    let Some(raw) = uri.query() else {
        return Ok(());
    };
    if !raw.contains("%00") {
        return Ok(());
    }
    // Undecodable: the handler's own `Query` refuses it with its reason.
    let Ok(Query(pairs)) = Query::<Vec<(String, String)>>::try_from_uri(uri) else {
        return Ok(());
    };
    // Names are not checked: one the handler does not know is ignored, never stored.
    pairs.iter().try_for_each(|(name, value)| text(name, value))
}

/// Every string of a JSON request body, and every key: the first with a NUL names its path.
/// JSON carries a NUL only escaped (`\u0000`: a raw one is not JSON), so a body without that
/// escape is passed without being parsed twice.
pub fn json_bytes(bytes: &[u8]) -> Result<(), Unstorable> {
    if memchr::memmem::find(bytes, br"\u0000").is_none() {
        return Ok(());
    }
    // Not JSON: the handler's own parse refuses it with its reason.
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) => json(&value),
        Err(_) => Ok(()),
    }
}

/// Every string and key of a JSON value already parsed (a body read as a `Value`).
pub fn json(value: &Value) -> Result<(), Unstorable> {
    let mut path = String::new();
    walk(value, &mut path)
}

/// `walk` keeps the path of `value` in `path` (restored on return), so that the refusal can
/// name it; "body" when the whole body is the string.
fn walk(value: &Value, path: &mut String) -> Result<(), Unstorable> {
    let here = |path: &str| if path.is_empty() { "body" } else { path }.to_owned();
    match value {
        Value::String(s) if !storable(s) => Err(Unstorable { field: here(path) }),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                let _ = write!(path, "[{i}]");
                walk(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                if !storable(key) {
                    // The key itself: named by its printable part.
                    path.push_str(&key.replace('\0', "\\u0000"));
                    return Err(Unstorable { field: here(path) });
                }
                path.push_str(key);
                walk(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn field(r: Result<(), Unstorable>) -> Option<String> {
        r.err().map(|e| e.field)
    }

    #[test]
    fn a_nul_anywhere_in_a_json_body_names_its_path() {
        let body = json!({"name": "ok", "agreement": {"headers": ["a", "b\u{0}"]}});
        assert_eq!(field(json(&body)).as_deref(), Some("agreement.headers[1]"));
        let bytes = serde_json::to_vec(&body).expect("JSON");
        assert_eq!(
            field(json_bytes(&bytes)).as_deref(),
            Some("agreement.headers[1]")
        );
        assert_eq!(
            field(json(&json!({"settlements": [{"receipt": "\u{0}"}]}))).as_deref(),
            Some("settlements[0].receipt")
        );
        assert_eq!(
            field(json(&json!({"a\u{0}": 1}))).as_deref(),
            Some("a\\u0000")
        );
        assert_eq!(field(json(&json!("\u{0}"))).as_deref(), Some("body"));
    }

    #[test]
    fn text_without_a_nul_passes_and_an_escaped_backslash_is_no_nul() {
        assert_eq!(
            json(&json!({"name": "a\\u0000", "n": [1, null, true]})),
            Ok(())
        );
        // The escape's text, not a NUL: `\\u0000` in the JSON is a backslash and "u0000".
        assert_eq!(json_bytes(br#"{"name": "a\\u0000"}"#), Ok(()));
        assert_eq!(json_bytes(b"not json \\u0000"), Ok(()));
        assert_eq!(text("id", "mid:x@y"), Ok(()));
        assert_eq!(field(text("id", "a\0")).as_deref(), Some("id"));
    }

    #[test]
    fn a_percent_encoded_nul_in_a_query_names_its_parameter() {
        let uri: Uri = "/x?state=sent&group=mid%3Aa%00b".parse().expect("uri");
        assert_eq!(field(query(&uri)).as_deref(), Some("group"));
        let uri: Uri = "/x?group=mid%3Aa%2500b".parse().expect("uri");
        assert_eq!(query(&uri), Ok(()), "%2500 is the text %00");
        let uri: Uri = "/x".parse().expect("uri");
        assert_eq!(query(&uri), Ok(()));
    }
}
