//! Go-compatible encodings, for bodies and messages byte-identical to
//! kube-apiserver's: JSON as Go's `encoding/json` writes it (compact,
//! `<`, `>` and `&` escaped as `\u003c`, `\u003e` and `\u0026`,
//! U+2028/U+2029 escaped, floats in Go's shortest form; `json.Encoder`
//! ends every value with a newline, as [`to_line`] does), and strings
//! quoted as Go's `strconv.Quote` (`%q`) quotes them ([`quote`]).

use std::io;

use bytes::Bytes;
use serde::Serialize;
use serde_json::ser::Formatter;

/// A `serde_json` formatter producing Go's `encoding/json` output.
#[derive(Debug, Clone, Copy, Default)]
pub struct GoFormatter;

impl Formatter for GoFormatter {
    fn write_string_fragment<W>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        // serde_json has already escaped quotes, backslashes and control
        // characters; what is left is Go's HTML-safe set and the two line
        // separators JavaScript treats as newlines.
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            let escaped: &[u8] = match c {
                '<' => b"\\u003c",
                '>' => b"\\u003e",
                '&' => b"\\u0026",
                '\u{2028}' => b"\\u2028",
                '\u{2029}' => b"\\u2029",
                _ => continue,
            };
            writer.write_all(&fragment.as_bytes()[start..i])?;
            writer.write_all(escaped)?;
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }

    fn write_f64<W>(&mut self, writer: &mut W, value: f64) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        writer.write_all(go_float(value).as_bytes())
    }

    fn write_f32<W>(&mut self, writer: &mut W, value: f32) -> io::Result<()>
    where
        W: ?Sized + io::Write,
    {
        writer.write_all(go_float(f64::from(value)).as_bytes())
    }
}

/// Go's `floatEncoder` for float64: shortest representation, decimal form
/// unless the magnitude is below 1e-6 or at least 1e21, exponents with a
/// sign and without a leading zero (`1e+21`, `1e-7`).
fn go_float(value: f64) -> String {
    let abs = value.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let s = format!("{value:e}");
        // Rust writes `1e21` / `1e-7`; Go writes `1e+21` / `1e-7`.
        match s.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => s,
        }
    } else {
        format!("{value}")
    }
}

/// Encodes `value` as Go would, without a trailing newline.
pub fn to_vec<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter);
    // Serializing `Value`s and plain structs into a Vec cannot fail: there
    // is no I/O error and no non-string map key in what the sim encodes.
    if value.serialize(&mut ser).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
    out
}

/// Go's `json.MarshalIndent(value, "", "  ")`: two-space indentation,
/// `": "` after keys, Go's escaping; no trailing newline.
pub fn to_vec_indented<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    struct Indented(serde_json::ser::PrettyFormatter<'static>);
    macro_rules! delegate {
        ($($name:ident($($arg:ident: $t:ty),*)),* $(,)?) => {$(
            fn $name<W: ?Sized + io::Write>(&mut self, w: &mut W $(, $arg: $t)*) -> io::Result<()> {
                self.0.$name(w $(, $arg)*)
            }
        )*};
    }
    impl Formatter for Indented {
        delegate!(
            begin_array(),
            end_array(),
            begin_array_value(first: bool),
            end_array_value(),
            begin_object(),
            end_object(),
            begin_object_key(first: bool),
            begin_object_value(),
            end_object_value(),
        );
        fn write_string_fragment<W: ?Sized + io::Write>(
            &mut self,
            w: &mut W,
            fragment: &str,
        ) -> io::Result<()> {
            GoFormatter.write_string_fragment(w, fragment)
        }
        fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
            GoFormatter.write_f64(w, value)
        }
    }
    let mut out = Vec::with_capacity(512);
    let mut ser = serde_json::Serializer::with_formatter(
        &mut out,
        Indented(serde_json::ser::PrettyFormatter::with_indent(b"  ")),
    );
    if value.serialize(&mut ser).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
    out
}

/// Encodes `value` as Go's `json.Encoder` does: followed by `\n`.
pub fn to_line<T: Serialize + ?Sized>(value: &T) -> Bytes {
    let mut out = to_vec(value);
    out.push(b'\n');
    Bytes::from(out)
}

/// Go's `strconv.Quote`: double quotes, `\"` and `\\` escaped, control and
/// non-printable characters escaped, printable Unicode kept.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            // Go's IsPrint rejects controls and every space but U+0020.
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let n = c as u32;
                if n > 0xffff {
                    out.push_str(&format!("\\U{n:08x}"));
                } else {
                    out.push_str(&format!("\\u{n:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn enc(v: &serde_json::Value) -> String {
        String::from_utf8(to_vec(v)).unwrap()
    }

    #[test]
    fn html_characters_are_escaped_like_go() {
        assert_eq!(
            enc(&json!({"m": "a<b>&c", "<k>": 1})),
            r#"{"m":"a\u003cb\u003e\u0026c","\u003ck\u003e":1}"#
        );
        assert_eq!(enc(&json!("x\u{2028}y\u{2029}")), r#""x\u2028y\u2029""#);
        assert_eq!(
            enc(&json!("q\"\\\n\t\u{1}\u{7f}é")),
            "\"q\\\"\\\\\\n\\t\\u0001\u{7f}é\""
        );
    }

    #[test]
    fn floats_are_formatted_like_go() {
        assert_eq!(enc(&json!(1.0)), "1");
        assert_eq!(enc(&json!(0.5)), "0.5");
        assert_eq!(enc(&json!(1e21)), "1e+21");
        assert_eq!(enc(&json!(1.5e-7)), "1.5e-7");
        assert_eq!(enc(&json!(1e-10)), "1e-10");
        assert_eq!(enc(&json!(123456789.0)), "123456789");
        assert_eq!(enc(&json!(-0.000001)), "-0.000001");
    }

    #[test]
    fn order_is_kept_and_line_ends_with_newline() {
        let v = json!({"kind": "X", "apiVersion": "v1", "a": [1, 2]});
        assert_eq!(
            &to_line(&v)[..],
            b"{\"kind\":\"X\",\"apiVersion\":\"v1\",\"a\":[1,2]}\n"
        );
    }
}
