//! Validation of a loaded configuration, before any socket is bound: every
//! field is checked and the first invalid one is named by its YAML path
//! (`cache.resources[0].kind`, `tls.csr.dnsNames[1]`).

use std::net::SocketAddr;
use std::path::Path;

use super::error::ConfigError;
use super::schema::{API_VERSION, CacheConfig, Config, CsrConfig, KIND};

impl Config {
    /// Checks every field. Runs before anything is started.
    ///
    /// # Errors
    /// The first invalid field, by its YAML path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(v) = &self.api_version
            && v != API_VERSION
        {
            return Err(ConfigError::invalid(
                "apiVersion",
                format!("must be {API_VERSION:?}, got {v:?}"),
            ));
        }
        if let Some(k) = &self.kind
            && k != KIND
        {
            return Err(ConfigError::invalid(
                "kind",
                format!("must be {KIND:?}, got {k:?}"),
            ));
        }
        if self.takeover.ready_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "takeover.readyTimeoutSeconds",
                "must be at least 1",
            ));
        }
        parse_addr("listen", &self.listen)?;
        let admin = parse_addr("adminListen", &self.admin_listen)?;
        if !admin.ip().is_loopback() {
            return Err(ConfigError::invalid(
                "adminListen",
                format!(
                    "{:?} is not a loopback address: the admin port answers /metrics without \
                     authentication, so it stays on 127.0.0.1 (kubelet probes a hostNetwork pod \
                     there); serve metrics beyond the node with metricsListen (HTTPS, \
                     authenticated and authorized)",
                    self.admin_listen
                ),
            ));
        }
        if self.listen == self.admin_listen && !self.listen.ends_with(":0") {
            return Err(ConfigError::invalid(
                "adminListen",
                "must differ from listen",
            ));
        }
        if let Some(metrics) = self.metrics_listen.as_ref().filter(|m| !m.is_empty()) {
            parse_addr("metricsListen", metrics)?;
            if (*metrics == self.listen || *metrics == self.admin_listen)
                && !metrics.ends_with(":0")
            {
                return Err(ConfigError::invalid(
                    "metricsListen",
                    "must differ from listen and adminListen",
                ));
            }
        }
        self.validate_pod_network()?;
        match (&self.tls.cert_file, &self.tls.private_key_file) {
            // The certificate comes from the CSR API; the files are unused.
            _ if self.tls.csr.enabled => self.tls.csr.validate(&self.node_name)?,
            (None, _) => {
                return Err(ConfigError::invalid(
                    "tls.certFile",
                    "required (--tls-cert-file)",
                ));
            }
            (_, None) => {
                return Err(ConfigError::invalid(
                    "tls.privateKeyFile",
                    "required (--tls-private-key-file)",
                ));
            }
            (Some(cert), Some(key)) => {
                readable("tls.certFile", cert)?;
                readable("tls.privateKeyFile", key)?;
            }
        }
        if let Some(ca) = &self.tls.client_ca_file {
            readable("tls.clientCAFile", ca)?;
        }
        if let Some(kc) = &self.upstream.kubeconfig {
            readable("upstream.kubeconfig", kc)?;
        }
        if let Some(f) = &self.upstream.fallback {
            readable("upstream.fallback.kubeconfig", &f.kubeconfig)?;
        }
        let balancing = &self.upstream.client_side_balancing;
        if balancing.enabled && balancing.probe_interval_seconds == 0 {
            return Err(ConfigError::invalid(
                "upstream.clientSideBalancing.probeIntervalSeconds",
                "must be at least 1",
            ));
        }
        if balancing.enabled && balancing.max_lag_seconds < balancing.probe_interval_seconds {
            return Err(ConfigError::invalid(
                "upstream.clientSideBalancing.maxLagSeconds",
                "must be at least probeIntervalSeconds (a lag is seen across probes)",
            ));
        }
        if self.upstream.connect_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "upstream.connectTimeoutSeconds",
                "must be at least 1",
            ));
        }
        if self.max_connections == 0 {
            return Err(ConfigError::invalid("maxConnections", "must be at least 1"));
        }
        if self.max_connections_per_client == 0 {
            return Err(ConfigError::invalid(
                "maxConnectionsPerClient",
                "must be at least 1",
            ));
        }
        if self.max_requests_in_flight_per_client == 0 {
            return Err(ConfigError::invalid(
                "maxRequestsInFlightPerClient",
                "must be at least 1",
            ));
        }
        self.cache.validate(&self.node_name)?;
        Ok(())
    }

    /// The parsed `listen` address. Valid after [`Config::validate`].
    ///
    /// # Errors
    /// When `listen` is not `host:port`.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("listen", &self.listen)
    }

    /// The parsed `podNetwork.listen` address, if set.
    ///
    /// # Errors
    /// When it is not `host:port`.
    pub fn pod_listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.pod_network
            .listen
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| parse_addr("podNetwork.listen", m))
            .transpose()
    }

    /// `podNetwork`: a specific address of its own, named by the requested
    /// serving certificate; a rewritten `kubernetes` Service needs it and
    /// the node's name (whose kubelet sees it).
    fn validate_pod_network(&self) -> Result<(), ConfigError> {
        use super::schema::KubernetesServiceMode;
        let pods = &self.pod_network;
        let addr = self.pod_listen_addr()?;
        if let Some(addr) = addr {
            if addr.ip().is_unspecified() {
                return Err(ConfigError::invalid(
                    "podNetwork.listen",
                    format!(
                        "{addr} would serve every network the node is on: give the node-local \
                         address pods reach (docs/pods.md)"
                    ),
                ));
            }
            let others = [
                Some(self.listen.as_str()),
                Some(self.admin_listen.as_str()),
                self.metrics_listen.as_deref(),
            ];
            if addr.port() != 0
                && others
                    .iter()
                    .flatten()
                    .any(|o| parse_addr("", o).ok() == Some(addr))
            {
                return Err(ConfigError::invalid(
                    "podNetwork.listen",
                    "must differ from listen, adminListen and metricsListen",
                ));
            }
            if self.tls.csr.enabled && !self.tls.csr.ip_addresses().contains(&addr.ip()) {
                return Err(ConfigError::invalid(
                    "tls.csr.ipAddresses",
                    format!(
                        "must include {}, the podNetwork.listen address pods verify the \
                         certificate against",
                        addr.ip()
                    ),
                ));
            }
        }
        if pods.kubernetes_service != KubernetesServiceMode::Never {
            if addr.is_none() {
                return Err(ConfigError::invalid(
                    "podNetwork.kubernetesService",
                    "needs podNetwork.listen: the address the Service is rewritten to",
                ));
            }
            let nodes_cached = self.cache.enabled
                && self
                    .cache
                    .resources
                    .iter()
                    .any(|r| r.group.is_empty() && r.resource == "nodes");
            if pods.kubernetes_service == KubernetesServiceMode::NodeLabel && !nodes_cached {
                return Err(ConfigError::invalid(
                    "podNetwork.kubernetesService",
                    "NodeLabel reads the label from the proxy's cache of its Node: cache nodes \
                     (cache.resources)",
                ));
            }
            if self.node_name.is_empty() {
                return Err(ConfigError::invalid(
                    "podNetwork.kubernetesService",
                    "needs nodeName (--node-name, NODE_NAME): only this node's kubelet sees the \
                     rewritten Service",
                ));
            }
        }
        Ok(())
    }

    /// The parsed `adminListen` address.
    ///
    /// # Errors
    /// When `adminListen` is not `host:port`.
    pub fn admin_listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        parse_addr("adminListen", &self.admin_listen)
    }

    /// The parsed `metricsListen` address, if set.
    ///
    /// # Errors
    /// When `metricsListen` is not `host:port`.
    pub fn metrics_listen_addr(&self) -> Result<Option<SocketAddr>, ConfigError> {
        self.metrics_listen
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| parse_addr("metricsListen", m))
            .transpose()
    }
}

