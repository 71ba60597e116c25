//! The real-control-plane tier: the proxy (`kube_cache_proxy::run`, over
//! real sockets and TLS) in front of a real kube-apiserver v1.36 and etcd
//! started by `kube-testenv`: one control plane shared by the tests of
//! `tests/real/`, or one of a test's own ([`Isolated`]).
//!
//! Where no control plane is available, [`RealEnv::start`] and
//! [`Isolated::start`] return `None` (after `kube-testenv` printed why,
//! once) and the test returns early. Tests sharing the control plane each
//! work in their own namespace and label the cluster-scoped objects they
//! make with their own name.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use apimachinery::pki::Ca;
use kube_cache_proxy::component::config::Config;
use kube_testenv::ControlPlane;
use serde_json::{Value, json};

use crate::client::{Auth, Client, Resp};
use crate::env::{Running, tempdir};

/// A real control plane and the proxy in front of it.
pub struct RealEnv {
    pub cp: &'static ControlPlane,
    pub dir: PathBuf,
    pub proxy_url: String,
    pub proxy_ca_pem: String,
    pub proxy_ca: Ca,
    pub config: Config,
    pub running: Running,
}

/// A control plane of one test's own, held while no other test of the
/// binary runs: for the tests that pause, restart, compact or restore it,
/// count the apiserver's own watches, or turn on fault injection (which is
/// process-wide). The plane is leaked to `&'static` (what the test spawns
/// borrows it); dropping this stops its processes, then lets the next test
/// run.
pub struct Isolated {
    cp: &'static ControlPlane,
    _alone: tokio::sync::MutexGuard<'static, ()>,
    /// When the control plane was started, for the line its drop prints
    /// (the time each test holds the binary, which CI's budget is made of).
    started: std::time::Instant,
}

