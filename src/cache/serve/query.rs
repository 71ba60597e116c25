//! `ListOptions` from a list or watch query, decoded, defaulted and
//! validated as kube-apiserver does before a request reaches storage:
//! selector parse errors are `400`, option combinations are `422`
//! (`ValidateListOptions` in
//! `staging/src/k8s.io/apimachinery/pkg/apis/meta/internalversion/validation`),
//! after the 1.34+ `WatchList` defaulting (`SetListOptionsDefaults`).
//!
//! Anything the cache cannot decode exactly as the apiserver would (an
//! unknown parameter, a malformed number) is a [`QueryError::PassThrough`]:
//! upstream answers it.

use apimachinery::go::quote as go_quote;
use apimachinery::selector::{FieldSelector, LabelSelector};
use apimachinery::status::{Cause, Status};

/// Parameters the cache understands. Any other parameter passes through.
const KNOWN: &[&str] = &[
    "watch",
    "resourceVersion",
    "resourceVersionMatch",
    "labelSelector",
    "fieldSelector",
    "limit",
    "continue",
    "timeoutSeconds",
    "allowWatchBookmarks",
    "sendInitialEvents",
    // Ignored by the apiserver for lists and watches.
    "timeout",
];

/// `resourceVersionMatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Match {
    Exact,
    NotOlderThan,
}

/// Decoded list/watch options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    pub label_selector: LabelSelector,
    /// As written by the client, before field-label conversion.
    pub field_selector: FieldSelector,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<Match>,
    pub limit: i64,
    pub continue_token: Option<String>,
    pub timeout_seconds: Option<i64>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
}

/// Why the cache does not answer from these options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// The apiserver's answer, given by the cache.
    Status(Box<Status>),
    /// Let upstream answer.
    PassThrough(&'static str),
}

/// Go's `strconv.ParseBool`-style truthiness used by the query decoder for
/// bools: anything but `0` and `false` (any case) is true.
fn go_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

/// Decodes and validates list or watch options. `watch` is the verb
/// (`?watch=` or a `/watch/` path).
///
/// # Errors
/// [`QueryError::Status`] with the apiserver's `400`/`422`, or
/// [`QueryError::PassThrough`].
pub fn parse(query: Option<&str>, watch: bool) -> Result<ListOptions, QueryError> {
    let mut raw: Vec<(String, String)> = Vec::new();
    // Go's `URL.Query()`: a pair with a `;` or a malformed escape is
    // dropped, not an error.
    for (k, v) in apimachinery::url::query_pairs(query.unwrap_or("")) {
        if !KNOWN.contains(&k.as_str()) {
            return Err(QueryError::PassThrough("unknown query parameter"));
        }
        // Only the first value of a parameter counts.
        if !raw.iter().any(|(rk, _)| *rk == k) {
            raw.push((k, v));
        }
    }
    let get = |name: &str| raw.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());

    let mut opts = ListOptions::default();
    if let Some(s) = get("labelSelector") {
        opts.label_selector = LabelSelector::parse(s)
            .map_err(|m| QueryError::Status(Box::new(Status::bad_request(m))))?;
    }
    if let Some(s) = get("fieldSelector") {
        opts.field_selector = FieldSelector::parse(s)
            .map_err(|m| QueryError::Status(Box::new(Status::bad_request(m))))?;
    }
    opts.allow_watch_bookmarks = get("allowWatchBookmarks").is_some_and(go_bool);
    opts.resource_version = get("resourceVersion")
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    let mut bogus_match = None;
    opts.resource_version_match = match get("resourceVersionMatch") {
        None | Some("") => None,
        Some("Exact") => Some(Match::Exact),
        Some("NotOlderThan") => Some(Match::NotOlderThan),
        Some(other) => {
            // Reported by validation below.
            bogus_match = Some(other.to_string());
            None
        }
    };
    if let Some(t) = get("timeoutSeconds").filter(|t| !t.is_empty()) {
        opts.timeout_seconds = Some(
            t.parse::<i64>()
                .map_err(|_| QueryError::PassThrough("unparseable timeoutSeconds"))?,
        );
    }
    if let Some(l) = get("limit").filter(|l| !l.is_empty()) {
        opts.limit = l
            .parse::<i64>()
            .map_err(|_| QueryError::PassThrough("unparseable limit"))?;
    }
    opts.continue_token = get("continue")
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    opts.send_initial_events = get("sendInitialEvents")
        .filter(|v| !v.is_empty())
        .map(go_bool);

    if bogus_match.is_none() {
        set_defaults(&mut opts, watch);
    }
    let causes = validate(&opts, watch, bogus_match.as_deref());
    if !causes.is_empty() {
        return Err(QueryError::Status(Box::new(Status::invalid_list_options(
            causes,
        ))));
    }
    Ok(opts)
}

