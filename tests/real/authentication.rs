//! Authentication edge cases against a real kube-apiserver v1.36: each
//! credential (header spellings, certificates that do not verify, tokens
//! for another audience) is sent to the apiserver directly and through the
//! proxy, and both must authenticate it as the same user, or refuse it the
//! same way.
//!
//! Skipped, with one line, where no control plane is available.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use crate::support;

use std::time::Duration;

use apimachinery::pki::{Ca, Issued};
use http::Method;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyUsagePurpose,
};
use serde_json::json;
use support::Auth;
use support::cache_configmaps;
use support::client::{Client, Resp};
use support::real::{RealEnv, eventually, metric_sum};

/// What a request was authenticated as, as far as a client can tell: the
/// status of a cached read (only the token's user may read), the user a
/// SelfSubjectReview names (passed through), and the Warning headers.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    read: u16,
    whoami: String,
    warnings: Vec<String>,
}

fn warnings(r: &Resp) -> Vec<String> {
    r.headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

async fn seen(client: &Client, read_path: &str, headers: &[(&str, &str)]) -> Seen {
    let read = client.send(Method::GET, read_path, headers, None).await;
    let mut h = headers.to_vec();
    h.push(("content-type", "application/json"));
    let r = client
        .send(
            Method::POST,
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &h,
            Some(
                serde_json::to_vec(&json!({"apiVersion": "authentication.k8s.io/v1",
                                             "kind": "SelfSubjectReview"}))
                .unwrap(),
            ),
        )
        .await;
    let whoami = match r.status.as_u16() {
        201 => r.json()["status"]["userInfo"]["username"]
            .as_str()
            .unwrap()
            .to_string(),
        // Anonymous may not create one: the message names the user.
        403 => r.json()["message"]
            .as_str()
            .unwrap()
            .split('"')
            .nth(1)
            .unwrap_or_default()
            .to_string(),
        s => format!("{s}"),
    };
    let mut w = warnings(&read);
    w.extend(warnings(&r));
    Seen {
        read: read.status.as_u16(),
        whoami,
        warnings: w,
    }
}

fn short(s: &str, token: &str) -> String {
    s.replace(token, "<token>")
}

/// A client certificate for `cn` signed by `ca`, valid from `not_before`
/// to `not_after` (Unix seconds), with `clientAuth` unless `server_only`.
fn cert(ca: &Ca, cn: Option<&str>, validity: (i64, i64), server_only: bool) -> Issued {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    // Not rcgen's default subject: only what is asked for.
    p.distinguished_name = DistinguishedName::new();
    if let Some(cn) = cn {
        p.distinguished_name.push(DnType::CommonName, cn);
    }
    p.distinguished_name
        .push(DnType::OrganizationName, "authn-probe-group");
    let at = |unix: i64| {
        x509_parser::time::ASN1Time::from_timestamp(unix)
            .unwrap()
            .to_datetime()
    };
    p.not_before = at(validity.0);
    p.not_after = at(validity.1);
    p.extended_key_usages = vec![if server_only {
        ExtendedKeyUsagePurpose::ServerAuth
    } else {
        ExtendedKeyUsagePurpose::ClientAuth
    }];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    ca.issue(p).unwrap()
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_authenticate_as_at_the_apiserver() {
    let Some(env) = RealEnv::start_with(cache_configmaps).await else {
        return;
    };
    let ns = env.namespace("authn-probe").await;
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    env.create(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}}),
    )
    .await;
    env.create(
        &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "cm-reader"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    env.create(
        &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "cm-reader"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns},
                            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "authn-probe-group"}]}),
    )
    .await;
    let token = env.token(&ns, "reader", &[]).await;
    let other_audience = env.token(&ns, "reader", &["other"]).await;
    let both_audiences = env
        .token(
            &ns,
            "reader",
            &["other", kube_testenv::SERVICE_ACCOUNT_ISSUER],
        )
        .await;
    let read = format!("{cms}?resourceVersion=0");
    eventually(Duration::from_secs(10), "RBAC to settle", || {
        let c = env.direct(Auth::Token(token.clone()));
        let p = read.clone();
        async move { (c.get(&p).await.status == 200).then_some(()) }
    })
    .await;

    let t = now();
    let cluster_ca = env.cp.ca();
    let stranger_ca = Ca::new("authn-probe-untrusted").unwrap();
    let year = 365 * 24 * 3600;
    let certs = [
        (
            "trusted certificate",
            Some(cert(
                cluster_ca,
                Some("authn-probe-user"),
                (t - 60, t + year),
                false,
            )),
        ),
        (
            "untrusted certificate",
            Some(cert(
                &stranger_ca,
                Some("authn-probe-user"),
                (t - 60, t + year),
                false,
            )),
        ),
        (
            "expired certificate",
            Some(cert(
                cluster_ca,
                Some("authn-probe-user"),
                (t - 2 * year, t - year),
                false,
            )),
        ),
        (
            "not-yet-valid certificate",
            Some(cert(
                cluster_ca,
                Some("authn-probe-user"),
                (t + year, t + 2 * year),
                false,
            )),
        ),
        (
            "certificate without CN",
            Some(cert(cluster_ca, None, (t - 60, t + year), false)),
        ),
        (
            "serverAuth-only certificate",
            Some(cert(
                cluster_ca,
                Some("authn-probe-user"),
                (t - 60, t + year),
                true,
            )),
        ),
        ("no certificate", None),
    ];
    let bearer = |s: &str| s.replace("TOKEN", &token);
    let headers: Vec<(String, Option<String>)> = vec![
        ("no Authorization".into(), None),
        ("Bearer <token>".into(), Some(bearer("Bearer TOKEN"))),
        ("Bearer  <token>".into(), Some(bearer("Bearer  TOKEN"))),
        ("bearer <token>".into(), Some(bearer("bearer TOKEN"))),
        ("BEARER <token>".into(), Some(bearer("BEARER TOKEN"))),
        (
            "Bearer <token> extra".into(),
            Some(bearer("Bearer TOKEN extra")),
        ),
        ("Bearer <token>  ".into(), Some(bearer("Bearer TOKEN  "))),
        ("Bearer\\t<token>".into(), Some(bearer("Bearer\tTOKEN"))),
        ("Bearer".into(), Some("Bearer".into())),
        ("Bearer (space)".into(), Some("Bearer ".into())),
        ("Basic <token>".into(), Some(bearer("Basic TOKEN"))),
        (
            "Bearer invalid".into(),
            Some("Bearer not-a-valid-token".into()),
        ),
        (
            "Bearer <token for audience other>".into(),
            Some(format!("Bearer {other_audience}")),
        ),
        (
            "Bearer <token for other and the apiserver>".into(),
            Some(format!("Bearer {both_audiences}")),
        ),
    ];
    let mut table = Vec::new();
    let mut mismatches = Vec::new();
    for (cert_name, issued) in &certs {
        let auth = match issued {
            Some(i) => Auth::Cert(i.clone()),
            None => Auth::Anonymous,
        };
        let (direct, proxy) = (env.direct(auth.clone()), env.proxy(auth));
        for (name, value) in &headers {
            let h: Vec<(&str, &str)> = value
                .iter()
                .map(|v| ("authorization", v.as_str()))
                .collect();
            let d = seen(&direct, &read, &h).await;
            let p = seen(&proxy, &read, &h).await;
            let what = format!("{cert_name} + {name}");
            table.push(format!(
                "{what}: apiserver {} {} | proxy {} {}",
                d.read, d.whoami, p.read, p.whoami
            ));
            if d != p {
                mismatches.push(format!(
                    "{}: apiserver {d:?} proxy {p:?}",
                    short(&what, &token)
                ));
            }
        }
    }
    println!("{}", table.join("\n"));
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // The reads that authenticated were answered by the proxy itself.
    let served = metric_sum(
        &env.proxy_metrics().await,
        "kube_cache_proxy_requests_total",
        &[("resource", "configmaps"), ("source", "cache")],
    );
    assert!(served >= 20.0, "{served} reads served from the cache");
}

