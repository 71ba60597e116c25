//! Label selectors: never panic; what parses prints back to a selector
//! that parses to the same requirements.
#![no_main]

use apimachinery::selector::LabelSelector;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = LabelSelector::parse(s) {
        let printed = sel.to_string();
        let again = LabelSelector::parse(&printed).expect("a printed selector parses");
        assert_eq!(again, sel, "{s:?} printed as {printed:?}");
        let labels = vec![("app".to_string(), "a".to_string())];
        let _ = sel.matches(&labels);
    }
});