impl CacheConfig {
    fn validate(&self, node_name: &str) -> Result<(), ConfigError> {
        if self.protobuf_cache_percent > 100 {
            return Err(ConfigError::invalid(
                "cache.protobufCachePercent",
                "must be at most 100",
            ));
        }
        if self.history_capacity == 0 {
            return Err(ConfigError::invalid(
                "cache.historyCapacity",
                "must be at least 1",
            ));
        }
        if self.history_max_age_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.historyMaxAgeSeconds",
                "must be at least 1",
            ));
        }
        if self.watcher_buffer_events == 0 {
            return Err(ConfigError::invalid(
                "cache.watcherBufferEvents",
                "must be at least 1",
            ));
        }
        if self.bookmark_interval_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.bookmarkIntervalSeconds",
                "must be at least 1",
            ));
        }
        if self.min_request_timeout_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.minRequestTimeoutSeconds",
                "must be at least 1",
            ));
        }
        if self.consistency_check.page_size == 0 {
            return Err(ConfigError::invalid(
                "cache.consistencyCheck.pageSize",
                "must be at least 1",
            ));
        }
        if self.persistence.interval_seconds == 0 {
            return Err(ConfigError::invalid(
                "cache.persistence.intervalSeconds",
                "must be at least 1",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, r) in self.resources.iter().enumerate() {
            let field = |f: &str| format!("cache.resources[{i}].{f}");
            if r.resource.is_empty() || r.resource.contains('/') {
                return Err(ConfigError::invalid(
                    &field("resource"),
                    "must be a resource name, e.g. pods",
                ));
            }
            if r.version.is_empty() {
                return Err(ConfigError::invalid(&field("version"), "required"));
            }
            if !seen.insert((r.group.clone(), r.version.clone(), r.resource.clone())) {
                return Err(ConfigError::invalid(&field("resource"), "listed twice"));
            }
            if r.history_capacity == Some(0) {
                return Err(ConfigError::invalid(
                    &field("historyCapacity"),
                    "must be at least 1",
                ));
            }
            if r.history_max_age_seconds == Some(0) {
                return Err(ConfigError::invalid(
                    &field("historyMaxAgeSeconds"),
                    "must be at least 1",
                ));
            }
            let known =
                apimachinery::resource::built_in(&r.group, &r.version, &r.resource).is_some();
            if !known && r.kind.as_deref().is_none_or(str::is_empty) {
                return Err(ConfigError::invalid(
                    &field("kind"),
                    "required for a resource the proxy does not know",
                ));
            }
            if !known && r.namespaced.is_none() {
                return Err(ConfigError::invalid(
                    &field("namespaced"),
                    "required for a resource the proxy does not know",
                ));
            }
            if let Some(sel) = &r.field_selector {
                r.scope(node_name).map_err(|m| {
                    ConfigError::invalid(&field("fieldSelector"), format!("{sel:?}: {m}"))
                })?;
            }
        }
        Ok(())
    }
}

