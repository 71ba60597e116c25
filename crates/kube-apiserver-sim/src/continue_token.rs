//! Continue tokens in the apiserver's format (`storage/continue.go`):
//! unpadded URL-safe base64 of `{"v":"meta.k8s.io/v1","rv":<list RV>,"start":"<key>\u0000"}`.
//!
//! The cacher encodes `start` relative to the list's key with a leading
//! slash (`/cm-0\u0000` in a namespace, `/ns/cm-0\u0000` across
//! namespaces); etcd encodes it without the slash. Both decode alike.

use base64::Engine;
use base64::alphabet::URL_SAFE;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::Serialize;
use serde_json::Value;

use super::gojson;
use apimachinery::go as json;

const VERSION: &str = "meta.k8s.io/v1";
const INVALID: &str = "continue key is not valid";

/// Go's `base64.RawURLEncoding`: no padding, lenient about trailing bits.
const RAW_URL: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

#[derive(Serialize)]
struct Token<'a> {
    v: &'a str,
    rv: i64,
    start: &'a str,
}

/// A token continuing after storage key `last_key` (relative to the list's
/// prefix: `name` in a namespace, `ns/name` across namespaces) at list RV
/// `rv` (`-1`: continue at the latest RV).
pub fn encode(rv: i64, last_key: &str) -> String {
    let start = format!("/{last_key}\u{0}");
    RAW_URL.encode(json::to_vec(&Token {
        v: VERSION,
        rv,
        start: &start,
    }))
}

/// Decodes a token into the relative start key (first key to return,
/// `last_key + "\0"`) and its RV.
///
/// # Errors
/// `DecodeContinue`'s message, e.g. `continue key is not valid: ...`; the
/// handler prefixes `invalid continue token: `.
pub fn decode(token: &str) -> Result<(String, i64), String> {
    let data = RAW_URL.decode(token).map_err(|e| {
        let offset = match e {
            base64::DecodeError::InvalidByte(o, _)
            | base64::DecodeError::InvalidLastSymbol(o, _) => o,
            base64::DecodeError::InvalidLength(n) => n,
            base64::DecodeError::InvalidPadding => token.len(),
        };
        format!("{INVALID}: illegal base64 data at input byte {offset}")
    })?;
    gojson::check_valid(&data).map_err(|e| format!("{INVALID}: {e}"))?;
    let value: Value = serde_json::from_slice(&data).map_err(|e| format!("{INVALID}: {e}"))?;
    let (v, rv, start) = fields(&value).map_err(|e| format!("{INVALID}: {e}"))?;
    if v != VERSION {
        return Err(format!(
            "{INVALID} server does not recognize this encoded version {}",
            super::errors::go_quote(&v)
        ));
    }
    if rv == 0 {
        return Err(format!(
            "{INVALID}: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        ));
    }
    if start.is_empty() {
        return Err(format!(
            "{INVALID}: encoded start key empty (version meta.k8s.io/v1)"
        ));
    }
    let key = if start.starts_with('/') {
        start.clone()
    } else {
        format!("/{start}")
    };
    if !is_clean(&key) {
        return Err(format!("{INVALID}: {start}"));
    }
    Ok((key[1..].to_string(), rv))
}

/// `json.Unmarshal` into `continueToken`: case-insensitive field names,
/// unknown fields ignored, missing fields zero.
fn fields(value: &Value) -> Result<(String, i64, String), String> {
    let Value::Object(map) = value else {
        return Err(format!(
            "json: cannot unmarshal {} into Go value of type storage.continueToken",
            go_type(value)
        ));
    };
    let (mut v, mut rv, mut start) = (String::new(), 0i64, String::new());
    for (k, val) in map {
        let field = k.to_ascii_lowercase();
        let type_err = |want: &str| {
            format!(
                "json: cannot unmarshal {} into Go struct field continueToken.{field} of type {want}",
                go_type(val)
            )
        };
        match field.as_str() {
            "v" | "start" => {
                let s = match val {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    _ => return Err(type_err("string")),
                };
                if field == "v" {
                    v = s;
                } else {
                    start = s;
                }
            }
            "rv" => {
                rv = match val {
                    Value::Null => 0,
                    Value::Number(n) => n.as_i64().ok_or_else(|| type_err("int64"))?,
                    _ => return Err(type_err("int64")),
                }
            }
            _ => {}
        }
    }
    Ok((v, rv, start))
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Whether `path.Clean(p) == p` for an absolute path.
fn is_clean(p: &str) -> bool {
    if p == "/" {
        return true;
    }
    p.split('/')
        .skip(1)
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    const RECORDED: &str =
        "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MzMxLCJzdGFydCI6Ii9jbS0wXHUwMDAwIn0";

    #[test]
    fn encodes_like_the_cacher() {
        assert_eq!(encode(331, "cm-0"), RECORDED);
        assert_eq!(decode(RECORDED), Ok(("cm-0\u{0}".to_string(), 331)));
        let t = encode(7, "ns/x");
        assert_eq!(decode(&t), Ok(("ns/x\u{0}".to_string(), 7)));
    }

    #[test]
    fn accepts_etcd_tokens_without_leading_slash() {
        let etcd = RAW_URL.encode(br#"{"v":"meta.k8s.io/v1","rv":5,"start":"cm-1\u0000"}"#);
        assert_eq!(decode(&etcd), Ok(("cm-1\u{0}".to_string(), 5)));
        let latest = encode(-1, "a");
        assert_eq!(decode(&latest), Ok(("a\u{0}".to_string(), -1)));
    }

    #[test]
    fn errors_match_the_apiserver() {
        assert_eq!(
            decode("garbage").unwrap_err(),
            "continue key is not valid: invalid character '\\x81' looking for beginning of value"
        );
        let zero = RAW_URL.encode(br#"{"v":"meta.k8s.io/v1","rv":0,"start":"/a"}"#);
        assert_eq!(
            decode(&zero).unwrap_err(),
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        );
        let empty = RAW_URL.encode(br#"{"v":"meta.k8s.io/v1","rv":3}"#);
        assert_eq!(
            decode(&empty).unwrap_err(),
            "continue key is not valid: encoded start key empty (version meta.k8s.io/v1)"
        );
        let traversal = RAW_URL.encode(br#"{"v":"meta.k8s.io/v1","rv":3,"start":"/../x"}"#);
        assert_eq!(
            decode(&traversal).unwrap_err(),
            "continue key is not valid: /../x"
        );
        assert!(
            decode("a=")
                .unwrap_err()
                .starts_with("continue key is not valid: illegal base64")
        );
    }
}
