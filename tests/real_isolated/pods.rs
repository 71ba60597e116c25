//! Pods on the pod network reach their node proxy (`podNetwork`,
//! docs/pods.md), against a real kube-apiserver v1.36 and a hollow node
//! (kubemark) whose kubelet and kube-proxy go through a node proxy on the
//! shipped node configuration (`manifests/node/config.yaml`: the node's own
//! certificate upstream, `upstream.identity: Node`), with `podNetwork.listen`
//! on a node-local address and `kubernetesService: NodeLabel`:
//!
//! - labelled, the node's kubelet reads the `default/kubernetes` Service
//!   pointing at the node proxy (its informer relists when the label
//!   changes), kube-proxy reads the real one;
//! - a pod of its own network namespace (`support::pod_network`), holding
//!   what kubelet gives it and nothing else — the service variables
//!   computed from the Service as kubelet reads it, and a token bound to
//!   the pod and `ca.crt` at `/var/run/secrets/kubernetes.io/serviceaccount/`
//!   — runs unmodified in-cluster clients of kube-rs, Python and client-go
//!   (kubectl): each lists and watches Services through the node proxy,
//!   from its cache, as its own ServiceAccount;
//! - that identity is honoured: the agent reads nothing of another
//!   namespace, a request without a token is the apiserver's anonymous;
//! - unlabelled again, the kubelet reads the real Service.
//!
//! Needs root (a network namespace), iproute2 and util-linux; skips with
//! one line without them, without a control plane or kubemark. kubectl and
//! Python are each skipped, saying so, where not installed.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_cache_proxy::component::config::{Config, KubernetesServiceMode};
use kube_testenv::{Morph, Options};
use serde_json::{Value, json};
use support::env::{Running, tempdir};
use support::kubectl::kubectl_available;
use support::pod_network::PodNetwork;
use support::python::{list_watch_script, python, python_run};
use support::real::{Isolated, apply, eventually, metric_sum, namespace, write};
use support::{Auth, Client};

const NODE: &str = "pods-node";
/// The agents' namespace, and another one.
const NS: &str = "agents";
const OTHER: &str = "other-team";
/// The environment variable that makes [`in_pod_kube_rs_client`] the
/// in-cluster client of a pod: `<namespace>:<events>`.
const IN_POD: &str = "KCP_IN_POD_CLIENT";
const TIMEOUT: Duration = Duration::from_secs(60);

fn condition_true(obj: &Value, kind: &str) -> bool {
    obj["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The `kubernetes` Service's variables, as kubelet makes them for every
/// container (`pkg/kubelet/envvars/envvars.go` `FromServices`: the cluster
/// IP, the first port, each named port, and the docker-link forms).
fn service_env(service: &Value) -> Vec<(String, String)> {
    let ip = service["spec"]["clusterIP"].as_str().unwrap().to_string();
    let ports = service["spec"]["ports"].as_array().unwrap();
    let first = ports[0]["port"].as_i64().unwrap();
    let mut env = vec![
        ("KUBERNETES_SERVICE_HOST".to_string(), ip.clone()),
        ("KUBERNETES_SERVICE_PORT".to_string(), first.to_string()),
        ("KUBERNETES_PORT".to_string(), format!("tcp://{ip}:{first}")),
    ];
    for p in ports {
        let port = p["port"].as_i64().unwrap();
        let proto = p["protocol"].as_str().unwrap_or("TCP");
        if let Some(name) = p["name"].as_str().filter(|n| !n.is_empty()) {
            env.push((
                format!("KUBERNETES_SERVICE_PORT_{}", name.to_uppercase()),
                port.to_string(),
            ));
        }
        let prefix = format!("KUBERNETES_PORT_{port}_{proto}");
        env.push((
            prefix.clone(),
            format!("{}://{ip}:{port}", proto.to_lowercase()),
        ));
        env.push((format!("{prefix}_PROTO"), proto.to_lowercase()));
        env.push((format!("{prefix}_PORT"), port.to_string()));
        env.push((format!("{prefix}_ADDR"), ip.clone()));
    }
    env
}

/// The `default/kubernetes` Service in a list.
fn kubernetes_in(list: &Value) -> Value {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["metadata"]["name"] == "kubernetes" && s["metadata"]["namespace"] == "default")
        .cloned()
        .unwrap_or(Value::Null)
}

fn address(service: &Value) -> String {
    format!(
        "{}:{}",
        service["spec"]["clusterIP"].as_str().unwrap_or_default(),
        service["spec"]["ports"][0]["port"]
    )
}

/// A token of `namespace/name` bound to its pod `pod`, as kubelet projects
/// a pod's service-account token (the node's name in its claims).
async fn bound_token(admin: &Client, namespace: &str, name: &str, pod: &str) -> String {
    let uid = admin
        .get(&format!("/api/v1/namespaces/{namespace}/pods/{pod}"))
        .await
        .json()["metadata"]["uid"]
        .clone();
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600,
                             "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}}}),
        )
        .await;
    assert_eq!(r.status, 201, "token: {}", r.text());
    r.json()["status"]["token"].as_str().unwrap().to_string()
}

