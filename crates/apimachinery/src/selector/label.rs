//! Label selectors: `labels.Parse` from
//! `staging/src/k8s.io/apimachinery/pkg/labels/selector.go`, with its lexer,
//! grammar and error messages.

use std::collections::BTreeSet;
use std::fmt;

use super::Pairs;
use super::validation::{is_qualified_name, is_valid_label_value};

/// A selector operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operator {
    /// `=`
    Equals,
    /// `==`
    DoubleEquals,
    /// `!=`
    NotEquals,
    /// `in (...)`
    In,
    /// `notin (...)`
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key > n`
    GreaterThan,
    /// `key < n`
    LessThan,
}

impl Operator {
    /// The operator as `selection.Operator` spells it (SubjectAccessReviews
    /// spell them as `LabelSelectorRequirement` operators instead; the
    /// proxy maps them in `auth/access.rs`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operator::Equals => "=",
            Operator::DoubleEquals => "==",
            Operator::NotEquals => "!=",
            Operator::In => "in",
            Operator::NotIn => "notin",
            Operator::Exists => "exists",
            Operator::DoesNotExist => "!",
            Operator::GreaterThan => "gt",
            Operator::LessThan => "lt",
        }
    }
}

/// One `key op values` term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    /// Sorted and deduplicated, like Go's `sets.String.List()`.
    pub values: Vec<String>,
}

/// A parsed label selector: requirements ANDed. Empty selects everything.
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

// === impl Requirement ===

impl Requirement {
    /// Whether `labels` satisfy this requirement.
    pub fn matches<P: Pairs + ?Sized>(&self, labels: &P) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::Equals | Operator::DoubleEquals | Operator::In => {
                value.is_some_and(|v| self.values.iter().any(|x| x == v))
            }
            Operator::NotEquals | Operator::NotIn => {
                value.is_none_or(|v| !self.values.iter().any(|x| x == v))
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let Some(v) = value.and_then(|v| v.parse::<i64>().ok()) else {
                    return false;
                };
                let Some(bound) = self.values.first().and_then(|b| b.parse::<i64>().ok()) else {
                    return false;
                };
                if self.operator == Operator::GreaterThan {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    /// `Requirement.String()`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.operator == Operator::DoesNotExist {
            f.write_str("!")?;
        }
        f.write_str(&self.key)?;
        match self.operator {
            Operator::Exists | Operator::DoesNotExist => return Ok(()),
            Operator::Equals => f.write_str("=")?,
            Operator::DoubleEquals => f.write_str("==")?,
            Operator::NotEquals => f.write_str("!=")?,
            Operator::In => f.write_str(" in ")?,
            Operator::NotIn => f.write_str(" notin ")?,
            Operator::GreaterThan => f.write_str(">")?,
            Operator::LessThan => f.write_str("<")?,
        }
        let set = matches!(self.operator, Operator::In | Operator::NotIn);
        if set {
            f.write_str("(")?;
        }
        f.write_str(&self.values.join(","))?;
        if set {
            f.write_str(")")?;
        }
        Ok(())
    }
}

// === impl LabelSelector ===

impl LabelSelector {
    /// Parses a selector string.
    ///
    /// # Errors
    /// The message the apiserver puts in its `400 BadRequest`, for example
    /// `unable to parse requirement: found '', expected: ',' or ')'`.
    pub fn parse(input: &str) -> Result<LabelSelector, String> {
        let mut parser = Parser::new(input);
        let mut requirements = parser.parse()?;
        // `internalSelector` is sorted by key so that String() is canonical.
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Whether the selector has no requirements (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches<P: Pairs + ?Sized>(&self, labels: &P) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// If the selector requires `key` to equal exactly one value, that value.
    pub fn requires_exact_match(&self, key: &str) -> Option<&str> {
        self.requirements.iter().find_map(|r| {
            (r.key == key
                && matches!(
                    r.operator,
                    Operator::Equals | Operator::DoubleEquals | Operator::In
                )
                && r.values.len() == 1)
                .then(|| r.values[0].as_str())
        })
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

// === lexer ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Error,
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

fn special_token(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special(c: u8) -> bool {
    matches!(c, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Lexer<'a> {
    fn lex(&mut self) -> (Token, String) {
        while self.pos < self.s.len() && is_whitespace(self.s[self.pos]) {
            self.pos += 1;
        }
        let Some(&c) = self.s.get(self.pos) else {
            return (Token::EndOfString, String::new());
        };
        if is_special(c) {
            self.scan_special()
        } else {
            self.scan_id_or_keyword()
        }
    }

    fn scan_id_or_keyword(&mut self) -> (Token, String) {
        let start = self.pos;
        while self.pos < self.s.len() {
            let c = self.s[self.pos];
            if is_whitespace(c) || is_special(c) {
                break;
            }
            self.pos += 1;
        }
        let lit = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        let tok = match lit.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier,
        };
        (tok, lit)
    }

    fn scan_special(&mut self) -> (Token, String) {
        let start = self.pos;
        let mut last: Option<(Token, usize)> = None;
        while self.pos < self.s.len() && is_special(self.s[self.pos]) {
            self.pos += 1;
            if let Some(tok) = special_token(&self.s[start..self.pos]) {
                last = Some((tok, self.pos));
            } else if last.is_some() {
                self.pos -= 1;
                break;
            }
        }
        match last {
            Some((tok, end)) => {
                self.pos = end;
                (
                    tok,
                    String::from_utf8_lossy(&self.s[start..end]).into_owned(),
                )
            }
            None => (
                Token::Error,
                format!(
                    "error expected: keyword found '{}'",
                    String::from_utf8_lossy(&self.s[start..self.pos])
                ),
            ),
        }
    }
}

// === parser ===

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<(Token, String)>,
    pos: usize,
}

impl Parser {
    fn new(input: &str) -> Parser {
        let mut lexer = Lexer {
            s: input.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let (tok, lit) = lexer.lex();
            let end = tok == Token::EndOfString;
            items.push((tok, lit));
            if end {
                break;
            }
        }
        Parser { items, pos: 0 }
    }

    fn item(&self, ctx: Context) -> (Token, String) {
        let (mut tok, lit) = self
            .items
            .get(self.pos)
            .cloned()
            .unwrap_or((Token::EndOfString, String::new()));
        if ctx == Context::Values && matches!(tok, Token::In | Token::NotIn) {
            tok = Token::Identifier;
        }
        (tok, lit)
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        self.item(ctx)
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        let item = self.item(ctx);
        if self.pos < self.items.len() {
            self.pos += 1;
        }
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, String> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::EndOfString => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                ));
                            }
                        }
                        _ => {
                            return Err(format!("found '{l}', expected: ',' or 'end of string'"));
                        }
                    }
                }
                Token::EndOfString => return Ok(requirements),
                _ => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, String> {
        let (key, mut operator) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = operator {
            return new_requirement(key, op, Vec::new());
        }
        let op = self.parse_operator()?;
        operator = Some(op);
        let values = match op {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, operator.unwrap_or(op), values.into_iter().collect())
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Operator>), String> {
        let mut operator = None;
        let (mut tok, mut lit) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            operator = Some(Operator::DoesNotExist);
            (tok, lit) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(format!("found '{lit}', expected: identifier"));
        }
        validate_key(&lit)?;
        let (t, _) = self.lookahead(Context::Values);
        if (t == Token::EndOfString || t == Token::Comma) && operator.is_none() {
            operator = Some(Operator::Exists);
        }
        Ok((lit, operator))
    }

    fn parse_operator(&mut self) -> Result<Operator, String> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(format!(
                    "found '{lit}', expected: '=', '!=', '==', 'in', notin'"
                ));
            }
        })
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let s = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    return Err(format!("found '{lit}', expected: ')'"));
                }
                Ok(s)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, String> {
        let mut s = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    s.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(s),
                        _ => return Err(format!("found '{lit2}', expected: ',' or ')'")),
                    }
                }
                Token::Comma => {
                    if s.is_empty() {
                        s.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar {
                        s.insert(String::new());
                        return Ok(s);
                    }
                    if tok2 == Token::Comma {
                        self.consume(Context::Values);
                        s.insert(String::new());
                    }
                }
                _ => return Err(format!("found '{lit}', expected: ',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, String> {
        let (tok, _) = self.lookahead(Context::Values);
        if tok == Token::EndOfString || tok == Token::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            return Ok(BTreeSet::from([lit]));
        }
        Err(format!("found '{lit}', expected: identifier"))
    }
}

fn validate_key(key: &str) -> Result<(), String> {
    let errs = is_qualified_name(key);
    if errs.is_empty() {
        Ok(())
    } else {
        // The apiserver parses without a field path, so the path prints as
        // `(*field.Path)(nil).String()`, i.e. `<nil>`.
        Err(format!(
            "<nil>: Invalid value: {key:?}: {}",
            errs.join("; ")
        ))
    }
}

/// `NewRequirement`: validates operator arity and values.
fn new_requirement(
    key: String,
    operator: Operator,
    values: Vec<String>,
) -> Result<Requirement, String> {
    // The key was validated by the parser before the operator was read.
    let mut errs: Vec<String> = Vec::new();
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => errs.push(format!(
            "values: Invalid value: {}: for 'in', 'notin' operators, values set can't be empty",
            go_string_slice(&values)
        )),
        Operator::Equals | Operator::DoubleEquals | Operator::NotEquals if values.len() != 1 => {
            errs.push(format!(
                "values: Invalid value: {}: exact-match compatibility requires one single value",
                go_string_slice(&values)
            ))
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(format!(
                    "values: Invalid value: {}: for 'Gt', 'Lt' operators, exactly one value is required",
                    go_string_slice(&values)
                ));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(format!(
                        "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
        }
        _ => {}
    }
    for (i, v) in values.iter().enumerate() {
        let problems = is_valid_label_value(v);
        if !problems.is_empty() {
            errs.push(format!(
                "values[{i}][{key}]: Invalid value: {v:?}: {}",
                problems.join("; ")
            ));
        }
    }
    match errs.len() {
        0 => Ok(Requirement {
            key,
            operator,
            values,
        }),
        1 => Err(errs.remove(0)),
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

/// `%#v` of a `[]string`.
fn go_string_slice(values: &[String]) -> String {
    let inner = values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!("[]string{{{inner}}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap()
    }

    #[test]
    fn recording_examples() {
        let a = labels(&[("app", "a")]);
        let b = labels(&[("app", "b")]);
        let s = sel("app in (a,b),app!=b");
        assert!(s.matches(&a));
        assert!(!s.matches(&b));
        assert_eq!(
            LabelSelector::parse("app in (a").unwrap_err(),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
    }

    #[test]
    fn operators() {
        let l = labels(&[("a", "1"), ("b", "x")]);
        assert!(sel("").matches(&l));
        assert!(sel("a").matches(&l));
        assert!(!sel("!a").matches(&l));
        assert!(sel("!c").matches(&l));
        assert!(sel("a==1").matches(&l));
        assert!(sel("c!=1").matches(&l), "!= matches a missing key");
        assert!(
            sel("c notin (1)").matches(&l),
            "notin matches a missing key"
        );
        assert!(!sel("c in (1)").matches(&l));
        assert!(sel("a>0").matches(&l));
        assert!(!sel("a<0").matches(&l));
        assert!(!sel("b>0").matches(&l));
        assert!(sel(" a = 1 , b in ( x , y ) ").matches(&l));
        assert!(sel("a=").matches(&labels(&[("a", "")])));
    }

    #[test]
    fn errors() {
        assert_eq!(
            LabelSelector::parse("a=1,").unwrap_err(),
            "found '', expected: identifier after ','"
        );
        assert_eq!(
            LabelSelector::parse("a b").unwrap_err(),
            "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'"
        );
        assert_eq!(
            LabelSelector::parse("a in b").unwrap_err(),
            "unable to parse requirement: found 'b' expected: '('"
        );
        assert_eq!(
            LabelSelector::parse("(").unwrap_err(),
            "found '(', expected: !, identifier, or 'end of string'"
        );
        assert!(
            LabelSelector::parse("a>b")
                .unwrap_err()
                .contains("must be an integer")
        );
        assert!(
            LabelSelector::parse("-a=1")
                .unwrap_err()
                .starts_with("unable to parse requirement: <nil>: Invalid value: \"-a\"")
        );
        assert!(LabelSelector::parse("a=-1-").is_err());
        assert!(LabelSelector::parse("a=>1").is_err());
    }

    #[test]
    fn display_is_canonical() {
        assert_eq!(sel("b in (y,x),a=1,!c").to_string(), "a=1,b in (x,y),!c");
    }

    #[test]
    fn exact_match() {
        assert_eq!(sel("a=1,b!=2").requires_exact_match("a"), Some("1"));
        assert_eq!(sel("b!=2").requires_exact_match("b"), None);
    }
}
