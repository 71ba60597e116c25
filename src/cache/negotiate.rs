//! Content negotiation, as kube-apiserver's
//! (`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/negotiation/negotiate.go`,
//! `github.com/munnerz/goautoneg`, and `RequestScope.AllowsMediaTypeTransform`
//! in `.../handlers/rest.go`): which representation a read is answered in,
//! and in which encoding an error `Status` is.
//!
//! The `Accept` clauses are sorted as goautoneg sorts them (by `q`, then
//! concrete types before wildcards; Go's `sort.Sort` is an insertion sort
//! for up to 12 elements, reproduced here; longer headers pass through).
//! Each clause is tried against the apiserver's serializers in order
//! (`application/json`, `application/yaml`,
//! `application/vnd.kubernetes.protobuf`); the first one whose parameters
//! the endpoint allows wins:
//! - `as`/`g`/`v` ask for a transformation: `PartialObjectMetadata[List]`
//!   or `Table` of `meta.k8s.io/v1` or `v1beta1` (a `Table` only in JSON
//!   or YAML);
//! - `stream` must be `watch`, on a serializer that streams (not YAML);
//! - `sv` must be `v1`; `pretty=1` asks for indented JSON.
//!
//! The cache answers in JSON, protobuf (built-in types), or as
//! `PartialObjectMetadata[List]` in either. Everything else passes through
//! and the apiserver answers it: YAML, `Table`, pretty-printed JSON
//! (`pretty=1`, or a `curl`, `Wget` or browser `User-Agent`), a
//! transformation of the wrong kind for the verb, and requests no
//! representation fits (the apiserver's `406`s: its route layer and its
//! handlers each word theirs differently).

use http::HeaderMap;
use http::header::{ACCEPT, USER_AGENT};

/// How a body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Json,
    Protobuf,
}

/// The `meta.k8s.io` version of a metadata-only answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaVersion {
    V1,
    V1beta1,
}

impl MetaVersion {
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
    pub fn api_version(self) -> &'static str {
        match self {
            MetaVersion::V1 => "meta.k8s.io/v1",
            MetaVersion::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// What a read is answered with: the objects, or their
/// `PartialObjectMetadata`; in JSON or protobuf.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Representation {
    pub encoding: Encoding,
    /// `Some` for `PartialObjectMetadata[List]`.
    pub metadata: Option<MetaVersion>,
}

impl Representation {
    /// Plain JSON objects.
    pub const JSON: Representation = Representation {
        encoding: Encoding::Json,
        metadata: None,
    };
    /// Protobuf objects.
    pub const PROTOBUF: Representation = Representation {
        encoding: Encoding::Protobuf,
        metadata: None,
    };

    /// A small index, for per-representation caches.
    pub fn index(self) -> usize {
        let e = match self.encoding {
            Encoding::Json => 0,
            Encoding::Protobuf => 1,
        };
        let m = match self.metadata {
            None => 0,
            Some(MetaVersion::V1) => 2,
            Some(MetaVersion::V1beta1) => 4,
        };
        e + m
    }

    /// Number of distinct [`Representation::index`] values.
    pub const COUNT: usize = 6;
}

/// The encoding of an error `Status` the cache answers with
/// (`responsewriters.ErrorNegotiated`): negotiated again without
/// transformations; when nothing fits, indented JSON (`WriteRawJSON`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorEncoding {
    Json,
    Protobuf,
    IndentedJson,
}

/// The verb being negotiated for: which transformation fits it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    List,
    Watch,
}

/// The outcome of negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub body: Representation,
    pub errors: ErrorEncoding,
}

/// The apiserver's serializers, in its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serializer {
    Json,
    Yaml,
    Protobuf,
}

const SERIALIZERS: [(Serializer, &str, &str); 3] = [
    (Serializer::Json, "application", "json"),
    (Serializer::Yaml, "application", "yaml"),
    (
        Serializer::Protobuf,
        "application",
        "vnd.kubernetes.protobuf",
    ),
];

