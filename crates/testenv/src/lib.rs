//! A real Kubernetes control plane for tests: etcd and kube-apiserver on
//! free `127.0.0.1` ports, with certificates generated in Rust, plus hollow
//! nodes (`kubemark --morph=kubelet|proxy`). The Rust counterpart of
//! controller-runtime's envtest, and the same binaries layout
//! (`KUBEBUILDER_ASSETS`).
//!
//! - [`ControlPlane::shared`] starts one control plane per test binary on
//!   first use and returns it to every test; where the binaries are absent
//!   it prints one line and returns `None`, so the tests skip.
//! - Every process it starts dies with the test binary, even when a test
//!   fails or the binary is killed ([`process`]).
//! - Identities: `admin` (`O=system:masters`), any user or node by client
//!   certificate ([`ControlPlane::issue_client`]), and ServiceAccount
//!   tokens (the apiserver signs them with a key generated here).
//!
//! ```no_run
//! # async fn demo() {
//! let Some(cp) = kube_testenv::ControlPlane::shared().await else { return };
//! println!("{} trusts {}", cp.url(), cp.ca_pem());
//! # }
//! ```
#![allow(clippy::result_large_err)]

pub mod assets;
mod etcd;
mod instance;
pub mod manifest;
pub mod process;
pub mod skip;
pub mod tls;

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use apimachinery::kubeconfig;
use apimachinery::pki::{Ca, Issued};

pub use assets::{Assets, AssetsError};
pub use process::Process;

use instance::{Apiserver, Member};

/// Why a control plane could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The binaries could not be found or unpacked.
    #[error(transparent)]
    Assets(#[from] AssetsError),
    /// A certificate or key could not be generated.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    /// A process did not become ready.
    #[error("{what} did not become ready: {detail}\n--- its log (tail) ---\n{log}")]
    NotReady {
        what: String,
        detail: String,
        log: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

/// How long kube-apiserver may take to answer `/readyz` with ok. It takes
/// 3-4 s on an idle 2-core machine; much more while tests compile.
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// The service-account issuer (and default audience) of the control plane.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc";

/// The environment variable naming the kube-apiserver minor version
/// (`1.34`) a control plane runs when its [`Options`] name none: the
/// version matrix runs the real-apiserver tests once per version with it
/// (README.md). Unset: the newest at hand.
pub const VERSION_ENV: &str = "KUBE_TESTENV_APISERVER_VERSION";

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Extra kube-apiserver flags, each `--name=value`, after the defaults
    /// (a later flag wins).
    pub apiserver_args: Vec<String>,
    /// The kube-apiserver minor version (`"1.35"`), from
    /// [`Assets::version`]; etcd and kubemark stay the control plane's.
    /// `None`: [`VERSION_ENV`], else the newest.
    pub version: Option<String>,
    /// How many kube-apiservers (0 counts as 1), each on its own port.
    pub apiservers: usize,
    /// How many etcd members (0 counts as 1). More than one is a cluster
    /// of the cluster etcd ([`Assets::etcd_cluster`]), and with as many
    /// apiservers as members each apiserver uses its own member only, as
    /// in kubeadm's stacked topology; otherwise every apiserver uses every
    /// member.
    pub etcd_members: usize,
}

impl Options {
    /// The apiserver version asked for: [`Options::version`], else
    /// [`VERSION_ENV`].
    pub fn wanted_version(&self) -> Option<String> {
        self.version.clone().or_else(|| {
            std::env::var(VERSION_ENV)
                .ok()
                .map(|v| v.trim().trim_start_matches('v').to_string())
                .filter(|v| !v.is_empty())
        })
    }
}

/// A running etcd and kube-apiserver (or several of each). Dropping it
/// stops them.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    assets: Assets,
    /// `/version`'s `gitVersion` (`v1.36.2`) of the first apiserver, at
    /// start.
    git_version: String,
    ca: Ca,
    admin: Issued,
    admin_kubeconfig: PathBuf,
    apiserver_args: Vec<String>,
    // Stopped in reverse order of declaration: the apiservers first.
    apiservers: Vec<Apiserver>,
    members: Vec<Member>,
}

static SHARED: tokio::sync::OnceCell<Result<ControlPlane, String>> =
    tokio::sync::OnceCell::const_new();

// === impl ControlPlane ===

