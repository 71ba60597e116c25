//! Go's `net/url`, as far as kube-apiserver's request handling depends on
//! it: how a request path is percent-decoded (`URL.Path`, which the
//! request-info resolver and the router read), how a query is split into
//! parameters (`URL.Query()`, which the parameter codec reads), and which
//! strings `url.ParseRequestURI` accepts (the WebSocket handshake's
//! `Origin` check).
//!
//! Ported from `src/net/url/url.go` of the Go release kube-apiserver v1.36
//! is built with; errors carry Go's messages.

use std::borrow::Cow;
use std::fmt;

use crate::go::quote;

/// Which part of a URL is being unescaped (Go's `encoding`): the rules for
/// `%XX` and `+` differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A whole path (`URL.Path`): `%XX` decoded, `+` kept.
    Path,
    /// A host: `%XX` only for bytes ≥ 0x80 (and `%25`), no reserved ASCII.
    Host,
    /// An IPv6 zone.
    Zone,
    /// User information.
    UserPassword,
    /// A query key or value: `%XX` decoded, `+` is a space.
    QueryComponent,
}

/// Why a string could not be parsed or unescaped, with Go's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlError(String);

impl fmt::Display for UrlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UrlError {}

fn is_hex(c: u8) -> bool {
    c.is_ascii_hexdigit()
}

fn unhex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => 0,
    }
}

/// Go's `shouldEscape`, for the modes unescaping consults.
fn should_escape(c: u8, mode: Mode) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if matches!(mode, Mode::Host | Mode::Zone)
        && matches!(
            c,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b'"'
        )
    {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => match mode {
            Mode::Path => c == b'?',
            Mode::UserPassword => matches!(c, b'@' | b'/' | b'?' | b':'),
            Mode::QueryComponent => true,
            Mode::Host | Mode::Zone => true,
        },
        _ => true,
    }
}

/// Go's `unescape(s, mode)`: every `%` must start `%XX` (an
/// `invalid URL escape "%zz"` error otherwise); in a query component `+`
/// is a space. The result is bytes: Go strings hold any bytes, decoded
/// `%FF` included.
///
/// # Errors
/// [`UrlError`] with Go's message.
pub fn unescape(s: &str, mode: Mode) -> Result<Cow<'_, [u8]>, UrlError> {
    let b = s.as_bytes();
    let mut n = 0;
    let mut has_plus = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                n += 1;
                if i + 2 >= b.len() || !is_hex(b[i + 1]) || !is_hex(b[i + 2]) {
                    let bad = &b[i..b.len().min(i + 3)];
                    return Err(escape_error(bad));
                }
                if mode == Mode::Host && unhex(b[i + 1]) < 8 && &b[i..i + 3] != b"%25" {
                    return Err(escape_error(&b[i..i + 3]));
                }
                if mode == Mode::Zone {
                    let v = (unhex(b[i + 1]) << 4) | unhex(b[i + 2]);
                    if &b[i..i + 3] != b"%25" && v != b' ' && should_escape(v, Mode::Host) {
                        return Err(escape_error(&b[i..i + 3]));
                    }
                }
                i += 3;
            }
            b'+' => {
                has_plus = mode == Mode::QueryComponent;
                i += 1;
            }
            c => {
                if matches!(mode, Mode::Host | Mode::Zone) && c < 0x80 && should_escape(c, mode) {
                    return Err(UrlError(format!(
                        "invalid character {} in host name",
                        quote(&String::from_utf8_lossy(&b[i..i + 1]))
                    )));
                }
                i += 1;
            }
        }
    }
    if n == 0 && !has_plus {
        return Ok(Cow::Borrowed(b));
    }
    let mut out = Vec::with_capacity(b.len() - 2 * n);
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                out.push((unhex(b[i + 1]) << 4) | unhex(b[i + 2]));
                i += 3;
            }
            b'+' if mode == Mode::QueryComponent => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(Cow::Owned(out))
}

fn escape_error(bad: &[u8]) -> UrlError {
    UrlError(format!(
        "invalid URL escape {}",
        quote(&String::from_utf8_lossy(bad))
    ))
}

/// A request path as Go's `URL.Path` holds it: percent-decoded (`%2F`
/// becomes `/`, `+` stays). `None` where Go's HTTP server rejects the
/// request line (`400 Bad Request`) because an escape is malformed.
pub fn decode_path(raw: &str) -> Option<Cow<'_, [u8]>> {
    unescape(raw, Mode::Path).ok()
}

