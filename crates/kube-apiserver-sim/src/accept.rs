//! Content negotiation for reads: the first media type in `Accept` the sim
//! can produce. It speaks JSON only, so a client offering protobuf with a
//! JSON or `*/*` fallback gets JSON, and one offering nothing it can produce
//! gets 406 (`/tmp/research` and the recording's `list-configmaps-*` cases).

/// What a read answers with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The objects themselves.
    Json,
    /// `meta.k8s.io` `Table` of the given version (`v1` or `v1beta1`).
    Table(String),
    /// `meta.k8s.io` `PartialObjectMetadata(List)` of the given version.
    PartialMetadata(String),
}

/// Picks the output for an `Accept` header value; `None` when nothing
/// acceptable is offered (406).
pub fn negotiate(accept: Option<&str>) -> Option<Output> {
    let accept = accept.map(str::trim).unwrap_or("");
    if accept.is_empty() {
        return Some(Output::Json);
    }
    for clause in accept.split(',') {
        let mut parts = clause.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let mut params: Vec<(String, String)> = Vec::new();
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                params.push((
                    k.trim().to_ascii_lowercase(),
                    v.trim().trim_matches('"').to_string(),
                ));
            }
        }
        let param = |k: &str| {
            params
                .iter()
                .find(|(pk, _)| pk == k)
                .map(|(_, v)| v.as_str())
        };
        if param("q").is_some_and(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0)) {
            continue;
        }
        if !matches!(media.as_str(), "application/json" | "*/*" | "application/*") {
            continue;
        }
        let version = param("v").unwrap_or("");
        let group_ok = param("g") == Some("meta.k8s.io");
        let version_ok = matches!(version, "v1" | "v1beta1");
        match param("as") {
            None => return Some(Output::Json),
            Some("Table") if group_ok && version_ok => return Some(Output::Table(version.into())),
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if group_ok && version_ok =>
            {
                return Some(Output::PartialMetadata(version.into()));
            }
            Some(_) => continue,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_first_producible() {
        assert_eq!(negotiate(None), Some(Output::Json));
        assert_eq!(
            negotiate(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )),
            Some(Output::Table("v1".into()))
        );
        assert_eq!(
            negotiate(Some("application/vnd.kubernetes.protobuf, */*")),
            Some(Output::Json)
        );
        assert_eq!(negotiate(Some("application/vnd.kubernetes.protobuf")), None);
        assert_eq!(
            negotiate(Some("application/json;as=Table;v=v2;g=meta.k8s.io")),
            None
        );
        assert_eq!(
            negotiate(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Some(Output::PartialMetadata("v1".into()))
        );
        assert_eq!(
            negotiate(Some(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
            )),
            Some(Output::Json)
        );
    }
}
