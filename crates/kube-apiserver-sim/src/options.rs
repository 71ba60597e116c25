//! `ListOptions` from the query string: decoding (400s), the 1.34 watch-list
//! defaulting, and `ValidateListOptions` (422s), in the apiserver's order.
//! See `/tmp/research/listwatch.md` §1.

use apimachinery::resource::FieldSet;
use apimachinery::selector::{FieldSelector, LabelSelector};
use apimachinery::status::{Cause, Status};

/// `resourceVersionMatch=NotOlderThan`.
pub const NOT_OLDER_THAN: &str = "NotOlderThan";
/// `resourceVersionMatch=Exact`.
pub const EXACT: &str = "Exact";

/// Decoded list/watch options.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub watch: bool,
    /// `""` when unset (Go does not tell unset from empty).
    pub resource_version: String,
    pub resource_version_match: String,
    pub send_initial_events: Option<bool>,
    pub allow_watch_bookmarks: bool,
    /// `<= 0` means no limit.
    pub limit: i64,
    pub continue_token: String,
    pub timeout_seconds: Option<i64>,
    pub label_selector: LabelSelector,
    /// After field-label conversion for the resource.
    pub field_selector: FieldSelector,
    /// `includeObject` for Table output (`None`, `Object`, `Metadata`).
    pub include_object: String,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(name: &str, v: &str) -> Result<bool, Status> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(Status::bad_request(format!(
            "{name}: strconv.ParseBool: parsing {}: invalid syntax",
            super::errors::go_quote(v)
        ))),
    }
}

fn parse_int(name: &str, v: &str) -> Result<i64, Status> {
    v.parse::<i64>().map_err(|_| {
        Status::bad_request(format!(
            "{name}: strconv.ParseInt: parsing {}: invalid syntax",
            super::errors::go_quote(v)
        ))
    })
}

// === impl ListOptions ===

