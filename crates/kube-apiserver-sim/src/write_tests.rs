//! Unit tests of `write`.

use super::*;
use serde_json::json;

fn cm() -> ResourceSpec {
    ResourceSpec::new("", "v1", "configmaps", "ConfigMap", true)
}

#[test]
fn create_update_delete_rules() {
    let store = Store::new(100, 100);
    let spec = cm();
    let made = create(
        &store,
        &spec,
        Some("ns"),
        json!({"metadata": {"generateName": "x-"}, "data": {"a": "1"}}),
    )
    .unwrap();
    let name = object::meta_str(&made, "name").to_string();
    assert!(name.starts_with("x-") && name.len() == 7);
    assert_eq!(object::meta_str(&made, "resourceVersion"), "101");
    let e = create(
        &store,
        &spec,
        Some("ns"),
        json!({"metadata": {"name": name.clone()}}),
    )
    .unwrap_err();
    assert_eq!(e.code, 409);
    let e = create(&store, &spec, Some("ns"), json!({"metadata": {}})).unwrap_err();
    assert_eq!(e.code, 422);
    let e = create(
        &store,
        &spec,
        Some("ns"),
        json!({"metadata": {"name": "a", "namespace": "other"}}),
    )
    .unwrap_err();
    assert_eq!(e.code, 400);

    // Stale RV: conflict. Same content: no write.
    let stale =
        json!({"metadata": {"name": name.clone(), "resourceVersion": "1"}, "data": {"a": "2"}});
    assert_eq!(
        update(
            &store,
            &spec,
            Some(("ns", &name)),
            stale,
            Target::Main { keep_status: false }
        )
        .unwrap_err()
        .code,
        409
    );
    let same =
        json!({"metadata": {"name": name.clone(), "generateName": "x-"}, "data": {"a": "1"}});
    let out = update(
        &store,
        &spec,
        Some(("ns", &name)),
        same,
        Target::Main { keep_status: false },
    )
    .unwrap();
    assert_eq!(
        (
            object::meta_str(&out, "resourceVersion"),
            store.current_rv()
        ),
        ("101", 101)
    );
    let changed = json!({"metadata": {"name": name.clone()}, "data": {"a": "2"}});
    let out = update(
        &store,
        &spec,
        Some(("ns", &name)),
        changed,
        Target::Main { keep_status: false },
    )
    .unwrap();
    assert_eq!(object::meta_str(&out, "resourceVersion"), "102");
    assert_eq!(
        object::meta_str(&out, "uid"),
        object::meta_str(&made, "uid")
    );

    let pre = Preconditions {
        uid: Some("nope".into()),
        ..Preconditions::default()
    };
    assert_eq!(
        delete(&store, &spec, "ns", &name, &pre).unwrap_err().code,
        409
    );
    let gone = delete(&store, &spec, "ns", &name, &Preconditions::default()).unwrap();
    assert_eq!(object::meta_str(&gone, "resourceVersion"), "103");
    assert_eq!(
        delete(&store, &spec, "ns", &name, &Preconditions::default())
            .unwrap_err()
            .code,
        404
    );
}

#[test]
fn status_and_generation() {
    let store = Store::new(1, 100);
    let spec = ResourceSpec::new("apps", "v1", "deployments", "Deployment", true).with_status();
    create(
        &store,
        &spec,
        Some("ns"),
        json!({"metadata": {"name": "d"}, "spec": {"replicas": 1}}),
    )
    .unwrap();
    let st = json!({"metadata": {"name": "d"}, "spec": {"replicas": 5}, "status": {"ready": 1}});
    let out = update(&store, &spec, Some(("ns", "d")), st, Target::Status).unwrap();
    assert_eq!(out["spec"]["replicas"], 1);
    assert_eq!(out["status"]["ready"], 1);
    assert_eq!(out["metadata"]["generation"], 1);
    let main = json!({"metadata": {"name": "d"}, "spec": {"replicas": 2}, "status": {"ready": 9}});
    let out = update(
        &store,
        &spec,
        Some(("ns", "d")),
        main,
        Target::Main { keep_status: true },
    )
    .unwrap();
    assert_eq!(
        (
            out["spec"]["replicas"].clone(),
            out["status"]["ready"].clone()
        ),
        (json!(2), json!(1))
    );
    assert_eq!(out["metadata"]["generation"], 2);
    let out = patch(
        &store,
        &spec,
        "ns",
        "d",
        Target::Main { keep_status: true },
        |o| {
            super::super::patch::merge(o, &json!({"metadata": {"labels": {"x": "y"}}}));
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(out["metadata"]["labels"]["x"], "y");
    assert_eq!(out["metadata"]["generation"], 2);
}