impl ControlPlane {
    /// The control plane of this test binary, started by the first caller
    /// and shared by every test; `None` where no binaries are available:
    /// each caller is then a skip ([`skip::skip`]).
    ///
    /// # Panics
    /// When the binaries are present but the control plane fails to start:
    /// that is a failure, not a skip; and when absent under
    /// [`skip::REQUIRE_ALL`].
    pub async fn shared() -> Option<&'static ControlPlane> {
        let cp = SHARED
            .get_or_init(|| async {
                match ControlPlane::start(Options::default()).await {
                    Ok(cp) => Ok(cp),
                    Err(Error::Assets(e @ AssetsError::Absent { .. })) => Err(e.to_string()),
                    Err(e) => Err(format!("starting the control plane: {e}")),
                }
            })
            .await;
        match cp {
            Ok(cp) => Some(cp),
            Err(e) if e.starts_with("starting") => {
                #[allow(clippy::panic)]
                {
                    panic!("kube-testenv: {e}")
                }
            }
            Err(e) => {
                skip::skip(format!("no real control plane: {e}"));
                None
            }
        }
    }

    /// Starts a control plane with `options`, or returns `None` (after
    /// printing why) where no binaries are available, for a test binary
    /// that needs other options than [`ControlPlane::shared`]'s.
    ///
    /// # Panics
    /// When the binaries are present but the control plane fails to start.
    #[allow(clippy::panic)]
    pub async fn start_or_skip(options: Options) -> Option<ControlPlane> {
        match ControlPlane::start(options).await {
            Ok(cp) => Some(cp),
            Err(Error::Assets(e @ AssetsError::Absent { .. })) => {
                skip::skip(format!("no real control plane: {e}"));
                None
            }
            Err(e) => panic!("kube-testenv: starting the control plane: {e}"),
        }
    }

    /// Starts etcd and kube-apiserver and waits until the apiserver is
    /// ready. A port taken between [`free_port`] finding it free and a
    /// process binding it (another test's connection got it) is retried
    /// with new ports, up to three times.
    ///
    /// # Errors
    /// [`Error`] when the binaries are absent or broken, or a process does
    /// not become ready.
    pub async fn start(options: Options) -> Result<ControlPlane, Error> {
        let mut attempt = 1;
        loop {
            match Self::start_once(options.clone()).await {
                Err(Error::NotReady { log, .. })
                    if attempt < 3 && log.contains("address already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn start_once(options: Options) -> Result<ControlPlane, Error> {
        let assets = Assets::locate()?;
        let apiserver_assets = match options.wanted_version() {
            Some(v) => Assets::version(&v)?,
            None => assets.clone(),
        };
        let dir = run_dir()?;
        let ca = Ca::new("kube-testenv-ca")?;
        let serving = ca.issue_server(
            &["localhost", "kubernetes", "kubernetes.default.svc"],
            &[
                Ipv4Addr::LOCALHOST.into(),
                Ipv4Addr::new(10, 0, 0, 1).into(),
            ],
        )?;
        let admin = ca.issue_client("admin", Some("system:masters"))?;
        let sa_key = rcgen::KeyPair::generate()?;
        let files = [
            ("ca.crt", ca.cert_pem()),
            ("apiserver.crt", serving.cert_pem.clone()),
            ("apiserver.key", serving.key_pem.clone()),
            ("sa.key", sa_key.serialize_pem()),
            ("sa.pub", sa_key.public_key_pem()),
        ];
        for (name, content) in &files {
            write_private(&dir.join(name), content)?;
        }

        let members = start_members(&assets, &dir, options.etcd_members.max(1))?;
        let n = options.apiservers.max(1);
        let stacked = members.len() > 1 && members.len() == n;
        let mut apiservers = Vec::with_capacity(n);
        let mut apiserver_args = Vec::new();
        for i in 0..n {
            let port = if n == 1 { free_port()? } else { stable_port()? };
            let etcd_servers = if stacked {
                members[i].url()
            } else {
                members
                    .iter()
                    .map(Member::url)
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let mut args = vec![
                format!("--secure-port={port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--etcd-servers={etcd_servers}"),
                format!(
                    "--cert-dir={}",
                    dir.join(format!("apiserver-certs-{i}")).display()
                ),
                format!("--client-ca-file={}", dir.join("ca.crt").display()),
                format!("--tls-cert-file={}", dir.join("apiserver.crt").display()),
                format!(
                    "--tls-private-key-file={}",
                    dir.join("apiserver.key").display()
                ),
                format!(
                    "--service-account-key-file={}",
                    dir.join("sa.pub").display()
                ),
                format!(
                    "--service-account-signing-key-file={}",
                    dir.join("sa.key").display()
                ),
                format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
                "--authorization-mode=Node,RBAC".into(),
                "--enable-admission-plugins=NodeRestriction".into(),
                "--anonymous-auth=true".into(),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--allow-privileged=true".into(),
                "--endpoint-reconciler-type=none".into(),
                "--profiling=false".into(),
            ];
            args.extend(options.apiserver_args.iter().cloned());
            if i == 0 {
                apiserver_args = args.clone();
            }
            let name = if n == 1 {
                "kube-apiserver".to_string()
            } else {
                format!("kube-apiserver-{i}")
            };
            let log = dir.join(format!("{name}.log"));
            apiservers.push(Apiserver::spawn(
                name,
                port,
                args,
                log,
                apiserver_assets.clone(),
            )?);
        }

        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let mut cp = ControlPlane {
            admin_kubeconfig: admin_kubeconfig.clone(),
            dir,
            assets,
            git_version: String::new(),
            apiserver_args,
            apiservers,
            members,
            admin,
            ca,
        };
        write_private(
            &admin_kubeconfig,
            &cp.kubeconfig_text(&cp.url(), "admin", &cp.admin),
        )?;
        for i in 0..n {
            cp.wait_ready(i, APISERVER_READY_TIMEOUT).await?;
        }
        cp.git_version = cp
            .apiserver_version(0)
            .await
            .map_err(|detail| Error::NotReady {
                what: "kube-apiserver /version".into(),
                detail,
                log: String::new(),
            })?;
        Ok(cp)
    }

    /// `/version`'s `gitVersion` of apiserver `i`, asked now.
    ///
    /// # Errors
    /// When it cannot be read.
    pub async fn apiserver_version(&self, i: usize) -> Result<String, String> {
        let client = self.admin_client_of(i).await?;
        let req = http::Request::get("/version")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        let text = client.request_text(req).await.map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        v["gitVersion"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no gitVersion in {text}"))
    }

    /// The apiserver's version, `/version`'s `gitVersion` (`v1.36.2`).
    pub fn version(&self) -> &str {
        &self.git_version
    }

    /// The apiserver's minor version (`36` for v1.36.2).
    pub fn minor(&self) -> u32 {
        self.git_version
            .trim_start_matches('v')
            .split('.')
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the apiserver decides node and user impersonation by
    /// constrained impersonation (KEP-5284: `ConstrainedImpersonation`,
    /// alpha and off in 1.35, beta and on from 1.36).
    pub fn has_constrained_impersonation(&self) -> bool {
        let gate = |on: bool| format!("ConstrainedImpersonation={on}");
        let named = |on: bool| {
            self.apiserver_args
                .iter()
                .any(|a| a.starts_with("--feature-gates") && a.contains(&gate(on)))
        };
        (self.minor() >= 36 && !named(false)) || (self.minor() == 35 && named(true))
    }

    /// `https://127.0.0.1:<port>` of the first apiserver.
    pub fn url(&self) -> String {
        self.apiserver_url(0)
    }

    /// The first apiserver's port.
    pub fn port(&self) -> u16 {
        self.apiservers[0].port
    }

    /// How many apiservers run (or are down).
    pub fn apiserver_count(&self) -> usize {
        self.apiservers.len()
    }

    /// `https://127.0.0.1:<port>` of apiserver `i`.
    pub fn apiserver_url(&self, i: usize) -> String {
        format!("https://127.0.0.1:{}", self.apiservers[i].port)
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`, no TLS), of the first
    /// member: its v3 JSON gateway (`/v3/kv/range`, `/v3/watch`,
    /// `/v3/kv/compaction`) for tests that read etcd's history or compact
    /// it.
    pub fn etcd_url(&self) -> String {
        self.members[0].url()
    }

    /// Every etcd member's client URL.
    pub fn etcd_urls(&self) -> Vec<String> {
        self.members.iter().map(Member::url).collect()
    }

    /// The first apiserver's process id.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiservers[0].with(Process::pid).unwrap_or_default()
    }

    /// The first etcd member's process id (0 if it is not running).
    pub fn etcd_pid(&self) -> u32 {
        self.members[0].with(Process::pid).unwrap_or_default()
    }

    /// The CA that signed the apiserver's serving certificate and that the
    /// apiserver trusts for client certificates, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.cert_pem()
    }

    /// The cluster CA, to issue more certificates.
    pub fn ca(&self) -> &Ca {
        &self.ca
    }

    /// The directory holding this control plane's files and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the binaries came from.
    pub fn assets(&self) -> &Assets {
        &self.assets
    }

    /// The `system:masters` client certificate.
    pub fn admin(&self) -> &Issued {
        &self.admin
    }

    /// A kubeconfig file for `admin`.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A client certificate for `user` in `group`, signed by the cluster
    /// CA (`CN=system:node:<name>, O=system:nodes` is a node).
    ///
    /// # Errors
    /// When signing fails.
    pub fn issue_client(&self, user: &str, group: Option<&str>) -> Result<Issued, Error> {
        Ok(self.ca.issue_client(user, group)?)
    }

    /// A kubeconfig text for `server` (trusting the cluster CA) with a
    /// client certificate.
    pub fn kubeconfig_text(&self, server: &str, user: &str, cert: &Issued) -> String {
        kubeconfig::with_certificate(
            server,
            &self.ca.cert_pem(),
            user,
            &cert.cert_pem,
            &cert.key_pem,
        )
    }

    /// Writes `text` as `name` in this control plane's directory, readable
    /// only by its owner; returns the path.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_file(&self, name: &str, text: &str) -> Result<PathBuf, Error> {
        let path = self.dir.join(name);
        write_private(&path, text)?;
        Ok(path)
    }

    /// Waits until apiserver `i`'s `/readyz` answers `ok`.
    async fn wait_ready(&self, i: usize, timeout: Duration) -> Result<(), Error> {
        let not_ready = |detail: String| Error::NotReady {
            what: self.apiservers[i].name.clone(),
            detail,
            log: self.apiserver_log_tail_of(i),
        };
        let client = self.admin_client_of(i).await.map_err(&not_ready)?;
        let deadline = Instant::now() + timeout;
        loop {
            let exited = self.apiservers[i].with(Process::exited).ok().flatten();
            if let Some(status) = exited {
                return Err(not_ready(format!("exited with {status}")));
            }
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .map_err(|e| not_ready(e.to_string()))?;
            let last = match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                return Err(not_ready(format!("after {timeout:?}: {last}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A `kube` client acting as `admin`, of the first apiserver.
    ///
    /// # Errors
    /// When the kubeconfig does not load (a bug here).
    pub async fn admin_client(&self) -> Result<kube::Client, String> {
        self.admin_client_of(0).await
    }

    /// A `kube` client acting as `admin`, of apiserver `i`.
    ///
    /// # Errors
    /// When the kubeconfig does not load (a bug here).
    pub async fn admin_client_of(&self, i: usize) -> Result<kube::Client, String> {
        let text = self.kubeconfig_text(&self.apiserver_url(i), "admin", &self.admin);
        let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }

    /// The last 8 KiB of the first apiserver's log.
    pub fn apiserver_log_tail(&self) -> String {
        self.apiserver_log_tail_of(0)
    }

    /// The last 8 KiB of apiserver `i`'s log.
    pub fn apiserver_log_tail_of(&self, i: usize) -> String {
        self.apiservers[i]
            .with(|p| p.log_tail(8192))
            .unwrap_or_default()
    }

    /// Suspends the first apiserver (`SIGSTOP`): connections stay open and
    /// nothing answers, as when it hangs or the network black-holes.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause_apiserver(&self) -> Result<(), Error> {
        self.pause_apiserver_of(0)
    }

    /// Resumes it after [`ControlPlane::pause_apiserver`].
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume_apiserver(&self) -> Result<(), Error> {
        self.resume_apiserver_of(0)
    }

    /// Suspends apiserver `i` (`SIGSTOP`).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause_apiserver_of(&self, i: usize) -> Result<(), Error> {
        self.apiservers[i]
            .with(Process::pause)?
            .map_err(io_err("suspending kube-apiserver"))
    }

    /// Resumes apiserver `i` (`SIGCONT`).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume_apiserver_of(&self, i: usize) -> Result<(), Error> {
        self.apiservers[i]
            .with(Process::resume)?
            .map_err(io_err("resuming kube-apiserver"))
    }

    /// Stops every apiserver, then every etcd member (`SIGKILL`), as
    /// dropping the control plane does: for a plane leaked to `&'static`
    /// (what a test spawns borrows it) whose processes must still end with
    /// the test. Nothing starts it again.
    pub fn stop(&self) {
        for apiserver in &self.apiservers {
            let _ = apiserver.with(Process::kill);
        }
        for member in &self.members {
            let _ = member.with(Process::kill);
        }
    }

    /// Stops the first apiserver (`SIGKILL`) and leaves it down, as in an
    /// outage; [`ControlPlane::start_apiserver`] brings it back. etcd keeps
    /// running.
    pub fn stop_apiserver(&self) {
        self.stop_apiserver_of(0);
    }

    /// Stops apiserver `i` (`SIGKILL`) and leaves it down.
    pub fn stop_apiserver_of(&self, i: usize) {
        let _ = self.apiservers[i].with(Process::kill);
    }

    /// Starts the first apiserver again after
    /// [`ControlPlane::stop_apiserver`], on the same port with the same
    /// data, and waits until it is ready.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_apiserver(&self) -> Result<(), Error> {
        self.start_apiserver_of(0, None).await
    }

    /// Starts apiserver `i` again (it must be stopped), of minor version
    /// `version` when given (`Some("1.35")`: a rolling upgrade's step),
    /// else of the version it ran, and waits until it is ready.
    ///
    /// # Errors
    /// When that version is not at hand, or it does not start.
    pub async fn start_apiserver_of(&self, i: usize, version: Option<&str>) -> Result<(), Error> {
        let assets = version.map(Assets::version).transpose()?;
        self.apiservers[i].respawn(assets)?;
        self.wait_ready(i, APISERVER_READY_TIMEOUT).await
    }

    /// Kills the first apiserver (`SIGKILL`, no shutdown at all), waits
    /// `down`, starts it again on the same port with the same data, and
    /// waits until it is ready.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn kill_apiserver(&self, down: Duration) -> Result<(), Error> {
        self.kill_apiserver_of(0, down).await
    }

    /// [`ControlPlane::kill_apiserver`] of apiserver `i`.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn kill_apiserver_of(&self, i: usize, down: Duration) -> Result<(), Error> {
        self.stop_apiserver_of(i);
        tokio::time::sleep(down).await;
        self.start_apiserver_of(i, None).await
    }

    /// Stops the first apiserver (`SIGTERM`, then `SIGKILL` after `grace`),
    /// waits `down`, starts it again on the same port with the same data,
    /// and waits until it is ready.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn restart_apiserver(&self, grace: Duration, down: Duration) -> Result<(), Error> {
        self.restart_apiserver_of(0, grace, down, None).await
    }

    /// Stops apiserver `i` as kubelet stops a static pod (`SIGTERM`, then
    /// `SIGKILL` after `grace`), waits `down`, and starts it again, of
    /// minor version `version` when given, and waits until it is ready.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn restart_apiserver_of(
        &self,
        i: usize,
        grace: Duration,
        down: Duration,
        version: Option<&str>,
    ) -> Result<(), Error> {
        let assets = version.map(Assets::version).transpose()?;
        // Blocks for at most `grace` (as `Process::terminate` waits).
        self.apiservers[i].with(|p| p.terminate(grace))?;
        tokio::time::sleep(down).await;
        self.apiservers[i].respawn(assets)?;
        self.wait_ready(i, APISERVER_READY_TIMEOUT).await
    }

    /// The minor version apiserver `i` runs now (its binary's, `"1.36"`).
    pub fn apiserver_minor_of(&self, i: usize) -> Option<String> {
        let assets = self.apiservers[i].assets()?;
        let v = assets.binary_version("kube-apiserver").ok()?;
        let v = v.rsplit(' ').next()?.trim_start_matches('v');
        let mut parts = v.split('.');
        Some(format!("{}.{}", parts.next()?, parts.next()?))
    }

    /// How many etcd members there are.
    pub fn etcd_member_count(&self) -> usize {
        self.members.len()
    }

    /// The member that leads the etcd cluster now, if one answers.
    pub fn etcd_leader(&self) -> Option<usize> {
        self.members
            .iter()
            .position(|m| etcd::is_leader(m.client_port).unwrap_or(false))
    }

    /// Whether etcd member `i` answers and knows its cluster's leader
    /// (after [`ControlPlane::start_etcd_member`]: that it has rejoined).
    pub fn etcd_member_joined(&self, i: usize) -> bool {
        etcd::knows_leader(self.members[i].client_port).unwrap_or(false)
    }

    /// Kills etcd member `i` (`SIGKILL`), leaving it down.
    pub fn kill_etcd_member(&self, i: usize) {
        let _ = self.members[i].with(Process::kill);
    }

    /// Starts etcd member `i` again from its data (it must be down): it
    /// rejoins the cluster and catches up.
    ///
    /// # Errors
    /// When it does not start.
    pub fn start_etcd_member(&self, i: usize) -> Result<(), Error> {
        self.members[i].respawn()
    }

    /// Suspends etcd member `i` (`SIGSTOP`): its apiserver's requests hang,
    /// as when it is cut off from the others.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause_etcd_member(&self, i: usize) -> Result<(), Error> {
        self.members[i]
            .with(Process::pause)?
            .map_err(io_err("suspending etcd"))
    }

    /// Resumes etcd member `i` after [`ControlPlane::pause_etcd_member`].
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume_etcd_member(&self, i: usize) -> Result<(), Error> {
        self.members[i]
            .with(Process::resume)?
            .map_err(io_err("resuming etcd"))
    }

    /// etcd's current revision, from the first member that answers (its
    /// v3 JSON gateway).
    ///
    /// # Errors
    /// When no member answers.
    pub fn etcd_revision(&self) -> Result<u64, Error> {
        let mut last = io::Error::other("no etcd member");
        for m in &self.members {
            match etcd::revision(m.client_port) {
                Ok(r) => return Ok(r),
                Err(e) => last = e,
            }
        }
        Err(Error::Io {
            what: "reading etcd's revision".into(),
            source: last,
        })
    }

    /// Backs etcd up as an operator's backup of every member would: their
    /// data directories copied while every member is suspended
    /// (`SIGSTOP`, a few milliseconds), so the copy is one consistent
    /// moment. Returns the copy's directory and the revision it holds.
    ///
    /// # Errors
    /// When the copy fails.
    pub fn etcd_backup(&self) -> Result<(PathBuf, u64), Error> {
        static BACKUPS: AtomicU32 = AtomicU32::new(0);
        let revision = self.etcd_revision()?;
        let backup = self.dir.join(format!(
            "etcd-backup-{}",
            BACKUPS.fetch_add(1, Ordering::Relaxed)
        ));
        for m in &self.members {
            m.with(Process::pause)?.map_err(io_err("suspending etcd"))?;
        }
        let copied: io::Result<()> = self
            .members
            .iter()
            .try_for_each(|m| copy_dir(m.data(), &backup.join(&m.name)));
        for m in &self.members {
            m.with(Process::resume)?.map_err(io_err("resuming etcd"))?;
        }
        copied.map_err(io_err("copying etcd's data"))?;
        Ok((backup, revision))
    }

    /// Restores etcd from `backup` ([`ControlPlane::etcd_backup`]) as the
    /// documented procedure does (kubernetes.io, "Operating etcd clusters
    /// for Kubernetes", "Restoring an etcd cluster"): every apiserver
    /// stopped, every member stopped, their data replaced by the backup,
    /// the members started, every apiserver started again. With `bump`,
    /// what `etcdutl snapshot restore --bump-revision --mark-compacted`
    /// does is emulated (the tool is not at hand): the revision moved past
    /// every one etcd gave before the restore, then compacted there, so
    /// that resourceVersions only move forward and watches from before get
    /// `410`. Without, resourceVersions go back in time. Returns etcd's
    /// revision before the restore and after it (and the bump).
    ///
    /// # Errors
    /// When a step fails.
    pub async fn etcd_restore(&self, backup: &Path, bump: bool) -> Result<(u64, u64), Error> {
        let before = self.etcd_revision()?;
        for i in 0..self.apiservers.len() {
            self.stop_apiserver_of(i);
        }
        for m in &self.members {
            m.with(Process::kill)?;
        }
        for m in &self.members {
            let _ = fs::remove_dir_all(m.data());
            copy_dir(&backup.join(&m.name), m.data())
                .map_err(io_err(format!("restoring {}", backup.display())))?;
        }
        for m in &self.members {
            let fresh = Process::spawn(&m.name, &m.binary, &m.restart_args, &m.log)
                .map_err(io_err("restarting etcd"))?;
            *m.process.lock().map_err(|_| Error::Io {
                what: "etcd lock".into(),
                source: io::Error::other("poisoned"),
            })? = fresh;
        }
        for m in &self.members {
            m.wait_listening(Duration::from_secs(30))?;
        }
        // A cluster elects a leader before it answers.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut after = loop {
            match self.etcd_revision() {
                Ok(r) => break r,
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        if bump {
            let port = self.members[0].client_port;
            after = tokio::task::spawn_blocking(move || etcd::bump_and_compact(port, before + 1))
                .await
                .map_err(|e| Error::Io {
                    what: "bumping etcd's revision".into(),
                    source: io::Error::other(e),
                })?
                .map_err(io_err("bumping etcd's revision"))?;
        }
        // Every apiserver at once, as kubelets restart their static pods.
        for a in &self.apiservers {
            a.respawn(None)?;
        }
        for i in 0..self.apiservers.len() {
            self.wait_ready(i, APISERVER_READY_TIMEOUT).await?;
        }
        Ok((before, after))
    }

    /// Starts a hollow node component: `kubemark --morph=kubelet` (the real
    /// kubelet with a fake container runtime) or `--morph=proxy`, named
    /// `name`, using `kubeconfig`. Its log is `<morph>-<name>.log` in this
    /// control plane's directory.
    ///
    /// # Errors
    /// When kubemark is absent (envtest's own assets have none) or does not
    /// start.
    pub fn hollow(
        &self,
        morph: Morph,
        name: &str,
        kubeconfig: &Path,
        extra: &[String],
    ) -> Result<Process, Error> {
        self.hollow_from(&self.assets, morph, name, kubeconfig, extra)
    }

    /// [`ControlPlane::hollow`] with the kubemark of `kubemark` (another
    /// version's, from [`Assets::version`]: a kubelet older than the
    /// apiserver).
    ///
    /// # Errors
    /// When kubemark is absent there or does not start.
    pub fn hollow_from(
        &self,
        kubemark: &Assets,
        morph: Morph,
        name: &str,
        kubeconfig: &Path,
        extra: &[String],
    ) -> Result<Process, Error> {
        if !kubemark.has_kubemark() {
            return Err(Error::Io {
                what: "hollow node".into(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no kubemark in {}", kubemark.dir.display()),
                ),
            });
        }
        let mut args = vec![
            format!("--morph={}", morph.as_str()),
            format!("--name={name}"),
            format!("--kubeconfig={}", kubeconfig.display()),
        ];
        if morph == Morph::Kubelet {
            args.extend([
                "--use-host-image-service=false".into(),
                format!("--kubelet-port={}", free_port()?),
                "--kubelet-read-only-port=0".into(),
                "--max-pods=110".into(),
            ]);
        }
        args.extend(extra.iter().cloned());
        let what = format!("{}-{name}", morph.as_str());
        Process::spawn(
            &what,
            &kubemark.binary("kubemark"),
            &args,
            &self.dir.join(format!("{what}.log")),
        )
        .map_err(io_err(format!("starting kubemark {what}")))
    }
}

/// kube-controller-manager and kube-scheduler, running against a
/// [`ControlPlane`] ([`ControlPlane::start_controllers`]); stopped when
/// dropped.
#[derive(Debug)]
pub struct Controllers {
    /// `kube-controller-manager`, as `system:kube-controller-manager`.
    pub controller_manager: Process,
    /// `kube-scheduler`, as `system:kube-scheduler`.
    pub scheduler: Process,
}

impl ControlPlane {
    /// Starts kube-controller-manager and kube-scheduler (from
    /// [`Assets::controllers`]) against the first apiserver, each as its
    /// own identity, without leader election, with the flags of
    /// `../shared/k8s/README.md`: Deployments, ReplicaSets, EndpointSlices,
    /// garbage collection, the node-lifecycle controller (which lifts a new
    /// node's `not-ready` taint) and service-account tokens become real,
    /// and pods without `spec.nodeName` are scheduled. Logs:
    /// `kube-controller-manager.log`, `kube-scheduler.log` in this control
    /// plane's directory.
    ///
    /// # Errors
    /// When the binaries are absent ([`Error::Assets`]) or do not start.
    pub fn start_controllers(&self) -> Result<Controllers, Error> {
        let assets = Assets::controllers()?;
        let dir = &self.dir;
        let start = |user: &str, binary: &str, extra: Vec<String>| -> Result<Process, Error> {
            let cert = self.issue_client(user, None)?;
            let kubeconfig = self.write_file(
                &format!("{binary}.kubeconfig"),
                &self.kubeconfig_text(&self.url(), user, &cert),
            )?;
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", free_port()?),
                "--leader-elect=false".into(),
            ];
            args.extend(extra);
            Process::spawn(
                binary,
                &assets.binary(binary),
                &args,
                &dir.join(format!("{binary}.log")),
            )
            .map_err(io_err(format!("starting {binary}")))
        };
        let controller_manager = start(
            "system:kube-controller-manager",
            "kube-controller-manager",
            vec![
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    dir.join("sa.key").display()
                ),
                format!("--root-ca-file={}", dir.join("ca.crt").display()),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
            ],
        )?;
        let scheduler = start("system:kube-scheduler", "kube-scheduler", Vec::new())?;
        Ok(Controllers {
            controller_manager,
            scheduler,
        })
    }
}

