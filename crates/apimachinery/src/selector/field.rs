//! Field selectors: `fields.ParseSelector` from
//! `staging/src/k8s.io/apimachinery/pkg/fields/selector.go`.
//!
//! Only `=`, `==` and `!=` exist; terms are split on unescaped commas and
//! values unescape `\,`, `\=` and `\\`. Which field names a resource accepts
//! is decided elsewhere (see `crate::resource`).

use std::fmt;

use super::Pairs;

/// One `field op value` term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldRequirement {
    pub field: String,
    /// `true` for `!=`.
    pub not_equals: bool,
    pub value: String,
}

/// A parsed field selector: terms ANDed, sorted like the apiserver's.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct FieldSelector {
    terms: Vec<FieldRequirement>,
}

// === impl FieldRequirement ===

impl FieldRequirement {
    /// Whether `fields` satisfy the term; a missing field is the empty string.
    pub fn matches<P: Pairs + ?Sized>(&self, fields: &P) -> bool {
        let v = fields.get(&self.field).unwrap_or("");
        (v == self.value) != self.not_equals
    }
}

// === impl FieldSelector ===

impl FieldSelector {
    /// Parses a selector string.
    ///
    /// # Errors
    /// The apiserver's message, e.g.
    /// `invalid selector: 'metadata.name'; can't understand 'metadata.name'`.
    pub fn parse(selector: &str) -> Result<FieldSelector, String> {
        let mut parts = split_terms(selector);
        parts.sort_unstable();
        let mut terms = Vec::with_capacity(parts.len());
        for part in parts {
            if part.is_empty() {
                continue;
            }
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(format!(
                    "invalid selector: '{selector}'; can't understand '{part}'"
                ));
            };
            let value = unescape_value(rhs)?;
            terms.push(FieldRequirement {
                field: lhs.to_string(),
                not_equals: op == "!=",
                value,
            });
        }
        Ok(FieldSelector { terms })
    }

    /// A selector from already-parsed terms.
    pub fn from_terms(mut terms: Vec<FieldRequirement>) -> FieldSelector {
        terms.sort_by_cached_key(term_string);
        FieldSelector { terms }
    }

    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The terms.
    pub fn terms(&self) -> &[FieldRequirement] {
        &self.terms
    }

    /// Whether `fields` satisfy every term.
    pub fn matches<P: Pairs + ?Sized>(&self, fields: &P) -> bool {
        self.terms.iter().all(|t| t.matches(fields))
    }

    /// `RequiresExactMatch`: the value an `=` term pins `field` to, if
    /// any.
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.not_equals)
            .map(|t| t.value.as_str())
    }

    /// Whether every term of `other` is also a term of `self`, so that every
    /// object `self` selects is selected by `other`.
    pub fn implies(&self, other: &FieldSelector) -> bool {
        other.terms.iter().all(|t| self.terms.contains(t))
    }

    /// A copy without the terms on `field`.
    pub fn without(&self, field: &str) -> FieldSelector {
        FieldSelector {
            terms: self
                .terms
                .iter()
                .filter(|t| t.field != field)
                .cloned()
                .collect(),
        }
    }
}

fn term_string(t: &FieldRequirement) -> String {
    format!(
        "{}{}{}",
        t.field,
        if t.not_equals { "!=" } else { "=" },
        escape_value(&t.value)
    )
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(&term_string(t))?;
        }
        Ok(())
    }
}

/// `EscapeValue`: escapes `\`, `,` and `=`.
pub fn escape_value(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Splits on commas not preceded by a backslash escape.
fn split_terms(selector: &str) -> Vec<&str> {
    if selector.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::with_capacity(1);
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in selector.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&selector[start..i]);
            start = i + 1;
        }
    }
    terms.push(&selector[start..]);
    terms
}

/// Splits at the first operator; `==` is tried before `=`.
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

fn unescape_value(s: &str) -> Result<String, String> {
    if !s.contains(['\\', ',', '=']) {
        return Ok(s.to_string());
    }
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(format!(
                        "invalid field selector: invalid escape sequence: \\{c}"
                    ));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                ));
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err("invalid field selector: invalid escape sequence: \\".to_string());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The apiserver sorts the raw parts before parsing them, so the order of
    /// terms depends on how they were spelled (`==` sorts after `=\x10`, `=`
    /// before it). Found by the `field_selector` fuzz target.
    #[test]
    fn term_order_follows_the_raw_text() {
        let sel = FieldSelector::parse("=\u{10}?,==").unwrap();
        let values: Vec<&str> = sel.terms().iter().map(|t| t.value.as_str()).collect();
        assert_eq!(values, ["\u{10}?", ""]);
        let printed = sel.to_string();
        assert_eq!(printed, "=\u{10}?,=");
        let again = FieldSelector::parse(&printed).unwrap();
        let values: Vec<&str> = again.terms().iter().map(|t| t.value.as_str()).collect();
        assert_eq!(values, ["", "\u{10}?"]);
        assert!(sel.implies(&again) && again.implies(&sel));
    }

    #[test]
    fn recording_examples() {
        assert_eq!(
            FieldSelector::parse("metadata.name").unwrap_err(),
            "invalid selector: 'metadata.name'; can't understand 'metadata.name'"
        );
        let s = FieldSelector::parse("status.phase=Pending,spec.nodeName!=node-2").unwrap();
        assert!(s.matches(&fields(&[
            ("status.phase", "Pending"),
            ("spec.nodeName", "node-1")
        ])));
        assert!(!s.matches(&fields(&[
            ("status.phase", "Pending"),
            ("spec.nodeName", "node-2")
        ])));
        assert!(
            s.matches(&fields(&[("status.phase", "Pending")])),
            "missing is empty"
        );
    }

    #[test]
    fn operators_and_escapes() {
        let s = FieldSelector::parse("a==x,b=y\\,z").unwrap();
        assert_eq!(s.requires_exact_match("a"), Some("x"));
        assert_eq!(s.requires_exact_match("b"), Some("y,z"));
        assert_eq!(s.to_string(), "a=x,b=y\\,z");
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert!(FieldSelector::parse(",,").unwrap().is_empty());
        assert_eq!(
            FieldSelector::parse("a=b=c").unwrap_err(),
            "invalid field selector: unescaped character in value: 61"
        );
        assert_eq!(
            FieldSelector::parse("a=b\\").unwrap_err(),
            "invalid field selector: invalid escape sequence: \\"
        );
        assert_eq!(
            FieldSelector::parse("a=b\\q").unwrap_err(),
            "invalid field selector: invalid escape sequence: \\q"
        );
        let s = FieldSelector::parse("=x").unwrap();
        assert_eq!(s.terms()[0].field, "");
    }

    #[test]
    fn implication() {
        let scope = FieldSelector::parse("spec.nodeName=n1").unwrap();
        let req = FieldSelector::parse("status.phase=Running,spec.nodeName=n1").unwrap();
        assert!(req.implies(&scope));
        assert!(
            !FieldSelector::parse("spec.nodeName=n2")
                .unwrap()
                .implies(&scope)
        );
        assert!(!FieldSelector::parse("").unwrap().implies(&scope));
        assert!(req.implies(&FieldSelector::default()));
    }
}