/// `SetListOptionsDefaults` with the `WatchList` feature on (1.34+): a
/// watch from RV `""` or `"0"` that sets neither `sendInitialEvents` nor
/// `resourceVersionMatch` becomes a streaming list.
fn set_defaults(opts: &mut ListOptions, watch: bool) {
    if opts.send_initial_events.is_some() || opts.resource_version_match.is_some() {
        return;
    }
    let legacy = matches!(opts.resource_version.as_deref(), None | Some("0"));
    if watch && legacy {
        opts.send_initial_events = Some(true);
        opts.resource_version_match = Some(Match::NotOlderThan);
    }
}

fn forbidden(field: &str, message: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {message}"),
        field: field.to_string(),
    }
}

fn not_supported(value: &str, supported: &str) -> Cause {
    Cause {
        reason: "FieldValueNotSupported",
        message: format!(
            "Unsupported value: {}: supported values: {supported}",
            go_quote(value)
        ),
        field: "resourceVersionMatch".to_string(),
    }
}

/// `ValidateListOptions`; `bogus_match` is an unsupported
/// `resourceVersionMatch` value.
fn validate(opts: &ListOptions, watch: bool, bogus_match: Option<&str>) -> Vec<Cause> {
    let mut causes = Vec::new();
    let has_match = opts.resource_version_match.is_some() || bogus_match.is_some();
    if watch {
        if opts.send_initial_events.is_some()
            && opts.resource_version_match != Some(Match::NotOlderThan)
        {
            causes.push(forbidden(
                "resourceVersionMatch",
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if has_match {
            if opts.send_initial_events.is_none() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            match (bogus_match, opts.resource_version_match) {
                (Some(v), _) => causes.push(not_supported(v, "\"NotOlderThan\"")),
                (None, Some(Match::Exact)) => {
                    causes.push(not_supported("Exact", "\"NotOlderThan\""))
                }
                _ => {}
            }
            if opts.continue_token.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
        }
        return causes;
    }
    if has_match {
        if opts.resource_version.is_none() {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if opts.continue_token.is_some() {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if let Some(v) = bogus_match {
            causes.push(not_supported(v, "\"Exact\", \"NotOlderThan\", \"\""));
        }
        if opts.resource_version_match == Some(Match::Exact)
            && opts.resource_version.as_deref() == Some("0")
        {
            causes.push(forbidden(
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if opts.send_initial_events.is_some() {
        causes.push(forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    causes
}

/// A resourceVersion parsed as the watch cache does
/// (`APIObjectVersioner.ParseResourceVersion`): `None` for `""`/`"0"`.
///
/// # Errors
/// The `field.Invalid` text, e.g. `resourceVersion: Invalid value: "abc":
/// strconv.ParseUint: parsing "abc": invalid syntax`.
pub fn parse_resource_version(rv: &str) -> Result<u64, String> {
    if rv.is_empty() || rv == "0" {
        return Ok(0);
    }
    parse_uint(rv).map_err(|reason| {
        format!(
            "resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: {reason}",
            go_quote(rv),
            go_quote(rv)
        )
    })
}

/// Go's `strconv.ParseUint(s, 10, 64)`.
fn parse_uint(s: &str) -> Result<u64, &'static str> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err("invalid syntax");
    }
    s.parse::<u64>().map_err(|_| "value out of range")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(q: &str, watch: bool) -> String {
        match parse(Some(q), watch) {
            Err(QueryError::Status(s)) => format!("{} {} {}", s.code, s.reason, s.message),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn recording_validation_messages() {
        assert_eq!(
            err("resourceVersionMatch=NotOlderThan", false),
            "422 Invalid ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"
        );
        assert_eq!(
            err("resourceVersionMatch=Exact&resourceVersion=0", false),
            "422 Invalid ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""
        );
        assert_eq!(
            err("resourceVersionMatch=Sometimes&resourceVersion=5", false),
            "422 Invalid ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Sometimes\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
        assert_eq!(
            err("labelSelector=app+in+(a", false),
            "400 BadRequest unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            err("fieldSelector=metadata.name", false),
            "400 BadRequest invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
    }

    #[test]
    fn recorded_status_json_is_exact() {
        let Err(QueryError::Status(s)) = parse(Some("resourceVersionMatch=NotOlderThan"), false)
        else {
            panic!()
        };
        assert_eq!(
            std::str::from_utf8(&s.to_json()).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided","reason":"Invalid","details":{"group":"meta.k8s.io","kind":"ListOptions","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided","field":"resourceVersionMatch"}]},"code":422}"#
        );
    }

    #[test]
    fn watch_defaulting_and_rules() {
        let o = parse(Some("watch=1&resourceVersion=0"), true).unwrap();
        assert_eq!(o.send_initial_events, Some(true));
        assert_eq!(o.resource_version_match, Some(Match::NotOlderThan));
        let o = parse(Some("watch=1"), true).unwrap();
        assert_eq!(o.send_initial_events, Some(true));
        let o = parse(Some("watch=1&resourceVersion=5"), true).unwrap();
        assert_eq!(o.send_initial_events, None);
        assert!(
            err("watch=1&sendInitialEvents=true", true).contains(
                "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            )
        );
        assert!(
            err(
                "watch=1&resourceVersionMatch=NotOlderThan&resourceVersion=5",
                true
            )
            .contains(
                "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
            )
        );
        let e = err(
            "watch=1&sendInitialEvents=true&resourceVersionMatch=Exact",
            true,
        );
        assert!(e.starts_with("422 Invalid ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires"), "{e}");
        assert!(
            err(
                "sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=1",
                false
            )
            .contains("sendInitialEvents is forbidden for list")
        );
        let o = parse(Some("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"), true).unwrap();
        assert!(o.allow_watch_bookmarks);
    }

    #[test]
    fn unknown_and_unparseable_pass_through() {
        assert_eq!(
            parse(Some("pretty=true"), false),
            Err(QueryError::PassThrough("unknown query parameter"))
        );
        assert_eq!(
            parse(Some("limit=x"), false),
            Err(QueryError::PassThrough("unparseable limit"))
        );
        let o = parse(Some("limit=-1&timeout=5s"), false).unwrap();
        assert_eq!(o.limit, -1);
    }

    #[test]
    fn resource_versions() {
        assert_eq!(parse_resource_version("0"), Ok(0));
        assert_eq!(parse_resource_version("42"), Ok(42));
        assert_eq!(
            parse_resource_version("abc").unwrap_err(),
            "resourceVersion: Invalid value: \"abc\": strconv.ParseUint: parsing \"abc\": invalid syntax"
        );
        assert!(
            parse_resource_version("+1")
                .unwrap_err()
                .ends_with("invalid syntax")
        );
        assert!(
            parse_resource_version("99999999999999999999")
                .unwrap_err()
                .ends_with("value out of range")
        );
    }
}
