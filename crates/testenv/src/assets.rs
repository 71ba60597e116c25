//! Finding the control plane's binaries: `KUBEBUILDER_ASSETS` (envtest's
//! layout: a directory with `kube-apiserver` and `etcd`, here also
//! `kubemark`), else the archive the workplace ships in `../shared/k8s/`,
//! unpacked once into a cache directory keyed by its SHA-256.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
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
    /// Neither `KUBEBUILDER_ASSETS` nor the archive is present: the tier
    /// is skipped.
    #[error(
        "no Kubernetes control plane: set KUBEBUILDER_ASSETS to a directory with kube-apiserver and etcd, or provide {archive_dir}/kubernetes-*-linux-amd64.tar.xz"
    )]
    Absent { archive_dir: String },
    /// `KUBEBUILDER_ASSETS` names a directory without the binaries.
    #[error("KUBEBUILDER_ASSETS={dir}: no {missing} there")]
    Incomplete { dir: String, missing: &'static str },
    /// The archive could not be read or unpacked.
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

// === impl Assets ===

impl Assets {
    /// Finds the binaries, unpacking the archive on first use.
    ///
    /// # Errors
    /// [`AssetsError::Absent`] when there is nothing to use (the caller
    /// skips); the others when what is there is broken (the caller fails).
    pub fn locate() -> Result<Assets, AssetsError> {
        if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
            let dir = PathBuf::from(dir);
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
        let archive_dir = archive_dir();
        let archive = fs::read_dir(&archive_dir).ok().and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("kubernetes-") && n.ends_with(".tar.xz"))
            })
        });
        let Some(archive) = archive else {
            return Err(AssetsError::Absent {
                archive_dir: archive_dir.display().to_string(),
            });
        };
        let unpack_err = |source| AssetsError::Unpack {
            archive: archive.display().to_string(),
            source,
        };
        let digest = sha256_file(&archive).map_err(unpack_err)?;
        let dir = cache_root().join(format!("k8s-{}", &digest[..16]));
        if !dir.join("kube-apiserver").is_file() {
            unpack(&archive, &dir).map_err(unpack_err)?;
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

    /// Whether `kubemark` is there (envtest's own assets have no kubemark).
    pub fn has_kubemark(&self) -> bool {
        self.binary("kubemark").is_file()
    }
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

/// Unpacks into a private directory, then renames it into place, so test
/// binaries running at once never see half an unpacking.
fn unpack(archive: &Path, dir: &Path) -> io::Result<()> {
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
    let xz = liblzma::read::XzDecoder::new(BufReader::new(File::open(archive)?));
    tar::Archive::new(xz).unpack(&staging)?;
    match fs::rename(&staging, dir) {
        Ok(()) => Ok(()),
        // Another test binary got there first.
        Err(_) if dir.join("kube-apiserver").is_file() => {
            let _ = fs::remove_dir_all(&staging);
            Ok(())
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            Err(e)
        }
    }
}
