//! Replays the recording of a real kube-apiserver v1.36
//! (`tests/fixtures/real-apiserver-v1.36.json`) against a server of these
//! tests (the simulated apiserver directly, or the proxy in front of it)
//! and compares every answer with the recorded one.
//!
//! The fixtures the recording implies are created first from the recorded
//! objects themselves (pods `demo/p1` and `p-node1`, node `node-1`,
//! configmaps `cm-0..2`), and the writes the watch cases observed are
//! performed while those watches are open.
//!
//! What is compared: status codes; `Content-Type`, `Cache-Control` and
//! `Retry-After`; whole `Status` bodies (numbers in messages normalized);
//! list kinds, metadata (continue tokens decoded and compared field by
//! field, `remainingItemCount`) and items; objects field by field, including
//! key order; watch event sequences and whether the server closed the
//! stream. Volatile values are relaxed, and only those: `uid` and
//! `creationTimestamp` must exist but may differ; `managedFields` (the sim
//! keeps none) are ignored; resourceVersions must map consistently — the
//! same recorded RV always to the same sim RV, order preserved — except
//! list RVs, which in the real server include writes to other resources and
//! are only checked to be at least the RV of every item.

use std::collections::BTreeMap;
use std::time::Duration;

use apimachinery::resource::Gvr;
use base64::Engine;
use http::Method;
use kube_apiserver_sim::Sim;
use serde_json::{Value, json};

use crate::{Client, Next, QUIET, Resp, SOON};

pub const FIXTURE: &str = include_str!("../../../tests/fixtures/real-apiserver-v1.36.json");

/// Recorded RV → sim RV, checked to stay consistent and order-preserving.
#[derive(Default)]
pub struct RvMap {
    pub pairs: BTreeMap<u64, u64>,
}

impl RvMap {
    fn map(&mut self, recorded: &str, sim: &str, what: &str) {
        let r: u64 = recorded
            .parse()
            .unwrap_or_else(|_| panic!("{what}: recorded RV {recorded:?}"));
        let s: u64 = sim
            .parse()
            .unwrap_or_else(|_| panic!("{what}: sim RV {sim:?}"));
        if let Some(prev) = self.pairs.get(&r) {
            assert_eq!(
                *prev, s,
                "{what}: recorded RV {r} maps to both {prev} and {s}"
            );
            return;
        }
        for (&r2, &s2) in &self.pairs {
            assert_eq!(
                r < r2,
                s < s2,
                "{what}: RV order differs ({r}->{s} vs {r2}->{s2})"
            );
            assert_ne!(
                s, s2,
                "{what}: distinct recorded RVs {r} and {r2} map to the same sim RV {s}"
            );
        }
        self.pairs.insert(r, s);
    }
}

/// Replaces runs of digits with `<n>`: RVs in messages differ run to run.
fn norm(s: &str) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push_str("<n>");
            }
            in_digits = true;
        } else {
            in_digits = false;
            out.push(c);
        }
    }
    out
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// A recorded object as a create/update body: server-set fields removed,
/// `kind`/`apiVersion` added for list items.
fn as_body(obj: &Value, kind: &str) -> Value {
    let mut o = obj.clone();
    let m = o["metadata"].as_object_mut().unwrap();
    for k in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "managedFields",
        "generation",
    ] {
        m.shift_remove(k);
    }
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), json!(kind));
    out.insert("apiVersion".into(), json!("v1"));
    for (k, v) in o.as_object().unwrap() {
        if k != "kind" && k != "apiVersion" {
            out.insert(k.clone(), v.clone());
        }
    }
    Value::Object(out)
}

