//! The envelope decoder on arbitrary bytes: a header either decodes into fields whose
//! arithmetic cannot overflow, or is refused with a reason; it never panics.
#![no_main]

use hicache_core::raw::envelope::{self, Header};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(header) = Header::decode(data) {
        // What a reader computes from a decoded header stays in range.
        let end = header
            .header_len
            .checked_add(header.payload_len)
            .expect("decode accepted an object length that overflows");
        assert_eq!(header.object_len(), end);
        // Encoding what was decoded gives the same fields back.
        let again = Header::decode(&header.encode()).expect("a re-encoded header decodes");
        assert_eq!(again, header);
        header
            .check_identity(&again)
            .expect("a header matches itself");
    }
    if data.len() >= 16 {
        let word = |i: usize| u64::from_le_bytes(data[i..i + 8].try_into().unwrap());
        let _ = envelope::object_len(word(0), word(8));
        let _ = envelope::header_len(word(8));
    }
    let _ = envelope::checksum([data]);
});
