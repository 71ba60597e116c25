//! Build information for `kube_cache_proxy_build_info` (the `built` crate:
//! the crate version, the compiler's version and the target), written to
//! `$OUT_DIR/built.rs`. The git commit comes from the environment variable
//! `KUBE_CACHE_PROXY_GIT_COMMIT` when the build sets it (build/release.sh
//! does).

fn main() {
    println!("cargo:rerun-if-env-changed=KUBE_CACHE_PROXY_GIT_COMMIT");
    if let Err(e) = built::write_built_file() {
        println!("cargo:warning=writing build information: {e}");
        std::process::exit(1);
    }
}
