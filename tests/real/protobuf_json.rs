//! Against a real kube-apiserver v1.36 (`kube-testenv`, etcd in protobuf,
//! the apiserver's default): the protobuf-to-JSON transcoder
//! (`apimachinery::protobuf::to_json`) writes, for every object of every
//! built-in resource the apiserver lists (what it makes at start: RBAC,
//! flow control, namespaces, leases; and one or more objects of some forty
//! kinds created here), the bytes the apiserver itself writes in JSON:
//! list items without `TypeMeta`, a get's object with it; a
//! CustomResourceDefinition's floats (`1e+22`) included. What it may refuse
//! is only what the schema says it cannot write: a CustomResourceDefinition
//! whose schema holds JSON-typed fields (`default`, `enum`, `example`).
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::collections::BTreeMap;

use apimachinery::protobuf::{field_number, find_field, message_for, to_json};
use http::Method;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use support::client::Client;
use support::real::RealEnv;

const PB: &str = "application/vnd.kubernetes.protobuf";

/// Objects of kinds the protobuf tests' fixtures lack, with the special
/// types in their corners: `IntOrString` both ways, `MicroTime`, raw JSON
/// with HTML characters, `[]byte`, times, quantities, a pod's status.
async fn more_fixtures(env: &RealEnv, ns: &str) {
    let admin = env.apiserver();
    let template = json!({"metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::new(Vec::<String>::new())
        .unwrap()
        .serialize_request(&key)
        .unwrap()
        .pem()
        .unwrap();
    let csr = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, csr);
    let objects = [
        (
            "/apis/apps/v1/namespaces/NS/deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "x"}}, "template": template,
                     "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}}}}),
        ),
        (
            "/apis/apps/v1/namespaces/NS/replicasets",
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template}}),
        ),
        (
            "/apis/apps/v1/namespaces/NS/daemonsets",
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template,
                     "updateStrategy": {"rollingUpdate": {"maxUnavailable": "10%"}}}}),
        ),
        (
            "/apis/apps/v1/namespaces/NS/statefulsets",
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "ss"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "serviceName": "s", "template": template,
                     "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}}),
        ),
        (
            "/apis/apps/v1/namespaces/NS/controllerrevisions",
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "cr"},
            "revision": 3, "data": {"spec": {"template": {"$patch": "replace", "note": "<a & b>", "n": 1.5, "e": [], "u": "\u{2028}"}}}}),
        ),
        (
            "/apis/batch/v1/namespaces/NS/jobs",
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"backoffLimit": 2, "suspend": true, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}),
        ),
        (
            "/apis/batch/v1/namespaces/NS/cronjobs",
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cj"},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure", "containers": [{"name": "c", "image": "i"}]}}}}}}),
        ),
        (
            "/apis/coordination.k8s.io/v1/namespaces/NS/leases",
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"},
            "spec": {"holderIdentity": "h", "leaseDurationSeconds": 40, "acquireTime": "2026-01-02T03:04:05.000000Z",
                     "renewTime": "2026-01-02T03:04:05.123456Z", "leaseTransitions": 0}}),
        ),
        (
            "/apis/events.k8s.io/v1/namespaces/NS/events",
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "ev"},
            "eventTime": "2026-01-02T03:04:05.654321Z", "reportingController": "x.io/c", "reportingInstance": "i", "action": "A", "reason": "R",
            "type": "Normal", "note": "n", "regarding": {"kind": "Pod", "name": "p-0", "namespace": "NS"}}),
        ),
        (
            "/api/v1/namespaces/NS/events",
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "ev1"},
            "involvedObject": {"kind": "Pod", "name": "p-0", "namespace": "NS"}, "reason": "R", "message": "m <x>", "count": 3, "type": "Warning",
            "firstTimestamp": "2026-01-02T03:04:05Z", "lastTimestamp": "2026-01-02T03:04:09Z", "source": {"component": "c"}}),
        ),
        (
            "/api/v1/namespaces/NS/secrets",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "sec"},
            "type": "Opaque", "data": {"bin": "AP8Q", "empty": ""}, "stringData": {"s": "é"}}),
        ),
        (
            "/api/v1/namespaces/NS/configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "annotations": {"a": "<&>\u{2029}\u{1}é"}},
            "data": {"z": "", "a": "1"}, "binaryData": {"b": "AAEC"}, "immutable": false}),
        ),
        (
            "/api/v1/namespaces/NS/serviceaccounts",
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa"},
            "automountServiceAccountToken": false, "imagePullSecrets": [{"name": "x"}]}),
        ),
        (
            "/api/v1/namespaces/NS/resourcequotas",
            json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "rq"},
            "spec": {"hard": {"pods": "10", "requests.cpu": "1500m", "requests.memory": "1.5Gi"}}}),
        ),
        (
            "/api/v1/namespaces/NS/limitranges",
            json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "200m"}, "max": {"memory": "1e3"}}]}}),
        ),
        (
            "/api/v1/namespaces/NS/persistentvolumeclaims",
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "pvc"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}, "storageClassName": "sc"}}),
        ),
        (
            "/api/v1/persistentvolumes",
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "NS-pv"},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"}, "persistentVolumeReclaimPolicy": "Retain"}}),
        ),
        (
            "/api/v1/namespaces/NS/endpoints",
            json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "ep"},
            "subsets": [{"addresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 80}]}]}),
        ),
        (
            "/apis/policy/v1/namespaces/NS/poddisruptionbudgets",
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "pdb"},
            "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "x"}}}}),
        ),
        (
            "/apis/autoscaling/v2/namespaces/NS/horizontalpodautoscalers",
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "hpa"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}, "minReplicas": 1, "maxReplicas": 5,
                     "metrics": [{"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "100Mi"}}}]}}),
        ),
        (
            "/apis/networking.k8s.io/v1/namespaces/NS/networkpolicies",
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "np"},
            "spec": {"podSelector": {}, "ingress": [{"ports": [{"port": "http"}, {"port": 53, "protocol": "UDP", "endPort": 60}]}], "policyTypes": ["Ingress"]}}),
        ),
        (
            "/apis/networking.k8s.io/v1/namespaces/NS/ingresses",
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "ing"},
            "spec": {"rules": [{"host": "a.example.com", "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "s", "port": {"number": 80}}}}]}}]}}),
        ),
        (
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "NS-pc"},
            "value": 1000, "globalDefault": false, "description": "d"}),
        ),
        (
            "/apis/storage.k8s.io/v1/storageclasses",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "NS-sc"},
            "provisioner": "x.io/p", "parameters": {"b": "2", "a": "1"}, "allowVolumeExpansion": true, "volumeBindingMode": "WaitForFirstConsumer"}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/NS/roles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "r"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
        ),
        (
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "NS-csr"},
            "spec": {"request": "", "signerName": "example.com/s", "usages": ["digital signature"], "expirationSeconds": 3600}}),
        ),
        (
            "/api/v1/namespaces/NS/replicationcontrollers",
            json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"},
            "spec": {"replicas": 0, "selector": {"app": "x"}, "template": template}}),
        ),
        (
            "/api/v1/namespaces/NS/podtemplates",
            json!({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "pt"}, "template": template}),
        ),
        (
            "/apis/networking.k8s.io/v1/ingressclasses",
            json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "NS-ic"},
            "spec": {"controller": "example.com/ingress"}}),
        ),
        (
            "/apis/storage.k8s.io/v1/volumeattachments",
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment", "metadata": {"name": "NS-va"},
            "spec": {"attacher": "attacher.example.com", "nodeName": "n", "source": {"persistentVolumeName": "NS-pv"}}}),
        ),
        (
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration", "metadata": {"name": "NS-vwc"},
            "webhooks": [{"name": "v.example.com", "clientConfig": {"url": "https://example.com/v", "caBundle": "AAEC/w=="}, "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Ignore", "timeoutSeconds": 5,
                          "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["configmaps"], "scope": "Namespaced"}],
                          "namespaceSelector": {"matchLabels": {"NS-none": "x"}}}]}),
        ),
        (
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "widgets.NS.example.com"},
            "spec": {"group": "NS.example.com", "scope": "Namespaced", "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
                     "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                         "size": {"type": "number", "minimum": 0.5, "maximum": 1e22, "multipleOf": 0.25},
                         "tiny": {"type": "number", "minimum": 1.5e-7}}}}}]}}),
        ),
    ];
    for (path, mut obj) in objects {
        let path = path.replace("NS", ns);
        let text = obj.to_string().replace("NS", ns);
        obj = serde_json::from_str(&text).unwrap();
        // The CSR goes in after the namespace: its base64 may hold "NS".
        if let Some(request) = obj.pointer_mut("/spec/request") {
            *request = json!(csr);
        }
        let r = admin.post_json(&path, &obj).await;
        assert!(
            r.status == 201 || r.status == 400 || r.status == 422,
            "create at {path}: {} {}",
            r.status,
            r.text()
        );
        if r.status != 201 {
            // A shape this version validates differently: not what this
            // test is about; the others still cover the kind.
            eprintln!("not created at {path}: {}", r.text());
        }
    }
    // A pod's status, as a kubelet writes it.
    let status = json!({"status": {"phase": "Running", "startTime": "2026-01-02T03:04:05Z", "podIP": "10.0.0.5", "podIPs": [{"ip": "10.0.0.5"}],
        "conditions": [{"type": "Ready", "status": "True", "lastProbeTime": null, "lastTransitionTime": "2026-01-02T03:04:06Z"}],
        "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0, "image": "registry.k8s.io/pause:3.10", "imageID": "", "started": true,
                               "state": {"running": {"startedAt": "2026-01-02T03:04:06Z"}}}]}});
    let r = admin
        .send(
            Method::PATCH,
            &format!("/api/v1/namespaces/{ns}/pods/p-0/status"),
            &[("content-type", "application/merge-patch+json")],
            Some(status.to_string().into_bytes()),
        )
        .await;
    assert_eq!(r.status, 200, "pod status: {}", r.text());
}