/// One `Accept` clause, as goautoneg parses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Clause<'a> {
    pub media_type: &'a str,
    pub sub_type: &'a str,
    pub q: f64,
    /// Parameters other than `q`; a later duplicate replaces an earlier one.
    pub params: Vec<(&'a str, &'a str)>,
}

impl Clause<'_> {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }
}

/// `strings.Index`-based split at the first `sep`.
fn split_once(s: &str, sep: char) -> (&str, &str) {
    s.split_once(sep).unwrap_or((s, ""))
}

fn trim(s: &str) -> &str {
    s.trim_matches(' ')
}

/// Go's `strconv.ParseFloat(s, 32)` where it matters; `None` for forms
/// Rust and Go read differently (hexadecimal, underscores), which pass
/// through.
fn parse_q(s: &str) -> Option<f64> {
    if s.contains(['x', 'X', '_']) {
        return None;
    }
    // A syntax error leaves 0; out of range, the infinity Go also returns.
    Some(s.parse::<f32>().map_or(0.0, f64::from))
}

/// `goautoneg.ParseAccept`, unsorted; `None` when a `q` cannot be read
/// exactly as Go reads it.
pub fn parse_accept(header: &str) -> Option<Vec<Clause<'_>>> {
    let mut out = Vec::new();
    let mut remaining = header;
    while !remaining.is_empty() {
        let (part, rest) = split_once(remaining, ',');
        remaining = rest;
        let part = trim(part);
        let (sp, mut params_part) = split_once(part, ';');
        let (sp0, sp_rest) = split_once(sp, '/');
        let media_type = trim(sp0);
        let sub_type = if sp_rest.is_empty() {
            if media_type != "*" {
                continue;
            }
            "*"
        } else {
            let (sp1, more) = split_once(sp_rest, '/');
            if !more.is_empty() {
                continue;
            }
            trim(sp1)
        };
        let mut clause = Clause {
            media_type,
            sub_type,
            q: 1.0,
            params: Vec::new(),
        };
        while !params_part.is_empty() {
            let (p, rest) = split_once(params_part, ';');
            params_part = rest;
            let (k, v) = split_once(p, '=');
            if v.is_empty() {
                continue;
            }
            let (v, more) = split_once(v, '=');
            if !more.is_empty() {
                continue;
            }
            let token = trim(k);
            if token == "q" {
                clause.q = parse_q(v)?;
            } else {
                clause.params.push((token, trim(v)));
            }
        }
        out.push(clause);
    }
    Some(out)
}

/// goautoneg's `Less`.
fn less(a: &Clause<'_>, b: &Clause<'_>) -> bool {
    a.q > b.q
        || (a.media_type != "*" && b.media_type == "*")
        || (a.sub_type != "*" && b.sub_type == "*")
}

/// Go's `sort.Sort` for up to 12 elements: an insertion sort.
fn go_sort(clauses: &mut [Clause<'_>]) {
    for i in 1..clauses.len() {
        let mut j = i;
        while j > 0 && less(&clauses[j], &clauses[j - 1]) {
            clauses.swap(j, j - 1);
            j -= 1;
        }
    }
}

/// A requested transformation (`as`, `g`, `v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Convert<'a> {
    kind: &'a str,
    group: &'a str,
    version: &'a str,
}

/// Which endpoint restrictions apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Restrictions {
    /// A built-in resource's `RequestScope`.
    BuiltIn,
    /// A custom resource's: plain responses in JSON or YAML only.
    Custom,
    /// `DefaultEndpointRestrictions` (error bodies): no transformation,
    /// no `sv`.
    Default,
}

