//! Field selectors: never panic; what parses prints back to the same
//! selector; conversion for every field set never panics.
#![no_main]

use kube_cache_proxy::resource::FieldSet;
use kube_cache_proxy::selector::FieldSelector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = FieldSelector::parse(s) {
        let printed = sel.to_string();
        let again = FieldSelector::parse(&printed).expect("a printed selector parses");
        assert_eq!(again, sel, "{s:?} printed as {printed:?}");
        for fs in [FieldSet::Default, FieldSet::Pod, FieldSet::Node, FieldSet::CoreEvent, FieldSet::EventsV1Event, FieldSet::Job, FieldSet::ResourceSlice] {
            let _ = fs.convert(&sel);
        }
    }
});