static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Isolated {
    /// Waits until no other test holds its own control plane, then starts
    /// one with `options`; `None` where no binaries are available (the
    /// test skips).
    pub async fn start(options: kube_testenv::Options) -> Option<Isolated> {
        let alone = Isolated::alone().await;
        let started = std::time::Instant::now();
        let cp = ControlPlane::start_or_skip(options).await?;
        Some(Isolated {
            cp: Box::leak(Box::new(cp)),
            _alone: alone,
            started,
        })
    }

    /// Waits until no other test holds its own control plane, for a test
    /// that starts its control plane itself (the robustness harness).
    pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
        ALONE.lock().await
    }

    /// The control plane, for the rest of the test.
    pub fn cp(&self) -> &'static ControlPlane {
        self.cp
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        self.cp.stop();
        eprintln!(
            "isolated: {} held its control plane {:.1} s",
            std::thread::current().name().unwrap_or("a test"),
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// The proxy's test configuration in front of `cp`, acting upstream as
/// `admin` (files written in `dir`).
pub fn proxy_config(cp: &ControlPlane, dir: &std::path::Path, proxy_ca: &Ca) -> Config {
    let serving = proxy_ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let mut config = Config {
        listen: "127.0.0.1:0".into(),
        admin_listen: "127.0.0.1:0".into(),
        shutdown_grace_period_seconds: 2,
        ..Config::default()
    };
    config.tls.cert_file = Some(write("tls.crt", &serving.cert_pem));
    config.tls.private_key_file = Some(write("tls.key", &serving.key_pem));
    config.tls.client_ca_file = Some(write("client-ca.crt", &cp.ca_pem()));
    config.upstream.kubeconfig = Some(write(
        "upstream.kubeconfig",
        &cp.kubeconfig_text(&cp.url(), "admin", cp.admin()),
    ));
    config.cache.ready_wait_milliseconds = 10_000;
    config
}

impl RealEnv {
    /// The shared control plane and a proxy with the test configuration;
    /// `None` where there is no control plane (the test skips).
    pub async fn start() -> Option<RealEnv> {
        RealEnv::start_with(|_| {}).await
    }

    /// Like [`RealEnv::start`], with the configuration adjusted by
    /// `customize`.
    pub async fn start_with(customize: impl FnOnce(&mut Config)) -> Option<RealEnv> {
        let cp = ControlPlane::shared().await?;
        Some(RealEnv::start_on(cp, customize).await)
    }

    /// A proxy with the test configuration, adjusted by `customize`, in
    /// front of `cp` (a control plane started with other options than the
    /// shared one).
    pub async fn start_on(
        cp: &'static ControlPlane,
        customize: impl FnOnce(&mut Config),
    ) -> RealEnv {
        RealEnv::start_on_within(cp, customize, Duration::from_secs(10)).await
    }

    /// [`RealEnv::start_on`], ready within `ready` (a control plane of
    /// several apiservers, some just restarted, answers more slowly).
    pub async fn start_on_within(
        cp: &'static ControlPlane,
        customize: impl FnOnce(&mut Config),
        ready: Duration,
    ) -> RealEnv {
        let dir = tempdir();
        let proxy_ca = Ca::new("kube-cache-proxy-test-ca").unwrap();
        let mut config = proxy_config(cp, &dir, &proxy_ca);
        customize(&mut config);
        let running = Running::start(&config).await;
        running.ready_within(ready).await;
        RealEnv {
            cp,
            dir,
            proxy_url: running.url.clone(),
            proxy_ca_pem: proxy_ca.cert_pem(),
            proxy_ca,
            config,
            running,
        }
    }

    /// `CN=admin, O=system:masters`.
    pub fn admin(&self) -> Auth {
        Auth::Cert(self.cp.admin().clone())
    }

    /// A client certificate issued by the cluster CA.
    pub fn cert(&self, user: &str, group: Option<&str>) -> Auth {
        Auth::Cert(self.cp.issue_client(user, group).unwrap())
    }

    /// `CN=system:node:<name>, O=system:nodes`.
    pub fn node(&self, name: &str) -> Auth {
        self.cert(&format!("system:node:{name}"), Some("system:nodes"))
    }

    /// A client of the apiserver directly (HTTP/1.1).
    pub fn direct(&self, auth: Auth) -> Client {
        Client::new(&self.cp.url(), &self.cp.ca_pem(), auth, false)
    }

    /// A client of the proxy (HTTP/1.1).
    pub fn proxy(&self, auth: Auth) -> Client {
        Client::new(&self.proxy_url, &self.proxy_ca_pem, auth, false)
    }

    /// A client of the proxy (HTTP/2).
    pub fn proxy_h2(&self, auth: Auth) -> Client {
        Client::new(&self.proxy_url, &self.proxy_ca_pem, auth, true)
    }

    /// The admin client of the apiserver directly.
    pub fn apiserver(&self) -> Client {
        self.direct(self.admin())
    }

    /// A kubeconfig file reaching the proxy with a client certificate.
    pub fn proxy_kubeconfig(&self, name: &str, user: &str, group: Option<&str>) -> PathBuf {
        let cert = self.cp.issue_client(user, group).unwrap();
        let text = apimachinery::kubeconfig::with_certificate(
            &self.proxy_url,
            &self.proxy_ca_pem,
            user,
            &cert.cert_pem,
            &cert.key_pem,
        );
        let path = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The proxy's metrics text.
    pub async fn proxy_metrics(&self) -> String {
        let (status, body) = self.running.admin_get("/metrics").await;
        assert_eq!(status, 200);
        body
    }

    /// The apiserver's metrics text.
    pub async fn apiserver_metrics(&self) -> String {
        let r = self.apiserver().get("/metrics").await;
        assert_eq!(r.status, 200);
        r.text()
    }

    /// Creates a namespace with a `default` ServiceAccount (no
    /// kube-controller-manager runs to make one) and returns its name.
    pub async fn namespace(&self, name: &str) -> String {
        namespace(&self.apiserver(), name).await;
        name.to_string()
    }

    /// Creates `obj` at `path` as admin, directly; returns it.
    pub async fn create(&self, path: &str, obj: Value) -> Value {
        let r = self.apiserver().post_json(path, &obj).await;
        assert_eq!(r.status, 201, "create at {path}: {}", r.text());
        r.json()
    }

    /// A ServiceAccount token (TokenRequest) for `namespace/name`, with
    /// `audiences` (empty: the apiserver's).
    pub async fn token(&self, namespace: &str, name: &str, audiences: &[&str]) -> String {
        let r = self
            .apiserver()
            .post_json(
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"audiences": audiences, "expirationSeconds": 3600}}),
            )
            .await;
        assert_eq!(r.status, 201, "token: {}", r.text());
        r.json()["status"]["token"].as_str().unwrap().to_string()
    }

    /// A token of ServiceAccount `namespace/name` bound to an object
    /// (`kind` Node or Pod, looked up by name for its uid), as kubelet's
    /// projected tokens are: it carries the node's name in its extra.
    pub async fn bound_token(
        &self,
        namespace: &str,
        name: &str,
        kind: &str,
        object: &str,
    ) -> String {
        let path = match kind {
            "Node" => format!("/api/v1/nodes/{object}"),
            _ => format!("/api/v1/namespaces/{namespace}/pods/{object}"),
        };
        let uid = self.apiserver().get(&path).await.json()["metadata"]["uid"].clone();
        let r = self
            .apiserver()
            .post_json(
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600,
                                 "boundObjectRef": {"apiVersion": "v1", "kind": kind, "name": object, "uid": uid}}}),
            )
            .await;
        assert_eq!(r.status, 201, "token: {}", r.text());
        r.json()["status"]["token"].as_str().unwrap().to_string()
    }

    /// Grants `rules` to `subject` (a JSON RBAC subject) cluster-wide.
    pub async fn grant(&self, name: &str, subject: Value, rules: Value) {
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": name}, "rules": rules}),
        )
        .await;
        self.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": name},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                   "subjects": [subject.clone()]}),
        )
        .await;
        self.wait_rbac(&subject, &rules, None).await;
    }

    /// Waits until the apiserver's authorizer allows `subject` the first
    /// verb on the first resource of each rule, in `namespace` (a
    /// RoleBinding's) or cluster-wide: its RBAC informers learn of a new
    /// binding asynchronously. A SubjectAccessReview each, the state the
    /// test needs, instead of a sleep.
    pub async fn wait_rbac(&self, subject: &Value, rules: &Value, namespace: Option<&str>) {
        let name = subject["name"].as_str().unwrap_or_default();
        let (user, groups) = match subject["kind"].as_str() {
            Some("ServiceAccount") => (
                format!(
                    "system:serviceaccount:{}:{name}",
                    subject["namespace"].as_str().unwrap_or_default()
                ),
                vec!["system:serviceaccounts".to_string()],
            ),
            Some("Group") => ("rbac-wait".to_string(), vec![name.to_string()]),
            _ => (name.to_string(), Vec::new()),
        };
        for rule in rules.as_array().into_iter().flatten() {
            if rule["resources"].as_array().is_none_or(|r| r.is_empty()) {
                continue;
            }
            let first = |k: &str| rule[k][0].as_str().unwrap_or_default().to_string();
            let review = json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "groups": groups, "resourceAttributes": {
                    "group": first("apiGroups"), "resource": first("resources"),
                    "verb": first("verbs"), "namespace": namespace.unwrap_or_default()}}});
            let what = format!(
                "RBAC to allow {user} {}",
                review["spec"]["resourceAttributes"]
            );
            let admin = self.apiserver();
            eventually(Duration::from_secs(20), &what, || {
                let (admin, review) = (admin.clone(), review.clone());
                async move {
                    let r = admin
                        .post_json(
                            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                            &review,
                        )
                        .await;
                    (r.json()["status"]["allowed"] == true).then_some(())
                }
            })
            .await;
        }
    }

    /// The current resourceVersion of the apiserver (a consistent list).
    pub async fn current_rv(&self) -> u64 {
        let r = self.apiserver().get("/api/v1/namespaces?limit=1").await;
        r.json()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    }
}