/// Go's `url.ParseQuery` (what `URL.Query()` returns), with the
/// parameters in the order given: `&`-separated `key=value` pairs, keys
/// and values query-unescaped; a pair holding a `;`, or with a malformed
/// escape, is dropped (Go reports an error that `URL.Query()` ignores);
/// empty pairs are skipped. Decoded bytes that are not UTF-8 are replaced
/// (U+FFFD).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for pair in query.split('&') {
        if pair.contains(';') || pair.is_empty() {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Ok(k), Ok(v)) = (
            unescape(k, Mode::QueryComponent),
            unescape(v, Mode::QueryComponent),
        ) else {
            continue;
        };
        out.push((
            String::from_utf8_lossy(&k).into_owned(),
            String::from_utf8_lossy(&v).into_owned(),
        ));
    }
    out
}

/// The first value of query parameter `name` (Go's `Values.Get`, or the
/// parameter codec's reading of a string option).
pub fn query_get(query: Option<&str>, name: &str) -> Option<String> {
    query_pairs(query.unwrap_or(""))
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

/// What [`parse_request_uri`] found (what callers here need of it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Url {
    /// Lowercased.
    pub scheme: String,
    pub opaque: String,
    /// `host[:port]`, unescaped.
    pub host: String,
    /// Decoded bytes.
    pub path: Vec<u8>,
    pub raw_query: String,
}

/// Go's `url.ParseRequestURI`: an absolute URI or an absolute path, as
/// received in an HTTP request (no fragment).
///
/// # Errors
/// [`UrlError`] with Go's `*url.Error` message: `parse "<raw>": <why>`.
pub fn parse_request_uri(raw: &str) -> Result<Url, UrlError> {
    parse(raw).map_err(|why| UrlError(format!("parse {}: {why}", quote(raw))))
}

fn parse(raw: &str) -> Result<Url, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() {
        return Err("empty url".into());
    }
    let mut url = Url::default();
    if raw == "*" {
        url.path = b"*".to_vec();
        return Ok(url);
    }
    let (scheme, mut rest) = get_scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        rest = &rest[..rest.len() - 1];
    } else if let Some((r, q)) = rest.split_once('?') {
        rest = r;
        url.raw_query = q.to_string();
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            // Rootless paths are opaque.
            url.opaque = rest.to_string();
            return Ok(url);
        }
        return Err("invalid URI for request".into());
    }
    if !url.scheme.is_empty() && rest.starts_with("//") {
        let authority_and_path = &rest[2..];
        let (authority, path) = match authority_and_path.find('/') {
            Some(i) => (&authority_and_path[..i], &authority_and_path[i..]),
            None => (authority_and_path, ""),
        };
        url.host = parse_authority(authority)?;
        rest = path;
    }
    url.path = unescape(rest, Mode::Path)
        .map_err(|e| e.to_string())?
        .into_owned();
    Ok(url)
}

