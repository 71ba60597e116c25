//! Header values clients control (Accept, User-Agent, Authorization,
//! Impersonate-*): never panic.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue};
use kube_cache_proxy::auth::{bearer_token, impersonation};
use kube_cache_proxy::cache::negotiate::{Verb, negotiate, parse_accept};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let (name, value) = rest.split_at(usize::from(split).min(rest.len()));
    let Ok(value) = HeaderValue::from_bytes(value) else {
        return;
    };
    if let Ok(text) = value.to_str() {
        let _ = parse_accept(text);
    }
    let mut accept = HeaderMap::new();
    accept.insert(http::header::ACCEPT, value.clone());
    accept.insert(http::header::USER_AGENT, value.clone());
    for verb in [Verb::Get, Verb::List, Verb::Watch] {
        for built_in in [true, false] {
            let _ = negotiate(&accept, None, verb, built_in);
        }
    }
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
    for filter in [
        impersonation::Filter::Constrained,
        impersonation::Filter::Legacy,
    ] {
        let _ = impersonation::requested(&headers, filter);
    }
});
