//! A pod on this machine (`../shared/docs/pod-network.md`): a network
//! namespace of its own, cabled to the node by a veth pair with its default
//! route through the node, and a node-local address on the node's
//! loopback for the node proxy's pods' listener (`podNetwork.listen`), as
//! a dummy interface holds it on a real node. From the pod the node-local
//! address answers and the node's `127.0.0.1` does not.
//!
//! A process run in the pod ([`PodNetwork::command`]) also gets a
//! service-account volume at `/var/run/secrets/kubernetes.io/serviceaccount/`
//! of its own, in a private mount namespace (a tmpfs over `/run`), and the
//! variables kubelet injects, so that an unmodified in-cluster client
//! (client-go's `rest.InClusterConfig`, kube-rs's `Config::incluster`, the
//! Python client's `load_incluster_config`) configures itself exactly as in
//! a pod.
//!
//! Needs root and iproute2 (`ip`) and util-linux's `unshare`; everything
//! made is removed when the value is dropped, on panic too.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// The pods of this process, for unique names and addresses.
static NEXT: AtomicU8 = AtomicU8::new(0);

/// A pod's network namespace and the node-local address it reaches.
pub struct PodNetwork {
    ns: String,
    host_if: String,
    node_address: Ipv4Addr,
    pod_address: Ipv4Addr,
}

/// Runs `ip args`, or says what failed.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl PodNetwork {
    /// A new pod network; `Err` says why it cannot be made here (not root,
    /// no `ip`, no `unshare`).
    ///
    /// # Errors
    /// What is missing.
    pub fn create() -> Result<PodNetwork, String> {
        let euid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|ids| ids.split_whitespace().nth(1).map(str::to_string))
            });
        if euid.as_deref() != Some("0") {
            return Err("a network namespace needs root".into());
        }
        let unshare = Command::new("unshare")
            .args(["-m", "sh", "-c", "mount -t tmpfs tmpfs /run"])
            .output()
            .map_err(|e| format!("util-linux's unshare: {e}"))?;
        if !unshare.status.success() {
            return Err(format!(
                "unshare -m: {}",
                String::from_utf8_lossy(&unshare.stderr).trim()
            ));
        }
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        // Names unique per process and pod; interface names stay within
        // the kernel's 15 characters.
        let id = format!("{}{n}", std::process::id() % 100_000);
        let pod = PodNetwork {
            ns: format!("kcp-pod-{id}"),
            host_if: format!("kcph{id}"),
            node_address: Ipv4Addr::new(169, 254, 64, 10 + n % 200),
            pod_address: Ipv4Addr::new(169, 254, 77, 4 * (n % 60) + 2),
        };
        pod.remove();
        pod.make().inspect_err(|_| pod.remove())?;
        Ok(pod)
    }

    fn make(&self) -> Result<(), String> {
        let [a, b, c, d] = self.pod_address.octets();
        let host_address = format!("{a}.{b}.{c}.{}/30", d - 1);
        let pod_if = format!("{}p", self.host_if);
        ip(&["netns", "add", &self.ns])?;
        ip(&[
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &pod_if,
        ])?;
        ip(&["link", "set", &pod_if, "netns", &self.ns])?;
        ip(&["addr", "add", &host_address, "dev", &self.host_if])?;
        ip(&["link", "set", &self.host_if, "up"])?;
        let in_ns = |args: &[&str]| {
            let mut all = vec!["netns", "exec", self.ns.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        in_ns(&[
            "addr",
            "add",
            &format!("{}/30", self.pod_address),
            "dev",
            &pod_if,
        ])?;
        in_ns(&["link", "set", &pod_if, "up"])?;
        in_ns(&["link", "set", "lo", "up"])?;
        in_ns(&[
            "route",
            "add",
            "default",
            "via",
            &host_address[..host_address.len() - 3],
        ])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/32", self.node_address),
            "dev",
            "lo",
        ])?;
        Ok(())
    }

    /// Removes what [`PodNetwork::make`] made (the veth pair goes with
    /// either end); errors are what was not there.
    fn remove(&self) {
        let _ = ip(&[
            "addr",
            "del",
            &format!("{}/32", self.node_address),
            "dev",
            "lo",
        ]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }

    /// The node-local address pods reach the node proxy at (on the node's
    /// loopback).
    pub fn node_address(&self) -> Ipv4Addr {
        self.node_address
    }

    /// The pod's own address.
    pub fn pod_address(&self) -> Ipv4Addr {
        self.pod_address
    }

    /// `program args…` in the pod: its network namespace, a private mount
    /// namespace whose `/var/run/secrets/kubernetes.io/serviceaccount/`
    /// holds the files of `service_account` (`token`, `ca.crt`,
    /// `namespace`), and `env` (what kubelet injects, such as
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`).
    pub fn command(
        &self,
        service_account: &Path,
        env: &[(String, String)],
        program: &Path,
        args: &[&str],
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "unshare", "-m", "sh", "-c"])
            .arg(
                "set -e; mount -t tmpfs tmpfs /run; \
                 mkdir -p /run/secrets/kubernetes.io/serviceaccount; \
                 cp \"$1\"/* /run/secrets/kubernetes.io/serviceaccount/; \
                 shift; exec \"$@\"",
            )
            .arg("sh")
            .arg(service_account)
            .arg(program)
            .args(args)
            .env_remove("KUBECONFIG")
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        self.remove();
    }
}