/// Go's `getScheme`: `[a-zA-Z][a-zA-Z0-9+-.]*:`, or none.
fn get_scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, c) in raw.bytes().enumerate() {
        match c {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i == 0 => return Ok(("", raw)),
            b'0'..=b'9' | b'+' | b'-' | b'.' => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

fn parse_authority(authority: &str) -> Result<String, String> {
    let (userinfo, host) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let host = parse_host(host)?;
    if let Some(userinfo) = userinfo {
        if !valid_userinfo(userinfo) {
            return Err("net/url: invalid userinfo".into());
        }
        match userinfo.split_once(':') {
            None => {
                unescape(userinfo, Mode::UserPassword).map_err(|e| e.to_string())?;
            }
            Some((user, password)) => {
                unescape(user, Mode::UserPassword).map_err(|e| e.to_string())?;
                unescape(password, Mode::UserPassword).map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(host)
}

fn parse_host(host: &str) -> Result<String, String> {
    let bytes_to_string = |b: Cow<'_, [u8]>| String::from_utf8_lossy(&b).into_owned();
    if host.starts_with('[') {
        let Some(i) = host.rfind(']') else {
            return Err("missing ']' in host".into());
        };
        let colon_port = &host[i + 1..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
        if let Some(zone) = host[..i].find("%25") {
            let h1 = unescape(&host[..zone], Mode::Host).map_err(|e| e.to_string())?;
            let h2 = unescape(&host[zone..i], Mode::Zone).map_err(|e| e.to_string())?;
            let h3 = unescape(&host[i..], Mode::Host).map_err(|e| e.to_string())?;
            return Ok(bytes_to_string(h1) + &bytes_to_string(h2) + &bytes_to_string(h3));
        }
    } else if let Some(i) = host.rfind(':') {
        let colon_port = &host[i..];
        if !valid_optional_port(colon_port) {
            return Err(format!("invalid port {} after host", quote(colon_port)));
        }
    }
    unescape(host, Mode::Host)
        .map(bytes_to_string)
        .map_err(|e| e.to_string())
}

/// Empty, or `:` and digits.
fn valid_optional_port(port: &str) -> bool {
    match port.strip_prefix(':') {
        None => port.is_empty(),
        Some(digits) => digits.bytes().all(|b| b.is_ascii_digit()),
    }
}

fn valid_userinfo(s: &str) -> bool {
    s.chars().all(|c| {
        c.is_ascii_alphanumeric()
            || matches!(
                c,
                '-' | '.'
                    | '_'
                    | ':'
                    | '~'
                    | '!'
                    | '$'
                    | '&'
                    | '\''
                    | '('
                    | ')'
                    | '*'
                    | '+'
                    | ','
                    | ';'
                    | '='
                    | '%'
                    | '@'
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(s: &str) -> Option<Vec<u8>> {
        decode_path(s).map(Cow::into_owned)
    }

    #[test]
    fn paths_decode_like_go() {
        assert_eq!(path("/api/v1/pods").as_deref(), Some(&b"/api/v1/pods"[..]));
        assert_eq!(path("/a%2Fb%2fc").as_deref(), Some(&b"/a/b/c"[..]));
        assert_eq!(path("/%61pi/x+y").as_deref(), Some(&b"/api/x+y"[..]));
        assert_eq!(path("/%FF%00").as_deref(), Some(&b"/\xff\x00"[..]));
        assert_eq!(path("/%25").as_deref(), Some(&b"/%"[..]));
        for bad in ["/a%", "/a%2", "/a%zz", "/a%2g", "%"] {
            assert_eq!(path(bad), None, "{bad}");
        }
        assert_eq!(
            unescape("/a%zzz", Mode::Path).unwrap_err().to_string(),
            r#"invalid URL escape "%zz""#
        );
        assert_eq!(
            unescape("/a%2", Mode::Path).unwrap_err().to_string(),
            r#"invalid URL escape "%2""#
        );
    }

    #[test]
    fn queries_split_like_go() {
        let q = |s: &str| query_pairs(s);
        assert_eq!(
            q("a=1&b=x+y%20z&&c&=d"),
            vec![
                ("a".into(), "1".into()),
                ("b".into(), "x y z".into()),
                ("c".into(), String::new()),
                (String::new(), "d".into()),
            ]
        );
        // A semicolon or a bad escape drops the pair, not the query.
        assert_eq!(
            q("resourceVersion=0;x&limit=1"),
            vec![("limit".into(), "1".into())]
        );
        assert_eq!(
            q("labelSelector=%zz&limit=1&x%=1"),
            vec![("limit".into(), "1".into())]
        );
        assert_eq!(q("a=%3B"), vec![("a".into(), ";".into())]);
        assert_eq!(query_get(Some("w=1&w=2"), "w").as_deref(), Some("1"));
        assert_eq!(query_get(None, "w"), None);
    }

    #[test]
    fn request_uris_parse_like_go() {
        for ok in [
            "https://example.com",
            "http://example.com:8080/x?y",
            "foo:bar",
            "/x",
            "*",
            "http://[::1]:80",
            "http://[fe80::1%25en0]/",
            "http://user:pw@host",
            "wss://127.0.0.1:6443/api/v1/pods?watch=1",
            "http://",
            "http:",
        ] {
            assert!(parse_request_uri(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("", "empty url"),
            ("null", "invalid URI for request"),
            ("example.com", "invalid URI for request"),
            (":x", "missing protocol scheme"),
            ("http://[::1", "missing ']' in host"),
            ("http://a:b", r#"invalid port ":b" after host"#),
            ("http://%zz", r#"invalid URL escape "%zz""#),
            ("http://h%41", r#"invalid URL escape "%41""#),
            ("http://a b", r#"invalid character " " in host name"#),
            ("http://u s@h", "net/url: invalid userinfo"),
            ("/a\u{7f}", "net/url: invalid control character in URL"),
        ] {
            let err = parse_request_uri(bad).unwrap_err().to_string();
            assert_eq!(err, format!("parse {}: {why}", quote(bad)), "{bad}");
        }
        let u = parse_request_uri("HTTPS://h:1/a%2Fb?q=1").unwrap();
        assert_eq!(
            (
                u.scheme.as_str(),
                u.host.as_str(),
                &u.path[..],
                u.raw_query.as_str()
            ),
            ("https", "h:1", &b"/a/b"[..], "q=1")
        );
    }
}