/// The shortest `spec.expirationSeconds` the apiserver accepts.
pub const MIN_CSR_EXPIRATION_SECONDS: u64 = 600;

impl CsrConfig {
    /// Checks the section when it is enabled.
    ///
    /// # Errors
    /// The first invalid field, by its YAML path.
    pub fn validate(&self, node_name: &str) -> Result<(), ConfigError> {
        if !self.enabled {
            return Ok(());
        }
        if node_name.is_empty() {
            return Err(ConfigError::invalid(
                "nodeName",
                "required with tls.csr.enabled: the certificate's subject is \
                 CN=system:node:<nodeName> (set nodeName, --node-name or NODE_NAME)",
            ));
        }
        if let Some(problem) = apimachinery::selector::is_dns1123_subdomain(node_name)
            .into_iter()
            .next()
        {
            return Err(ConfigError::invalid(
                "nodeName",
                format!("{node_name:?} is not a node name: {problem}"),
            ));
        }
        let valid_signer = self
            .signer_name
            .split_once('/')
            .is_some_and(|(domain, path)| {
                domain.contains('.')
                    && apimachinery::selector::is_dns1123_subdomain(domain).is_empty()
                    && !path.is_empty()
                    && !path.contains(char::is_whitespace)
            });
        if !valid_signer {
            return Err(ConfigError::invalid(
                "tls.csr.signerName",
                format!(
                    "{:?} is not a signer name (<domain>/<name>, e.g. kubernetes.io/kubelet-serving)",
                    self.signer_name
                ),
            ));
        }
        for (i, raw) in self.dns_names.iter().enumerate() {
            let name = raw.replace("${NODE_NAME}", node_name);
            if let Some(problem) = apimachinery::selector::is_dns1123_subdomain(&name)
                .into_iter()
                .next()
            {
                return Err(ConfigError::invalid(
                    &format!("tls.csr.dnsNames[{i}]"),
                    format!("{raw:?} is not a DNS name: {problem}"),
                ));
            }
        }
        for (i, raw) in self.ip_addresses.iter().enumerate() {
            if let Err(e) = raw.parse::<std::net::IpAddr>() {
                return Err(ConfigError::invalid(
                    &format!("tls.csr.ipAddresses[{i}]"),
                    format!("{raw:?} is not an IP address: {e}"),
                ));
            }
        }
        if self.dns_names.is_empty() && self.ip_addresses.is_empty() {
            return Err(ConfigError::invalid(
                "tls.csr.ipAddresses",
                "the certificate needs at least one DNS name or IP address (clients connect to 127.0.0.1)",
            ));
        }
        if self.directory.as_os_str().is_empty() {
            return Err(ConfigError::invalid("tls.csr.directory", "required"));
        }
        if self.directory.exists() && !self.directory.is_dir() {
            return Err(ConfigError::invalid(
                "tls.csr.directory",
                format!("{}: not a directory", self.directory.display()),
            ));
        }
        let duration = self.requested_duration_seconds;
        if duration != 0 && !(MIN_CSR_EXPIRATION_SECONDS..=i32::MAX as u64).contains(&duration) {
            return Err(ConfigError::invalid(
                "tls.csr.requestedDurationSeconds",
                format!(
                    "must be 0 (the signer's default) or between {MIN_CSR_EXPIRATION_SECONDS} and {}",
                    i32::MAX
                ),
            ));
        }
        Ok(())
    }
}

