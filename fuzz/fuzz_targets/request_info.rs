//! Request paths and queries: never panic.
#![no_main]

use apimachinery::request::RequestInfo;
use http::Method;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let (path, query) = s.split_once('?').unwrap_or((s, ""));
    for m in [Method::GET, Method::POST, Method::DELETE, Method::PATCH] {
        let info = RequestInfo::parse(&m, path, Some(query));
        let _ = info.is_read();
    }
});
