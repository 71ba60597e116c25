//! `kube-cache-proxy demo`: the simulated apiserver with sample objects
//! and the proxy in front of it, on this machine, with a kubeconfig and
//! curl lines printed to reach it. No cluster needed.

use std::future::Future;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use apimachinery::kubeconfig;
use apimachinery::pki::Ca;
use kube_apiserver_sim::{Sim, SimConfig};
use kube_cache_proxy::component::cli::DemoArgs;
use kube_cache_proxy::component::config::{CachedResource, Config};
use kube_cache_proxy::{Listeners, RunError};

mod churn;
mod objects;

pub use churn::TICK;
pub use objects::FLAKY;

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),
    #[error("{0}")]
    Run(#[from] RunError),
    #[error("creating sample objects: {0}")]
    Objects(String),
    /// A port the demo needs is taken, most likely by a running demo.
    #[error(
        "{addr} is in use, most likely by a demo already running{files}; stop it, or start \
         another one on free ports: demo --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0"
    )]
    InUse { addr: SocketAddr, files: String },
    /// The `--dir` given holds the files of a demo that is running.
    #[error(
        "{dir} holds the files of a demo that is running (its proxy answers at {addr}); \
         stop it, or choose another --dir"
    )]
    DirInUse { dir: PathBuf, addr: String },
}

/// The file, in the demo's directory, naming the proxy's address while
/// the demo runs.
const ADDRESS_FILE: &str = "proxy-address";

/// The default directory of the demo whose proxy listens on `port`: the
/// port is held by that demo alone, so no live demo shares it.
pub fn default_dir(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("kube-cache-proxy-demo-{port}"))
}

