//! Field selectors: never panic; what parses prints back to the same
//! terms; conversion for every field set never panics.
//!
//! Term order follows the raw text, as the apiserver's `parseSelector` sorts
//! the unparsed parts (`sort.StringSlice(parts).Sort()`), so `==` printed as
//! `=` may reorder terms: the terms are compared as a multiset.
#![no_main]

use apimachinery::resource::FieldSet;
use apimachinery::selector::FieldSelector;
use libfuzzer_sys::fuzz_target;

fn sorted(sel: &FieldSelector) -> Vec<(&str, bool, &str)> {
    let mut terms: Vec<_> = sel
        .terms()
        .iter()
        .map(|t| (t.field.as_str(), t.not_equals, t.value.as_str()))
        .collect();
    terms.sort_unstable();
    terms
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = FieldSelector::parse(s) {
        let printed = sel.to_string();
        let again = FieldSelector::parse(&printed).expect("a printed selector parses");
        assert_eq!(sorted(&again), sorted(&sel), "{s:?} printed as {printed:?}");
        for fs in [
            FieldSet::Default,
            FieldSet::Pod,
            FieldSet::Node,
            FieldSet::CoreEvent,
            FieldSet::EventsV1Event,
            FieldSet::Job,
            FieldSet::ResourceSlice,
        ] {
            let _ = fs.convert(&sel);
        }
    }
});