/// `metricsListen`: `/metrics` beyond loopback only for a caller the
/// apiserver authenticates (TokenReview, or a client certificate) and
/// authorizes `get` on the non-resource URL `/metrics` (SubjectAccessReview),
/// with the apiserver's own 403 for anyone else; health endpoints open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_beyond_loopback_need_authentication_and_authorization() {
    let Some(env) = RealEnv::start_with(|c| c.metrics_listen = Some("127.0.0.1:0".into())).await
    else {
        return;
    };
    let ns = env.namespace("metrics-authz").await;
    for name in ["scraper", "nobody"] {
        env.create(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}),
        )
        .await;
    }
    // What Prometheus is given: get on /metrics (the built-in
    // system:monitoring role).
    env.create(
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "metrics-authz-scraper"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:monitoring"},
               "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns}]}),
    )
    .await;
    let scraper = env.token(&ns, "scraper", &[]).await;
    let nobody = env.token(&ns, "nobody", &[]).await;
    let metrics_url = format!("https://{}", env.running.metrics.unwrap());
    let client = |auth: Auth| Client::new(&metrics_url, &env.proxy_ca_pem, auth, false);
    eventually(Duration::from_secs(10), "RBAC to settle", || {
        let c = client(Auth::Token(scraper.clone()));
        async move { (c.get("/metrics").await.status == 200).then_some(()) }
    })
    .await;

    let stranger = Ca::new("metrics-untrusted")
        .unwrap()
        .issue_client("system:admin", Some("system:monitoring"))
        .unwrap();
    let cases: Vec<(&str, Auth, u16)> = vec![
        ("no credential", Auth::Anonymous, 401),
        ("invalid token", Auth::Token("not-a-token".into()), 401),
        ("untrusted certificate", Auth::Cert(stranger), 401),
        ("unauthorized token", Auth::Token(nobody.clone()), 403),
        (
            "unauthorized certificate",
            env.cert("metrics-nobody", None),
            403,
        ),
        ("authorized token", Auth::Token(scraper.clone()), 200),
        (
            "certificate in system:monitoring",
            env.cert("metrics-prometheus", Some("system:monitoring")),
            200,
        ),
    ];
    let mut table = Vec::new();
    for (what, auth, want) in cases {
        let r = client(auth.clone()).get("/metrics").await;
        table.push(format!("{what}: {}", r.status));
        assert_eq!(r.status, want, "{what}: {}", r.text());
        match want {
            200 => assert!(r.text().contains("kube_cache_proxy_ready"), "{what}"),
            401 => assert_eq!(r.json()["reason"], "Unauthorized", "{what}"),
            _ => {
                // The apiserver's own answer to the same identity for its
                // /metrics.
                let d = env.direct(auth).get("/metrics").await;
                assert_eq!(d.status, 403, "{what}: {}", d.text());
                assert_eq!(r.json(), d.json(), "{what}");
            }
        }
    }
    // The identity monitoring/podmonitor.yaml scrapes with
    // (monitoring/scraper.yaml; a TokenRequest stands in for the Secret
    // the token controller would fill): /metrics, and nothing else.
    let manifest = include_str!("../../manifests/monitoring/scraper.yaml");
    for o in kube_testenv::manifest::objects(manifest, "kube-system").unwrap() {
        if o.body["kind"] != "Secret" {
            env.create(&o.collection, o.body).await;
        }
    }
    let reader = env
        .token("kube-system", "kube-cache-proxy-metrics-reader", &[])
        .await;
    let r = eventually(Duration::from_secs(10), "the reader's binding", || {
        let c = client(Auth::Token(reader.clone()));
        async move { Some(c.get("/metrics").await).filter(|r| r.status == 200) }
    })
    .await;
    assert!(r.text().contains("kube_cache_proxy_ready"));
    table.push("monitoring/scraper.yaml's token: 200 OK".into());
    let direct = env.direct(Auth::Token(reader));
    assert_eq!(direct.get("/api/v1/namespaces").await.status, 403);
    assert_eq!(
        direct
            .get("/api/v1/namespaces/kube-system/secrets")
            .await
            .status,
        403
    );
    println!("{}", table.join("\n"));
    // Health is open and carries no cluster data; other paths are
    // authorized first, then not found.
    let anonymous = client(Auth::Anonymous);
    for path in ["/readyz", "/livez", "/healthz"] {
        let r = anonymous.get(path).await;
        assert_eq!(
            (r.status.as_u16(), r.text().as_str()),
            (200, "ok"),
            "{path}"
        );
    }
    assert_eq!(anonymous.get("/debug/pprof").await.status, 401);
    assert_eq!(
        client(Auth::Token(scraper)).get("/nothing").await.status,
        403
    );
    assert_eq!(client(env.admin()).get("/nothing").await.status, 404);
    // The loopback admin port is unchanged.
    let (status, _) = env.running.admin_get("/metrics").await;
    assert_eq!(status, 200);
}