fn parse_addr(field: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse::<SocketAddr>().map_err(|e| {
        ConfigError::invalid(
            field,
            format!("{value:?} is not an IP address and port (host:port): {e}"),
        )
    })
}

fn readable(field: &str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| ConfigError::invalid(field, format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::super::load::Overrides;
    use super::*;

    #[test]
    fn bad_address_names_field() {
        let c = Config {
            listen: "localhost".into(),
            ..Config::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("listen:"), "{err}");
    }

    #[test]
    fn admin_port_stays_on_loopback() {
        let check = |admin: &str, metrics: Option<&str>| {
            let c = Config {
                admin_listen: admin.into(),
                metrics_listen: metrics.map(str::to_string),
                ..Config::default()
            };
            // The first error after the addresses is the missing certificate.
            let err = c.validate().unwrap_err().to_string();
            (!err.starts_with("tls.certFile:")).then_some(err)
        };
        assert_eq!(check("127.0.0.1:9444", None), None);
        assert_eq!(check("127.0.0.1:9444", Some("")), None);
        assert_eq!(check("[::1]:9444", Some("0.0.0.0:9445")), None);
        for addr in ["0.0.0.0:9444", "[::]:9444", "10.0.0.5:9444"] {
            let err = check(addr, None).unwrap();
            assert!(err.starts_with("adminListen:"), "{err}");
            assert!(err.contains("metricsListen"), "{err}");
        }
        let err = check("127.0.0.1:9444", Some("nowhere")).unwrap();
        assert!(err.starts_with("metricsListen:"), "{err}");
        let err = check("127.0.0.1:9444", Some("127.0.0.1:9444")).unwrap();
        assert!(err.starts_with("metricsListen:"), "{err}");
        let mut c = Config::default();
        c.apply(&Overrides {
            metrics_listen: Some("0.0.0.0:9445".into()),
            ..Overrides::default()
        });
        assert_eq!(c.metrics_listen.as_deref(), Some("0.0.0.0:9445"));
        c.apply(&Overrides {
            metrics_listen: Some(String::new()),
            ..Overrides::default()
        });
        assert_eq!(c.metrics_listen, None);
    }

    #[test]
    fn missing_cert_names_field() {
        let err = Config::default().validate().unwrap_err().to_string();
        assert!(err.starts_with("tls.certFile:"), "{err}");
    }

    #[test]
    fn cache_resources_are_validated() {
        let c = Config::from_yaml(
            "cache:\n  resources:\n  - {group: example.com, version: v1, resource: widgets}\n",
        )
        .unwrap();
        let err = c.cache.validate("").unwrap_err().to_string();
        assert!(err.starts_with("cache.resources[0].kind:"), "{err}");
        let c = Config::from_yaml("cache:\n  resources:\n  - {version: v1, resource: pods, fieldSelector: 'spec.nodeName=${NODE_NAME}'}\n").unwrap();
        let err = c.cache.validate("").unwrap_err().to_string();
        assert!(
            err.starts_with("cache.resources[0].fieldSelector:"),
            "{err}"
        );
        assert!(c.cache.validate("node-1").is_ok());
        assert_eq!(
            c.cache.resources[0].scope("node-1").unwrap().to_string(),
            "spec.nodeName=node-1"
        );
        let c = Config::from_yaml("cache:\n  resources:\n  - {version: v1, resource: configmaps, fieldSelector: 'spec.nodeName=x'}\n").unwrap();
        assert!(c.cache.validate("").is_err());
        let c = Config::from_yaml("cache:\n  resources:\n  - {group: discovery.k8s.io, version: v1, resource: endpointslices, historyMaxAgeSeconds: 0}\n").unwrap();
        let err = c.cache.validate("").unwrap_err().to_string();
        assert!(
            err.starts_with("cache.resources[0].historyMaxAgeSeconds:"),
            "{err}"
        );
        let c = Config::from_yaml("cache:\n  resources:\n  - {group: discovery.k8s.io, version: v1, resource: endpointslices, historyMaxAgeSeconds: 75}\n").unwrap();
        assert!(c.cache.validate("").is_ok());
        assert_eq!(c.cache.resources[0].history_max_age_seconds, Some(75));
    }

    #[test]
    fn the_pod_network_section_is_validated() {
        let with = |yaml: &str, node: &str| {
            let mut c = Config::from_yaml(&format!(
                "tls:\n  csr: {{enabled: true, ipAddresses: ['127.0.0.1', '169.254.64.1']}}\n{yaml}"
            ))
            .unwrap();
            c.node_name = node.into();
            c.validate().map_err(|e| e.to_string())
        };
        assert!(with("podNetwork: {listen: '169.254.64.1:6444'}\n", "n").is_ok());
        assert!(with("podNetwork: {listen: ''}\n", "n").is_ok());
        for (yaml, node, field) in [
            (
                "podNetwork: {listen: '0.0.0.0:6444'}\n",
                "n",
                "podNetwork.listen:",
            ),
            (
                "podNetwork: {listen: '[::]:6444'}\n",
                "n",
                "podNetwork.listen:",
            ),
            (
                "podNetwork: {listen: 'pods:6444'}\n",
                "n",
                "podNetwork.listen:",
            ),
            (
                "podNetwork: {listen: '127.0.0.1:6444'}\n",
                "n",
                "podNetwork.listen:",
            ),
            (
                "podNetwork: {listen: '169.254.64.2:6444'}\n",
                "n",
                "tls.csr.ipAddresses:",
            ),
            (
                "podNetwork: {kubernetesService: Always}\n",
                "n",
                "podNetwork.kubernetesService:",
            ),
            (
                "podNetwork: {listen: '169.254.64.1:6444', kubernetesService: NodeLabel}\n",
                "",
                "podNetwork.kubernetesService:",
            ),
            (
                "podNetwork: {listen: '169.254.64.1:6444', kubernetesService: Always}\n",
                "",
                "podNetwork.kubernetesService:",
            ),
        ] {
            let err = with(yaml, node).unwrap_err();
            assert!(err.starts_with(field), "{yaml}: {err}");
        }
        assert!(
            with(
                "podNetwork: {listen: '169.254.64.1:6444', kubernetesService: Always}\n",
                "n"
            )
            .is_ok()
        );
        assert!(Config::from_yaml("podNetwork: {kubernetesService: Sometimes}\n").is_err());
        let err = with(
            "podNetwork: {listen: '169.254.64.1:6444', kubernetesService: NodeLabel}\ncache: {resources: [{version: v1, resource: pods}]}\n",
            "n",
        )
        .unwrap_err();
        assert!(err.contains("cache nodes"), "{err}");
    }

    #[test]
    fn csr_section_is_validated() {
        let c = Config::from_yaml("tls:\n  csr: {enabled: true}\n").unwrap();
        assert_eq!(c.tls.csr.signer_name, "kubernetes.io/kubelet-serving");
        // No certificate files needed, but a node name is.
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("nodeName:"), "{err}");
        let with = |yaml: &str| {
            let mut c = Config::from_yaml(yaml).unwrap();
            c.node_name = "node-1".into();
            c.validate().map_err(|e| e.to_string())
        };
        assert!(with("tls:\n  csr: {enabled: true}\n").is_ok());
        // Certificate files are ignored, not checked.
        assert!(with("tls:\n  certFile: /nonexistent\n  csr: {enabled: true}\n").is_ok());
        for (yaml, field) in [
            (
                "{enabled: true, dnsNames: ['-bad']}",
                "tls.csr.dnsNames[0]:",
            ),
            (
                "{enabled: true, ipAddresses: ['127.0.0.1', 'x']}",
                "tls.csr.ipAddresses[1]:",
            ),
            (
                "{enabled: true, signerName: kubelet-serving}",
                "tls.csr.signerName:",
            ),
            (
                "{enabled: true, requestedDurationSeconds: 60}",
                "tls.csr.requestedDurationSeconds:",
            ),
            (
                "{enabled: true, dnsNames: [], ipAddresses: []}",
                "tls.csr.ipAddresses:",
            ),
            ("{enabled: true, directory: ''}", "tls.csr.directory:"),
            (
                "{enabled: true, directory: /dev/null}",
                "tls.csr.directory:",
            ),
        ] {
            let err = with(&format!("tls:\n  csr: {yaml}\n")).unwrap_err();
            assert!(err.starts_with(field), "{yaml}: {err}");
        }
        assert!(with("tls:\n  csr: {enabled: true, requestedDurationSeconds: 3600}\n").is_ok());
        let mut c = Config::from_yaml("tls:\n  csr: {enabled: true}\n").unwrap();
        c.node_name = "Not_A_Node".into();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.starts_with("nodeName:"), "{err}");
        // Disabled: not checked, and the files are required as before.
        let err = Config::from_yaml("tls:\n  csr: {dnsNames: ['-bad']}\n")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("tls.certFile:"), "{err}");
    }
}