/// `acceptMediaTypeOptions` and `AllowsMediaTypeTransform`: the
/// transformation asked for, whether pretty output is, or `None` when the
/// clause does not fit this serializer.
fn accept_options<'a>(
    clause: &Clause<'a>,
    serializer: Serializer,
    restrictions: Restrictions,
) -> Option<(Option<Convert<'a>>, bool)> {
    let mut convert: Option<Convert<'a>> = None;
    let mut pretty = false;
    // Later duplicates win, as in Go's map.
    let mut seen: Vec<&str> = Vec::new();
    for (k, v) in clause.params.iter().rev() {
        if seen.contains(k) {
            continue;
        }
        seen.push(k);
        match *k {
            "as" => {
                convert
                    .get_or_insert(Convert {
                        kind: "",
                        group: "",
                        version: "",
                    })
                    .kind = v
            }
            "g" => {
                convert
                    .get_or_insert(Convert {
                        kind: "",
                        group: "",
                        version: "",
                    })
                    .group = v
            }
            "v" => {
                convert
                    .get_or_insert(Convert {
                        kind: "",
                        group: "",
                        version: "",
                    })
                    .version = v
            }
            "stream" if !v.is_empty() && (serializer == Serializer::Yaml || *v != "watch") => {
                return None;
            }
            "sv" if !v.is_empty() && (restrictions == Restrictions::Default || *v != "v1") => {
                return None;
            }
            "pretty" => pretty = *v == "1",
            _ => {}
        }
    }
    let allowed = match convert {
        None => restrictions != Restrictions::Custom || serializer != Serializer::Protobuf,
        Some(_) if restrictions == Restrictions::Default => false,
        Some(c) => {
            c.group == "meta.k8s.io"
                && (c.version == "v1" || c.version == "v1beta1")
                && match c.kind {
                    "Table" => serializer != Serializer::Protobuf,
                    "PartialObjectMetadata" | "PartialObjectMetadataList" => true,
                    _ => false,
                }
        }
    };
    allowed.then_some((convert, pretty))
}

/// A fitting clause: the serializer, the transformation, whether pretty.
type Fit<'a> = (Serializer, Option<Convert<'a>>, bool);

/// `NegotiateMediaTypeOptions`: the serializer and options of the first
/// fitting clause.
fn negotiate_options<'a>(clauses: &[Clause<'a>], restrictions: Restrictions) -> Option<Fit<'a>> {
    for clause in clauses {
        for (serializer, t, s) in SERIALIZERS {
            let matches = (clause.media_type == t
                && (clause.sub_type == s || clause.sub_type == "*"))
                || (clause.media_type == "*" && clause.sub_type == "*");
            if !matches {
                continue;
            }
            if let Some((convert, pretty)) = accept_options(clause, serializer, restrictions) {
                return Some((serializer, convert, pretty));
            }
        }
    }
    None
}

/// `isPrettyPrint`: a `pretty` query parameter, or a human's client.
fn pretty_request(headers: &HeaderMap, query: Option<&str>) -> bool {
    if query.is_some_and(|q| q.contains("pretty")) {
        return true;
    }
    headers
        .get(USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ua| {
            ua.starts_with("curl") || ua.starts_with("Wget") || ua.starts_with("Mozilla/5.0")
        })
}