/// Every listable resource of every group version the apiserver serves:
/// its collection path, group, version and kind.
async fn resources(admin: &Client) -> Vec<(String, String, String, String)> {
    let mut gvs = vec![("/api/v1".to_string(), String::new(), "v1".to_string())];
    let groups = admin.get("/apis").await.json();
    for g in groups["groups"].as_array().unwrap() {
        for v in g["versions"].as_array().unwrap() {
            gvs.push((
                format!("/apis/{}", v["groupVersion"].as_str().unwrap()),
                g["name"].as_str().unwrap().to_string(),
                v["version"].as_str().unwrap().to_string(),
            ));
        }
    }
    let mut out = Vec::new();
    for (base, group, version) in gvs {
        let list = admin.get(&base).await.json();
        for r in list["resources"].as_array().unwrap() {
            let name = r["name"].as_str().unwrap();
            let listable = r["verbs"]
                .as_array()
                .is_some_and(|v| v.iter().any(|v| v == "list"));
            if name.contains('/') || !listable {
                continue;
            }
            out.push((
                format!("{base}/{name}"),
                group.clone(),
                version.clone(),
                r["kind"].as_str().unwrap().to_string(),
            ));
        }
    }
    out
}

/// The `raw` of a protobuf envelope, and its type meta's `apiVersion` and
/// `kind`.
fn unwrap_envelope(body: &[u8]) -> (&[u8], String, String) {
    assert!(body.starts_with(b"k8s\0"), "not protobuf");
    let e = &body[4..];
    let tm = &e[find_field(e, 1).unwrap()];
    let text = |n| String::from_utf8(tm[find_field(tm, n).unwrap()].to_vec()).unwrap();
    (&e[find_field(e, 2).unwrap()], text(1), text(2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_object_in_protobuf_reads_back_as_the_apiservers_json() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("pb-json").await;
    crate::protobuf::fixtures(&env, &ns, "pb-json", "pb-json-node").await;
    more_fixtures(&env, &ns).await;
    let admin = env.apiserver();
    let mut compared: BTreeMap<String, usize> = BTreeMap::new();
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    for (path, group, version, kind) in resources(&admin).await {
        let Some(item_message) = message_for(&group, &version, &kind) else {
            continue;
        };
        let list_message = message_for(&group, &version, &format!("{kind}List"))
            .unwrap_or_else(|| panic!("{path}: no {kind}List"));
        let items_field = field_number(list_message, "items").unwrap();
        // The JSON list, then the protobuf list at its resourceVersion.
        let json_list = admin.get(&path).await;
        assert_eq!(json_list.status, 200, "{path}: {}", json_list.text());
        #[derive(serde::Deserialize)]
        struct List<'a> {
            metadata: Value,
            #[serde(borrow)]
            items: Vec<&'a RawValue>,
        }
        let list: List<'_> = serde_json::from_slice(&json_list.body).unwrap();
        // Not from storage (componentstatuses): no resourceVersion.
        let at = match list.metadata["resourceVersion"].as_str() {
            Some(rv) if !rv.is_empty() => {
                format!("?resourceVersion={rv}&resourceVersionMatch=Exact")
            }
            _ => String::new(),
        };
        let pb_list = admin
            .send(Method::GET, &format!("{path}{at}"), &[("accept", PB)], None)
            .await;
        assert_eq!(pb_list.status, 200, "{path}{at} in protobuf");
        let (raw, _, _) = unwrap_envelope(&pb_list.body);
        let items: Vec<&[u8]> = apimachinery::protobuf::fields(raw)
            .unwrap()
            .into_iter()
            .filter(|(n, _, _)| *n == items_field)
            .map(|(_, _, r)| &raw[r])
            .collect();
        assert_eq!(items.len(), list.items.len(), "{path}: items");
        let mut ours = Vec::new();
        for pb in &items {
            let mut out = Vec::new();
            match to_json(pb, item_message, None, &mut out) {
                Ok(()) => ours.push(String::from_utf8(out).unwrap()),
                Err(e) => {
                    refused.insert(path.clone(), e.to_string());
                }
            }
        }
        if refused.contains_key(&path) {
            continue;
        }
        let mut theirs: Vec<String> = list.items.iter().map(|i| i.get().to_string()).collect();
        if at.is_empty() {
            // Not from storage: in no set order.
            ours.sort();
            theirs.sort();
        }
        for (ours, theirs) in ours.iter().zip(&theirs) {
            assert_eq!(
                ours, theirs,
                "{path}: a list item written otherwise than the apiserver's JSON"
            );
        }
        *compared.entry(path.clone()).or_default() += ours.len();
        // A get of the first item, with its TypeMeta.
        let Some(first) = list.items.first() else {
            continue;
        };
        let meta: Value = serde_json::from_str(first.get()).unwrap();
        let name = meta["metadata"]["name"].as_str().unwrap();
        let object_path = match meta["metadata"]["namespace"].as_str() {
            Some(n) => {
                let (base, resource) = path.rsplit_once('/').unwrap();
                format!("{base}/namespaces/{n}/{resource}/{name}")
            }
            None => format!("{path}/{name}"),
        };
        let (j, p) = tokio::join!(
            admin.get(&object_path),
            admin.send(Method::GET, &object_path, &[("accept", PB)], None)
        );
        if j.status != 200 || p.status != 200 {
            continue;
        }
        let jv: Value = j.json();
        if jv["metadata"]["resourceVersion"] != meta["metadata"]["resourceVersion"] {
            continue; // Changed in between (a lease renewed).
        }
        let (raw, api_version, pb_kind) = unwrap_envelope(&p.body);
        let mut out = Vec::new();
        if to_json(raw, item_message, Some((&pb_kind, &api_version)), &mut out).is_ok() {
            out.push(b'\n');
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&j.body),
                "{object_path}: an object written otherwise than the apiserver's JSON"
            );
        }
    }
    eprintln!("compared: {compared:?}");
    eprintln!("refused: {refused:?}");
    let total: usize = compared.values().sum();
    assert!(total > 200, "only {total} objects compared");
    for kind in [
        "/api/v1/pods",
        "/api/v1/nodes",
        "/api/v1/secrets",
        "/apis/apps/v1/deployments",
        "/apis/apps/v1/controllerrevisions",
        "/apis/coordination.k8s.io/v1/leases",
        "/apis/events.k8s.io/v1/events",
        "/apis/discovery.k8s.io/v1/endpointslices",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
        "/apis/apps/v1/statefulsets",
        "/apis/certificates.k8s.io/v1/certificatesigningrequests",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    ] {
        assert!(
            compared.get(kind).is_some_and(|n| *n > 0),
            "{kind} not compared"
        );
    }
    for (path, error) in &refused {
        assert!(
            path.contains("customresourcedefinitions"),
            "{path}: refused: {error}"
        );
    }
}

