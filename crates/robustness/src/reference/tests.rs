//! Tests of the [`Reference`]: a small history of pods recorded as etcd
//! sends it, queried by state, events and versions; repeats and keys the
//! run does not follow; checkpoints against a full replay.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::model::{Filter, Kind, ObjectKey, Requirement, Resource};

use super::record::Reference;

fn pod(ns: &str, name: &str, app: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "uid": "x"},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    })
}

fn pkey(ns: &str, name: &str) -> String {
    format!("/registry/pods/{ns}/{name}")
}

fn k(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new(ns, name)
}

fn app(v: &str) -> Filter {
    Filter {
        labels: vec![Requirement::Equals("app".into(), v.into())],
        ..Filter::all(Resource::Pods)
    }
}

fn node(v: &str) -> Filter {
    Filter {
        fields: vec![Requirement::Equals("spec.nodeName".into(), v.into())],
        ..Filter::all(Resource::Pods)
    }
}

/// Start 10: a/p1 (web, n1) at 5, b/p2 (db, n2) at 8.
/// 11: create a/p3 (web, n1)
/// 12: update a/p1 -> db (moves out of app=web), still n1
/// 13: update b/p2 -> n1 (moves into nodeName=n1)
/// 14: delete a/p3
/// 15: update a/p1 -> web again (moves back in)
/// 16: create a configmap (another resource)
/// 17: update b/p2 (no selector change)
fn sample() -> Reference {
    let mut r = Reference::new(
        10,
        vec![
            (Resource::Pods, k("a", "p1"), 5, pod("a", "p1", "web", "n1")),
            (Resource::Pods, k("b", "p2"), 8, pod("b", "p2", "db", "n2")),
        ],
    );
    r.record(
        11,
        &pkey("a", "p3"),
        Some(pod("a", "p3", "web", "n1")),
        None,
    );
    r.record(
        12,
        &pkey("a", "p1"),
        Some(pod("a", "p1", "db", "n1")),
        Some(pod("a", "p1", "web", "n1")),
    );
    r.record(13, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
    r.record(
        14,
        &pkey("a", "p3"),
        None,
        Some(pod("a", "p3", "web", "n1")),
    );
    r.record(
        15,
        &pkey("a", "p1"),
        Some(pod("a", "p1", "web", "n1")),
        None,
    );
    r.record(
        16,
        "/registry/configmaps/a/cm",
        Some(json!({"metadata": {"name": "cm", "namespace": "a"}})),
        None,
    );
    r.record(17, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
    r
}

fn map(items: &[(ObjectKey, u64)]) -> BTreeMap<ObjectKey, u64> {
    items.iter().cloned().collect()
}

#[test]
fn counts_and_head() {
    let mut r = sample();
    assert_eq!(r.start(), 10);
    assert_eq!(r.head(), 17);
    assert_eq!(r.len(), 7);
    assert!(!r.is_empty());
    assert_eq!(r.changes_of(Resource::Pods), 6);
    assert_eq!(r.changes_of(Resource::ConfigMaps), 1);
    assert_eq!(r.changes_of(Resource::Nodes), 0);
    r.progress(20);
    assert_eq!(r.head(), 20);
    r.progress(19);
    assert_eq!(r.head(), 20);
    assert_eq!(r.changes(Resource::Pods, 12, 14).len(), 2);
}

#[test]
fn state_at_revisions() {
    let r = sample();
    let all = Filter::all(Resource::Pods);
    assert_eq!(
        r.state_at(&all, 10),
        map(&[(k("a", "p1"), 5), (k("b", "p2"), 8)])
    );
    assert_eq!(
        r.state_at(&all, 11),
        map(&[(k("a", "p1"), 5), (k("a", "p3"), 11), (k("b", "p2"), 8)])
    );
    assert_eq!(
        r.state_at(&all, 14),
        map(&[(k("a", "p1"), 12), (k("b", "p2"), 13)])
    );
    assert_eq!(
        r.state_at(&all, 17),
        map(&[(k("a", "p1"), 15), (k("b", "p2"), 17)])
    );
    // Clamped to the head and to the start.
    assert_eq!(r.state_at(&all, 100), r.state_at(&all, 17));
    assert_eq!(r.state_at(&all, 3), r.state_at(&all, 10));

    assert_eq!(r.state_at(&app("web"), 10), map(&[(k("a", "p1"), 5)]));
    assert_eq!(
        r.state_at(&app("web"), 11),
        map(&[(k("a", "p1"), 5), (k("a", "p3"), 11)])
    );
    assert_eq!(r.state_at(&app("web"), 12), map(&[(k("a", "p3"), 11)]));
    assert_eq!(r.state_at(&app("web"), 14), map(&[]));
    assert_eq!(r.state_at(&app("web"), 15), map(&[(k("a", "p1"), 15)]));

    assert_eq!(
        r.state_at(&node("n1"), 12),
        map(&[(k("a", "p1"), 12), (k("a", "p3"), 11)])
    );
    assert_eq!(r.state_at(&node("n1"), 13).len(), 3);
    assert_eq!(r.state_at(&node("n2"), 12), map(&[(k("b", "p2"), 8)]));
    assert_eq!(r.state_at(&node("n2"), 13), map(&[]));

    let in_b = Filter {
        namespace: Some("b".into()),
        ..Filter::all(Resource::Pods)
    };
    assert_eq!(r.state_at(&in_b, 17), map(&[(k("b", "p2"), 17)]));
    let cms = Filter::all(Resource::ConfigMaps);
    assert_eq!(r.state_at(&cms, 15), map(&[]));
    assert_eq!(r.state_at(&cms, 16), map(&[(k("a", "cm"), 16)]));
}

#[test]
fn expected_events_follow_selectors() {
    let r = sample();
    use Kind::*;
    assert_eq!(
        r.expected(&Filter::all(Resource::Pods), 10, 17),
        vec![
            (Added, k("a", "p3"), 11),
            (Modified, k("a", "p1"), 12),
            (Modified, k("b", "p2"), 13),
            (Deleted, k("a", "p3"), 14),
            (Modified, k("a", "p1"), 15),
            (Modified, k("b", "p2"), 17),
        ]
    );
    assert_eq!(
        r.expected(&app("web"), 10, 17),
        vec![
            (Added, k("a", "p3"), 11),
            (Deleted, k("a", "p1"), 12),
            (Deleted, k("a", "p3"), 14),
            (Added, k("a", "p1"), 15),
        ]
    );
    assert_eq!(
        r.expected(&app("db"), 10, 17),
        vec![
            (Added, k("a", "p1"), 12),
            (Modified, k("b", "p2"), 13),
            (Deleted, k("a", "p1"), 15),
            (Modified, k("b", "p2"), 17),
        ]
    );
    assert_eq!(
        r.expected(&node("n2"), 10, 17),
        vec![(Deleted, k("b", "p2"), 13)]
    );
    assert_eq!(
        r.expected(&node("n1"), 12, 13),
        vec![(Added, k("b", "p2"), 13)]
    );
    // (from, to]: nothing at `from` itself.
    assert_eq!(
        r.expected(&app("web"), 11, 12),
        vec![(Deleted, k("a", "p1"), 12)]
    );
    assert!(r.expected(&app("web"), 15, 17).is_empty());
    assert!(r.expected(&app("web"), 17, 100).is_empty());
}

#[test]
fn versions() {
    let r = sample();
    let p1 = k("a", "p1");
    let p3 = k("a", "p3");
    assert_eq!(r.version_at(Resource::Pods, &p1, 4), None);
    assert_eq!(r.version_at(Resource::Pods, &p1, 10).map(|v| v.rv), Some(5));
    assert_eq!(
        r.version_at(Resource::Pods, &p1, 12).map(|v| v.rv),
        Some(12)
    );
    assert_eq!(
        r.version_at(Resource::Pods, &p1, 14).map(|v| v.rv),
        Some(12)
    );
    assert_eq!(
        r.version_at(Resource::Pods, &p1, 99).map(|v| v.rv),
        Some(15)
    );
    assert_eq!(r.version_at(Resource::Pods, &p3, 10), None);
    assert_eq!(
        r.version_at(Resource::Pods, &p3, 13).map(|v| v.rv),
        Some(11)
    );
    assert_eq!(r.version_at(Resource::Pods, &p3, 14), None);
    assert_eq!(r.version_at(Resource::Services, &p1, 14), None);
    // Trimmed to what selectors read.
    let v = r
        .version_at(Resource::Pods, &p1, 12)
        .map(|v| v.object.clone());
    assert_eq!(
        v.as_deref(),
        Some(&json!({
            "metadata": {"name": "p1", "namespace": "a", "labels": {"app": "db"}},
            "spec": {"nodeName": "n1"},
        }))
    );

    assert!(r.has_version(Resource::Pods, &p1, 5));
    assert!(r.has_version(Resource::Pods, &p1, 12));
    assert!(r.has_version(Resource::Pods, &p1, 15));
    assert!(!r.has_version(Resource::Pods, &p1, 13));
    assert!(!r.has_version(Resource::Pods, &p3, 14));
    assert!(r.has_change(Resource::Pods, &p3, 14));
    assert!(!r.has_change(Resource::Pods, &p3, 13));
    assert!(!r.has_version(Resource::Pods, &k("x", "y"), 11));
}

#[test]
fn repeated_and_old_events_are_ignored() {
    let mut r = sample();
    let all = Filter::all(Resource::Pods);
    let before = r.state_at(&all, 17);
    // A resumed etcd watch repeating the last and older events.
    r.record(17, &pkey("b", "p2"), Some(pod("b", "p2", "db", "n1")), None);
    r.record(14, &pkey("a", "p3"), None, None);
    r.record(
        12,
        &pkey("a", "p9"),
        Some(pod("a", "p9", "web", "n1")),
        None,
    );
    assert_eq!(r.len(), 7);
    assert_eq!(r.state_at(&all, 17), before);
    // At or below the start.
    let mut s = Reference::new(10, vec![]);
    s.record(10, &pkey("a", "x"), Some(pod("a", "x", "web", "n1")), None);
    s.record(9, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
    assert_eq!(s.len(), 0);
    // Another key at the same revision (one transaction) is kept.
    s.record(11, &pkey("a", "x"), Some(pod("a", "x", "web", "n1")), None);
    s.record(11, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
    s.record(11, &pkey("a", "y"), Some(pod("a", "y", "web", "n1")), None);
    assert_eq!(s.len(), 2);
    // Progress does not make later events repeats.
    s.progress(20);
    s.record(12, &pkey("a", "x"), None, None);
    assert_eq!(s.len(), 3);
    assert_eq!(s.state_at(&all, 20), map(&[(k("a", "y"), 11)]));
    // Keys the run does not follow.
    s.record(
        21,
        "/registry/leases/kube-node-lease/n1",
        Some(json!({})),
        None,
    );
    s.record(22, "/registry/events/a/e", Some(json!({})), None);
    assert_eq!(s.len(), 3);
    assert_eq!(s.head(), 22);
}

#[test]
fn unknown_previous_from_prev_kv() {
    let mut r = Reference::new(10, vec![]);
    // Updating and deleting objects the start state lacked: the
    // previous value etcd sent decides the event.
    r.record(
        11,
        &pkey("a", "p"),
        Some(pod("a", "p", "db", "n1")),
        Some(pod("a", "p", "web", "n1")),
    );
    r.record(12, &pkey("a", "q"), None, Some(pod("a", "q", "web", "n1")));
    r.record(13, &pkey("a", "z"), None, None);
    assert_eq!(
        r.expected(&app("web"), 10, 13),
        vec![
            (Kind::Deleted, k("a", "p"), 11),
            (Kind::Deleted, k("a", "q"), 12)
        ]
    );
    assert_eq!(r.len(), 2);
}

#[test]
fn nodes_and_services_keys() {
    let mut r = Reference::new(
        1,
        vec![(
            Resource::Nodes,
            k("", "n1"),
            1,
            json!({"metadata": {"name": "n1", "labels": {"zone": "a"}}}),
        )],
    );
    r.record(
        2,
        "/registry/minions/n2",
        Some(json!({"metadata": {"name": "n2"}})),
        None,
    );
    r.record(
        3,
        "/registry/services/specs/a/s",
        Some(json!({"metadata": {"name": "s", "namespace": "a"}})),
        None,
    );
    r.record(4, "/registry/services/endpoints/a/s", Some(json!({})), None);
    let nodes = Filter::all(Resource::Nodes);
    assert_eq!(
        r.state_at(&nodes, 2),
        map(&[(k("", "n1"), 1), (k("", "n2"), 2)])
    );
    let zone = Filter {
        labels: vec![Requirement::Equals("zone".into(), "a".into())],
        ..nodes
    };
    assert_eq!(r.state_at(&zone, 4), map(&[(k("", "n1"), 1)]));
    assert_eq!(r.changes_of(Resource::Services), 1);
    assert_eq!(r.len(), 2);
}

/// Many changes: checkpoints give the same answers as a full replay.
#[test]
fn checkpoints_agree_with_replay() {
    let names: Vec<String> = (0..50).map(|i| format!("p{i}")).collect();
    let mut r = Reference::new(
        100,
        names
            .iter()
            .take(20)
            .map(|n| (Resource::Pods, k("a", n), 50, pod("a", n, "web", "n1")))
            .collect(),
    );
    let mut rng = fastrand::Rng::with_seed(7);
    let mut rev = 100;
    let mut live: BTreeMap<String, (String, String)> = names
        .iter()
        .take(20)
        .map(|n| (n.clone(), ("web".to_string(), "n1".to_string())))
        .collect();
    for _ in 0..5000 {
        rev += rng.u64(1..3);
        let n = &names[rng.usize(..names.len())];
        let apps = ["web", "db"];
        let nodes = ["n1", "n2"];
        if live.contains_key(n) && rng.u8(..4) == 0 {
            let (a, nd) = live.remove(n).unwrap_or_default();
            r.record(rev, &pkey("a", n), None, Some(pod("a", n, &a, &nd)));
        } else {
            let a = apps[rng.usize(..2)].to_string();
            let nd = nodes[rng.usize(..2)].to_string();
            r.record(rev, &pkey("a", n), Some(pod("a", n, &a, &nd)), None);
            live.insert(n.clone(), (a, nd));
        }
    }
    assert_eq!(r.len(), 5000);
    let history = &r.histories[&Resource::Pods];
    assert!(history.checkpoints.len() >= 5);
    for f in [Filter::all(Resource::Pods), app("web"), node("n2")] {
        // A naive replay from the base, by events.
        let mut state = r.state_at(&f, 100);
        let mut at = 100;
        for probe in [100, 150, 1000, 2500, 5001, 7000, rev] {
            for (kind, key, rv) in r.expected(&f, at, probe) {
                match kind {
                    Kind::Added | Kind::Modified => {
                        state.insert(key, rv);
                    }
                    Kind::Deleted => {
                        state.remove(&key);
                    }
                }
            }
            at = probe;
            assert_eq!(r.state_at(&f, probe), state, "{f} at {probe}");
        }
    }
    // The final state is the live one.
    let all = r.state_at(&Filter::all(Resource::Pods), rev);
    assert_eq!(
        all.keys().map(|k| k.name.clone()).collect::<Vec<_>>(),
        live.keys().cloned().collect::<Vec<_>>()
    );
}
