//! The syntax errors Go's `encoding/json` reports, so that 400s caused by a
//! malformed body or continue token carry the apiserver's exact message
//! (`invalid character 'n' looking for beginning of object key string`).
//!
//! A byte-level port of the state machine in Go's `encoding/json/scanner.go`:
//! `json.Unmarshal` runs it over the whole input before decoding, so the first
//! error it finds is the one the apiserver prints.

/// Checks `data` the way `json.Unmarshal`'s `checkValid` does.
///
/// # Errors
/// Go's `SyntaxError` message, e.g. `unexpected end of JSON input`.
pub fn check_valid(data: &[u8]) -> Result<(), String> {
    let mut s = Scanner::default();
    for &c in data {
        s.step(c)?;
    }
    s.eof()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Parse {
    ObjectKey,
    ObjectValue,
    ArrayValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    BeginValue,
    BeginValueOrEmpty,
    BeginStringOrEmpty,
    BeginString,
    EndValue,
    EndTop,
    InString,
    InStringEsc,
    InStringEscU(u8),
    Neg,
    One,
    Zero,
    Dot,
    Dot0,
    E,
    ESign,
    E0,
    Literal(&'static [u8], usize),
}

#[derive(Debug)]
struct Scanner {
    state: State,
    stack: Vec<Parse>,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            state: State::BeginValue,
            stack: Vec::new(),
        }
    }
}

fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

/// Go's `quoteChar`: the byte as a Go character literal.
fn quote_char(c: u8) -> String {
    match c {
        b'\'' => r"'\''".to_string(),
        b'"' => "'\"'".to_string(),
        0x07 => r"'\a'".to_string(),
        0x08 => r"'\b'".to_string(),
        0x0c => r"'\f'".to_string(),
        b'\n' => r"'\n'".to_string(),
        b'\r' => r"'\r'".to_string(),
        b'\t' => r"'\t'".to_string(),
        0x0b => r"'\v'".to_string(),
        b'\\' => r"'\\'".to_string(),
        0x20..=0x7e => format!("'{}'", c as char),
        _ => format!("'\\x{c:02x}'"),
    }
}

fn syntax(c: u8, context: &str) -> String {
    format!("invalid character {} {context}", quote_char(c))
}

// === impl Scanner ===

impl Scanner {
    fn eof(&mut self) -> Result<(), String> {
        if self.state == State::EndTop {
            return Ok(());
        }
        // A number at top level only ends when something follows it.
        if self.step(b' ').is_ok() && self.state == State::EndTop {
            return Ok(());
        }
        Err("unexpected end of JSON input".to_string())
    }

    fn end_value(&mut self) {
        self.state = if self.stack.is_empty() {
            State::EndTop
        } else {
            State::EndValue
        };
    }

    fn step(&mut self, c: u8) -> Result<(), String> {
        match self.state {
            State::BeginValueOrEmpty => {
                if is_space(c) {
                    return Ok(());
                }
                if c == b']' {
                    return self.step_end_value(c);
                }
                self.begin_value(c)
            }
            State::BeginValue => self.begin_value(c),
            State::BeginStringOrEmpty => {
                if is_space(c) {
                    return Ok(());
                }
                if c == b'}' {
                    if let Some(top) = self.stack.last_mut() {
                        *top = Parse::ObjectValue;
                    }
                    return self.step_end_value(c);
                }
                self.begin_string(c)
            }
            State::BeginString => self.begin_string(c),
            State::EndValue => self.step_end_value(c),
            State::EndTop => {
                if is_space(c) {
                    Ok(())
                } else {
                    Err(syntax(c, "after top-level value"))
                }
            }
            State::InString => {
                match c {
                    b'"' => self.end_value(),
                    b'\\' => self.state = State::InStringEsc,
                    0x00..=0x1f => return Err(syntax(c, "in string literal")),
                    _ => {}
                }
                Ok(())
            }
            State::InStringEsc => match c {
                b'b' | b'f' | b'n' | b'r' | b't' | b'\\' | b'/' | b'"' => {
                    self.state = State::InString;
                    Ok(())
                }
                b'u' => {
                    self.state = State::InStringEscU(0);
                    Ok(())
                }
                _ => Err(syntax(c, "in string escape code")),
            },
            State::InStringEscU(n) => {
                if !c.is_ascii_hexdigit() {
                    return Err(syntax(c, "in \\u hexadecimal character escape"));
                }
                self.state = if n == 3 {
                    State::InString
                } else {
                    State::InStringEscU(n + 1)
                };
                Ok(())
            }
            State::Neg => match c {
                b'0' => {
                    self.state = State::Zero;
                    Ok(())
                }
                b'1'..=b'9' => {
                    self.state = State::One;
                    Ok(())
                }
                _ => Err(syntax(c, "in numeric literal")),
            },
            State::One => {
                if c.is_ascii_digit() {
                    return Ok(());
                }
                self.after_zero(c)
            }
            State::Zero => self.after_zero(c),
            State::Dot => {
                if c.is_ascii_digit() {
                    self.state = State::Dot0;
                    Ok(())
                } else {
                    Err(syntax(c, "after decimal point in numeric literal"))
                }
            }
            State::Dot0 => {
                if c.is_ascii_digit() {
                    return Ok(());
                }
                if c == b'e' || c == b'E' {
                    self.state = State::E;
                    return Ok(());
                }
                self.end_number(c)
            }
            State::E => {
                if c == b'+' || c == b'-' {
                    self.state = State::ESign;
                    return Ok(());
                }
                self.e_sign(c)
            }
            State::ESign => self.e_sign(c),
            State::E0 => {
                if c.is_ascii_digit() {
                    return Ok(());
                }
                self.end_number(c)
            }
            State::Literal(lit, i) => {
                if c != lit[i] {
                    let word = std::str::from_utf8(lit).unwrap_or_default();
                    return Err(syntax(
                        c,
                        &format!("in literal {word} (expecting {})", quote_char(lit[i])),
                    ));
                }
                if i + 1 == lit.len() {
                    self.end_value();
                } else {
                    self.state = State::Literal(lit, i + 1);
                }
                Ok(())
            }
        }
    }