/// kube-apiserver ends an HTTP/2 connection after a request it did not
/// authenticate, or took as anonymous: anonymous clients and bad tokens
/// passed through the proxy must not take down the requests of other
/// clients that share its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_clients_do_not_disturb_the_others() {
    let Some(env) = RealEnv::start().await else {
        return;
    };
    let ns = env.namespace("authn-neighbours").await;
    env.create(
        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent"}}),
    )
    .await;
    let token = env.token(&ns, "agent", &[]).await;
    // Passed through (not cached), authenticated: the token's user.
    let path = "/apis/authentication.k8s.io/v1/selfsubjectreviews";
    let body = serde_json::to_vec(
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
    )
    .unwrap();
    let agent = env.proxy_h2(Auth::Token(token));
    // A cached read reviews the token: the proxy knows it is valid.
    let r = agent.get("/api/v1/namespaces?resourceVersion=0").await;
    assert_eq!(r.status, 403, "{}", r.text());
    let strangers = [
        env.proxy_h2(Auth::Anonymous),
        env.proxy_h2(Auth::Token("not-a-token".into())),
    ];
    let agent_task = async {
        let mut statuses = Vec::new();
        for _ in 0..150 {
            let r = agent
                .send(
                    Method::POST,
                    path,
                    &[("content-type", "application/json")],
                    Some(body.clone()),
                )
                .await;
            statuses.push(r.status.as_u16());
        }
        statuses
    };
    let stranger_task = async {
        let mut statuses = Vec::new();
        for i in 0..150 {
            statuses.push(strangers[i % 2].get("/version").await.status.as_u16());
        }
        statuses
    };
    let (agent_statuses, stranger_statuses) = tokio::join!(agent_task, stranger_task);
    assert!(
        agent_statuses.iter().all(|s| *s == 201),
        "{agent_statuses:?}"
    );
    assert!(
        stranger_statuses.iter().all(|s| *s == 200 || *s == 401),
        "{stranger_statuses:?}"
    );
}
