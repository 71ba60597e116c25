//! The proxy's binary against a real control plane, started as a node
//! starts it: a shipped configuration, with flags for what exists only on
//! a node (ports, certificate files, the upstream kubeconfig, the node's
//! name and state directory).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use apimachinery::pki::Ca;
use kube_testenv::ControlPlane;

use crate::{Auth, Client};

/// The binary, started with a shipped configuration (unchanged) and, for
/// what only exists on a node, flags: loopback ports, certificate files,
/// the upstream kubeconfig and the node's name.
pub struct Binary {
    pub child: tokio::process::Child,
    pub port: u16,
    pub admin_port: u16,
    pub metrics_port: u16,
    pub dir: PathBuf,
    pub ca_pem: String,
    /// The program, its arguments and environment, to start it again.
    recipe: (PathBuf, Vec<std::ffi::OsString>, Vec<(String, String)>),
}

impl Binary {
    /// With the DaemonSet's configuration (`manifests/kube-cache-proxy.yaml`).
    pub fn start(cp: &ControlPlane, upstream_kubeconfig: &str, node: &str) -> Binary {
        Binary::start_with(
            cp,
            "manifests/kube-cache-proxy.yaml",
            |_| upstream_kubeconfig.to_string(),
            node,
            false,
        )
    }

    /// With `config` (relative to the repository), the upstream kubeconfig
    /// `kubeconfig(dir)` writes (files it names go in `dir`), and, when
    /// `no_capabilities`, the process as a static pod or the systemd unit
    /// runs it: root without any capability (`setpriv`; only where the
    /// test runs as root and has it, else as is).
    pub fn start_with(
        cp: &ControlPlane,
        config: &str,
        kubeconfig: impl FnOnce(&Path) -> String,
        node: &str,
        no_capabilities: bool,
    ) -> Binary {
        Binary::start_with_env(cp, config, kubeconfig, node, no_capabilities, &[])
    }

    /// [`Binary::start_with`], with `env` added to the process's
    /// environment (a test build's `FAILPOINTS`, say).
    pub fn start_with_env(
        cp: &ControlPlane,
        config: &str,
        kubeconfig: impl FnOnce(&Path) -> String,
        node: &str,
        no_capabilities: bool,
        env: &[(&str, &str)],
    ) -> Binary {
        let dir = crate::env::tempdir();
        let upstream_kubeconfig = kubeconfig(&dir);
        let ca = Ca::new("lp-binary").unwrap();
        let serving = ca
            .issue_server(&["localhost"], &["127.0.0.1".parse().unwrap()])
            .unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let free = || kube_testenv::free_port().unwrap();
        let (port, admin_port, metrics_port) = (free(), free(), free());
        let bin = crate::proxy_binary();
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        if no_capabilities && !can_drop_capabilities() {
            kube_testenv::skip::skip(
                "running the proxy as root without capabilities needs root and setpriv: it \
                 runs as it is",
            );
        }
        let program = if no_capabilities && can_drop_capabilities() {
            args.extend(
                [
                    "--bounding-set=-all",
                    "--inh-caps=-all",
                    "--ambient-caps=-all",
                    "--",
                ]
                .map(Into::into),
            );
            args.push(bin.into());
            PathBuf::from("setpriv")
        } else {
            bin
        };
        let mut arg = |a: &dyn AsRef<std::ffi::OsStr>| args.push(a.as_ref().to_owned());
        arg(&"--config");
        arg(&crate::repo().join(config));
        arg(&"--listen");
        arg(&format!("127.0.0.1:{port}"));
        arg(&"--admin-listen");
        arg(&format!("127.0.0.1:{admin_port}"));
        arg(&"--metrics-listen");
        arg(&format!("127.0.0.1:{metrics_port}"));
        arg(&"--tls-cert-file");
        arg(&write("tls.crt", &serving.cert_pem));
        arg(&"--tls-private-key-file");
        arg(&write("tls.key", &serving.key_pem));
        arg(&"--client-ca-file");
        arg(&write("client-ca.crt", &cp.ca_pem()));
        arg(&"--upstream-kubeconfig");
        arg(&write("upstream.kubeconfig", &upstream_kubeconfig));
        arg(&"--node-name");
        arg(&node);
        // The node's state directory, here the test's own.
        arg(&"--cache-persistence-directory");
        arg(&dir.join("state/cache"));
        arg(&"--takeover-socket-path");
        arg(&dir.join("state/takeover.sock"));
        let recipe = (
            program,
            args,
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        Binary {
            child: spawn(&recipe, &dir),
            port,
            admin_port,
            metrics_port,
            dir,
            ca_pem: ca.cert_pem(),
            recipe,
        }
    }

    /// Kills the process (`SIGKILL`, as a crash or an OOM kill) and starts
    /// it again with the same arguments, ports and state directory (its
    /// snapshots, what it wrote before the kill).
    pub async fn kill_and_restart(&mut self) {
        let _ = self.child.kill().await;
        self.child = spawn(&self.recipe, &self.dir);
    }

    /// A plain-HTTP GET on the admin port: (status, body), or `None` while
    /// nothing listens.
    pub async fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.admin_port))
            .await
            .ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        let status = out.get(9..12)?.parse().ok()?;
        Some((status, out.split_once("\r\n\r\n")?.1.to_string()))
    }

    pub fn client(&self, auth: Auth) -> Client {
        Client::new(
            &format!("https://127.0.0.1:{}", self.port),
            &self.ca_pem,
            auth,
            false,
        )
    }

    pub fn metrics_client(&self, auth: Auth) -> Client {
        Client::new(
            &format!("https://127.0.0.1:{}", self.metrics_port),
            &self.ca_pem,
            auth,
            false,
        )
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }
}

/// Starts `recipe` (program, arguments, environment), its stderr appended
/// to `dir/stderr`.
fn spawn(
    recipe: &(PathBuf, Vec<std::ffi::OsString>, Vec<(String, String)>),
    dir: &Path,
) -> tokio::process::Child {
    let (program, args, env) = recipe;
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("stderr"))
        .unwrap();
    tokio::process::Command::new(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        // A file, not a pipe nobody drains while it runs.
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Whether this test runs as root with `setpriv` at hand, to run the proxy
/// as root without capabilities.
pub fn can_drop_capabilities() -> bool {
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    root && std::process::Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
