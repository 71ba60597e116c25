//! What `tls.csr.directory` holds: the issued certificate and its key
//! ([`CURRENT_FILE`]), read back on start, and the key of an outstanding
//! request ([`PENDING_KEY_FILE`]); written atomically, private to the proxy.

use std::io::Write;
use std::path::Path;

use rustls::sign::CertifiedKey;

use super::certificate::{LeafInfo, Template, parse_pair, timestamp, unix_now};

/// The issued certificate chain and its key, PEM, in one file (0600).
pub const CURRENT_FILE: &str = "kube-cache-proxy-serving-current.pem";
/// The key of the request being waited for (0600), removed once issued.
pub const PENDING_KEY_FILE: &str = "kube-cache-proxy-serving-pending.key";

/// Reads the issued certificate and key, and checks they match and are
/// valid now.
pub(super) fn load_current(
    path: &Path,
    template: &Template,
) -> Result<(LeafInfo, CertifiedKey), String> {
    if !path.exists() {
        return Err("not found".into());
    }
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let (leaf, key) = parse_pair(&pem)?;
    let now = unix_now();
    if (leaf.not_after as f64) <= now {
        return Err(format!("expired at {}", timestamp(leaf.not_after)));
    }
    if !template.satisfied_by(&leaf) {
        tracing::info!(
            "the issued certificate on disk does not have the configured subject and names; a new one will be requested"
        );
    }
    Ok((leaf, key))
}

/// Writes `data` to `path` through a temporary file in the same directory
/// and a rename, so readers see the old or the new content, never a mix.
/// The file is 0600.
pub(super) fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        file.write_all(data)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result?;
    // Make the rename durable; not every filesystem allows this.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates `dir` (and parents) 0700 if missing.
pub(super) fn ensure_dir(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_is_private() {
        let dir = std::env::temp_dir().join(format!("kcp-csr-{}", uuid::Uuid::new_v4()));
        ensure_dir(&dir.join("pki")).unwrap();
        let path = dir.join("pki").join("f");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
            let mode = std::fs::metadata(dir.join("pki"))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        assert_eq!(std::fs::read_dir(dir.join("pki")).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
