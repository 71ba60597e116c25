//! Logs as Kubernetes components write them: `-v`/`--v` verbosity levels
//! (klog's) and `--logging-format=text|json`, on stderr.
//!
//! - Verbosity: klog's levels mapped to tracing's. `0`–`3`: errors,
//!   warnings and informational messages (the default, `0`); `4`–`5`:
//!   also the proxy's debug messages (klog's `--v=4`, "debug level");
//!   `6`–`7`: the proxy's trace messages and its libraries' debug
//!   messages; `8` and more: everything. `RUST_LOG`, when set, overrides
//!   `-v` with tracing's own directives (`RUST_LOG=kube_cache_proxy=debug`).
//! - `text`: one human-readable line per event; ANSI colours only when
//!   stderr is a terminal (never in a file or a container log), and never
//!   with `NO_COLOR` set.
//! - `json`: one flat JSON object per line with the keys of Kubernetes'
//!   JSON log format (`component-base/logs/json`, the structured logging
//!   KEP-1602): `ts` (seconds since the Unix epoch, a float), `caller`
//!   (`file:line`), `msg`, `v` (the klog verbosity of the message, absent
//!   for errors), `err` (an `error` field), then the event's other fields
//!   and those of its spans, each as its own key.

use std::fmt;
use std::io::IsTerminal;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::component::cli::LogFormat;

/// The tracing filter for klog verbosity `v` (see the module docs).
pub fn filter_directives(v: u8) -> &'static str {
    match v {
        0..=3 => "info",
        4..=5 => "info,kube_cache_proxy=debug,apimachinery=debug",
        6..=7 => "debug,kube_cache_proxy=trace,apimachinery=trace",
        _ => "trace",
    }
}

/// The filter: `RUST_LOG` when set (and valid), else `-v`'s.
fn filter(v: u8) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter_directives(v)))
}

/// Installs the global subscriber. Call once, first thing.
pub fn init(format: LogFormat, v: u8) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(v))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => {
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(ansi).init();
        }
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonFields::new())
            .event_format(KubeJson)
            .init(),
    }
}

/// The klog verbosity a tracing level corresponds to (the inverse of
/// [`filter_directives`]).
fn verbosity(level: &Level) -> Option<u8> {
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(4),
        Level::TRACE => Some(6),
    }
}

/// Kubernetes' JSON log line format (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct KubeJson;

impl<S, N> FormatEvent<S, N> for KubeJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        line.insert("ts".into(), Value::from(ts));
        if let (Some(file), Some(n)) = (meta.file(), meta.line()) {
            line.insert("caller".into(), Value::from(format!("{file}:{n}")));
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        line.insert(
            "msg".into(),
            Value::from(fields.message.take().unwrap_or_default()),
        );
        if let Some(v) = verbosity(meta.level()) {
            line.insert("v".into(), Value::from(v));
        }
        // The spans' fields (outermost first), then the event's own, each
        // as a key of its own; the event's win.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                // Recorded by JsonFields: a JSON object.
                if let Some(f) = ext.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(map)) = serde_json::from_str::<Value>(&f.fields)
                {
                    line.extend(map);
                }
            }
        }
        line.extend(fields.map);
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// An event's fields: `message` apart, `error` renamed `err` (Kubernetes'
/// key), every other field by its name.
#[derive(Default)]
struct Fields {
    message: Option<String>,
    map: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => {
                self.message = Some(match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                });
            }
            "error" => {
                self.map.insert("err".into(), value);
            }
            name => {
                self.map.insert(name.to_string(), value);
            }
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::from(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::from(value.to_string()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_are_flat_with_kubernetes_keys() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(filter_directives(4)))
            .with_writer(move || writer.clone())
            .fmt_fields(JsonFields::new())
            .event_format(KubeJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", verb = "list");
            let _g = span.enter();
            tracing::info!(resource = "pods", objects = 3u64, "listed from upstream");
            tracing::warn!(error = %"boom", "upstream watch failed");
            tracing::debug!("a debug line");
            tracing::trace!("not at -v 4");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["msg"], "listed from upstream");
        assert_eq!(lines[0]["v"], 0);
        assert_eq!(lines[0]["resource"], "pods");
        assert_eq!(lines[0]["objects"], 3);
        assert_eq!(lines[0]["verb"], "list");
        assert!(lines[0]["ts"].as_f64().unwrap() > 1.6e9);
        assert!(
            lines[0]["caller"]
                .as_str()
                .unwrap()
                .starts_with("src/component/logging.rs:")
        );
        assert!(lines[0].get("message").is_none() && lines[0].get("fields").is_none());
        assert_eq!(lines[1]["err"], "boom");
        assert_eq!(lines[2]["v"], 4);
    }

    #[test]
    fn verbosity_maps_to_levels() {
        assert_eq!(filter_directives(0), "info");
        assert!(filter_directives(4).contains("kube_cache_proxy=debug"));
        assert!(filter_directives(6).contains("kube_cache_proxy=trace"));
        assert_eq!(filter_directives(10), "trace");
    }
}