/// Compares a recorded object with the sim's, relaxing only volatile fields.
fn compare_object(recorded: &Value, got: &Value, rv: &mut RvMap, what: &str) {
    let mut r = recorded.clone();
    let mut g = got.clone();
    for v in [&mut r, &mut g] {
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.shift_remove("managedFields");
        }
    }
    assert_eq!(
        keys(&r),
        keys(&g),
        "{what}: top-level keys (order included)"
    );
    assert_eq!(
        keys(&r["metadata"]),
        keys(&g["metadata"]),
        "{what}: metadata keys (order included)"
    );
    for k in ["uid", "creationTimestamp"] {
        if r["metadata"].get(k).is_some() {
            assert!(
                g["metadata"][k].as_str().is_some_and(|s| !s.is_empty()),
                "{what}: {k} missing"
            );
            r["metadata"].as_object_mut().unwrap().shift_remove(k);
            g["metadata"].as_object_mut().unwrap().shift_remove(k);
        }
    }
    if let Some(rrv) = r["metadata"].get("resourceVersion").and_then(Value::as_str) {
        let grv = g["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default();
        rv.map(rrv, grv, what);
        r["metadata"]
            .as_object_mut()
            .unwrap()
            .shift_remove("resourceVersion");
        g["metadata"]
            .as_object_mut()
            .unwrap()
            .shift_remove("resourceVersion");
    }
    assert_eq!(r, g, "{what}: object differs");
}

fn compare_status(recorded: &Value, got: &Value, what: &str) {
    let mut r = recorded.clone();
    let mut g = got.clone();
    for v in [&mut r, &mut g] {
        if let Some(m) = v.get("message").and_then(Value::as_str) {
            let n = norm(m);
            v["message"] = json!(n);
        }
    }
    assert_eq!(r, g, "{what}: Status differs");
}

fn decode_token(token: &str) -> Value {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

pub struct Replay<'a> {
    pub sim: &'a Sim,
    pub clients: BTreeMap<&'static str, Client>,
    pub rv: RvMap,
    pub namespace: String,
    /// The continue token of the sim's `limit=1` answer, for the cases
    /// that chain it.
    pub continue_token: Option<String>,
    /// Recorded list RV → sim list RV, to translate watch start RVs.
    pub list_rvs: BTreeMap<String, String>,
    /// The target speaks JSON only (the simulated apiserver), so a client
    /// offering protobuf or JSON gets JSON where the recording has
    /// protobuf; the proxy answers protobuf from its cache.
    pub json_only: bool,
}

