//! List/watch query strings, continue tokens and resourceVersions: never
//! panic.
#![no_main]

use kube_cache_proxy::cache::serve::{continue_token, query};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let _ = query::parse(Some(s), false);
    let _ = query::parse(Some(s), true);
    let _ = query::parse_resource_version(s);
    if let Some(t) = continue_token::decode(s) {
        let _ = continue_token::encode(t.rv.unsigned_abs(), t.start.trim_end_matches('\0'));
    }
});