/// A proxy whose caches read upstream in protobuf
/// (`cache.upstreamEncoding: Protobuf`) answers every read as the
/// apiserver does: JSON gets byte for byte, and the protobuf and
/// metadata-only lists, gets and watch event sequences of the protobuf
/// tests; and it did read in protobuf throughout (its operator's view says
/// so, and no resource fell back to JSON).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_reading_upstream_in_protobuf_answers_as_the_apiserver() {
    let Some(env) = RealEnv::start_with(|c| {
        support::cache_configmaps(c);
        c.cache.upstream_encoding = kube_cache_proxy::component::config::UpstreamEncoding::Protobuf;
    })
    .await
    else {
        return;
    };
    let ns = env.namespace("pbu-json").await;
    let (label, node) = ("pbu-json", "pbu-json-node");
    crate::protobuf::fixtures(&env, &ns, label, node).await;
    let rv = env.current_rv().await;
    let admin = env.admin();
    let (direct, proxy) = (env.direct(admin.clone()), env.proxy(admin));
    let mut colls = crate::protobuf::collections(&ns, label, node);
    colls.push((
        format!("/api/v1/namespaces/{ns}/configmaps"),
        format!("/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt"),
    ));
    crate::protobuf::synced(&direct, &proxy, &colls, rv).await;
    for (list, get) in &colls {
        let sep = if list.contains('?') { '&' } else { '?' };
        for path in [
            format!("{get}?resourceVersion=0"),
            format!("{list}{sep}resourceVersion=0"),
        ] {
            let h = [("accept", "application/json")];
            let (d, p) = tokio::join!(
                direct.send(Method::GET, &path, &h, None),
                proxy.send(Method::GET, &path, &h, None)
            );
            support::differential::assert_same(&d, &p, &path);
            if path.starts_with(get.as_str()) {
                assert_eq!(
                    String::from_utf8_lossy(&d.body),
                    String::from_utf8_lossy(&p.body),
                    "{path}: not the apiserver's bytes"
                );
            }
        }
    }
    crate::protobuf::lists_and_gets_match(&env, "pbu-reads", true).await;
    crate::protobuf::watch_event_sequences_match(&env, "pbu-watch").await;

    let (status, body) = env.running.admin_get("/debug/caches").await;
    assert_eq!(status, 200);
    let caches: Value = serde_json::from_str(&body).unwrap();
    let caches = caches["caches"].as_array().unwrap();
    assert!(caches.len() >= 9, "{body}");
    for c in caches {
        assert_eq!(c["upstreamEncoding"], "Protobuf", "{c}");
    }
    let fallbacks = support::real::metric_sum(
        &env.proxy_metrics().await,
        "kube_cache_proxy_upstream_json_fallbacks_total",
        &[],
    );
    assert_eq!(fallbacks, 0.0);
    // The reflector's `Accept` offers JSON after protobuf (for a server
    // that cannot encode the kind so): the apiserver picks protobuf.
    use kube_cache_proxy::cache::ingest::upstream_protobuf::{LIST_ACCEPT, WATCH_ACCEPT};
    for (path, accept, content_type) in [
        (
            "/api/v1/pods?limit=1",
            LIST_ACCEPT,
            "application/vnd.kubernetes.protobuf",
        ),
        (
            "/api/v1/pods?watch=true&timeoutSeconds=1",
            WATCH_ACCEPT,
            "application/vnd.kubernetes.protobuf;stream=watch",
        ),
    ] {
        let r = direct
            .send(Method::GET, path, &[("accept", accept)], None)
            .await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some(content_type), "{path}");
    }
}