/// Polls `check` every 200 ms until it returns `Some`, for at most
/// `timeout`; panics with `what` otherwise.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A metric's samples whose labels include every `label=value` pair in
/// `labels` (Prometheus text format): their labels and values.
fn samples<'t>(
    text: &'t str,
    name: &'t str,
    labels: &'t [(&str, &str)],
) -> impl Iterator<Item = (&'t str, f64)> + 't {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(move |l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let matches = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            matches
                .then(|| Some((rest, value.parse::<f64>().ok()?)))
                .flatten()
        })
}

/// The sum of a metric's samples whose labels include every `label=value`
/// pair in `labels` (Prometheus text format).
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples(text, name, labels).map(|(_, v)| v).sum()
}

/// Like [`metric_sum`], summed per value of the `resource` label.
pub fn metric_by_resource(
    text: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for (series, value) in samples(text, name, labels) {
        let resource = series
            .split(',')
            .find_map(|kv| kv.strip_prefix("resource=\""))
            .map(|r| r.trim_end_matches('"').to_string())
            .unwrap_or_default();
        *out.entry(resource).or_default() += value;
    }
    out
}

/// A response's body as JSON, or `Value::Null` when it is not JSON.
pub fn json_or_null(r: &Resp) -> Value {
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

/// Creates every object of a manifest as `admin`, the namespaced ones in
/// kube-system; existing ones are fine.
pub async fn apply(admin: &Client, manifest: &str) {
    apply_in(admin, "kube-system", manifest).await;
}

/// [`apply`] with the namespaced objects in `namespace` (as `kubectl
/// apply -k` with the kustomization's namespace).
pub async fn apply_in(admin: &Client, namespace: &str, manifest: &str) {
    for o in kube_testenv::manifest::objects(manifest, namespace).unwrap() {
        let r = admin.post_json(&o.collection, &o.body).await;
        assert!(r.status == 201 || r.status == 409, "{}", r.text());
    }
}

/// Creates namespace `name` and its `default` ServiceAccount (which the
/// ServiceAccount admission wants and no controller-manager creates
/// here) as `admin`; existing ones are fine.
pub async fn namespace(admin: &Client, name: &str) {
    let r = admin
        .post_json(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        )
        .await;
    assert!(
        r.status == 201 || r.status == 409,
        "namespace {name}: {}",
        r.text()
    );
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{name}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
        )
        .await;
    assert!(
        r.status == 201 || r.status == 409,
        "default sa: {}",
        r.text()
    );
}

