//! Key validation on arbitrary text: a key is accepted only if it is one safe path
//! component (so it can never name a file outside its bucket dir), and routing any accepted
//! key works.
#![no_main]

use hicache_core::{PageKey};
use hicache_core::raw::{ObjectKey};
use libfuzzer_sys::fuzz_target;

fn safe_component(name: &str) {
    assert!(!name.is_empty(), "an empty name was accepted");
    assert!(
        name.len() <= 255,
        "a name longer than NAME_MAX was accepted"
    );
    assert!(
        !name.starts_with('.'),
        "{name:?}: hidden/temp names are reserved"
    );
    assert!(
        !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control()),
        "{name:?}: a separator or control character was accepted"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(key) = PageKey::new(text) {
        safe_component(key.as_str());
    }
    if let Ok(object) = ObjectKey::new(text) {
        safe_component(object.as_str());
        assert_eq!(object.as_str(), text);
        let route = hicache_core::raw::routing::route(&object, 3).expect("3 dirs route any key");
        assert!(route.dir < 3);
        assert!(hicache_core::raw::routing::route(&object, 0).is_err());
    }
    // Concatenation validates the whole: safe parts cannot join into an unsafe name.
    let middle = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(text.len(), |(i, _)| i);
    let (a, b) = text.split_at(middle);
    if let Ok(joined) = ObjectKey::concat(&[a, b]) {
        safe_component(joined.as_str());
    }
    if let Ok(ns) = hicache_cli::scrub::parse_namespace(text) {
        assert!(ns.len() == 16 && ns.bytes().all(|b| b.is_ascii_hexdigit()));
    }
});
