//! Configuration files: never panic.
#![no_main]

use kube_cache_proxy::component::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = Config::from_yaml(s) {
        let _ = c.validate();
    }
});