/// Negotiates a read of a built-in (`built_in`) or custom resource.
///
/// # Errors
/// The reason the read passes through.
pub fn negotiate(
    headers: &HeaderMap,
    query: Option<&str>,
    verb: Verb,
    built_in: bool,
) -> Result<Negotiated, &'static str> {
    if pretty_request(headers, query) {
        return Err("pretty output");
    }
    let header = match headers.get(ACCEPT) {
        None => "",
        Some(v) => v.to_str().map_err(|_| "representation")?,
    };
    if header.is_empty() {
        return Ok(Negotiated {
            body: Representation::JSON,
            errors: ErrorEncoding::Json,
        });
    }
    let mut clauses = parse_accept(header).ok_or("representation")?;
    if clauses.len() > 12 {
        return Err("representation");
    }
    go_sort(&mut clauses);
    let restrictions = if built_in {
        Restrictions::BuiltIn
    } else {
        Restrictions::Custom
    };
    let Some((serializer, convert, pretty)) = negotiate_options(&clauses, restrictions) else {
        return Err("not acceptable");
    };
    if pretty && serializer == Serializer::Json {
        return Err("pretty output");
    }
    let encoding = match serializer {
        Serializer::Json => Encoding::Json,
        Serializer::Protobuf => Encoding::Protobuf,
        Serializer::Yaml => return Err("representation"),
    };
    let metadata = match convert {
        None => None,
        Some(c) if c.kind == "Table" => return Err("table"),
        Some(c) => {
            let wanted = match verb {
                Verb::Get | Verb::Watch => "PartialObjectMetadata",
                Verb::List => "PartialObjectMetadataList",
            };
            if c.kind != wanted {
                return Err("representation");
            }
            Some(if c.version == "v1" {
                MetaVersion::V1
            } else {
                MetaVersion::V1beta1
            })
        }
    };
    if !built_in && (encoding != Encoding::Json || metadata.is_some()) {
        return Err("representation");
    }
    let errors = match negotiate_options(&clauses, Restrictions::Default) {
        None => ErrorEncoding::IndentedJson,
        Some((Serializer::Json, _, true)) => return Err("pretty output"),
        Some((Serializer::Json, _, false)) => ErrorEncoding::Json,
        Some((Serializer::Protobuf, _, _)) if built_in => ErrorEncoding::Protobuf,
        Some(_) => return Err("representation"),
    };
    Ok(Negotiated {
        body: Representation { encoding, metadata },
        errors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn n(
        accept: &str,
        verb: Verb,
    ) -> Result<(Encoding, Option<MetaVersion>, ErrorEncoding), &'static str> {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_str(accept).unwrap());
        negotiate(&h, None, verb, true).map(|n| (n.body.encoding, n.body.metadata, n.errors))
    }

    use Encoding::{Json, Protobuf};

    #[test]
    fn what_clients_send() {
        assert_eq!(
            negotiate(&HeaderMap::new(), None, Verb::List, true)
                .unwrap()
                .body,
            Representation::JSON
        );
        assert_eq!(
            n("application/json", Verb::List),
            Ok((Json, None, ErrorEncoding::Json))
        );
        // kubelet, kube-proxy: protobuf first.
        assert_eq!(
            n("application/vnd.kubernetes.protobuf, */*", Verb::Watch),
            Ok((Protobuf, None, ErrorEncoding::Protobuf))
        );
        assert_eq!(
            n("application/vnd.kubernetes.protobuf", Verb::Get),
            Ok((Protobuf, None, ErrorEncoding::Protobuf))
        );
        assert_eq!(
            n("application/json;stream=watch", Verb::Watch),
            Ok((Json, None, ErrorEncoding::Json))
        );
        // The metadata client.
        assert_eq!(
            n(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
                Verb::List
            ),
            Ok((Protobuf, Some(MetaVersion::V1), ErrorEncoding::Json))
        );
        assert_eq!(
            n(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
                Verb::Watch
            ),
            Ok((
                Json,
                Some(MetaVersion::V1beta1),
                ErrorEncoding::IndentedJson
            ))
        );
        // kubectl get: tables pass through.
        assert_eq!(
            n(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
                Verb::List
            ),
            Err("table")
        );
    }

    #[test]
    fn goautoneg_rules() {
        // q orders clauses; q=0 still counts (goautoneg keeps it).
        assert_eq!(
            n(
                "application/json;q=0.5, application/vnd.kubernetes.protobuf",
                Verb::List
            )
            .unwrap()
            .0,
            Protobuf
        );
        assert_eq!(n("application/json;q=0", Verb::List).unwrap().0, Json);
        // Wildcards: the first serializer, JSON.
        assert_eq!(n("*/*", Verb::List).unwrap().0, Json);
        assert_eq!(n("application/*", Verb::List).unwrap().0, Json);
        assert_eq!(n("*", Verb::List).unwrap().0, Json);
        // Case-sensitive, no other types.
        assert_eq!(n("Application/JSON", Verb::List), Err("not acceptable"));
        assert_eq!(n("text/plain", Verb::List), Err("not acceptable"));
        assert_eq!(
            n("application/yaml, application/json", Verb::List),
            Err("representation")
        );
        // A wildcard sorts after a concrete type whatever its q (goautoneg's Less).
        assert_eq!(
            n(
                "*/*;q=1, application/vnd.kubernetes.protobuf;q=0.1",
                Verb::List
            )
            .unwrap()
            .0,
            Protobuf
        );
        // stream must be watch; YAML cannot stream.
        assert_eq!(
            n(
                "application/json;stream=list, application/vnd.kubernetes.protobuf",
                Verb::List
            )
            .unwrap()
            .0,
            Protobuf
        );
        assert_eq!(
            n(
                "application/yaml;stream=watch, application/json",
                Verb::List
            )
            .unwrap()
            .0,
            Json
        );
        // Protobuf Table is not allowed: the next clause decides.
        assert_eq!(
            n("application/vnd.kubernetes.protobuf;as=Table;g=meta.k8s.io;v=v1, application/vnd.kubernetes.protobuf", Verb::List).unwrap().0,
            Protobuf
        );
        // Transformations of the wrong kind or group pass through or are skipped.
        assert_eq!(
            n(
                "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",
                Verb::List
            ),
            Err("representation")
        );
        assert_eq!(
            n(
                "application/json;as=Pod;g=;v=v1, application/json",
                Verb::List
            )
            .unwrap()
            .0,
            Json
        );
        assert_eq!(
            n("application/json;pretty=1", Verb::List),
            Err("pretty output")
        );
        assert_eq!(
            n(
                "application/json;sv=v2, application/vnd.kubernetes.protobuf",
                Verb::List
            )
            .unwrap()
            .0,
            Protobuf
        );
        assert_eq!(
            n(
                "application/json; q=0.5, application/vnd.kubernetes.protobuf;q=0.4",
                Verb::List
            )
            .unwrap()
            .0,
            Json
        );
        assert_eq!(
            n("application/json;q=0x1p-1", Verb::List),
            Err("representation")
        );
    }

    #[test]
    fn custom_resources_stay_json() {
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_static("application/json, */*"));
        assert_eq!(
            negotiate(&h, None, Verb::List, false).unwrap().body,
            Representation::JSON
        );
        // JSON, but an error would be in protobuf, which the cache does not
        // write for custom resources.
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf, application/json"),
        );
        assert_eq!(
            negotiate(&h, None, Verb::List, false),
            Err("representation")
        );
        h.insert(
            ACCEPT,
            HeaderValue::from_static("application/vnd.kubernetes.protobuf"),
        );
        assert_eq!(
            negotiate(&h, None, Verb::List, false),
            Err("not acceptable")
        );
    }

    #[test]
    fn pretty_clients_pass_through() {
        let mut h = HeaderMap::new();
        h.insert(USER_AGENT, HeaderValue::from_static("curl/8.5.0"));
        assert_eq!(negotiate(&h, None, Verb::Get, true), Err("pretty output"));
        assert_eq!(
            negotiate(&HeaderMap::new(), Some("pretty=1"), Verb::Get, true),
            Err("pretty output")
        );
    }

    #[test]
    fn parsing() {
        let c = parse_accept("application/json ;q=0.5;as = Table , */*,bad,a/b/c").unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(
            (c[0].media_type, c[0].sub_type, c[0].q),
            ("application", "json", 0.5)
        );
        assert_eq!(c[0].param("as"), Some("Table"));
        assert_eq!((c[1].media_type, c[1].sub_type), ("*", "*"));
        assert_eq!(parse_accept("application/json;q= 1").unwrap()[0].q, 0.0);
    }
}
