//! Writing kubeconfig files (for the demo, the simulated apiserver and
//! tests) with `kube`'s own kubeconfig types, serialized as JSON, which is
//! valid YAML and read by kubectl and every client library.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};
use secrecy::SecretString;

/// A kubeconfig for `server` trusting `ca_pem`, with `auth` as the user.
fn render(server: &str, ca_pem: &str, user: &str, auth: AuthInfo) -> String {
    let config = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "cluster".into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority_data: Some(STANDARD.encode(ca_pem)),
                ..Cluster::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.into(),
            auth_info: Some(auth),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "default".into(),
            context: Some(Context {
                cluster: "cluster".into(),
                user: Some(user.into()),
                ..Context::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("default".into()),
        kind: Some("Config".into()),
        api_version: Some("v1".into()),
        ..Kubeconfig::default()
    };
    serde_json::to_string_pretty(&config).unwrap_or_default()
}

/// A kubeconfig authenticating with a client certificate and key (PEM).
pub fn with_certificate(
    server: &str,
    ca_pem: &str,
    user: &str,
    cert_pem: &str,
    key_pem: &str,
) -> String {
    render(
        server,
        ca_pem,
        user,
        AuthInfo {
            client_certificate_data: Some(STANDARD.encode(cert_pem)),
            client_key_data: Some(SecretString::from(STANDARD.encode(key_pem))),
            ..AuthInfo::default()
        },
    )
}

/// A kubeconfig authenticating with the client certificate and key in the
/// files `cert_file` and `key_file` (which may be the same file, as
/// kubelet's `kubelet-client-current.pem`).
pub fn with_certificate_files(
    server: &str,
    ca_pem: &str,
    user: &str,
    cert_file: &str,
    key_file: &str,
) -> String {
    render(
        server,
        ca_pem,
        user,
        AuthInfo {
            client_certificate: Some(cert_file.into()),
            client_key: Some(key_file.into()),
            ..AuthInfo::default()
        },
    )
}

/// A kubeconfig authenticating with a bearer token.
pub fn with_token(server: &str, ca_pem: &str, token: &str) -> String {
    render(
        server,
        ca_pem,
        "token-user",
        AuthInfo {
            token: Some(SecretString::from(token.to_string())),
            ..AuthInfo::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn kube_reads_what_we_write() {
        let ca = crate::pki::Ca::new("ca").unwrap();
        let c = ca.issue_client("alice", None).unwrap();
        let text = with_certificate(
            "https://127.0.0.1:1",
            &ca.cert_pem(),
            "alice",
            &c.cert_pem,
            &c.key_pem,
        );
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        assert_eq!(cfg.cluster_url.to_string(), "https://127.0.0.1:1/");
        let text = with_token("https://127.0.0.1:1", &ca.cert_pem(), "t0k");
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert!(kc.auth_infos[0].auth_info.as_ref().unwrap().token.is_some());
    }
}
