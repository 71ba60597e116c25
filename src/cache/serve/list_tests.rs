//! Unit tests of `list.rs`.

use super::*;
use apimachinery::resource::FieldSet;
use apimachinery::selector::LabelSelector;
use http_body_util::BodyExt;

fn cm(ns: &str, name: &str, app: &str) -> (Arc<str>, Arc<CachedObject>) {
    let json = format!(
        r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"1","labels":{{"app":"{app}"}}}}}}"#
    );
    let o = Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap());
    (o.key_arc().clone(), o)
}

fn objects() -> Objects {
    [
        cm("a", "x", "1"),
        cm("a", "y", "2"),
        cm("a-b", "z", "1"),
        cm("b", "w", "1"),
    ]
    .into_iter()
    .collect()
}

fn names(p: &Page) -> Vec<String> {
    p.items.iter().map(|o| o.key().to_string()).collect()
}

/// Walking a node's keys gives the page walking every object gives:
/// the same items and the same continue token, for every limit, start
/// and scope, with selections matching some, all or none of them.
#[test]
fn a_list_walking_the_node_index_pages_as_walking_everything() {
    let pod = |ns: &str, name: &str, node: &str, app: &str| {
        let json = format!(
            r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"1","labels":{{"app":"{app}"}}}},"spec":{{"nodeName":"{node}"}}}}"#
        );
        let o = Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Pod, true).unwrap());
        (o.key_arc().clone(), o)
    };
    let mut all = Vec::new();
    for (i, ns) in ["a", "a-b", "b"].iter().enumerate() {
        for j in 0..7 {
            let node = ["n1", "n2", ""][(i + j) % 3];
            let app = if j % 2 == 0 { "x" } else { "y" };
            all.push(pod(ns, &format!("p{j}"), node, app));
        }
    }
    let objects: Objects = all.into_iter().collect();
    for node in ["n1", "n2", "", "n9"] {
        let candidates: Keys = objects
            .iter()
            .filter(|(_, o)| o.field("spec.nodeName") == Some(node))
            .map(|(k, _)| k.clone())
            .collect();
        for fields in [
            format!("spec.nodeName={node}"),
            format!("spec.nodeName={node},spec.nodeName!={node}"),
            format!("spec.nodeName={node},metadata.name!=p3"),
        ] {
            for labels in ["", "app=x"] {
                for namespace in [None, Some("a"), Some("b")] {
                    let filter = Filter {
                        namespace: namespace.map(str::to_string),
                        labels: LabelSelector::parse(labels).unwrap(),
                        fields: apimachinery::selector::FieldSelector::parse(&fields).unwrap(),
                    };
                    let prefix = scope_prefix(namespace);
                    for limit in [0, 1, 2, 3, 100] {
                        let mut start: Option<String> = None;
                        loop {
                            let case = format!("{fields} {labels} {namespace:?} {limit} {start:?}");
                            let walked =
                                select(&objects, &filter, &prefix, start.as_deref(), limit, 9);
                            let indexed = select_in(
                                &objects,
                                &candidates,
                                &filter,
                                &prefix,
                                start.as_deref(),
                                limit,
                                9,
                            );
                            assert_eq!(names(&walked), names(&indexed), "{case}");
                            assert_eq!(walked.continue_token, indexed.continue_token, "{case}");
                            match walked.continue_token {
                                Some(t) => start = Some(continue_token::decode(&t).unwrap().start),
                                None => break,
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_large_protobuf_list_is_encoded_alike_on_several_threads() {
    let (codec, items) = configmaps(3000);
    let codec = &*codec;
    let joined = |parts| -> Vec<u8> {
        encode_items(&items, codec, parts)
            .unwrap()
            .iter()
            .flat_map(|b| b.iter().copied())
            .collect()
    };
    let one = joined(1);
    assert!(one.len() > 2 << 20, "{} bytes", one.len());
    for parts in [2, 3, 4] {
        assert!(joined(parts) == one, "{parts} threads");
    }
    assert_eq!(
        encode_items(&items[..1], codec, 4).map(|s| s.concat().len()),
        protobuf_segments(&items[..1], codec).map(|s| s.concat().len())
    );
    assert_eq!(encoding_threads(1000), 1);
}

/// A ConfigMap codec that keeps no forms, and `n` ConfigMaps of
/// varied sizes (about 1.1 KB each on average).
fn configmaps(n: usize) -> (Arc<encode::ProtoCodec>, Vec<Arc<CachedObject>>) {
    let codec = encode::ProtoCodec::new(
        "",
        "v1",
        "ConfigMap",
        "v1",
        prometheus::IntGauge::new("b", "b").unwrap(),
        prometheus::IntCounter::new("f", "f").unwrap(),
        encode::ProtoForms::new(0, 0).for_resource(0),
    )
    .unwrap();
    let items = (0..n)
        .map(|i| {
            let json = format!(
                r#"{{"kind":"ConfigMap","apiVersion":"v1","metadata":{{"name":"cm-{i:05}","namespace":"ns","resourceVersion":"{i}"}},"data":{{"k":"{}"}}}}"#,
                "x".repeat(i % 2000)
            );
            Arc::new(CachedObject::from_json(json.as_bytes(), FieldSet::Default, true).unwrap())
        })
        .collect();
    (Arc::new(codec), items)
}

async fn protobuf_list_body(
    info: &ResourceInfo,
    items: &[Arc<CachedObject>],
) -> Result<Vec<Vec<u8>>, BoxError> {
    let page = Page {
        items: items.to_vec(),
        ..Page::default()
    };
    let resp = response(page, info, 9, Representation::PROTOBUF).unwrap();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            frames.push(data.to_vec());
        }
    }
    Ok(frames)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_of_measured_versions_is_sent_as_encoded_with_the_same_bytes() {
    let (codec, items) = configmaps(5000);
    let mut info = crate::cache::resource::tests::test_cache().info().clone();
    info.codec = Some(codec.clone());
    let total: usize = items.iter().map(|o| o.json().len()).sum();
    assert!(total >= PARALLEL_LIST_BYTES, "{total} bytes");
    assert_eq!(measured_items_len(&items), None);
    // The first list is written whole, and measures every version.
    let whole = protobuf_list_body(&info, &items).await.unwrap().concat();
    let items_len = measured_items_len(&items).unwrap();
    assert!(whole.len() > items_len && whole.len() < items_len + 100);
    // Later lists are streamed; their bytes are the same, on any
    // number of encoding tasks.
    let streamed = protobuf_list_body(&info, &items).await.unwrap();
    assert!(streamed.len() > 3, "{} frames", streamed.len());
    assert!(streamed.concat() == whole);
    for parts in [1, 3, 4] {
        let head_len = whole.len() - items_len - protobuf::ENVELOPE_TAIL.len();
        let head = Bytes::copy_from_slice(&whole[..head_len]);
        let resp = streamed_protobuf_list(head, items.clone(), codec.clone(), parts);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body[..] == whole[..], "{parts} tasks");
    }
}

#[tokio::test]
async fn a_streamed_list_whose_item_is_not_its_recorded_length_is_cut() {
    let (codec, items) = configmaps(3000);
    let mut info = crate::cache::resource::tests::test_cache().info().clone();
    info.codec = Some(codec);
    protobuf_list_body(&info, &items).await.unwrap();
    let n = items[2000].proto_len().unwrap();
    items[2000].note_proto_len(n + 1);
    let err = protobuf_list_body(&info, &items).await.unwrap_err();
    assert!(err.to_string().contains("recorded length"), "{err}");
}

/// A panic in a streamed list's encoder ends the body in an error,
/// after what was sent before it.
#[tokio::test]
async fn a_panic_in_a_streamed_lists_encoder_is_an_error() {
    let mut rx = spawn_run(|tx| {
        tx.send(Ok(Bytes::from_static(b"first"))).unwrap();
        panic!("an encoder's bug");
    });
    assert_eq!(rx.recv().await.unwrap().unwrap(), "first");
    let err = rx.recv().await.unwrap().unwrap_err();
    assert!(err.to_string().contains("panicked"), "{err}");
    assert!(rx.recv().await.is_none());
}

#[test]
fn scope_sizes() {
    let o = objects();
    assert!(scope_holds_at_least(&o, "", 4));
    assert!(!scope_holds_at_least(&o, "", 5));
    // "a/" holds a/x and a/y, not a-b/z.
    assert!(scope_holds_at_least(&o, "a/", 2));
    assert!(!scope_holds_at_least(&o, "a/", 3));
    assert!(scope_holds_at_least(&o, "b/", 1));
    assert!(!scope_holds_at_least(&o, "c/", 1));
    assert!(scope_holds_at_least(&o, "c/", 0));
}

#[test]
fn storage_key_order_and_namespace_range() {
    let all = select(&objects(), &Filter::default(), "", None, 0, 5);
    // "a-b/z" sorts before "a/x": '-' < '/'.
    assert_eq!(names(&all), vec!["a-b/z", "a/x", "a/y", "b/w"]);
    let ns = select(&objects(), &Filter::default(), "a/", None, 0, 5);
    assert_eq!(names(&ns), vec!["a/x", "a/y"]);
}

#[test]
fn paging_without_selector_counts_remaining() {
    let p = select(&objects(), &Filter::default(), "", None, 1, 5);
    assert_eq!(names(&p), vec!["a-b/z"]);
    assert_eq!(p.remaining, Some(3));
    let token = continue_token::decode(p.continue_token.as_deref().unwrap()).unwrap();
    assert_eq!(token.rv, 5);
    let p2 = select(&objects(), &Filter::default(), "", Some(&token.start), 2, 5);
    assert_eq!(names(&p2), vec!["a/x", "a/y"]);
    assert_eq!(p2.remaining, Some(1));
    let token = continue_token::decode(p2.continue_token.as_deref().unwrap()).unwrap();
    let p3 = select(&objects(), &Filter::default(), "", Some(&token.start), 2, 5);
    assert_eq!(names(&p3), vec!["b/w"]);
    assert!(p3.continue_token.is_none());
}

#[test]
fn paging_with_selector_has_no_count() {
    let f = Filter {
        labels: LabelSelector::parse("app=1").unwrap(),
        ..Filter::default()
    };
    let p = select(&objects(), &f, "", None, 2, 5);
    assert_eq!(names(&p), vec!["a-b/z", "a/x"]);
    assert_eq!(p.remaining, None);
    assert!(
        p.continue_token.is_some(),
        "more objects follow a full page"
    );
    let p = select(&objects(), &f, "a/", None, 1, 5);
    assert_eq!(names(&p), vec!["a/x"]);
    assert!(
        p.continue_token.is_some(),
        "a/y follows even though it does not match"
    );
}

#[tokio::test]
async fn response_bytes() {
    let p = select(&objects(), &Filter::default(), "a/", None, 1, 7);
    let info = crate::cache::resource::tests::test_cache().info().clone();
    let resp = response(p, &info, 7, Representation::JSON).unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = std::str::from_utf8(&body).unwrap();
    assert!(text.starts_with(r#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7","continue":""#), "{text}");
    assert!(text.ends_with(r#""remainingItemCount":1},"items":[{"metadata":{"name":"x","namespace":"a","resourceVersion":"1","labels":{"app":"1"}}}]}
"#), "{text}");
    let empty = response(Page::default(), &info, 7, Representation::JSON).unwrap();
    let body = empty.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"kind\":\"ConfigMapList\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"7\"},\"items\":[]}\n");
    // A metadata-only list's empty items are `null`, as the
    // apiserver's.
    let metadata = Representation {
        metadata: Some(MetaVersion::V1),
        ..Representation::JSON
    };
    let empty = response(Page::default(), &info, 7, metadata).unwrap();
    let body = empty.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"meta.k8s.io/v1\",\"metadata\":{\"resourceVersion\":\"7\"},\"items\":null}\n");
}