/// Binds the proxy's two listeners, before anything is written: a second
/// demo on the same ports stops here, naming the first one's files.
async fn bind(config: &Config, explicit_dir: Option<&Path>) -> Result<Listeners, DemoError> {
    match Listeners::bind(config).await {
        Ok(listeners) => Ok(listeners),
        Err(RunError::Bind { addr, source }) if source.kind() == ErrorKind::AddrInUse => {
            let api_port = config.listen_addr().map(|a| a.port()).unwrap_or_default();
            let dir = explicit_dir.map_or_else(|| default_dir(api_port), Path::to_path_buf);
            let kubeconfig = dir.join("kubeconfig");
            let files = if api_port != 0 && kubeconfig.exists() {
                format!(" (its kubeconfig: {})", kubeconfig.display())
            } else {
                String::new()
            };
            Err(DemoError::InUse { addr, files })
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuses a `--dir` whose demo still answers at the address it recorded.
async fn refuse_live_dir(dir: &Path) -> Result<(), DemoError> {
    let Ok(addr) = std::fs::read_to_string(dir.join(ADDRESS_FILE)) else {
        return Ok(());
    };
    let addr = addr.trim().to_string();
    let connect = tokio::net::TcpStream::connect(addr.as_str());
    match tokio::time::timeout(Duration::from_secs(1), connect).await {
        Ok(Ok(_)) => Err(DemoError::DirInUse {
            dir: dir.to_path_buf(),
            addr,
        }),
        _ => Ok(()),
    }
}

/// Writes `text` to `dir/name`, readable by its owner only when
/// `private` (keys, and kubeconfigs embedding one).
fn write_file(dir: &Path, name: &str, text: &str, private: bool) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = dir.join(name);
    let mode = if private { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(mode)
        .open(&path)?;
    // The mode above applies only to a new file; an old one keeps its own.
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.write_all(text.as_bytes())?;
    Ok(path)
}

/// Runs the demo until `shutdown`.
///
/// The proxy's ports are bound first; the files go to `--dir`, or to
/// [`default_dir`] of the proxy's port, so that a second demo never
/// overwrites the files of one that is running.
///
/// # Errors
/// [`DemoError`] when a port is taken or files cannot be written.
pub async fn run(
    args: DemoArgs,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), DemoError> {
    let mut config = Config {
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
        ..Config::default()
    };
    let listeners = bind(&config, args.dir.as_deref()).await?;
    let api_addr = listeners.api.local_addr()?;
    let dir = match args.dir.clone() {
        Some(dir) => {
            refuse_live_dir(&dir).await?;
            std::fs::create_dir_all(&dir)?;
            dir
        }
        None => {
            let dir = default_dir(api_addr.port());
            std::fs::create_dir_all(&dir)?;
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
            dir
        }
    };

    let sim = Sim::start(SimConfig::default()).await?;
    for (gvr, object) in objects::sample_objects(&churn::now_rfc3339()) {
        sim.create(&gvr, object)
            .map_err(|s| DemoError::Objects(s.message))?;
    }

    // The proxy serves its own certificate and trusts the simulated
    // cluster's CA for client certificates, like a real deployment.
    let proxy_ca = Ca::new("kube-cache-proxy-demo-ca")?;
    let serving = proxy_ca.issue_server(
        &["localhost"],
        &[std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST)],
    )?;
    let admin = sim.issue_client("admin", Some("system:masters"));
    let ca_path = write_file(&dir, "ca.crt", &proxy_ca.cert_pem(), false)?;
    let admin_crt = write_file(&dir, "admin.crt", &admin.cert_pem, false)?;
    let admin_key = write_file(&dir, "admin.key", &admin.key_pem, true)?;
    config.tls.cert_file = Some(write_file(&dir, "tls.crt", &serving.cert_pem, false)?);
    config.tls.private_key_file = Some(write_file(&dir, "tls.key", &serving.key_pem, true)?);
    config.tls.client_ca_file = Some(write_file(&dir, "client-ca.crt", &sim.ca_pem(), false)?);
    config.upstream.kubeconfig = Some(write_file(
        &dir,
        "upstream.kubeconfig",
        &sim.kubeconfig(&SimConfig::default().proxy_user, None),
        true,
    )?);
    config.cache.resources.push(CachedResource {
        version: "v1".into(),
        resource: "configmaps".into(),
        ..CachedResource::default()
    });
    config.validate().map_err(RunError::Config)?;
    let proxy_url = format!("https://{api_addr}");
    let admin_url = format!("http://{}", listeners.admin.local_addr()?);
    let kubeconfig_path = write_file(
        &dir,
        "kubeconfig",
        &kubeconfig::with_certificate(
            &proxy_url,
            &proxy_ca.cert_pem(),
            "admin",
            &admin.cert_pem,
            &admin.key_pem,
        ),
        true,
    )?;
    write_file(&dir, ADDRESS_FILE, &api_addr.to_string(), false)?;

    println!(
        "kube-cache-proxy demo\n\
         \n  simulated kube-apiserver  {sim_url}  (sample namespaces, nodes, pods, services, configmaps...)\
         \n  kube-cache-proxy          {proxy_url}\
         \n  metrics and health        {admin_url}/metrics  {admin_url}/readyz?verbose\
         \n  files                     {dir}\
         \n\nTry:\
         \n  export KUBECONFIG={kc}\
         \n  kubectl get pods -A -w\
         \n  kubectl get nodes -o wide\
         \n  kubectl describe node node-2\
         \n  kubectl exec -n demo app-3 -- echo hello\
         \n  kubectl exec -it -n demo app-3 -- sh\
         \n  kubectl get --raw '/api/v1/namespaces/demo/configmaps?watch=1&resourceVersion=0'\
         \n  curl --cacert {ca} --cert {crt} --key {key} '{proxy_url}/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1'\
         \n  curl -s {admin_url}/metrics | grep kube_cache_proxy_cache_reads_total\
         \n\nEvery {tick} s the configmap demo/heartbeat changes; a pod demo/churn-<n> is created, \
         \nstarts and is deleted; demo/{flaky} crashes and restarts now and then. Ctrl-C stops the demo.",
        sim_url = sim.url(),
        dir = dir.display(),
        kc = kubeconfig_path.display(),
        ca = ca_path.display(),
        crt = admin_crt.display(),
        key = admin_key.display(),
        tick = TICK.as_secs(),
        flaky = FLAKY,
    );

    let churn = tokio::spawn(async move {
        let mut churn = churn::Churn::default();
        loop {
            tokio::time::sleep(TICK).await;
            churn.step(&sim);
        }
    });
    let result = kube_cache_proxy::run(listeners, config, shutdown).await;
    churn.abort();
    let _ = std::fs::remove_file(dir.join(ADDRESS_FILE));
    result.map_err(DemoError::from)
}
