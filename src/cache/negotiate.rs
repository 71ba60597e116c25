//! Content negotiation: whether a read can be answered with the JSON the
//! cache holds.
//!
//! The cache answers JSON when the client's most preferred acceptable
//! representation that the cache can tell apart is plain JSON. Protobuf,
//! YAML and CBOR are encodings of the same object: a client that prefers
//! them but also accepts JSON gets JSON (kubelet and kube-proxy ask for
//! protobuf first, with JSON as a fallback). A preferred *transformation*
//! (`as=Table`, `as=PartialObjectMetadata...`) is a different object, so the
//! request passes through.

use http::HeaderValue;

/// The outcome of negotiation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Negotiated {
    /// Answer `application/json`.
    Json,
    /// Let upstream answer.
    PassThrough,
}

/// Decides from the `Accept` header (absent means anything).
pub fn negotiate(accept: Option<&HeaderValue>) -> Negotiated {
    let Some(accept) = accept else {
        return Negotiated::Json;
    };
    let Ok(accept) = accept.to_str() else {
        return Negotiated::PassThrough;
    };
    if accept.trim().is_empty() {
        return Negotiated::Json;
    }
    let mut clauses: Vec<(f32, usize, &str, bool)> = Vec::new();
    for (i, clause) in accept.split(',').enumerate() {
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut q = 1.0_f32;
        let mut transformed = false;
        for p in parts {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            match k.trim().to_ascii_lowercase().as_str() {
                "q" => q = v.trim().parse().unwrap_or(1.0),
                "as" => transformed = true,
                _ => {}
            }
        }
        if q <= 0.0 || media.is_empty() {
            continue;
        }
        let media: &'static str = match media.as_str() {
            "application/json" => "json",
            "*/*" | "application/*" => "any",
            _ => "other",
        };
        clauses.push((q, i, media, transformed));
    }
    // Highest q first; ties keep the client's order.
    clauses.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    for (_, _, media, transformed) in clauses {
        if transformed {
            return Negotiated::PassThrough;
        }
        if media == "json" || media == "any" {
            return Negotiated::Json;
        }
    }
    Negotiated::PassThrough
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Negotiated {
        negotiate(Some(&HeaderValue::from_str(s).unwrap()))
    }

    #[test]
    fn decisions() {
        assert_eq!(negotiate(None), Negotiated::Json);
        assert_eq!(n("application/json"), Negotiated::Json);
        assert_eq!(
            n("application/vnd.kubernetes.protobuf, */*"),
            Negotiated::Json
        );
        assert_eq!(
            n("application/vnd.kubernetes.protobuf,application/json"),
            Negotiated::Json
        );
        assert_eq!(n("application/json;stream=watch"), Negotiated::Json);
        assert_eq!(
            n(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            Negotiated::PassThrough
        );
        assert_eq!(
            n("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"),
            Negotiated::PassThrough
        );
        assert_eq!(
            n("application/vnd.kubernetes.protobuf"),
            Negotiated::PassThrough
        );
        assert_eq!(n("application/yaml"), Negotiated::PassThrough);
        assert_eq!(
            n("application/json;q=0.5, application/json;as=Table;g=meta.k8s.io;v=v1;q=0.9"),
            Negotiated::PassThrough
        );
        assert_eq!(
            n("application/json;as=Table;q=0, application/json"),
            Negotiated::Json
        );
    }
}
