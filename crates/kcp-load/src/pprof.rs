//! Where kube-apiserver's CPU goes: a Go CPU profile (`/debug/pprof/profile`,
//! with `--profiling=true`; pprof's `profile.proto`, gzipped) summed by what
//! each sample's stack was doing.
//!
//! Each sample's CPU time goes to the first of [`PARTS`] one of whose
//! markers is a substring of a function on its stack: the parts a proxy
//! can take over (serving watches, lists and gets) are checked before what
//! every request pays (filters, I/O), so a watch handler's own encoding and
//! writing count as watch serving. The marker functions are read from the
//! v1.36 tree (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/`:
//! `ListResource` serves lists and, through `serveWatchHandler`, watches;
//! `storage/cacher/`: the watch cache's dispatch to its watchers).

use std::collections::HashMap;
use std::io::Read as _;

use anyhow::{Context as _, Result, bail};

/// What the apiserver's CPU is spent on, and the function-name markers of
/// each, in the order they are tried.
pub const PARTS: &[(&str, &[&str])] = &[
    (
        "watch: the watch cache's dispatch to watchers",
        &[
            "cacher.(*Cacher).dispatchEvent",
            "cacher.(*Cacher).dispatchEvents",
            "cacher.(*cacheWatcher).add",
            "cacher.(*cacheWatcher).nonblockingAdd",
        ],
    ),
    (
        "watch: serving watch streams",
        &[
            "handlers.serveWatchHandler",
            "handlers.(*WatchServer)",
            "cacher.(*cacheWatcher).process",
            "cacher.(*cacheWatcher).processInterval",
            "cacher.(*cacheWatcher).sendWatchCacheEvent",
            "cacher.(*cacheWatcher).convertToWatchEvent",
        ],
    ),
    ("list", &["handlers.ListResource"]),
    ("get", &["handlers.GetResource"]),
    (
        "authentication and authorization reviews (TokenReview, SubjectAccessReview)",
        &["subjectaccessreview", "tokenreview", "selfsubjectreview"],
    ),
    (
        "writes (create, update, patch, delete)",
        &[
            "handlers.createHandler",
            "handlers.CreateResource",
            "handlers.CreateNamedResource",
            "handlers.UpdateResource",
            "handlers.PatchResource",
            "handlers.DeleteResource",
            "handlers.DeleteCollection",
        ],
    ),
    (
        "storage: etcd client and the watch cache's own watch",
        &[
            "storage/etcd3",
            "go.etcd.io/etcd",
            "cacher.(*watchCache)",
            "cacher.(*Cacher).startCaching",
            "google.golang.org/grpc",
        ],
    ),
    (
        "request filters (authentication, authorization, priority and fairness)",
        &["pkg/endpoints/filters", "pkg/server/filters", "flowcontrol"],
    ),
    (
        "the apiserver's own informers and controllers",
        &[
            "client-go/tools/cache",
            "plugin/pkg/auth/authorizer/node",
            "pkg/controller",
            "controlplane/controller",
        ],
    ),
    (
        "HTTP/2, HTTP/1.1 and TLS I/O outside a handler",
        &[
            "golang.org/x/net/http2",
            "net/http.",
            "crypto/tls",
            "crypto/aes",
        ],
    ),
    (
        "Go runtime: garbage collection, scheduler",
        &[
            "runtime.gcBgMarkWorker",
            "runtime.bgsweep",
            "runtime.bgscavenge",
            "runtime.gcStart",
            "runtime.mcall",
            "runtime.morestack",
            "runtime.systemstack",
        ],
    ),
];

/// The part of samples matching none of [`PARTS`].
pub const OTHER: &str = "other";