/// Which hollow component kubemark becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Morph {
    /// The kubelet, with a fake runtime.
    Kubelet,
    /// kube-proxy, with a fake proxier.
    Proxy,
}

impl Morph {
    fn as_str(self) -> &'static str {
        match self {
            Morph::Kubelet => "kubelet",
            Morph::Proxy => "proxy",
        }
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; the usual race with
/// other binders is accepted).
///
/// # Errors
/// When no port can be bound.
pub fn free_port() -> Result<u16, Error> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io_err("finding a free port"))
}

/// A free TCP port on 127.0.0.1 below the kernel's ephemeral range, for a
/// process that is stopped and started again on it: an outgoing
/// connection's local port (drawn from the ephemeral range) cannot take
/// it while the process is down.
///
/// # Errors
/// When no port can be bound.
pub fn stable_port() -> Result<u16, Error> {
    let low = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|p| p.parse::<u16>().ok())
        })
        .unwrap_or(32768);
    let (from, to) = if low > 12000 {
        (10000, low)
    } else {
        (low, low)
    };
    for _ in 0..1000 {
        let port = from + (rand_u16() % (to.max(from + 1) - from));
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(port);
        }
    }
    free_port()
}

/// A pseudo-random number (no crate for it: the time's nanoseconds and a
/// counter, hashed).
fn rand_u16() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(SEQ.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    (h.finish() & 0xffff) as u16
}