async fn create(admin: &Client, path: &str, body: Value) {
    let r = admin.post_json(path, &body).await;
    assert!(r.status == 201 || r.status == 409, "{path}: {}", r.text());
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
           "spec": {"ports": [{"port": 80}], "selector": {"app": name}}})
}

/// The ServiceAccounts and RBAC: the agent may list and watch what node
/// agents do; kube-proxy is `system:node-proxier`, as kubeadm binds it.
async fn identities(admin: &Client) {
    namespace(admin, NS).await;
    namespace(admin, OTHER).await;
    create(
        admin,
        &format!("/api/v1/namespaces/{NS}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent"}}),
    )
    .await;
    create(
        admin,
        "/api/v1/namespaces/kube-system/serviceaccounts",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy"}}),
    )
    .await;
    apply(
        admin,
        r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pods-test-agent}
rules:
- apiGroups: [""]
  resources: [pods, services, namespaces, nodes]
  verbs: [get, list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pods-test-agent}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pods-test-agent}
subjects: [{kind: ServiceAccount, name: agent, namespace: agents}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: pods-test-kube-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
"#,
    )
    .await;
    create(
        admin,
        &format!("/api/v1/namespaces/{OTHER}/secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "theirs"}, "stringData": {"k": "v"}}),
    )
    .await;
}

/// The node proxy on the shipped node configuration, as `NODE` with its
/// certificate, the pods' listener at `pods` and the serving certificate
/// from the cluster CA, which pods trust (`ca.crt`): docs/pods.md.
fn node_proxy_config(cp: &kube_testenv::ControlPlane, dir: &Path, pods: &str) -> Config {
    let user = format!("system:node:{NODE}");
    let cert = cp.issue_client(&user, Some("system:nodes")).unwrap();
    let pod_ip = pods.rsplit_once(':').unwrap().0;
    let serving = cp
        .ca()
        .issue_server(
            &["localhost"],
            &["127.0.0.1".parse().unwrap(), pod_ip.parse().unwrap()],
        )
        .unwrap();
    let mut c = Config::from_file(&support::repo().join("manifests/node/config.yaml")).unwrap();
    c.listen = "127.0.0.1:0".into();
    c.admin_listen = "127.0.0.1:0".into();
    c.metrics_listen = None;
    c.node_name = NODE.into();
    c.tls.cert_file = Some(write(dir, "tls.crt", &serving.cert_pem));
    c.tls.private_key_file = Some(write(dir, "tls.key", &serving.key_pem));
    c.tls.client_ca_file = Some(write(dir, "client-ca.crt", &cp.ca_pem()));
    c.upstream.kubeconfig = Some(write(
        dir,
        "upstream.kubeconfig",
        &apimachinery::kubeconfig::with_certificate(
            &cp.url(),
            &cp.ca_pem(),
            &user,
            &cert.cert_pem,
            &cert.key_pem,
        ),
    ));
    c.cache.persistence.directory = None;
    c.takeover.socket_path = None;
    c.cache.ready_wait_milliseconds = 10_000;
    c.pod_network.listen = Some(pods.to_string());
    c.pod_network.kubernetes_service = KubernetesServiceMode::NodeLabel;
    c
}

