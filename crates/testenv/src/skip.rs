//! A test that cannot run here: what it lacks (a binary, a tool, a
//! privilege, a version at hand), said where a user sees it, and counted.
//!
//! Without [`REQUIRE_ALL`], [`skip`] writes one line straight to the
//! terminal (past the test harness's capture, so a green run still shows
//! what it did not check) and appends it to the file [`SKIP_LOG`] names,
//! if set, which `build/test.sh` tallies at the end ("53 skipped: no
//! control plane"). With it set (CI, `build/test.sh`), the test fails
//! instead, naming what is missing: a suite that passes must have run.
//!
//! [`not_applicable`] is for what a version does not have (a check of
//! constrained impersonation on kube-apiserver 1.34): nothing is missing
//! there, so it never fails; it is said and counted the same way.

use std::io::Write;

/// The switch: set (to anything but `0` or empty), a test that would skip
/// fails instead.
pub const REQUIRE_ALL: &str = "KUBE_CACHE_PROXY_REQUIRE_ALL";
/// A file each skip (and each not-applicable case) is appended to, one
/// line each, when set.
pub const SKIP_LOG: &str = "KUBE_CACHE_PROXY_SKIP_LOG";

/// Whether a test that cannot run must fail ([`REQUIRE_ALL`]).
pub fn required() -> bool {
    std::env::var(REQUIRE_ALL).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// This test cannot run here for want of `what`: fails under
/// [`REQUIRE_ALL`], else says so and is counted. The caller returns.
///
/// # Panics
/// Under [`REQUIRE_ALL`].
#[allow(clippy::panic)]
pub fn skip(what: impl std::fmt::Display) {
    if required() {
        panic!("{what} ({REQUIRE_ALL} is set: a test that cannot run fails)");
    }
    note("skipped", &what.to_string());
}

/// This test does not apply here (`why`: what this version lacks); said
/// and counted, never a failure.
pub fn not_applicable(why: impl std::fmt::Display) {
    note("not applicable", &why.to_string());
}

fn note(kind: &str, what: &str) {
    let line = format!("{kind}: {what}");
    // Past the harness's capture: `eprintln!` would show only on failure.
    let _ = writeln!(std::io::stderr(), "test {}", line);
    if let Some(path) = std::env::var_os(SKIP_LOG)
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}
