//! Clients' reads validated: no list older than asked, nor than the
//! client's previous reads.

use std::collections::HashMap;

use crate::model::ReadObservation;

use super::report::{Anomaly, Property};

/// Validates reads: per client, in order, each list's resourceVersion is
/// at least its `NotOlderThan` one and at least the client's previous
/// reads' (no read goes back in time). One anomaly per read at most.
pub fn validate_reads(reads: &[ReadObservation]) -> Vec<Anomaly> {
    let mut anomalies = Vec::new();
    // Per client: the newest resourceVersion read, and what read it.
    let mut newest: HashMap<&str, &ReadObservation> = HashMap::new();
    for read in reads {
        let detail = if let Some(n) = read.not_older_than
            && read.rv < n
        {
            Some(format!(
                "{} list not older than {n} got resourceVersion {}",
                read.resource, read.rv
            ))
        } else if let Some(prev) = newest.get(read.client.as_str())
            && read.rv < prev.rv
        {
            Some(format!(
                "{} list {} at {} (t={:.3}) after a {} list at {} (via {}, t={:.3})",
                read.resource,
                read.not_older_than
                    .map_or("resourceVersion=0".to_string(), |n| format!(
                        "not older than {n}"
                    )),
                read.rv,
                read.at,
                prev.resource,
                prev.rv,
                prev.target,
                prev.at
            ))
        } else {
            None
        };
        if let Some(detail) = detail {
            anomalies.push(Anomaly {
                property: Property::Reads,
                watcher: read.client.clone(),
                target: read.target.clone(),
                detail,
            });
        }
        let entry = newest.entry(read.client.as_str()).or_insert(read);
        if read.rv > entry.rv {
            *entry = read;
        }
    }
    anomalies
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Resource;

    fn read(client: &str, not_older_than: Option<u64>, rv: u64) -> ReadObservation {
        ReadObservation {
            client: client.into(),
            target: "proxy-1".into(),
            resource: Resource::Pods,
            not_older_than,
            rv,
            at: 0.0,
        }
    }

    #[test]
    fn reads() {
        let reads = vec![
            read("c1", None, 10),
            read("c2", Some(5), 5),
            read("c1", Some(12), 12),
            read("c1", None, 11),
            read("c2", Some(9), 8),
            read("c1", Some(3), 12),
            read("c2", None, 7),
        ];
        let anomalies = validate_reads(&reads);
        assert_eq!(anomalies.len(), 3, "{anomalies:?}");
        assert!(anomalies.iter().all(|a| a.property == Property::Reads));
        assert_eq!(anomalies[0].watcher, "c1");
        assert!(
            anomalies[0]
                .detail
                .contains("resourceVersion=0 at 11 (t=0.000) after a pods list at 12"),
            "{}",
            anomalies[0].detail
        );
        assert_eq!(anomalies[1].watcher, "c2");
        assert!(
            anomalies[1]
                .detail
                .contains("not older than 9 got resourceVersion 8"),
            "{}",
            anomalies[1].detail
        );
        assert_eq!(anomalies[2].watcher, "c2");
        assert!(validate_reads(&reads[..3]).is_empty());
    }
}