/// A proxy older than the apiserver (a field hidden from its schema) that
/// reads upstream in protobuf meets an object with that field (a pod's
/// `hostname`, which gogo's marshaller writes even empty: so every pod,
/// whether listed or watched): rather than lose it, the cache goes back to
/// reading the resource in JSON, once, and serves the object with the
/// field, as the apiserver does; its other resources stay in protobuf.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_proxy_reads_json_rather_than_lose_a_field() {
    use kube_testenv::ControlPlane;
    use std::time::Duration;
    use support::Auth;
    use support::real::{eventually, metric_sum};
    let Some(cp) = ControlPlane::shared().await else {
        return;
    };
    let config = std::fs::read_to_string(support::repo().join("config/kube-cache-proxy.yaml"))
        .unwrap()
        .replace("upstreamEncoding: JSON", "upstreamEncoding: Protobuf");
    assert!(config.contains("upstreamEncoding: Protobuf"));
    let dir = support::env::tempdir();
    let config_path = dir.join("config.yaml");
    std::fs::write(&config_path, config).unwrap();
    let proxy =
        crate::protobuf::older_proxy(cp, config_path.to_str().unwrap(), "older-pb-node").await;
    let encoding = |resource: &'static str| {
        let proxy = &proxy;
        async move {
            let (_, body) = proxy.admin_get("/debug/caches").await.unwrap_or_default();
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            v["caches"]
                .as_array()
                .and_then(|c| c.iter().find(|c| c["resource"] == resource))
                .map(|c| c["upstreamEncoding"].as_str().unwrap_or("").to_string())
                .unwrap_or_default()
        }
    };
    let admin = Auth::Cert(cp.admin().clone());
    let direct = Client::new(&cp.url(), &cp.ca_pem(), admin.clone(), false);
    let through = proxy.client(admin);
    let ns = "pbu-older";
    crate::protobuf::namespace_with_default_sa(&direct, ns).await;
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "newer"},
        "spec": {"nodeName": "older-pb-node", "hostname": "h-newer", "containers": [{"name": "c", "image": "i"}]}});
    let r = direct.post_json(&pods, &pod).await;
    assert_eq!(r.status, 201, "{}", r.text());
    // The cache goes back to JSON and then holds the pod, field and all.
    let get = format!("{pods}/newer?resourceVersion=0");
    let body = eventually(Duration::from_secs(20), "the pod from the cache", || {
        let (through, get) = (&through, &get);
        async move {
            let r = through.get(get).await;
            (r.status == 200).then_some(r)
        }
    })
    .await;
    assert!(body.text().contains("h-newer"), "{}", body.text());
    assert_eq!(encoding("pods").await, "JSON");
    assert_eq!(encoding("nodes").await, "Protobuf");
    let (_, text) = proxy.admin_get("/metrics").await.unwrap();
    assert_eq!(
        metric_sum(
            &text,
            "kube_cache_proxy_upstream_json_fallbacks_total",
            &[("resource", "pods")]
        ),
        1.0
    );
    let direct_body = direct.get(&get).await;
    assert_eq!(direct_body.text(), body.text(), "the apiserver's bytes");
}
