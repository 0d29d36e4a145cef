//! `scrub` on an arbitrary file in a storage dir: raw bytes, or a header with valid
//! checksums around fuzzed fields (so the payload checks are reached). Scrub must finish,
//! never panic, and delete a file only with proof that it is not a valid page.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use hicache_cli::scrub::{ScrubOptions, scrub};
use hicache_core::raw::Namespace;
use hicache_core::raw::envelope::{self, HEADER_FIELDS_LEN, Header};
use hicache_core::raw::routing::{bucket_name, key_hash};
use libfuzzer_sys::fuzz_target;

/// A private storage dir for this process (memory-backed where `/dev/shm` exists).
fn root() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // `cargo xtask fuzz` names a scratch dir it removes afterwards.
        let base = match std::env::var_os("HICACHE_FUZZ_SCRATCH") {
            Some(dir) => PathBuf::from(dir),
            None if std::path::Path::new("/dev/shm").is_dir() => PathBuf::from("/dev/shm"),
            None => std::env::temp_dir(),
        };
        let dir = base.join(format!("hicache-fuzz-scrub-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch root");
        dir
    })
}

const NAMESPACE: [u8; 16] = *b"fuzz-namespace!!";

/// Input: flags, a name selector, header fields, then payload bytes.
struct Input<'a> {
    flags: u8,
    name: String,
    fields: [u8; 32],
    rest: &'a [u8],
}

fn parse(data: &[u8]) -> Option<Input<'_>> {
    let (&flags, data) = data.split_first()?;
    let (&name_len, data) = data.split_first()?;
    let name_len = usize::from(name_len % 48);
    if data.len() < name_len + 32 {
        return None;
    }
    let (name_bytes, data) = data.split_at(name_len);
    const ALPHABET: &[u8] = b"0123456789abcdefABCDEF._-";
    let mut name: String = name_bytes
        .iter()
        .map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()]))
        .collect();
    if flags & 0x10 != 0 || name.is_empty() || name == "." || name == ".." {
        // A name as hicache writes it: a page key and the namespace suffix.
        name = format!(
            "{:064x}.{}",
            7u64,
            Namespace::from_bytes(NAMESPACE).short_hex()
        );
    }
    let (fields, rest) = data.split_at(32);
    Some(Input {
        flags,
        name,
        fields: fields.try_into().ok()?,
        rest,
    })
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = parse(data) else {
        return;
    };
    let root = root();
    let bucket_byte = (key_hash(&input.name) & 0xff) as u8;
    let bucket = String::from_utf8(bucket_name(bucket_byte).to_vec()).unwrap();
    // Only this input's file is under the root.
    let _ = std::fs::remove_dir_all(root);
    let bucket_dir = root.join(&bucket);
    std::fs::create_dir_all(&bucket_dir).expect("bucket dir");
    let path = bucket_dir.join(&input.name);

    let mut bytes = Vec::new();
    if input.flags & 1 != 0 {
        // A header whose own checksum is right, around fuzzed lengths and flags.
        let word = |i: usize| u64::from_le_bytes(input.fields[i..i + 8].try_into().unwrap());
        let header_len = word(0) % (1 << 14);
        let payload_len = if input.flags & 2 != 0 {
            input.rest.len() as u64
        } else {
            word(8)
        };
        let checksum = if input.flags & 4 != 0 {
            envelope::checksum([input.rest])
        } else {
            word(16)
        };
        let header = Header {
            flags: word(24) as u16,
            header_len,
            namespace: Namespace::from_bytes(NAMESPACE),
            key_hash: key_hash(&input.name),
            payload_len,
            checksum,
        };
        bytes.extend_from_slice(&header.encode());
        bytes.resize(
            usize::try_from(header_len).unwrap().max(HEADER_FIELDS_LEN),
            0,
        );
    } else {
        bytes.extend_from_slice(&input.fields);
    }
    bytes.extend_from_slice(input.rest);
    std::fs::write(&path, &bytes).expect("write the object");
    if input.flags & 8 != 0 {
        // Sparse growth: a file far larger than what was written.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(bytes.len() as u64 + (u64::from(input.flags) << 16))
            .unwrap();
    }

    let delete = input.flags & 0x20 != 0;
    let namespace = (input.flags & 0x40 != 0).then(|| Namespace::from_bytes(NAMESPACE).short_hex());
    let report = scrub(&ScrubOptions {
        dirs: vec![root.clone()],
        delete,
        namespace,
        temp_age: Duration::ZERO,
        progress: false,
    })
    .expect("scrub of a readable dir succeeds");
    let exists = path.exists();
    let deleted: Vec<_> = report.findings.iter().filter(|f| f.deleted).collect();
    for f in &deleted {
        assert!(
            matches!(f.kind, "torn" | "corrupt" | "foreign" | "stale-temp"),
            "deleted without proof: {f:?}"
        );
    }
    if !delete {
        assert!(
            exists && deleted.is_empty(),
            "scrub without --delete removed a file"
        );
    }
    if report.valid == 1 {
        assert!(exists, "a valid page was deleted");
    }
});
