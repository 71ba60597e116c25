//! Finding the binaries: `KUBEBUILDER_ASSETS` (envtest's layout: a
//! directory with `kube-apiserver` and `etcd`, here also `kubemark`), else
//! the archives the workplace ships in `../shared/k8s/`, each unpacked once
//! into a cache directory keyed by its SHA-256 and checked against its own
//! digest list.
//!
//! The archives, by name (`../shared/k8s/README.md`):
//!
//! | archive | binaries | found by |
//! |---|---|---|
//! | `kubernetes-v<newest>-linux-amd64.tar.xz` | etcd, kube-apiserver, kubemark | [`Assets::locate`] |
//! | `kubernetes-v<X.Y.Z>-linux-amd64.tar.xz` (older) | kube-apiserver, kubemark in some | [`Assets::version`] |
//! | `kubernetes-v<X.Y.Z>-controllers-linux-amd64.tar.xz` | kube-scheduler, kube-controller-manager | [`Assets::controllers`] |
//! | `etcd-v<X.Y.Z>-cluster-linux-amd64.tar.xz` | etcd that can join a multi-member cluster | [`Assets::etcd_cluster`] |
//!
//! With `KUBEBUILDER_ASSETS` set, another minor version's binaries are
//! looked for where `setup-envtest` puts them: a sibling directory named
//! `<X.Y.Z>-linux-amd64`.

use std::fs::{self, File};
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Assets {
    /// The directory holding them.
    pub dir: PathBuf,
    /// Where they came from, for messages.
    pub source: String,
}

/// Why no binaries could be found or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum AssetsError {
    /// Nothing of what was asked for is present: the tests that need it
    /// are skipped.
    #[error("no {what}: {hint}")]
    Absent { what: String, hint: String },
    /// `KUBEBUILDER_ASSETS` names a directory without the binaries.
    #[error("KUBEBUILDER_ASSETS={dir}: no {missing} there")]
    Incomplete { dir: String, missing: &'static str },
    /// The archive could not be read or unpacked, or a binary in it does
    /// not match its digest list.
    #[error("unpacking {archive}: {source}")]
    Unpack {
        archive: String,
        #[source]
        source: io::Error,
    },
}

/// The directory `../shared/k8s/` next to the workspace.
pub fn archive_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/k8s")
}

/// A version `X.Y.Z` as numbers, for ordering.
fn parse_version(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// The archives in `dir` named `<prefix>v<X.Y.Z><suffix>`, with their
/// versions, newest first.
fn archives(dir: &Path, prefix: &str, suffix: &str) -> Vec<(String, PathBuf)> {
    let mut found: Vec<_> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let version = name.strip_prefix(prefix)?.strip_prefix('v')?;
            let version = version.strip_suffix(suffix)?;
            parse_version(version)?;
            Some((version.to_string(), e.path()))
        })
        .collect();
    found.sort_by_key(|(v, _)| std::cmp::Reverse(parse_version(v)));
    found
}

const PLATFORM: &str = "-linux-amd64.tar.xz";

// === impl Assets ===

impl Assets {
    /// The control plane's binaries (etcd, kube-apiserver, kubemark):
    /// `KUBEBUILDER_ASSETS`, else the newest
    /// `kubernetes-v<X.Y.Z>-linux-amd64.tar.xz`, unpacked on first use.
    ///
    /// # Errors
    /// [`AssetsError::Absent`] when there is nothing to use (the caller
    /// skips); the others when what is there is broken (the caller fails).
    pub fn locate() -> Result<Assets, AssetsError> {
        if let Some(dir) = kubebuilder_assets() {
            for binary in ["kube-apiserver", "etcd"] {
                if !dir.join(binary).is_file() {
                    return Err(AssetsError::Incomplete {
                        dir: dir.display().to_string(),
                        missing: binary,
                    });
                }
            }
            return Ok(Assets {
                source: format!("KUBEBUILDER_ASSETS={}", dir.display()),
                dir,
            });
        }
        let dir = archive_dir();
        let newest = archives(&dir, "kubernetes-", PLATFORM).into_iter().next();
        let Some((_, archive)) = newest else {
            return Err(AssetsError::Absent {
                what: "Kubernetes control plane".into(),
                hint: format!(
                    "set KUBEBUILDER_ASSETS to a directory with kube-apiserver and etcd, or provide {}/kubernetes-v<version>{PLATFORM}",
                    dir.display()
                ),
            });
        };
        Assets::unpacked(&archive, "kube-apiserver")
    }

