//! Counters read from Prometheus text (the proxy's `/metrics` on its admin
//! port, kube-apiserver's `/metrics`), and their growth over a run.
//!
//! The text format: one sample per line, `name{label="value",...} value`,
//! label values escaped with `\\`, `\"` and `\n`
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>).

use std::collections::BTreeMap;

/// One sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key` ("" when absent, as Prometheus reads it).
    pub fn label(&self, key: &str) -> &str {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// Every sample of `text`; comments and lines that do not parse are
/// skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end = loop {
            // Skip separators, find the key.
            while let Some((_, c)) = chars.peek() {
                if *c == ',' || *c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            let (start, c) = chars.next()?;
            if c == '}' {
                break start + 1;
            }
            let eq = inner[start..].find('=')? + start;
            let key = inner[start..eq].trim().to_string();
            // Advance to the opening quote.
            while let Some((i, _)) = chars.peek() {
                if *i > eq {
                    break;
                }
                chars.next();
            }
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()? {
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, '"') => break,
                    (_, c) => value.push(c),
                }
            }
            labels.push((key, value));
        };
        rest = &inner[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// How much each series of counter `name` grew from `before` to `after`,
/// summed by the values of `keys`; series that did not grow are left out.
pub fn growth(
    before: &[Sample],
    after: &[Sample],
    name: &str,
    keys: &[&str],
) -> BTreeMap<Vec<String>, f64> {
    let sum = |samples: &[Sample]| {
        let mut m: BTreeMap<Vec<String>, f64> = BTreeMap::new();
        for s in samples.iter().filter(|s| s.name == name) {
            let key = keys.iter().map(|k| s.label(k).to_string()).collect();
            *m.entry(key).or_default() += s.value;
        }
        m
    };
    let b = sum(before);
    let mut out = sum(after);
    for (k, v) in &mut out {
        *v -= b.get(k).copied().unwrap_or(0.0);
    }
    out.retain(|_, v| *v > 0.0);
    out
}

/// [`growth`] as one line, `a/b=n c/d=m` ("none" when nothing grew).
pub fn growth_line(before: &[Sample], after: &[Sample], name: &str, keys: &[&str]) -> String {
    let g = growth(before, after, name, keys);
    if g.is_empty() {
        return "none".into();
    }
    g.iter()
        .map(|(k, v)| format!("{}={v:.0}", k.join("/")))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_samples_and_growth() {
        let before = parse(
            "# HELP x y\n# TYPE apiserver_request_total counter\n\
             apiserver_request_total{code=\"200\",resource=\"configmaps\",verb=\"LIST\"} 3\n\
             apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 7\n\
             up 1\n",
        );
        assert_eq!(before.len(), 3);
        assert_eq!(before[0].label("verb"), "LIST");
        assert_eq!(before[2].name, "up");
        assert_eq!(before[2].value, 1.0);
        let after = parse(
            "apiserver_request_total{code=\"200\",resource=\"configmaps\",verb=\"LIST\"} 5\n\
             apiserver_request_total{code=\"500\",resource=\"configmaps\",verb=\"LIST\"} 1\n\
             apiserver_request_total{code=\"200\",resource=\"pods\",verb=\"LIST\"} 7\n\
             apiserver_request_total{code=\"201\",resource=\"leases\",verb=\"POST\"} 4\n",
        );
        let g = growth(
            &before,
            &after,
            "apiserver_request_total",
            &["verb", "resource"],
        );
        assert_eq!(
            g.into_iter().collect::<Vec<_>>(),
            vec![
                (vec!["LIST".to_string(), "configmaps".to_string()], 3.0),
                (vec!["POST".to_string(), "leases".to_string()], 4.0),
            ]
        );
    }

    #[test]
    fn unescapes_label_values() {
        let s = parse(r#"m{a="x\"y,z}",b="\\n\n"} 2.5e3"#);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].label("a"), "x\"y,z}");
        assert_eq!(s[0].label("b"), "\\n\n");
        assert_eq!(s[0].label("c"), "");
        assert_eq!(s[0].value, 2500.0);
        assert!(parse("m{a=\"unterminated} 1").is_empty());
    }
}