impl Replay<'_> {
    fn client(&self, identity: &str) -> &Client {
        self.clients
            .get(identity)
            .unwrap_or_else(|| panic!("unknown identity {identity}"))
    }

    fn cm_gvr() -> Gvr {
        Gvr {
            group: "".into(),
            version: "v1".into(),
            resource: "configmaps".into(),
        }
    }

    /// Creates what the recording shows existed before it started.
    pub fn seed(&mut self, rec: &Value) {
        let case = |name: &str| {
            rec["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == name)
                .unwrap()
                .clone()
        };
        let gvr = |r: &str| Gvr {
            group: "".into(),
            version: "v1".into(),
            resource: r.into(),
        };
        for ns in ["demo", self.namespace.as_str()] {
            self.sim
                .create(
                    &gvr("namespaces"),
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )
                .unwrap();
        }
        let p1 =
            case("list-pods-fieldselector-status-phase")["response"]["body"]["items"][0].clone();
        let node = case("list-nodes-cluster-scoped")["response"]["body"]["items"][0].clone();
        let cms = case("list-configmaps-ns")["response"]["body"]["items"].clone();
        let p_node1 =
            case("list-pods-all-namespaces-fieldselector-node")["response"]["body"]["items"][0]
                .clone();
        let mut seeded = vec![(gvr("pods"), "Pod", p1), (gvr("nodes"), "Node", node)];
        for cm in cms.as_array().unwrap() {
            seeded.push((Self::cm_gvr(), "ConfigMap", cm.clone()));
        }
        seeded.push((gvr("pods"), "Pod", p_node1));
        for (g, kind, obj) in seeded {
            let created = self.sim.create(&g, as_body(&obj, kind)).unwrap();
            let what = format!("seed {}", obj["metadata"]["name"]);
            self.rv.map(
                obj["metadata"]["resourceVersion"].as_str().unwrap(),
                created["metadata"]["resourceVersion"].as_str().unwrap(),
                &what,
            );
        }
    }

    /// Writes the recording implies happened before `case` (outside any
    /// watch): kubelet updated p-node1's status between the 3rd and 4th case.
    pub fn before(&mut self, case: &str, rec: &Value) {
        if case == "list-configmaps-labelselector" {
            let v2 = rec["cases"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "node-list-pods-own-node")
                .unwrap()["response"]["body"]["items"][0]
                .clone();
            let gvr = Gvr {
                group: "".into(),
                version: "v1".into(),
                resource: "pods".into(),
            };
            let updated = self.sim.update(&gvr, as_body(&v2, "Pod")).unwrap();
            self.rv.map(
                v2["metadata"]["resourceVersion"].as_str().unwrap(),
                updated["metadata"]["resourceVersion"].as_str().unwrap(),
                "p-node1 status update",
            );
        }
    }

    fn path(&self, case: &Value) -> String {
        let req = &case["request"];
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in req["query"].as_object().unwrap() {
            let mut v = v.as_str().unwrap().to_string();
            let name = case["name"].as_str().unwrap();
            if k == "continue" && v != "garbage" {
                v = self
                    .continue_token
                    .clone()
                    .expect("the limit-1 case runs first");
            }
            if k == "resourceVersion" && req["query"].get("watch").is_some() {
                // Watches start from the RV of an earlier list.
                if let Some(sim_rv) = self.list_rvs.get(&v) {
                    v = sim_rv.clone();
                }
            }
            if k == "timeoutSeconds" && name == "watch-timeout-seconds-2" {
                // Same semantics, half the test time.
                v = "1".into();
            }
            q.append_pair(k, &v);
        }
        let q = q.finish();
        let path = req["path"].as_str().unwrap();
        if q.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{q}")
        }
    }

    fn headers(case: &Value) -> Vec<(String, String)> {
        case["request"]
            .get("headers")
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn check_headers(
        recorded: &Value,
        resp_headers: &http::HeaderMap,
        name: &str,
        json_only: bool,
    ) {
        for h in ["Content-Type", "Cache-Control", "Retry-After"] {
            let got = resp_headers.get(h).and_then(|v| v.to_str().ok());
            let want = recorded["response"]["headers"]
                .get(h)
                .and_then(Value::as_str);
            if json_only && name == "list-configmaps-accept-protobuf-or-json" && h == "Content-Type"
            {
                assert_eq!(got, Some("application/json"), "{name}");
                continue;
            }
            assert_eq!(got, want, "{name}: header {h}");
        }
        assert!(resp_headers.contains_key("audit-id"), "{name}: Audit-Id");
    }

    pub async fn replay(&mut self, case: &Value) {
        let name = case["name"].as_str().unwrap().to_string();
        let identity = case["request"]["identity"].as_str().unwrap();
        if case["response"].get("events").is_some() {
            return self.replay_watch(case, &name, identity).await;
        }
        let method: Method = case["request"]["method"].as_str().unwrap().parse().unwrap();
        let path = self.path(case);
        let headers = Self::headers(case);
        let mut hdrs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let body = match name.as_str() {
            // The request bodies are not recorded; the responses show them.
            "create-configmap" | "create-configmap-conflict" => Some(
                serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-created"}})).unwrap(),
            ),
            "create-configmap-invalid-body" => Some(b"{not json".to_vec()),
            _ => None,
        };
        if body.is_some() {
            hdrs.push(("content-type", "application/json"));
        }
        let resp = self.client(identity).send(method, &path, &hdrs, body).await;
        self.compare_response(case, &name, resp);
    }

    fn compare_response(&mut self, case: &Value, name: &str, resp: Resp) {
        let want = &case["response"];
        assert_eq!(
            resp.status.as_u16(),
            want["status"].as_u64().unwrap() as u16,
            "{name}: status; body {}",
            String::from_utf8_lossy(&resp.body)
        );
        Self::check_headers(case, &resp.headers, name, self.json_only);
        if name == "list-configmaps-accept-protobuf-or-json" && self.json_only {
            let got = resp.json();
            assert_eq!(got["kind"], "ConfigMapList", "{name}");
            assert_eq!(got["items"].as_array().unwrap().len(), 3, "{name}");
            return;
        }
        if name == "list-configmaps-accept-protobuf-or-json" {
            // Protobuf, as recorded: a ConfigMapList of the three objects
            // (tests/real/protobuf.rs compares the bytes with a real
            // apiserver's).
            use apimachinery::protobuf::{fields, find_field};
            assert!(resp.body.starts_with(b"k8s\0"), "{name}");
            let envelope = &resp.body[4..];
            let type_meta = find_field(envelope, 1).unwrap();
            assert!(envelope[type_meta].ends_with(b"ConfigMapList"), "{name}");
            let list = &envelope[find_field(envelope, 2).unwrap()];
            let items = fields(list).unwrap().iter().filter(|f| f.0 == 2).count();
            assert_eq!(items, 3, "{name}");
            return;
        }
        assert!(
            resp.body.ends_with(b"\n"),
            "{name}: body must end with a newline"
        );
        let got = resp.json();
        let rec = &want["body"];
        match rec["kind"].as_str().unwrap() {
            "Status" => compare_status(rec, &got, name),
            "Table" => self.compare_table(rec, &got, name),
            k if k.ends_with("List") => self.compare_list(rec, &got, name),
            _ => compare_object(rec, &got, &mut self.rv, name),
        }
    }

    fn compare_list(&mut self, rec: &Value, got: &Value, name: &str) {
        assert_eq!(rec["kind"], got["kind"], "{name}");
        assert_eq!(rec["apiVersion"], got["apiVersion"], "{name}");
        assert_eq!(
            keys(&rec["metadata"]),
            keys(&got["metadata"]),
            "{name}: list metadata keys"
        );
        assert_eq!(
            rec["metadata"].get("remainingItemCount"),
            got["metadata"].get("remainingItemCount"),
            "{name}"
        );
        let list_rv = got["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        self.list_rvs.insert(
            rec["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .to_string(),
            list_rv.clone(),
        );
        if let Some(token) = got["metadata"].get("continue").and_then(Value::as_str) {
            let (r, g) = (
                decode_token(rec["metadata"]["continue"].as_str().unwrap()),
                decode_token(token),
            );
            assert_eq!(r["v"], g["v"], "{name}: token version");
            assert_eq!(r["start"], g["start"], "{name}: token start key");
            assert_eq!(
                r["rv"].to_string(),
                rec["metadata"]["resourceVersion"].as_str().unwrap(),
                "{name}: recorded token rv"
            );
            assert_eq!(
                g["rv"].to_string(),
                list_rv,
                "{name}: token rv is the list RV"
            );
            if name == "list-configmaps-limit-1" {
                self.continue_token = Some(token.to_string());
            }
        }
        let (ri, gi) = (
            rec["items"].as_array().unwrap(),
            got["items"].as_array().unwrap(),
        );
        let names = |items: &[Value]| {
            items
                .iter()
                .map(|i| i["metadata"]["name"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(ri), names(gi), "{name}: items");
        let list_rv: u64 = list_rv.parse().unwrap();
        for (r, g) in ri.iter().zip(gi) {
            let item_rv: u64 = g["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                item_rv <= list_rv,
                "{name}: item RV {item_rv} above list RV {list_rv}"
            );
            compare_object(
                r,
                g,
                &mut self.rv,
                &format!("{name} item {}", r["metadata"]["name"]),
            );
        }
        assert!(
            list_rv <= self.sim.resource_version(),
            "{name}: list RV from the future"
        );
    }

    fn compare_table(&mut self, rec: &Value, got: &Value, name: &str) {
        assert_eq!(keys(rec), keys(got), "{name}: table keys");
        assert_eq!(rec["kind"], got["kind"]);
        assert_eq!(rec["apiVersion"], got["apiVersion"]);
        assert_eq!(
            rec["columnDefinitions"], got["columnDefinitions"],
            "{name}: columns"
        );
        let (rr, gr) = (
            rec["rows"].as_array().unwrap(),
            got["rows"].as_array().unwrap(),
        );
        assert_eq!(rr.len(), gr.len(), "{name}: rows");
        for (r, g) in rr.iter().zip(gr) {
            assert_eq!(r["cells"][0], g["cells"][0], "{name}: name cell");
            assert_eq!(r["cells"][1], g["cells"][1], "{name}: data cell");
            let age = g["cells"][2].as_str().unwrap();
            assert!(
                age.ends_with('s') && age[..age.len() - 1].parse::<u32>().is_ok(),
                "{name}: age {age}"
            );
            compare_object(
                &r["object"],
                &g["object"],
                &mut self.rv,
                &format!("{name} row"),
            );
        }
    }

    /// Writes the watch cases observed, performed before reading event `i`.
    async fn during_watch(&mut self, name: &str, i: usize, expected: &[Value]) {
        let admin = self.client("admin").clone();
        let base = format!("/api/v1/namespaces/{}/configmaps", self.namespace);
        match (name, i) {
            ("watch-configmaps-from-list-rv-with-changes", 0) => {
                let created = admin
                    .post_json(&base, &as_body(&expected[0]["object"], "ConfigMap"))
                    .await;
                assert_eq!(created.status, 201);
                let update =
                    serde_json::to_vec(&as_body(&expected[1]["object"], "ConfigMap")).unwrap();
                let r = admin
                    .send(
                        Method::PUT,
                        &format!("{base}/cm-new"),
                        &[("content-type", "application/json")],
                        Some(update),
                    )
                    .await;
                assert_eq!(r.status, 200);
                let r = admin
                    .send(Method::DELETE, &format!("{base}/cm-new"), &[], None)
                    .await;
                assert_eq!(r.status, 200);
            }
            ("watch-configmaps-labelselector-transitions", 3) => {
                for app in ["a", "b"] {
                    let patch =
                        serde_json::to_vec(&json!({"metadata": {"labels": {"app": app}}})).unwrap();
                    let r = admin
                        .send(
                            Method::PATCH,
                            &format!("{base}/cm-2"),
                            &[("content-type", "application/merge-patch+json")],
                            Some(patch),
                        )
                        .await;
                    assert_eq!(
                        r.status,
                        200,
                        "relabel cm-2: {}",
                        String::from_utf8_lossy(&r.body)
                    );
                }
            }
            _ => {}
        }
    }

    async fn replay_watch(&mut self, case: &Value, name: &str, identity: &str) {
        let path = self.path(case);
        let headers = Self::headers(case);
        let hdrs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut stream = self.client(identity).watch(&path, &hdrs).await;
        let want = &case["response"];
        assert_eq!(
            stream.status.as_u16(),
            want["status"].as_u64().unwrap() as u16,
            "{name}: status"
        );
        Self::check_headers(case, &stream.headers, name, self.json_only);
        if want["status"] != 200 {
            let body = stream.event(SOON).await;
            compare_status(&want["body"], &body, name);
            return;
        }
        let expected = want["events"].as_array().unwrap().clone();
        for (i, exp) in expected.iter().enumerate() {
            self.during_watch(name, i, &expected).await;
            let got = stream.event(SOON).await;
            let what = format!("{name} event {i}");
            assert_eq!(exp["type"], got["type"], "{what}: type; got {got}");
            match exp["type"].as_str().unwrap() {
                "ERROR" => compare_status(&exp["object"], &got["object"], &what),
                "BOOKMARK" => {
                    let (r, g) = (&exp["object"], &got["object"]);
                    assert_eq!(keys(r), keys(g), "{what}");
                    assert_eq!(keys(&r["metadata"]), keys(&g["metadata"]), "{what}");
                    assert_eq!(
                        (&r["kind"], &r["apiVersion"]),
                        (&g["kind"], &g["apiVersion"]),
                        "{what}"
                    );
                    assert_eq!(
                        r["metadata"]["annotations"], g["metadata"]["annotations"],
                        "{what}"
                    );
                    self.rv.map(
                        r["metadata"]["resourceVersion"].as_str().unwrap(),
                        g["metadata"]["resourceVersion"].as_str().unwrap(),
                        &what,
                    );
                }
                _ => compare_object(&exp["object"], &got["object"], &mut self.rv, &what),
            }
        }
        for line in &stream.raw {
            assert!(
                line.ends_with(b"\n") && !line[..line.len() - 1].contains(&b'\n'),
                "{name}: framing"
            );
        }
        let closed = want["closed_by_server"].as_bool().unwrap();
        let wait = if closed {
            Duration::from_secs(3)
        } else {
            QUIET
        };
        match stream.next(wait).await {
            Next::End => assert!(
                closed,
                "{name}: the sim closed a stream the apiserver kept open"
            ),
            Next::Timeout => assert!(
                !closed,
                "{name}: the apiserver closed this stream, the sim did not"
            ),
            other => panic!("{name}: unexpected {other:?} after the recorded events"),
        }
    }
}