/// Starts `n` etcd members: the control plane's etcd alone, or a cluster
/// of the cluster etcd ([`Assets::etcd_cluster`]) on loopback, with the
/// flags of `../shared/k8s/README.md`.
fn start_members(assets: &Assets, dir: &Path, n: usize) -> Result<Vec<Member>, Error> {
    if n == 1 {
        let (client, peer) = (free_port()?, free_port()?);
        let data = dir.join("etcd");
        let args = vec![
            "--name=testenv".into(),
            format!("--data-dir={}", data.display()),
            format!("--listen-client-urls=http://127.0.0.1:{client}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
            "--unsafe-no-fsync".into(),
            "--quota-backend-bytes=4294967296".into(),
            "--log-level=error".into(),
        ];
        let m = Member::spawn(
            "etcd".into(),
            client,
            assets.binary("etcd"),
            data,
            args.clone(),
            args,
            dir.join("etcd.log"),
        )?;
        m.wait_listening(Duration::from_secs(30))?;
        return Ok(vec![m]);
    }
    let binary = Assets::etcd_cluster()?.binary("etcd");
    let mut ports = Vec::with_capacity(n);
    for _ in 0..n {
        ports.push((stable_port()?, stable_port()?));
    }
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::with_capacity(n);
    for (i, (client, peer)) in ports.into_iter().enumerate() {
        let name = format!("etcd-{i}");
        let data = dir.join(&name);
        let args = |state: &str| -> Vec<String> {
            vec![
                format!("--name=m{i}"),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster={initial}"),
                format!("--initial-cluster-state={state}"),
                "--initial-cluster-token=kube-testenv".into(),
                "--unsafe-no-fsync".into(),
                "--quota-backend-bytes=4294967296".into(),
                "--log-level=error".into(),
            ]
        };
        let log = dir.join(format!("{name}.log"));
        members.push(Member::spawn(
            name,
            client,
            binary.clone(),
            data.clone(),
            args("new"),
            args("existing"),
            log,
        )?);
    }
    for m in &members {
        m.wait_listening(Duration::from_secs(30))?;
    }
    Ok(members)
}

/// Waits until `port` accepts connections, or `process` exits.
fn wait_for_port(process: &Process, port: u16, timeout: Duration) -> Result<(), Error> {
    let deadline = Instant::now() + timeout;
    loop {
        if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(());
        }
        let detail = match process.exited() {
            Some(status) => format!("exited with {status}"),
            None if Instant::now() > deadline => format!("port {port} closed after {timeout:?}"),
            None => {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        return Err(Error::NotReady {
            what: process.name().to_string(),
            detail,
            log: process.log_tail(4096),
        });
    }
}

/// Copies directory `from` to `to` (created), recursively.
fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Writes a file readable only by its owner.
fn write_private(path: &Path, content: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(format!("writing {}", path.display())))?;
    f.write_all(content.as_bytes())
        .map_err(io_err(format!("writing {}", path.display())))
}

/// A fresh directory `<tmp>/kube-testenv/<pid>-<n>`, after removing those
/// of test binaries that are gone.
fn run_dir() -> Result<PathBuf, Error> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let base = std::env::temp_dir().join("kube-testenv");
    if let Ok(entries) = fs::read_dir(&base) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|n| n.split('-').next())
                .and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|pid| !process::alive(pid)) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    let dir = base.join(format!(
        "{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
    Ok(dir)
}
