//! Readiness: a latch per subsystem. The proxy reports ready when every
//! registered check passes and it is not shutting down; `/readyz?verbose`
//! lists each check like kube-apiserver's health endpoints do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// The set of readiness checks.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    checks: Arc<Mutex<BTreeMap<String, Option<String>>>>,
    shutting_down: Arc<AtomicBool>,
}

/// One check's result: `Ok` or the reason it is not ready.
pub type CheckResult = Result<(), String>;

// === impl Readiness ===

impl Readiness {
    /// Registers a check that starts not ready with `reason`.
    pub fn register(&self, name: &str, reason: &str) {
        self.checks
            .lock()
            .insert(name.to_string(), Some(reason.to_string()));
    }

    /// Marks a check ready (`Ok`) or not ready with a reason.
    pub fn set(&self, name: &str, result: CheckResult) {
        self.checks.lock().insert(name.to_string(), result.err());
    }

    /// Marks the process as shutting down: readiness fails from now on.
    pub fn set_shutting_down(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Whether the process is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Every check with its result, `shutdown` first.
    pub fn report(&self) -> Vec<(String, CheckResult)> {
        let mut out = vec![(
            "shutdown".to_string(),
            if self.is_shutting_down() {
                Err("process is shutting down".to_string())
            } else {
                Ok(())
            },
        )];
        out.extend(self.checks.lock().iter().map(|(name, reason)| {
            (
                name.clone(),
                match reason {
                    None => Ok(()),
                    Some(r) => Err(r.clone()),
                },
            )
        }));
        out
    }

    /// Whether every check passes.
    pub fn is_ready(&self) -> bool {
        self.report().iter().all(|(_, r)| r.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latch() {
        let r = Readiness::default();
        assert!(r.is_ready());
        r.register("cache:pods", "initial list not done");
        assert!(!r.is_ready());
        r.set("cache:pods", Ok(()));
        assert!(r.is_ready());
        r.set_shutting_down();
        assert!(!r.is_ready());
    }
}
