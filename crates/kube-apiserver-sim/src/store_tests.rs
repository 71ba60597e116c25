//! Unit tests of `store`.

use super::*;
use serde_json::json;

fn spec() -> ResourceSpec {
    ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true)
}

fn put(store: &Store, name: &str, v: &str) -> u64 {
    let obj = json!({"metadata": {"name": name, "namespace": "ns"}, "data": {"v": v}});
    let out = store
        .mutate(&spec(), &format!("ns/{name}"), |_| Ok(Mutation::Put(obj)))
        .unwrap();
    object::meta_str(&out, "resourceVersion").parse().unwrap()
}

fn names(items: &[(String, Arc<Value>)]) -> Vec<String> {
    items
        .iter()
        .map(|(_, v)| {
            format!(
                "{}={}",
                object::meta_str(v, "name"),
                v["data"]["v"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn history_reconstructs_past_states() {
    let store = Store::new(100, 1000);
    let a1 = put(&store, "a", "1");
    let b1 = put(&store, "b", "1");
    let a2 = put(&store, "a", "2");
    store
        .mutate(&spec(), "ns/b", |_| Ok(Mutation::Delete))
        .unwrap();
    assert_eq!((a1, b1, a2, store.current_rv()), (101, 102, 103, 104));

    let at = |rv| names(&store.list(&spec(), Some(rv), "ns/", None).unwrap().1);
    assert_eq!(at(100), Vec::<String>::new());
    assert_eq!(at(101), ["a=1"]);
    assert_eq!(at(102), ["a=1", "b=1"]);
    assert_eq!(at(103), ["a=2", "b=1"]);
    assert_eq!(at(104), ["a=2"]);
    assert_eq!(
        store.list(&spec(), Some(99), "", None).unwrap_err(),
        TooOld { oldest: 100 }
    );
}

#[test]
fn eviction_and_compaction_move_the_oldest_rv() {
    let store = Store::new(100, 2);
    for i in 0..4 {
        put(&store, &format!("o{i}"), "x");
    }
    // Events 103 and 104 remain: a watch may resume from 102.
    let (tx, _rx) = mpsc::channel(10);
    assert_eq!(
        store
            .watch(&spec(), WatchFrom::After(101), "", tx.clone())
            .unwrap_err(),
        TooOld { oldest: 102 }
    );
    let r = store
        .watch(&spec(), WatchFrom::After(102), "", tx.clone())
        .unwrap();
    match r.initial {
        Initial::Events(e) => {
            assert_eq!(e.iter().map(|e| e.rv).collect::<Vec<_>>(), [103, 104])
        }
        Initial::Objects(_) => panic!("expected events"),
    }
    store.compact();
    assert_eq!(
        store
            .watch(&spec(), WatchFrom::After(103), "", tx)
            .unwrap_err(),
        TooOld { oldest: 104 }
    );
}

#[test]
fn watchers_receive_writes_and_deletes_carry_the_delete_rv() {
    let store = Store::new(100, 10);
    put(&store, "a", "1");
    let (tx, mut rx) = mpsc::channel(10);
    let r = store
        .watch(&spec(), WatchFrom::Snapshot, "ns/", tx)
        .unwrap();
    assert_eq!(r.rv, 101);
    store
        .mutate(&spec(), "ns/a", |_| Ok(Mutation::Delete))
        .unwrap();
    let e = rx.try_recv().unwrap();
    assert_eq!(e.kind, EventType::Deleted);
    assert_eq!(object::meta_str(&e.object, "resourceVersion"), "102");
    assert_eq!(
        object::meta_str(e.prev.as_ref().unwrap(), "resourceVersion"),
        "101"
    );
}
