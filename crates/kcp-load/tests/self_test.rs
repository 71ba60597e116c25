#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The `kcp-load` binary, end to end.

/// The load tool (`kcp-load`, docs/performance.md) runs each of its
/// measurements, small, against the simulated apiserver and the proxy, and
/// fails on any error.
#[test]
fn the_load_tool_self_test_passes() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kcp-load"))
        .arg("--self-test")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kcp-load --self-test failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
