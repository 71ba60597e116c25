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
pub mod process;

use std::fs;
use std::io;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use apimachinery::kubeconfig;
use apimachinery::pki::{Ca, Issued};

pub use assets::{Assets, AssetsError};
pub use process::Process;

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

/// A running etcd and kube-apiserver. Dropping it stops them.
#[derive(Debug)]
pub struct ControlPlane {
    dir: PathBuf,
    assets: Assets,
    /// Where kube-apiserver comes from (another version than `assets`'s,
    /// when asked).
    apiserver_assets: Assets,
    /// `/version`'s `gitVersion` (`v1.36.2`).
    git_version: String,
    ca: Ca,
    port: u16,
    admin: Issued,
    admin_kubeconfig: PathBuf,
    apiserver_args: Vec<String>,
    etcd_port: u16,
    etcd_args: Vec<String>,
    etcd_data: PathBuf,
    // Stopped in reverse order of declaration: the apiserver first.
    apiserver: Mutex<Process>,
    etcd: Mutex<Process>,
}

static SHARED: tokio::sync::OnceCell<Option<ControlPlane>> = tokio::sync::OnceCell::const_new();

// === impl ControlPlane ===

impl ControlPlane {
    /// The control plane of this test binary, started by the first caller
    /// and shared by every test; `None` (after printing why, once) where
    /// no binaries are available.
    ///
    /// # Panics
    /// When the binaries are present but the control plane fails to start:
    /// that is a failure, not a skip.
    pub async fn shared() -> Option<&'static ControlPlane> {
        SHARED
            .get_or_init(|| ControlPlane::start_or_skip(Options::default()))
            .await
            .as_ref()
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
                eprintln!("kube-testenv: skipping the real control-plane tests: {e}");
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

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_data = dir.join("etcd");
        let etcd_args = vec![
            "--name=testenv".into(),
            format!("--data-dir={}", etcd_data.display()),
            format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync".into(),
            "--quota-backend-bytes=4294967296".into(),
            "--log-level=error".into(),
        ];
        let etcd = Process::spawn(
            "etcd",
            &assets.binary("etcd"),
            &etcd_args,
            &dir.join("etcd.log"),
        )
        .map_err(io_err("starting etcd"))?;
        wait_for_port(&etcd, etcd_port, Duration::from_secs(30))?;