    /// kube-apiserver (and kubemark, where shipped) of Kubernetes `minor`
    /// (`"1.34"`): from `KUBEBUILDER_ASSETS`'s sibling `<minor>.<patch>-linux-amd64`
    /// (setup-envtest's layout) when that is set, else the newest
    /// `kubernetes-v<minor>.<patch>-linux-amd64.tar.xz`. The control
    /// plane's own version (from [`Assets::locate`]) is found here too.
    ///
    /// # Errors
    /// [`AssetsError::Absent`] when that version is not at hand.
    pub fn version(minor: &str) -> Result<Assets, AssetsError> {
        let absent = |hint: String| AssetsError::Absent {
            what: format!("kube-apiserver {minor}"),
            hint,
        };
        if let Some(dir) = kubebuilder_assets() {
            let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
            let mut siblings: Vec<_> = fs::read_dir(&parent)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().into_string().ok()?;
                    let version = name.strip_suffix("-linux-amd64")?;
                    let patch = version.strip_prefix(minor)?.strip_prefix('.')?;
                    let patch = patch.parse::<u32>().ok()?;
                    e.path()
                        .join("kube-apiserver")
                        .is_file()
                        .then(|| (patch, e.path()))
                })
                .collect();
            siblings.sort_by_key(|(patch, _)| std::cmp::Reverse(*patch));
            return match siblings.into_iter().next() {
                Some((_, dir)) => Ok(Assets {
                    source: dir.display().to_string(),
                    dir,
                }),
                None => Err(absent(format!(
                    "no {}/{minor}.*-linux-amd64 beside KUBEBUILDER_ASSETS (setup-envtest use {minor}.x)",
                    parent.display()
                ))),
            };
        }
        let dir = archive_dir();
        let archive = archives(&dir, "kubernetes-", PLATFORM)
            .into_iter()
            .find(|(v, _)| v.strip_prefix(minor).is_some_and(|p| p.starts_with('.')));
        match archive {
            Some((_, archive)) => Assets::unpacked(&archive, "kube-apiserver"),
            None => Err(absent(format!(
                "no {}/kubernetes-v{minor}.<patch>{PLATFORM}",
                dir.display()
            ))),
        }
    }

    /// kube-scheduler and kube-controller-manager: the newest
    /// `kubernetes-v<X.Y.Z>-controllers-linux-amd64.tar.xz`, or
    /// `KUBEBUILDER_ASSETS` where it holds them.
    ///
    /// # Errors
    /// [`AssetsError::Absent`] when they are not at hand.
    pub fn controllers() -> Result<Assets, AssetsError> {
        Assets::extra(
            "kube-scheduler and kube-controller-manager",
            "kubernetes-",
            &format!("-controllers{PLATFORM}"),
            "kube-controller-manager",
        )
    }

    /// An etcd that can be a member of a multi-member cluster (the
    /// `--initial-cluster` flags): the newest
    /// `etcd-v<X.Y.Z>-cluster-linux-amd64.tar.xz`, or `KUBEBUILDER_ASSETS`'s
    /// etcd (an upstream etcd release takes those flags).
    ///
    /// # Errors
    /// [`AssetsError::Absent`] when it is not at hand.
    pub fn etcd_cluster() -> Result<Assets, AssetsError> {
        Assets::extra(
            "etcd cluster member",
            "etcd-",
            &format!("-cluster{PLATFORM}"),
            "etcd",
        )
    }

    fn extra(what: &str, prefix: &str, suffix: &str, binary: &str) -> Result<Assets, AssetsError> {
        if let Some(dir) = kubebuilder_assets().filter(|d| d.join(binary).is_file()) {
            return Ok(Assets {
                source: format!("KUBEBUILDER_ASSETS={}", dir.display()),
                dir,
            });
        }
        let dir = archive_dir();
        match archives(&dir, prefix, suffix).into_iter().next() {
            Some((_, archive)) => Assets::unpacked(&archive, binary),
            None => Err(AssetsError::Absent {
                what: what.into(),
                hint: format!("no {}/{prefix}v<version>{suffix}", dir.display()),
            }),
        }
    }

    /// `archive` unpacked into the cache (once, keyed by its digest).
    fn unpacked(archive: &Path, binary: &str) -> Result<Assets, AssetsError> {
        let unpack_err = |source| AssetsError::Unpack {
            archive: archive.display().to_string(),
            source,
        };
        let digest = sha256_file(archive).map_err(unpack_err)?;
        let dir = cache_root().join(format!("k8s-{}", &digest[..16]));
        if !dir.join(binary).is_file() {
            unpack(archive, &dir, binary).map_err(unpack_err)?;
        }
        Ok(Assets {
            source: archive.display().to_string(),
            dir,
        })
    }

    /// The path of one binary.
    pub fn binary(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether `kubemark` is there (envtest's own assets have none).
    pub fn has_kubemark(&self) -> bool {
        self.binary("kubemark").is_file()
    }

    /// What `<binary> --version` prints, trimmed (`Kubernetes v1.34.9`).
    ///
    /// # Errors
    /// When the binary cannot be run.
    pub fn binary_version(&self, binary: &str) -> io::Result<String> {
        let out = std::process::Command::new(self.binary(binary))
            .arg("--version")
            .output()?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

fn kubebuilder_assets() -> Option<PathBuf> {
    std::env::var_os("KUBEBUILDER_ASSETS")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// `$XDG_CACHE_HOME/kube-cache-proxy`, else `~/.cache/kube-cache-proxy`,
/// else under the temporary directory.
fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|d| !d.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })
        .unwrap_or_else(std::env::temp_dir);
    base.join("kube-cache-proxy")
}

fn sha256_file(path: &Path) -> io::Result<String> {
    let mut file = BufReader::new(File::open(path)?);
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The digest lists that may describe `archive`, most specific first:
/// `SHA256SUMS-v1.34.9` for `kubernetes-v1.34.9-linux-amd64.tar.xz`,
/// `SHA256SUMS-v1.36.2-controllers`, `SHA256SUMS-etcd-cluster`, then
/// `SHA256SUMS`.
fn digest_lists(archive: &Path) -> Vec<PathBuf> {
    let dir = archive.parent().unwrap_or(Path::new("."));
    let name = archive
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let middle = name.strip_suffix(PLATFORM).unwrap_or(name);
    let mut lists = Vec::new();
    if let Some(rest) = middle.strip_prefix("kubernetes-") {
        lists.push(dir.join(format!("SHA256SUMS-{rest}")));
    }
    if let Some(rest) = middle.strip_prefix("etcd-") {
        let kind = rest.split_once('-').map(|(_, k)| k).unwrap_or(rest);
        lists.push(dir.join(format!("SHA256SUMS-etcd-{kind}")));
    }
    lists.push(dir.join("SHA256SUMS"));
    lists
}

/// Checks the unpacked binaries in `dir` against the first digest list
/// whose every file is there (a list that names other binaries belongs to
/// another archive).
fn verify(archive: &Path, dir: &Path) -> io::Result<()> {
    for list in digest_lists(archive) {
        let Ok(file) = File::open(&list) else {
            continue;
        };
        let entries: Vec<(String, String)> = BufReader::new(file)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let (digest, name) = l.split_once(char::is_whitespace)?;
                Some((
                    digest.to_string(),
                    name.trim().trim_start_matches('*').into(),
                ))
            })
            .collect();
        if entries.is_empty() || !entries.iter().all(|(_, n)| dir.join(n).is_file()) {
            continue;
        }
        for (digest, name) in entries {
            let actual = sha256_file(&dir.join(&name))?;
            if actual != digest {
                return Err(io::Error::other(format!(
                    "{name}: sha256 {actual}, {} says {digest}",
                    list.display()
                )));
            }
        }
        return Ok(());
    }
    Ok(())
}