/// `kube_cache_proxy_requests_total` of `verb` on services answered from
/// the cache.
fn services_from_cache(metrics: &str, verb: &str) -> f64 {
    metric_sum(
        metrics,
        "kube_cache_proxy_requests_total",
        &[
            ("verb", verb),
            ("resource", "services"),
            ("source", "cache"),
        ],
    )
}

/// kubelet's watches of Services answered from the cache with `result`
/// (`rewritten` or `real`): its informer's streaming lists, which the
/// test's own reads as kubelet (lists) do not add to.
fn kubelet_watches(metrics: &str, result: &str) -> f64 {
    metric_sum(
        metrics,
        "kube_cache_proxy_kubernetes_service_reads_total",
        &[("verb", "watch"), ("result", result)],
    )
}

/// A service-account volume as kubelet projects it: `token`, `ca.crt`,
/// `namespace`.
fn service_account_volume(dir: &Path, token: &str, ca_pem: &str) -> PathBuf {
    let d = dir.join("serviceaccount");
    std::fs::create_dir_all(&d).unwrap();
    write(&d, "token", token);
    write(&d, "ca.crt", ca_pem);
    write(&d, "namespace", NS);
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_clients_in_a_pod_reach_their_node_proxy_as_kubelet_points_them() {
    let pod = match PodNetwork::create() {
        Ok(pod) => pod,
        Err(why) => {
            kube_testenv::skip::skip(format!("no pod network: {why}"));
            return;
        }
    };
    let Some(plane) = Isolated::start(Options::default()).await else {
        return;
    };
    let cp = plane.cp();
    if !cp.assets().has_kubemark() {
        kube_testenv::skip::skip(format!("no kubemark in {}", cp.assets().dir.display()));
        return;
    }
    let admin = Client::new(
        &cp.url(),
        &cp.ca_pem(),
        Auth::Cert(cp.admin().clone()),
        false,
    );
    apply(&admin, include_str!("../../manifests/node/rbac.yaml")).await;
    identities(&admin).await;

    let dir = tempdir();
    let pods_addr = format!(
        "{}:{}",
        pod.node_address(),
        kube_testenv::free_port().unwrap()
    );
    let config = node_proxy_config(cp, &dir, &pods_addr);
    let proxy = Running::start(&config).await;
    proxy.ready_within(Duration::from_secs(30)).await;
    let proxy_metrics = || async { proxy.admin_get("/metrics").await.1 };

    // The hollow node, through its node proxy: kubelet with the node's
    // certificate, kube-proxy with its ServiceAccount's token.
    let node_cert = cp
        .issue_client(&format!("system:node:{NODE}"), Some("system:nodes"))
        .unwrap();
    let kubelet_kc = write(
        &dir,
        "kubelet.kubeconfig",
        &apimachinery::kubeconfig::with_certificate(
            &proxy.url,
            &cp.ca_pem(),
            &format!("system:node:{NODE}"),
            &node_cert.cert_pem,
            &node_cert.key_pem,
        ),
    );
    let _kubelet = cp.hollow(Morph::Kubelet, NODE, &kubelet_kc, &[]).unwrap();
    let kube_proxy_token =
        support::real::service_account_token(&admin, "kube-system", "kube-proxy").await;
    let kube_proxy_kc = write(
        &dir,
        "kube-proxy.kubeconfig",
        &apimachinery::kubeconfig::with_token(&proxy.url, &cp.ca_pem(), &kube_proxy_token),
    );
    let _kube_proxy = cp.hollow(Morph::Proxy, NODE, &kube_proxy_kc, &[]).unwrap();
    eventually(TIMEOUT, "the hollow node to be Ready", || {
        let admin = admin.clone();
        async move {
            let r = admin.get(&format!("/api/v1/nodes/{NODE}")).await;
            (r.status == 200 && condition_true(&r.json(), "Ready")).then_some(())
        }
    })
    .await;
    let real = kubernetes_in(&admin.get("/api/v1/services").await.json());
    assert_eq!(real["spec"]["ports"][0]["name"], "https", "{real}");

    // Labelled: kubelet (its informer relisted) reads the Service at its
    // node proxy.
    let before = proxy_metrics().await;
    let r = admin
        .send(
            http::Method::PATCH,
            &format!("/api/v1/nodes/{NODE}"),
            &[("content-type", "application/merge-patch+json")],
            Some(
                json!({"metadata": {"labels": {"kubecacheproxy.io/kubernetes-service": "node-local"}}})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let as_kubelet = Client::new(
        &proxy.url,
        &cp.ca_pem(),
        Auth::Cert(node_cert.clone()),
        true,
    );
    let rewritten = eventually(
        TIMEOUT,
        "kubelet's informer to read the rewritten Service",
        || {
            let as_kubelet = as_kubelet.clone();
            let proxy_metrics = &proxy_metrics;
            let before = &before;
            let pods_addr = &pods_addr;
            async move {
                let m = proxy_metrics().await;
                let service = kubernetes_in(
                    &as_kubelet
                        .get("/api/v1/services?resourceVersion=0")
                        .await
                        .json(),
                );
                (address(&service) == *pods_addr
                    && kubelet_watches(&m, "rewritten") > kubelet_watches(before, "rewritten"))
                .then_some(service)
            }
        },
    )
    .await;
    assert_eq!(
        rewritten["metadata"]["annotations"]["kubecacheproxy.io/rewritten-from"],
        format!(
            "clusterIP {}, port https 443",
            real["spec"]["clusterIP"].as_str().unwrap()
        )
    );
    // kube-proxy, and anyone else, reads the real Service.
    let as_kube_proxy = Client::new(
        &proxy.url,
        &cp.ca_pem(),
        Auth::Token(kube_proxy_token.clone()),
        false,
    );
    let seen = kubernetes_in(
        &as_kube_proxy
            .get("/api/v1/services?resourceVersion=0")
            .await
            .json(),
    );
    assert_eq!(address(&seen), address(&real));
    assert_eq!(seen["spec"], real["spec"]);

    // The agent's pod on the node, its token bound to the pod.
    create(
        &admin,
        &format!("/api/v1/namespaces/{NS}/pods"),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "agent-0"},
               "spec": {"nodeName": NODE, "serviceAccountName": "agent", "automountServiceAccountToken": false,
                        "containers": [{"name": "agent", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await;
    let token = bound_token(&admin, NS, "agent", "agent-0").await;
    let volume = service_account_volume(&dir, &token, &cp.ca_pem());
    // What kubelet injects into the agent's containers.
    let env = service_env(&rewritten);
    assert!(env.contains(&(
        "KUBERNETES_SERVICE_HOST".into(),
        pod.node_address().to_string()
    )));
    let served_before = proxy_metrics().await;

    // kube-rs's Config::incluster(), in the pod.
    let kube_rs = python_run({
        let mut cmd = pod.command(
            &volume,
            &env,
            &std::env::current_exe().unwrap(),
            &[
                "--exact",
                "pods::in_pod_kube_rs_client",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ],
        );
        cmd.env(IN_POD, format!("{NS}:1"));
        cmd
    })
    .await;
    create(
        &admin,
        &format!("/api/v1/namespaces/{NS}/services"),
        service("kube-rs"),
    )
    .await;
    let seen = tokio::time::timeout(TIMEOUT, kube_rs)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen.events.len(), 1, "{:?}", seen.events);
    assert_eq!(
        (seen.events[0].0.as_str(), seen.events[0].1.as_str()),
        ("ADDED", "kube-rs")
    );
    assert!(seen.last.contains_key("kube-rs"), "{:?}", seen.last);

    // The Python client's load_incluster_config(), in the pod.
    match python() {
        None => kube_testenv::skip::skip("the Python client: no Python venv (above)"),
        Some(python) => {
            let run = python_run(pod.command(
                &volume,
                &env,
                &python,
                &[
                    list_watch_script().to_str().unwrap(),
                    "in-cluster",
                    NS,
                    "1",
                    "services",
                ],
            ))
            .await;
            create(
                &admin,
                &format!("/api/v1/namespaces/{NS}/services"),
                service("python"),
            )
            .await;
            let seen = tokio::time::timeout(TIMEOUT, run).await.unwrap().unwrap();
            assert_eq!(seen.events.len(), 1, "{:?}", seen.events);
            assert_eq!(seen.events[0].1, "python");
            assert!(
                seen.last.contains_key("kube-rs") && seen.last.contains_key("python"),
                "{:?}",
                seen.last
            );
        }
    }

    // client-go's in-cluster configuration (kubectl with no kubeconfig),
    // in the pod: a list, and a watch that sees a new Service.
    if kubectl_available() {
        let kubectl = PathBuf::from("kubectl");
        let out = pod
            .command(&volume, &env, &kubectl, &["get", "services", "-o", "name"])
            .output()
            .await
            .unwrap();
        let listed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{listed} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(listed.contains("service/kube-rs"), "{listed}");
        let mut watch = pod.command(
            &volume,
            &env,
            &kubectl,
            &["get", "services", "--watch-only", "-o", "name"],
        );
        watch
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = watch.spawn().unwrap();
        let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
            child.stdout.take().unwrap(),
        ));
        // kubectl's watch starts from its list: wait until the proxy served
        // one more watch of services than before it.
        let listed_at = services_from_cache(&proxy_metrics().await, "WATCH");
        eventually(Duration::from_secs(30), "kubectl's watch to start", || {
            let proxy_metrics = &proxy_metrics;
            async move {
                (services_from_cache(&proxy_metrics().await, "WATCH") > listed_at).then_some(())
            }
        })
        .await;
        create(
            &admin,
            &format!("/api/v1/namespaces/{NS}/services"),
            service("client-go"),
        )
        .await;
        let line = tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(line.as_deref(), Some("service/client-go"));
        let _ = child.kill().await;
    } else {
        kube_testenv::skip::skip("the client-go client: kubectl is not installed");
    }

    // Each client's list and watch went through the node proxy as the
    // agent (its token reviewed, its reads authorized for it): every watch
    // answered from the cache; a list from the cache, or passed through
    // when, consistent (no resourceVersion, as these clients list), the
    // cache could not show at once that it was fresh (docs/design.md,
    // "Consistent reads").
    let m = proxy_metrics().await;
    // kube-rs, and Python and kubectl where they ran.
    let clients =
        1.0 + f64::from(u8::from(python().is_some())) + f64::from(u8::from(kubectl_available()));
    let requests = |metrics: &str, verb: &str, source: &str| {
        metric_sum(
            metrics,
            "kube_cache_proxy_requests_total",
            &[("verb", verb), ("resource", "services"), ("source", source)],
        )
    };
    let since = |verb: &str, source: &str| {
        requests(&m, verb, source) - requests(&served_before, verb, source)
    };
    assert!(
        since("WATCH", "cache") >= clients,
        "{clients} clients' watches\n{m}"
    );
    assert_eq!(
        since("WATCH", "upstream"),
        0.0,
        "a watch passed through\n{m}"
    );
    assert!(
        since("LIST", "cache") + since("LIST", "upstream") >= clients,
        "{clients} clients' lists\n{m}"
    );
    let reads = |metrics: &str, reason: Option<&str>| {
        let mut labels = vec![
            ("resource", "services"),
            ("source", "upstream"),
            ("verb", "LIST"),
        ];
        labels.extend(reason.map(|r| ("reason", r)));
        metric_sum(metrics, "kube_cache_proxy_cache_reads_total", &labels)
    };
    let passed_lists = (reads(&m, None) - reads(&served_before, None))
        - (reads(&m, Some("not_fresh")) - reads(&served_before, Some("not_fresh")));
    assert_eq!(
        passed_lists, 0.0,
        "a list of services passed through but for freshness\n{m}"
    );

    // The agent's identity: what its token gets at the apiserver, no
    // more, at the pods' address.
    let at_pods = |auth| Client::new(&format!("https://{pods_addr}"), &cp.ca_pem(), auth, false);
    let agent = at_pods(Auth::Token(token.clone()));
    assert_eq!(
        agent
            .get(&format!("/api/v1/namespaces/{NS}/services"))
            .await
            .status,
        200
    );
    let theirs = agent
        .get(&format!("/api/v1/namespaces/{OTHER}/secrets/theirs"))
        .await;
    assert_eq!(theirs.status, 403, "{}", theirs.text());
    assert!(
        theirs.text().contains("system:serviceaccount:agents:agent"),
        "{}",
        theirs.text()
    );
    let direct = Client::new(&cp.url(), &cp.ca_pem(), Auth::Token(token.clone()), false)
        .get(&format!("/api/v1/namespaces/{OTHER}/secrets/theirs"))
        .await;
    assert_eq!(theirs.json(), direct.json());
    let anonymous = at_pods(Auth::Anonymous)
        .get(&format!("/api/v1/namespaces/{NS}/services"))
        .await;
    assert_eq!(anonymous.status, 403, "{}", anonymous.text());
    assert!(
        anonymous.text().contains("system:anonymous"),
        "{}",
        anonymous.text()
    );

    // Unlabelled: kubelet relists and reads the real Service again.
    let before = proxy_metrics().await;
    let r = admin
        .send(
            http::Method::PATCH,
            &format!("/api/v1/nodes/{NODE}"),
            &[("content-type", "application/merge-patch+json")],
            Some(
                json!({"metadata": {"labels": {"kubecacheproxy.io/kubernetes-service": null}}})
                    .to_string()
                    .into_bytes(),
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually(
        TIMEOUT,
        "kubelet's informer to read the real Service",
        || {
            let as_kubelet = as_kubelet.clone();
            let proxy_metrics = &proxy_metrics;
            let before = &before;
            let real = &real;
            async move {
                let m = proxy_metrics().await;
                let service = kubernetes_in(
                    &as_kubelet
                        .get("/api/v1/services?resourceVersion=0")
                        .await
                        .json(),
                );
                (address(&service) == address(real)
                    && kubelet_watches(&m, "real") > kubelet_watches(before, "real"))
                .then_some(())
            }
        },
    )
    .await;
    let m = proxy_metrics().await;
    assert_eq!(
        metric_sum(&m, "kube_cache_proxy_kubernetes_service_changes_total", &[]),
        2.0
    );
    assert_eq!(
        metric_sum(&m, "kube_cache_proxy_kubernetes_service_rewritten", &[]),
        0.0
    );
    drop(pod);
}

/// Not a test of its own: the in-cluster kube-rs client that
/// [`in_cluster_clients_in_a_pod_reach_their_node_proxy_as_kubelet_points_them`]
/// runs in its pod, this test binary started again there with
/// `KCP_IN_POD_CLIENT=<namespace>:<events>`. It configures itself with
/// `kube::Config::incluster()` alone, lists the namespace's Services and
/// watches them from the list's resourceVersion, printing
/// `tests/python/list_watch.py`'s lines. Without the variable it does
/// nothing.
#[tokio::test]
#[ignore = "the in-pod client of in_cluster_clients_in_a_pod_reach_their_node_proxy_as_kubelet_points_them"]
async fn in_pod_kube_rs_client() {
    use futures_util::TryStreamExt;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, ListParams, WatchEvent, WatchParams};
    let Ok(spec) = std::env::var(IN_POD) else {
        return;
    };
    let (ns, count) = spec.split_once(':').unwrap();
    let count: usize = count.parse().unwrap();
    let config = kube::Config::incluster().expect("the in-cluster configuration");
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<Service> = Api::namespaced(client, ns);
    let list = api.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.clone().unwrap();
    let mut state: std::collections::BTreeMap<String, String> = list
        .items
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap(),
                s.metadata.resource_version.clone().unwrap(),
            )
        })
        .collect();
    println!("{}", json!({"ready": rv}));
    let stream = api
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap();
    futures_util::pin_mut!(stream);
    let mut seen = 0;
    while seen < count {
        let Some(event) = stream.try_next().await.unwrap() else {
            break;
        };
        let (kind, s) = match event {
            WatchEvent::Added(s) => ("ADDED", s),
            WatchEvent::Modified(s) => ("MODIFIED", s),
            WatchEvent::Deleted(s) => ("DELETED", s),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
        };
        let name = s.metadata.name.clone().unwrap();
        let version = s.metadata.resource_version.clone().unwrap();
        println!("{}", json!({"type": kind, "name": name, "rv": version}));
        if kind == "DELETED" {
            state.remove(&name);
        } else {
            state.insert(name, version);
        }
        seen += 1;
    }
    println!("{}", json!({"final": state}));
}