/// Writes `text` to `dir/name`.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A shipped configuration with what only exists on a node or in a pod
/// (addresses, files) replaced.
pub fn shipped(path: &str, dir: &Path, serving_ca: &Ca, client_ca_pem: &str) -> Config {
    let mut c = Config::from_file(&crate::repo().join(path)).unwrap();
    let serving = serving_ca
        .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
        .unwrap();
    c.listen = "127.0.0.1:0".into();
    c.admin_listen = "127.0.0.1:0".into();
    c.metrics_listen = None;
    c.tls.cert_file = Some(write(dir, "tls.crt", &serving.cert_pem));
    c.tls.private_key_file = Some(write(dir, "tls.key", &serving.key_pem));
    c.tls.client_ca_file = Some(write(dir, "client-ca.crt", client_ca_pem));
    c.cache.persistence.directory = None;
    c.takeover.socket_path = None;
    c.cache.ready_wait_milliseconds = 10_000;
    c
}

/// A token of ServiceAccount `namespace/name`, valid for an hour, from the
/// TokenRequest API (as `admin`).
pub async fn service_account_token(admin: &Client, namespace: &str, name: &str) -> String {
    let r = admin
        .post_json(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                    "spec": {"expirationSeconds": 3600}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["status"]["token"].as_str().unwrap().to_string()
}