/// Unpacks into a private directory, checks it, then renames it into
/// place, so test binaries running at once never see half an unpacking.
fn unpack(archive: &Path, dir: &Path, binary: &str) -> io::Result<()> {
    let parent = dir
        .parent()
        .ok_or_else(|| io::Error::other("cache directory has no parent"))?;
    fs::create_dir_all(parent)?;
    let staging = parent.join(format!(
        ".{}-{}",
        dir.file_name().and_then(|n| n.to_str()).unwrap_or("k8s"),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)?;
    let checked = (|| {
        let xz = liblzma::read::XzDecoder::new(BufReader::new(File::open(archive)?));
        tar::Archive::new(xz).unpack(&staging)?;
        if !staging.join(binary).is_file() {
            return Err(io::Error::other(format!("no {binary} in it")));
        }
        verify(archive, &staging)
    })();
    if let Err(e) = checked {
        let _ = fs::remove_dir_all(&staging);
        return Err(e);
    }
    match fs::rename(&staging, dir) {
        Ok(()) => Ok(()),
        // Another test binary got there first.
        Err(_) if dir.join(binary).is_file() => {
            let _ = fs::remove_dir_all(&staging);
            Ok(())
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_are_found_by_exact_name_newest_first() {
        let dir = std::env::temp_dir().join(format!("kube-testenv-assets-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for name in [
            "kubernetes-v1.36.2-controllers-linux-amd64.tar.xz",
            "kubernetes-v1.34.9-linux-amd64.tar.xz",
            "kubernetes-v1.36.2-linux-amd64.tar.xz",
            "kubernetes-v1.35.6-linux-amd64.tar.xz",
            "etcd-v3.6.13-cluster-linux-amd64.tar.xz",
            "SHA256SUMS",
        ] {
            fs::write(dir.join(name), b"").unwrap();
        }
        let names = |found: Vec<(String, PathBuf)>| -> Vec<String> {
            found.into_iter().map(|(v, _)| v).collect()
        };
        assert_eq!(
            names(archives(&dir, "kubernetes-", PLATFORM)),
            ["1.36.2", "1.35.6", "1.34.9"]
        );
        assert_eq!(
            names(archives(
                &dir,
                "kubernetes-",
                "-controllers-linux-amd64.tar.xz"
            )),
            ["1.36.2"]
        );
        assert_eq!(
            names(archives(&dir, "etcd-", "-cluster-linux-amd64.tar.xz")),
            ["3.6.13"]
        );
        let lists = |n: &str| -> Vec<String> {
            digest_lists(&dir.join(n))
                .iter()
                .filter_map(|p| p.file_name()?.to_str().map(String::from))
                .collect()
        };
        assert_eq!(
            lists("kubernetes-v1.34.9-linux-amd64.tar.xz"),
            ["SHA256SUMS-v1.34.9", "SHA256SUMS"]
        );
        assert_eq!(
            lists("kubernetes-v1.36.2-controllers-linux-amd64.tar.xz"),
            ["SHA256SUMS-v1.36.2-controllers", "SHA256SUMS"]
        );
        assert_eq!(
            lists("etcd-v3.6.13-cluster-linux-amd64.tar.xz"),
            ["SHA256SUMS-etcd-cluster", "SHA256SUMS"]
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
