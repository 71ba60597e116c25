//! Header values clients control (Accept, Authorization, Impersonate-*):
//! never panic.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use kube_cache_proxy::auth::{bearer_token, impersonation};
use kube_cache_proxy::cache::negotiate::negotiate;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (name, value) = rest.split_at(usize::from(split).min(rest.len()));
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };
    let _ = negotiate(Some(&value));
    let mut headers = HeaderMap::new();
    headers.insert(http::header::AUTHORIZATION, value.clone());
    headers.append("impersonate-group", value.clone());
    if let Ok(n) = HeaderName::from_bytes(name) {
        headers.append(n, value.clone());
    }
    let mut extra = b"impersonate-extra-".to_vec();
    extra.extend_from_slice(name);
    if let Ok(n) = HeaderName::from_bytes(&extra) {
        headers.append(n, value);
    }
    let _ = bearer_token(&headers);
    let _ = impersonation::requested(&headers);
});