        let port = free_port()?;
        let mut apiserver_args = vec![
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
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
        apiserver_args.extend(options.apiserver_args);
        let apiserver = Process::spawn(
            "kube-apiserver",
            &apiserver_assets.binary("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
        )
        .map_err(io_err("starting kube-apiserver"))?;

        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let mut cp = ControlPlane {
            admin_kubeconfig: admin_kubeconfig.clone(),
            dir,
            assets,
            apiserver_assets,
            git_version: String::new(),
            port,
            apiserver_args,
            etcd_port,
            etcd_args,
            etcd_data,
            apiserver: Mutex::new(apiserver),
            etcd: Mutex::new(etcd),
            admin,
            ca,
        };
        write_private(
            &admin_kubeconfig,
            &cp.kubeconfig_text(&cp.url(), "admin", &cp.admin),
        )?;
        cp.wait_ready(APISERVER_READY_TIMEOUT).await?;
        cp.git_version = cp.read_version().await.map_err(|detail| Error::NotReady {
            what: "kube-apiserver /version".into(),
            detail,
            log: String::new(),
        })?;
        Ok(cp)
    }

    async fn read_version(&self) -> Result<String, String> {
        let client = self.admin_client().await?;
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

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The apiserver's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`, no TLS): its v3 JSON
    /// gateway (`/v3/kv/range`, `/v3/watch`, `/v3/kv/compaction`) for tests
    /// that read etcd's history or compact it.
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The apiserver's process id.
    pub fn apiserver_pid(&self) -> u32 {
        self.apiserver.lock().map(|p| p.pid()).unwrap_or_default()
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

    /// Waits until `/readyz` answers `ok`.
    async fn wait_ready(&self, timeout: Duration) -> Result<(), Error> {
        let not_ready = |detail: String| Error::NotReady {
            what: "kube-apiserver".into(),
            detail,
            log: self.apiserver_log_tail(),
        };
        let client = self.admin_client().await.map_err(&not_ready)?;
        let deadline = Instant::now() + timeout;
        loop {
            let exited = self.apiserver.lock().ok().and_then(|p| p.exited());
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

    /// A `kube` client acting as `admin`.
    ///
    /// # Errors
    /// When the kubeconfig does not load (a bug here).
    pub async fn admin_client(&self) -> Result<kube::Client, String> {
        let text = self.kubeconfig_text(&self.url(), "admin", &self.admin);
        let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    }

    /// The last 8 KiB of the apiserver's log.
    pub fn apiserver_log_tail(&self) -> String {
        self.apiserver
            .lock()
            .map(|p| p.log_tail(8192))
            .unwrap_or_default()
    }

    /// Suspends the apiserver (`SIGSTOP`): connections stay open and
    /// nothing answers, as when it hangs or the network black-holes.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause_apiserver(&self) -> Result<(), Error> {
        self.with_apiserver(Process::pause)
    }

    /// Resumes it after [`ControlPlane::pause_apiserver`].
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume_apiserver(&self) -> Result<(), Error> {
        self.with_apiserver(Process::resume)
    }

    fn with_apiserver(&self, f: impl FnOnce(&Process) -> io::Result<()>) -> Result<(), Error> {
        let p = self.apiserver.lock().map_err(|_| Error::Io {
            what: "apiserver lock".into(),
            source: io::Error::other("poisoned"),
        })?;
        f(&p).map_err(io_err("signalling kube-apiserver"))
    }

    /// Stops the apiserver (`SIGKILL`) and leaves it down, as in an outage;
    /// [`ControlPlane::start_apiserver`] brings it back. etcd keeps running.
    pub fn stop_apiserver(&self) {
        if let Ok(p) = self.apiserver.lock() {
            p.kill();
        }
    }

    /// Starts the apiserver again after [`ControlPlane::stop_apiserver`], on
    /// the same port with the same data, and waits until it is ready.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_apiserver(&self) -> Result<(), Error> {
        self.start_apiserver_again(Duration::ZERO).await
    }

    /// Kills the apiserver (`SIGKILL`, no shutdown at all), waits `down`,
    /// starts it again on the same port with the same data, and waits
    /// until it is ready.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn kill_apiserver(&self, down: Duration) -> Result<(), Error> {
        if let Ok(p) = self.apiserver.lock() {
            p.kill();
        }
        self.start_apiserver_again(down).await
    }

    /// Stops the apiserver (`SIGTERM`, then `SIGKILL` after `grace`),
    /// waits `down`, starts it again on the same port with the same data,
    /// and waits until it is ready.
    ///
    /// # Errors
    /// When it does not start again.
    pub async fn restart_apiserver(&self, grace: Duration, down: Duration) -> Result<(), Error> {
        {
            let p = self.apiserver.lock().map_err(|_| Error::Io {
                what: "apiserver lock".into(),
                source: io::Error::other("poisoned"),
            })?;
            p.terminate(grace);
        }
        self.start_apiserver_again(down).await
    }

    async fn start_apiserver_again(&self, down: Duration) -> Result<(), Error> {
        tokio::time::sleep(down).await;
        let fresh = Process::spawn(
            "kube-apiserver",
            &self.apiserver_assets.binary("kube-apiserver"),
            &self.apiserver_args,
            &self.dir.join("kube-apiserver.log"),
        )
        .map_err(io_err("restarting kube-apiserver"))?;
        if let Ok(mut p) = self.apiserver.lock() {
            *p = fresh;
        }
        self.wait_ready(APISERVER_READY_TIMEOUT).await
    }

    /// etcd's current revision (its v3 JSON gateway).
    ///
    /// # Errors
    /// When etcd cannot be asked.
    pub fn etcd_revision(&self) -> Result<u64, Error> {
        etcd::revision(self.etcd_port).map_err(io_err("reading etcd's revision"))
    }

    /// Backs etcd up as an operator's backup of the member would: its data
    /// directory copied while etcd is suspended (`SIGSTOP`, a few
    /// milliseconds), so the copy is consistent. Returns the copy's
    /// directory and the revision it holds.
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
        let etcd = self.etcd.lock().map_err(|_| Error::Io {
            what: "etcd lock".into(),
            source: io::Error::other("poisoned"),
        })?;
        etcd.pause().map_err(io_err("suspending etcd"))?;
        let copied = copy_dir(&self.etcd_data, &backup);
        etcd.resume().map_err(io_err("resuming etcd"))?;
        copied.map_err(io_err(format!("copying {}", self.etcd_data.display())))?;
        Ok((backup, revision))
    }

    /// Restores etcd from `backup` ([`ControlPlane::etcd_backup`]) as the
    /// documented procedure does (kubernetes.io, "Operating etcd clusters
    /// for Kubernetes", "Restoring an etcd cluster"): the apiserver
    /// stopped, etcd stopped, its data replaced by the backup, etcd
    /// started, the apiserver started again. With `bump`, what
    /// `etcdutl snapshot restore --bump-revision --mark-compacted` does is
    /// emulated (the tool is not at hand): the revision moved past every
    /// one etcd gave before the restore, then compacted there, so that
    /// resourceVersions only move forward and watches from before get
    /// `410`. Without, resourceVersions go back in time. Returns etcd's
    /// revision before the restore and after it (and the bump).
    ///
    /// # Errors
    /// When a step fails.
    pub async fn etcd_restore(&self, backup: &Path, bump: bool) -> Result<(u64, u64), Error> {
        let before = self.etcd_revision()?;
        self.stop_apiserver();
        {
            let mut etcd = self.etcd.lock().map_err(|_| Error::Io {
                what: "etcd lock".into(),
                source: io::Error::other("poisoned"),
            })?;
            etcd.kill();
            let _ = fs::remove_dir_all(&self.etcd_data);
            copy_dir(backup, &self.etcd_data)
                .map_err(io_err(format!("restoring {}", backup.display())))?;
            *etcd = Process::spawn(
                "etcd",
                &self.assets.binary("etcd"),
                &self.etcd_args,
                &self.dir.join("etcd.log"),
            )
            .map_err(io_err("restarting etcd"))?;
            wait_for_port(&etcd, self.etcd_port, Duration::from_secs(30))?;
        }
        let mut after = self.etcd_revision()?;
        if bump {
            after = etcd::bump_and_compact(self.etcd_port, before + 1)
                .map_err(io_err("bumping etcd's revision"))?;
        }
        self.start_apiserver().await?;
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