impl ListOptions {
    /// Decodes, defaults and validates the options of a list (`watch` false)
    /// or watch request, converting field labels for `fields`.
    ///
    /// # Errors
    /// `400 BadRequest` for undecodable values and unsupported field labels,
    /// `422 Invalid` for option combinations `ValidateListOptions` rejects.
    pub fn parse(query: &str, watch: bool, fields: FieldSet) -> Result<ListOptions, Status> {
        let mut o = ListOptions {
            watch,
            ..ListOptions::default()
        };
        let mut seen: Vec<String> = Vec::new();
        let mut raw_fields = String::new();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            // Like url.Values decoding into a struct: the first value wins.
            if seen.iter().any(|s| *s == k) {
                continue;
            }
            seen.push(k.to_string());
            match k.as_ref() {
                "resourceVersion" => o.resource_version = v.to_string(),
                "resourceVersionMatch" => o.resource_version_match = v.to_string(),
                "sendInitialEvents" => {
                    o.send_initial_events = Some(parse_bool("sendInitialEvents", &v)?)
                }
                "allowWatchBookmarks" => {
                    o.allow_watch_bookmarks = parse_bool("allowWatchBookmarks", &v)?
                }
                "limit" => o.limit = parse_int("limit", &v)?,
                "continue" => o.continue_token = v.to_string(),
                "timeoutSeconds" => o.timeout_seconds = Some(parse_int("timeoutSeconds", &v)?),
                "labelSelector" => {
                    o.label_selector = LabelSelector::parse(&v).map_err(Status::bad_request)?
                }
                "fieldSelector" => raw_fields = v.to_string(),
                "includeObject" => o.include_object = v.to_string(),
                _ => {}
            }
        }
        let parsed_fields = FieldSelector::parse(&raw_fields).map_err(Status::bad_request)?;
        o.set_defaults();
        let causes = o.validate();
        if !causes.is_empty() {
            return Err(Status::invalid_list_options(causes));
        }
        o.field_selector = fields
            .convert(&parsed_fields)
            .map_err(Status::bad_request)?;
        Ok(o)
    }

    /// `SetListOptionsDefaults` with the WatchList gate on (1.34+): a watch
    /// from RV ""/"0" without sendInitialEvents or resourceVersionMatch
    /// becomes a streaming list.
    fn set_defaults(&mut self) {
        if self.send_initial_events.is_some() || !self.resource_version_match.is_empty() {
            return;
        }
        let legacy = self.resource_version.is_empty() || self.resource_version == "0";
        if self.watch && legacy {
            self.send_initial_events = Some(true);
            self.resource_version_match = NOT_OLDER_THAN.to_string();
        }
    }

    /// `ValidateListOptions`, errors in the apiserver's order.
    fn validate(&self) -> Vec<Cause> {
        let mut errs = Vec::new();
        let m = self.resource_version_match.as_str();
        if self.watch {
            if self.send_initial_events.is_some() && m != NOT_OLDER_THAN {
                errs.push(forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            if !m.is_empty() {
                if self.send_initial_events.is_none() {
                    errs.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != NOT_OLDER_THAN {
                    errs.push(not_supported("resourceVersionMatch", m, &["NotOlderThan"]));
                }
                if !self.continue_token.is_empty() {
                    errs.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
            }
            return errs;
        }
        if !m.is_empty() {
            if self.resource_version.is_empty() {
                errs.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if !self.continue_token.is_empty() {
                errs.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if m != EXACT && m != NOT_OLDER_THAN {
                errs.push(not_supported(
                    "resourceVersionMatch",
                    m,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if m == EXACT && self.resource_version == "0" {
                errs.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if self.send_initial_events.is_some() {
            errs.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
        errs
    }
}

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueForbidden",
        message: format!("Forbidden: {detail}"),
        field: field.to_string(),
    }
}

fn not_supported(field: &str, value: &str, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported
        .iter()
        .map(|s| super::errors::go_quote(s))
        .collect();
    Cause {
        reason: "FieldValueNotSupported",
        message: format!(
            "Unsupported value: {}: supported values: {}",
            super::errors::go_quote(value),
            list.join(", ")
        ),
        field: field.to_string(),
    }
}

/// Parses a resourceVersion like `APIObjectVersioner.ParseResourceVersion`:
/// `""` and `"0"` are 0.
///
/// # Errors
/// The `strconv.ParseUint` message (see `errors::rv_parse_message`).
pub fn parse_rv(rv: &str) -> Result<u64, String> {
    if rv.is_empty() || rv == "0" {
        return Ok(0);
    }
    rv.parse::<u64>()
        .map_err(|_| super::errors::rv_parse_message(rv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(q: &str, watch: bool) -> String {
        ListOptions::parse(q, watch, FieldSet::Default)
            .unwrap_err()
            .message
    }

    #[test]
    fn list_validation_messages() {
        assert_eq!(
            msg("resourceVersionMatch=Sometimes&resourceVersion=5", false),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Unsupported value: \"Sometimes\": supported values: \"Exact\", \"NotOlderThan\", \"\""
        );
        assert_eq!(
            msg("sendInitialEvents=true", false),
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"
        );
        assert_eq!(
            msg("fieldSelector=spec.nodeName%3Dx", false),
            "\"spec.nodeName\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
    }

    #[test]
    fn watch_defaulting_and_validation() {
        let o = ListOptions::parse("resourceVersion=0", true, FieldSet::Default).unwrap();
        assert_eq!(
            (o.send_initial_events, o.resource_version_match.as_str()),
            (Some(true), "NotOlderThan")
        );
        let o = ListOptions::parse("resourceVersion=5", true, FieldSet::Default).unwrap();
        assert_eq!(o.send_initial_events, None);
        assert_eq!(
            msg("sendInitialEvents=true&resourceVersionMatch=Exact", true),
            "ListOptions.meta.k8s.io \"\" is invalid: [resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]"
        );
        assert_eq!(
            msg("resourceVersionMatch=NotOlderThan&resourceVersion=5", true),
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
        );
    }

    #[test]
    fn rv_parsing() {
        assert_eq!(parse_rv(""), Ok(0));
        assert_eq!(parse_rv("42"), Ok(42));
        assert!(parse_rv("-1").is_err());
    }
}