#[derive(Clone, PartialEq, prost::Message)]
struct Profile {
    #[prost(message, repeated, tag = "1")]
    sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    sample: Vec<ProfileSample>,
    #[prost(message, repeated, tag = "4")]
    location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    string_table: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ValueType {
    #[prost(int64, tag = "1")]
    r#type: i64,
    #[prost(int64, tag = "2")]
    unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProfileSample {
    #[prost(uint64, repeated, tag = "1")]
    location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    value: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Location {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(message, repeated, tag = "4")]
    line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Line {
    #[prost(uint64, tag = "1")]
    function_id: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Function {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int64, tag = "2")]
    name: i64,
}

/// CPU seconds by part, in [`PARTS`] order then [`OTHER`], and the whole.
#[derive(Debug, Clone, Default)]
pub struct Breakdown {
    pub parts: Vec<(&'static str, f64)>,
    pub total: f64,
}

/// Reads a CPU profile (gzipped or not) into a [`Breakdown`].
///
/// # Errors
/// When it is not a CPU profile.
pub fn breakdown(bytes: &[u8]) -> Result<Breakdown> {
    let raw = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut out)
            .context("gunzipping the profile")?;
        out
    } else {
        bytes.to_vec()
    };
    let p: Profile = prost::Message::decode(raw.as_slice()).context("decoding the profile")?;
    let string = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| p.string_table.get(i))
            .map_or("", String::as_str)
    };
    // The value that is CPU time: `cpu`/`nanoseconds` (the second of a Go
    // CPU profile's `samples/count`, `cpu/nanoseconds`).
    let Some(cpu) = p
        .sample_type
        .iter()
        .position(|t| string(t.r#type) == "cpu" && string(t.unit) == "nanoseconds")
    else {
        bail!("not a CPU profile (no cpu/nanoseconds sample type)");
    };
    let functions: HashMap<u64, &str> = p.function.iter().map(|f| (f.id, string(f.name))).collect();
    let locations: HashMap<u64, Vec<&str>> = p
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .filter_map(|line| functions.get(&line.function_id).copied())
                .collect();
            (l.id, names)
        })
        .collect();
    let mut by_part = vec![0i64; PARTS.len() + 1];
    for s in &p.sample {
        let Some(&v) = s.value.get(cpu) else {
            continue;
        };
        let names: Vec<&str> = s
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .flatten()
            .copied()
            .collect();
        by_part[part_of(&names)] += v;
    }
    let parts: Vec<(&'static str, f64)> = PARTS
        .iter()
        .map(|(name, _)| *name)
        .chain([OTHER])
        .zip(by_part.iter().map(|&ns| ns as f64 / 1e9))
        .collect();
    let total = parts.iter().map(|(_, s)| s).sum();
    Ok(Breakdown { parts, total })
}

/// The index in [`PARTS`] (or `PARTS.len()`, other) of a stack's part.
fn part_of(stack: &[&str]) -> usize {
    PARTS
        .iter()
        .position(|(_, markers)| stack.iter().any(|f| markers.iter().any(|m| f.contains(m))))
        .unwrap_or(PARTS.len())
}

impl std::fmt::Display for Breakdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, s) in &self.parts {
            if *s > 0.0 {
                writeln!(
                    f,
                    "  {:5.1} %  {s:7.2} CPU s  {name}",
                    100.0 * s / self.total.max(f64::MIN_POSITIVE)
                )?;
            }
        }
        write!(f, "  100.0 %  {:7.2} CPU s  in all", self.total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    /// A profile of three samples: a watch handler's, a write's, and the
    /// garbage collector's, each counted once in its part.
    #[test]
    fn samples_go_to_the_first_part_on_their_stack() {
        let strings: Vec<String> = [
            "",
            "samples",
            "count",
            "cpu",
            "nanoseconds",
            "k8s.io/apiserver/pkg/endpoints/handlers.ListResource.func1",
            "k8s.io/apiserver/pkg/endpoints/handlers.serveWatchHandler",
            "k8s.io/apiserver/pkg/endpoints/filters.WithAuthorization.func1",
            "k8s.io/apiserver/pkg/endpoints/handlers.PatchResource.func1",
            "runtime.gcBgMarkWorker",
        ]
        .map(String::from)
        .to_vec();
        let function = |id: u64| Function {
            id,
            name: id as i64 + 4,
        };
        let location = |id: u64| Location {
            id,
            line: vec![Line { function_id: id }],
        };
        let sample = |stack: &[u64], ns: i64| ProfileSample {
            location_id: stack.to_vec(),
            value: vec![1, ns],
        };
        let p = Profile {
            sample_type: vec![
                ValueType { r#type: 1, unit: 2 },
                ValueType { r#type: 3, unit: 4 },
            ],
            // Leaf first: serveWatchHandler under ListResource under the
            // filters; a patch under the filters; the GC.
            sample: vec![
                sample(&[2, 1, 3], 3_000_000_000),
                sample(&[4, 3], 1_000_000_000),
                sample(&[5], 500_000_000),
            ],
            location: (1..=5).map(location).collect(),
            function: (1..=5).map(function).collect(),
            string_table: strings,
        };
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &p.encode_to_vec()).unwrap();
        let b = breakdown(&gz.finish().unwrap()).unwrap();
        let of = |name: &str| b.parts.iter().find(|(n, _)| n.starts_with(name)).unwrap().1;
        assert_eq!(of("watch: serving"), 3.0);
        assert_eq!(of("list"), 0.0, "a watch is served by ListResource too");
        assert_eq!(of("writes"), 1.0);
        assert_eq!(of("Go runtime"), 0.5);
        assert_eq!(b.total, 4.5);
    }
}
