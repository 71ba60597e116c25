//! kubectl as a client of the servers of these tests. Tests using it skip
//! (with a note) when kubectl is not installed.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// Whether `kubectl` is installed.
pub fn kubectl_available() -> bool {
    std::process::Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub struct Kubectl {
    pub kubeconfig: std::path::PathBuf,
    cache_dir: std::path::PathBuf,
}

impl Kubectl {
    /// kubectl with `kubeconfig` (its text) and a private cache directory.
    pub fn new(kubeconfig: &str) -> Kubectl {
        let dir = std::env::temp_dir().join(format!(
            "sim-kubectl-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let kubeconfig_text = kubeconfig;
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text).unwrap();
        Kubectl {
            kubeconfig,
            cache_dir: dir.join("cache"),
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .args(args)
            .kill_on_drop(true);
        cmd
    }

    pub async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = tokio::time::timeout(Duration::from_secs(20), self.command(args).output())
            .await
            .expect("kubectl timed out")
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub async fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args).await;
        assert!(ok, "kubectl {args:?} failed: {err}\n{out}");
        out
    }
}