    fn begin_value(&mut self, c: u8) -> Result<(), String> {
        if is_space(c) {
            return Ok(());
        }
        self.state = match c {
            b'{' => {
                self.stack.push(Parse::ObjectKey);
                State::BeginStringOrEmpty
            }
            b'[' => {
                self.stack.push(Parse::ArrayValue);
                State::BeginValueOrEmpty
            }
            b'"' => State::InString,
            b'-' => State::Neg,
            b'0' => State::Zero,
            b'1'..=b'9' => State::One,
            b't' => State::Literal(b"true", 1),
            b'f' => State::Literal(b"false", 1),
            b'n' => State::Literal(b"null", 1),
            _ => return Err(syntax(c, "looking for beginning of value")),
        };
        Ok(())
    }

    fn begin_string(&mut self, c: u8) -> Result<(), String> {
        if is_space(c) {
            return Ok(());
        }
        if c == b'"' {
            self.state = State::InString;
            return Ok(());
        }
        Err(syntax(c, "looking for beginning of object key string"))
    }

    fn after_zero(&mut self, c: u8) -> Result<(), String> {
        match c {
            b'.' => {
                self.state = State::Dot;
                Ok(())
            }
            b'e' | b'E' => {
                self.state = State::E;
                Ok(())
            }
            _ => self.end_number(c),
        }
    }

    fn e_sign(&mut self, c: u8) -> Result<(), String> {
        if c.is_ascii_digit() {
            self.state = State::E0;
            Ok(())
        } else {
            Err(syntax(c, "in exponent of numeric literal"))
        }
    }

    fn end_number(&mut self, c: u8) -> Result<(), String> {
        self.end_value();
        if self.state == State::EndTop {
            return self.step(c);
        }
        self.step_end_value(c)
    }

    fn step_end_value(&mut self, c: u8) -> Result<(), String> {
        let Some(&top) = self.stack.last() else {
            self.state = State::EndTop;
            return self.step(c);
        };
        if is_space(c) {
            self.state = State::EndValue;
            return Ok(());
        }
        match top {
            Parse::ObjectKey => {
                if c == b':' {
                    if let Some(t) = self.stack.last_mut() {
                        *t = Parse::ObjectValue;
                    }
                    self.state = State::BeginValue;
                    return Ok(());
                }
                Err(syntax(c, "after object key"))
            }
            Parse::ObjectValue => match c {
                b',' => {
                    if let Some(t) = self.stack.last_mut() {
                        *t = Parse::ObjectKey;
                    }
                    self.state = State::BeginString;
                    Ok(())
                }
                b'}' => {
                    self.stack.pop();
                    self.end_value();
                    Ok(())
                }
                _ => Err(syntax(c, "after object key:value pair")),
            },
            Parse::ArrayValue => match c {
                b',' => {
                    self.state = State::BeginValue;
                    Ok(())
                }
                b']' => {
                    self.stack.pop();
                    self.end_value();
                    Ok(())
                }
                _ => Err(syntax(c, "after array element")),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &[u8]) -> String {
        check_valid(s).unwrap_err()
    }

    #[test]
    fn valid_documents_pass() {
        for s in [
            &b"{}"[..],
            b" {\"a\": [1, -2.5e+3, true, false, null, \"x\\u00e9\"]} ",
            b"0",
            b"123",
            b"[]",
            b"[{}, []]",
        ] {
            assert_eq!(check_valid(s), Ok(()), "{}", String::from_utf8_lossy(s));
        }
    }

    #[test]
    fn messages_match_go() {
        assert_eq!(
            err(b"{not json"),
            "invalid character 'n' looking for beginning of object key string"
        );
        assert_eq!(
            err(&[0x81, 0x01]),
            "invalid character '\\x81' looking for beginning of value"
        );
        assert_eq!(err(b"{\"a\":1"), "unexpected end of JSON input");
        assert_eq!(err(b""), "unexpected end of JSON input");
        assert_eq!(err(b"{\"a\" 1}"), "invalid character '1' after object key");
        assert_eq!(
            err(b"{\"a\":1 \"b\"}"),
            "invalid character '\"' after object key:value pair"
        );
        assert_eq!(err(b"[1 2]"), "invalid character '2' after array element");
        assert_eq!(err(b"{} x"), "invalid character 'x' after top-level value");
        assert_eq!(
            err(b"[tru]"),
            "invalid character ']' in literal true (expecting 'e')"
        );
        assert_eq!(err(b"[-x]"), "invalid character 'x' in numeric literal");
        assert_eq!(err(b"01"), "invalid character '1' after top-level value");
    }
}
