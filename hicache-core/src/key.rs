//! Page keys, object names and the namespace that keeps foreign bytes out.
//!
//! A [`PageKey`] is what the engine hands us (SGLang: 64 hex chars of a chained SHA-256).
//! An [`ObjectKey`] is the validated name an object is stored under; [`ObjectNamer`] derives
//! it from the page key and the pool's [`Namespace`]. Neither can hold `/`, `\`, NUL or
//! control characters, start with `.` (so neither is `.` or `..`), or exceed the lengths
//! below, so no key can escape a storage root or collide with a backend's temporary files.
//! A run of dots inside a name (`model..v2`) stays within its one path component, so it is
//! allowed: SGLang's model names hold such runs.

use std::fmt;

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::pool::{AttentionKind, PoolGeometry, PoolName, SidecarGeometry};

/// Longest page key accepted, in bytes.
pub const MAX_PAGE_KEY_LEN: usize = 160;
/// Longest object name accepted, in bytes: Linux's NAME_MAX, the limit SGLang's file backends
/// meet. A file plugin must not derive other names (temp files, sidecars) by lengthening an
/// object's name: POSIX stages writes under short random names of its own.
pub const MAX_OBJECT_KEY_LEN: usize = 255;

fn validate_name(name: &str, max: usize) -> Result<()> {
    let reject = |reason: String| {
        let shown: String = name.chars().take(80).collect();
        Err(Error::InvalidKey { key: shown, reason })
    };
    if name.is_empty() {
        return reject("key is empty".into());
    }
    if name.len() > max {
        return reject(format!("key is {} bytes, the limit is {max}", name.len()));
    }
    if name.starts_with('.') {
        return reject("key starts with '.' (reserved for hidden and temporary files)".into());
    }
    // Keys are ASCII almost always (SGLang's are hex): one pass over the bytes clears them,
    // without a branch per byte. Anything else is decoded, since `char::is_control` also
    // covers C1 controls (U+0080 to U+009F), which are two bytes in UTF-8.
    let plain = name.as_bytes().iter().fold(true, |ok, &b| {
        ok & (0x20..0x7f).contains(&b) & (b != b'/') & (b != b'\\')
    });
    if plain {
        return Ok(());
    }
    if let Some(c) = name
        .chars()
        .find(|c| *c == '/' || *c == '\\' || c.is_control())
    {
        return reject(format!(
            "key contains the forbidden character {c:?} (no path separators or control characters)"
        ));
    }
    Ok(())
}

/// A validated page key as the engine gives it (opaque to hicache).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct PageKey(String);

impl PageKey {
    /// Validates `key`.
    pub fn new(key: impl Into<String>) -> Result<Self> {
        let key = key.into();
        validate_name(&key, MAX_PAGE_KEY_LEN)?;
        Ok(PageKey(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for PageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated object name, with its stable 64-bit hash (routing and envelope identity).
///
/// The name is stored inline (no heap allocation), since one is made per page per transfer.
#[derive(Clone)]
pub struct ObjectKey {
    len: u8,
    buf: [u8; MAX_OBJECT_KEY_LEN],
    hash: u64,
}

impl ObjectKey {
    /// Validates `name` and computes its hash.
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        Self::concat(&[name.as_ref()])
    }

    /// The name made of `parts` joined without separator, validated, without allocating.
    pub fn concat(parts: &[&str]) -> Result<Self> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > MAX_OBJECT_KEY_LEN {
            return Err(Error::InvalidKey {
                key: parts.concat().chars().take(80).collect(),
                reason: format!("key is {total} bytes, the limit is {MAX_OBJECT_KEY_LEN}"),
            });
        }
        let mut buf = [0u8; MAX_OBJECT_KEY_LEN];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p.as_bytes());
            at += p.len();
        }
        // SAFETY: `buf[..at]` holds the `&str` parts copied end to end, and UTF-8 strings
        // joined are UTF-8.
        let name = unsafe { std::str::from_utf8_unchecked(&buf[..at]) };
        validate_name(name, MAX_OBJECT_KEY_LEN)?;
        let hash = crate::hash::key_hash(name);
        Ok(ObjectKey {
            len: at as u8,
            buf,
            hash,
        })
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        // SAFETY: `buf[..len]` is written only by `concat`, from `&str` parts copied end to
        // end (UTF-8, as above), and never changed after; `as_str` runs per key and per use,
        // so it does not check again.
        unsafe { std::str::from_utf8_unchecked(&self.buf[..self.len as usize]) }
    }

    /// blake2b-64 of the name, big-endian (SGLang's routing hash).
    pub fn hash(&self) -> u64 {
        self.hash
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ObjectKey {}

impl std::hash::Hash for ObjectKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is storing: the engine-side identity that, with the pool, decides page bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StorageIdentity {
    /// Served model name (`None` in SGLang becomes the empty string).
    pub model: String,
    /// Tensor-parallel rank.
    pub tp_rank: u32,
    /// Tensor-parallel size.
    pub tp_size: u32,
    /// Pipeline-parallel rank.
    pub pp_rank: u32,
    /// Pipeline-parallel size.
    pub pp_size: u32,
    /// Attention context-parallel rank.
    pub cp_rank: u32,
    /// Attention context-parallel size.
    pub cp_size: u32,
}

impl Default for StorageIdentity {
    fn default() -> Self {
        StorageIdentity {
            model: String::new(),
            tp_rank: 0,
            tp_size: 1,
            pp_rank: 0,
            pp_size: 1,
            cp_rank: 0,
            cp_size: 1,
        }
    }
}

impl StorageIdentity {
    /// Identity of a single-rank deployment of `model`.
    pub fn single(model: impl Into<String>) -> Self {
        StorageIdentity {
            model: model.into(),
            ..Default::default()
        }
    }

    /// Checks that every rank is below its size.
    pub fn validate(&self) -> Result<()> {
        for (name, rank, size) in [
            ("tp", self.tp_rank, self.tp_size),
            ("pp", self.pp_rank, self.pp_size),
            ("cp", self.cp_rank, self.cp_size),
        ] {
            if size == 0 || rank >= size {
                return Err(Error::invalid_config(
                    format!("{name}_rank/{name}_size"),
                    "storage identity",
                    format!("{name} rank {rank} is not below {name} size {size}"),
                ));
            }
        }
        Ok(())
    }
}

/// Everything that changes the bytes of a stored page, digested into 16 bytes.
///
/// Rank-replicated pools (MLA) leave TP rank and size out: every TP rank holds the same latent,
/// so a page written at TP 0/4 is valid at 2/4 and 0/8. Everything else — model, PP and CP
/// position, dtype, layout (byte order), page size, geometry — is in.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Namespace([u8; 16]);

impl Namespace {
    /// The namespace of `geometry` stored by `identity`.
    pub fn new(identity: &StorageIdentity, geometry: &PoolGeometry) -> Self {
        let mut canon = String::from("hicache-namespace-v1\n");
        let mut field = |k: &str, v: &dyn fmt::Display| {
            canon.push_str(k);
            canon.push('=');
            canon.push_str(&v.to_string());
            canon.push('\n');
        };
        identity_fields(
            &mut field,
            identity,
            geometry.attention().is_rank_replicated(),
        );
        field("dtype", &geometry.dtype());
        field("layout", &geometry.layout());
        field("page_tokens", &geometry.page_tokens());
        field("layers", &geometry.layers());
        match geometry.attention() {
            AttentionKind::Mha { kv_heads, head_dim } => {
                field("kv_heads", &kv_heads);
                field("head_dim", &head_dim);
            }
            AttentionKind::Mla { kv_cache_dim } => field("kv_cache_dim", &kv_cache_dim),
        }
        let digest = Blake2b::<U16>::digest(canon.as_bytes());
        Namespace(digest.into())
    }

    /// The namespace of the sidecar pool `pool` of `geometry` stored by `identity`: the
    /// identity as for a KV pool (without the TP rank when the pool is rank-replicated),
    /// the pool's name, page size, each buffer's span lengths and the caller's format.
    pub fn sidecar(
        identity: &StorageIdentity,
        pool: &PoolName,
        geometry: &SidecarGeometry,
    ) -> Self {
        let mut canon = String::from("hicache-sidecar-namespace-v1\n");
        let mut field = |k: &str, v: &dyn fmt::Display| {
            canon.push_str(k);
            canon.push('=');
            canon.push_str(&v.to_string());
            canon.push('\n');
        };
        field("pool", pool);
        identity_fields(&mut field, identity, geometry.rank_replicated());
        field("page_tokens", &geometry.page_tokens());
        for (i, b) in geometry.buffers().iter().enumerate() {
            let lens: Vec<String> = b.spans().iter().map(|s| s.len.to_string()).collect();
            field(&format!("buffer{i}"), &lens.join(","));
        }
        field("format", &geometry.format());
        let digest = Blake2b::<U16>::digest(canon.as_bytes());
        Namespace(digest.into())
    }

    /// From raw bytes (as stored in an envelope header).
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Namespace(bytes)
    }

    /// The 16 digest bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The first 8 bytes as 16 lowercase hex chars (used in object names).
    pub fn short_hex(&self) -> String {
        self.0[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The namespace an object name carries under hicache naming (`<page key>.<16 hex>`,
    /// [`short_hex`](Self::short_hex) as written): the 16 hex digits, or `None` for a name
    /// without them (SGLang naming, or not a page).
    pub fn suffix_of(name: &str) -> Option<&str> {
        let (_, suffix) = name.rsplit_once('.')?;
        (suffix.len() == 16 && suffix.bytes().all(|b| b.is_ascii_hexdigit())).then_some(suffix)
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Namespace({})", self.short_hex())
    }
}

/// The identity's part of a namespace: model, TP position (left out when every TP rank
/// holds the same bytes), whether it is replicated, PP and CP positions.
fn identity_fields(
    field: &mut impl FnMut(&str, &dyn fmt::Display),
    identity: &StorageIdentity,
    replicated: bool,
) {
    field("model", &identity.model);
    if !replicated {
        field("tp_rank", &identity.tp_rank);
        field("tp_size", &identity.tp_size);
    }
    field("rank_replicated", &replicated);
    field("pp_rank", &identity.pp_rank);
    field("pp_size", &identity.pp_size);
    field("cp_rank", &identity.cp_rank);
    field("cp_size", &identity.cp_size);
}

/// How object names are formed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NamingScheme {
    /// `{key}.{namespace}`: one object per page, isolated by the full namespace digest.
    #[default]
    Hicache,
    /// SGLang NIXL's names (`{key}_{model}_{tp_rank}_{tp_size}`, MLA `{key}_{model}`, `_k`/`_v`
    /// per span in zero-copy), for reading and writing stores shared with SGLang. Weaker
    /// isolation: PP/CP position, dtype, layout and page size are not in the name.
    Sglang,
}

impl fmt::Display for NamingScheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NamingScheme::Hicache => "hicache",
            NamingScheme::Sglang => "sglang",
        })
    }
}

/// Turns page keys into object names for one pool.
#[derive(Clone, Debug)]
pub(crate) struct ObjectNamer {
    suffix: String,
}

impl ObjectNamer {
    /// A namer for `scheme`, pool namespace `ns` and engine identity; `replicated` pools
    /// (MLA) leave the TP rank out of SGLang names.
    pub(crate) fn new(
        scheme: NamingScheme,
        ns: &Namespace,
        identity: &StorageIdentity,
        replicated: bool,
    ) -> Self {
        let suffix = match scheme {
            NamingScheme::Hicache => format!(".{}", ns.short_hex()),
            NamingScheme::Sglang => {
                let model = identity.model.replace('/', "-");
                if replicated {
                    format!("_{model}")
                } else {
                    format!("_{model}_{}_{}", identity.tp_rank, identity.tp_size)
                }
            }
        };
        ObjectNamer { suffix }
    }

    /// A namer for the sidecar pool `pool`: under SGLang naming, SGLang's component names
    /// (`{key}{rank suffix}_{pool}`, Mamba always with the TP rank); under hicache naming the
    /// sidecar's own namespace, as for any pool.
    pub(crate) fn sidecar(
        scheme: NamingScheme,
        ns: &Namespace,
        identity: &StorageIdentity,
        replicated: bool,
        pool: &PoolName,
    ) -> Self {
        let mut namer = ObjectNamer::new(scheme, ns, identity, replicated && !pool.is_mamba());
        if scheme == NamingScheme::Sglang {
            namer.suffix.push('_');
            namer.suffix.push_str(pool.as_str());
        }
        namer
    }

    /// The object holding the whole page.
    pub(crate) fn page_object(&self, key: &PageKey) -> Result<ObjectKey> {
        ObjectKey::concat(&[key.as_str(), &self.suffix])
    }

    /// The object holding one part of a page, named by its tag (SGLang zero-copy naming:
    /// `_k`, `_v`, a sidecar's `_conv_0`…).
    pub(crate) fn part_object(&self, key: &PageKey, tag: &str) -> Result<ObjectKey> {
        ObjectKey::concat(&[key.as_str(), &self.suffix, tag])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{Dtype, Layout};

    fn mha(layout: Layout) -> PoolGeometry {
        PoolGeometry::new(
            AttentionKind::Mha {
                kv_heads: 8,
                head_dim: 128,
            },
            4,
            Dtype::Bf16,
            16,
            layout,
            8,
        )
        .unwrap()
    }

    #[test]
    fn the_namespace_suffix_is_sixteen_hex_digits_after_the_last_dot() {
        let ns = Namespace::from_bytes([0xab; 16]);
        let name = format!("page.{}", ns.short_hex());
        assert_eq!(Namespace::suffix_of(&name), Some(ns.short_hex().as_str()));
        for other in [
            "page",
            "page.",
            "a.abababababababa",
            "a.abababababababzz",
            "x_model_0_1",
            "é.ab",
        ] {
            assert_eq!(Namespace::suffix_of(other), None, "{other}");
        }
    }

    fn mla() -> PoolGeometry {
        PoolGeometry::new(
            AttentionKind::Mla { kv_cache_dim: 576 },
            4,
            Dtype::Bf16,
            16,
            Layout::PageFirst,
            8,
        )
        .unwrap()
    }

    #[test]
    fn object_keys_compare_and_hash_by_name() {
        use std::collections::HashSet;
        let a = ObjectKey::new("page-1.ns").unwrap();
        let same = ObjectKey::concat(&["page-1", ".ns"]).unwrap();
        let other = ObjectKey::new("page-2.ns").unwrap();
        assert_eq!(a, same);
        assert_ne!(a, other);
        let hash = |k: &ObjectKey| {
            use std::hash::{BuildHasher, BuildHasherDefault};
            BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(k)
        };
        assert_eq!(hash(&a), hash(&same));
        assert_ne!(hash(&a), hash(&other), "the name goes into the hash");
        let set: HashSet<ObjectKey> = [a.clone(), same, other.clone()].into_iter().collect();
        assert_eq!(set.len(), 2);
        assert!(set.contains(&a) && set.contains(&other));
        assert_eq!(a.to_string(), "page-1.ns");
        assert_eq!(format!("{a:?}"), "\"page-1.ns\"");
        let key = PageKey::new("abc").unwrap();
        assert_eq!(
            (key.to_string(), format!("{key:?}")),
            ("abc".into(), "\"abc\"".into())
        );
    }

    #[test]
    fn identities_need_every_rank_below_its_size() {
        assert!(StorageIdentity::single("m").validate().is_ok());
        let ok = StorageIdentity {
            tp_rank: 3,
            tp_size: 4,
            pp_rank: 1,
            pp_size: 2,
            cp_rank: 0,
            cp_size: 2,
            ..StorageIdentity::single("m")
        };
        assert!(ok.validate().is_ok());
        let bad = [
            StorageIdentity {
                tp_rank: 4,
                ..ok.clone()
            },
            StorageIdentity {
                tp_size: 0,
                tp_rank: 0,
                ..ok.clone()
            },
            StorageIdentity {
                pp_rank: 2,
                ..ok.clone()
            },
            StorageIdentity {
                pp_size: 0,
                pp_rank: 0,
                ..ok.clone()
            },
            StorageIdentity {
                cp_rank: 2,
                ..ok.clone()
            },
            StorageIdentity {
                cp_size: 0,
                ..ok.clone()
            },
        ];
        for (identity, part) in bad.iter().zip(["tp", "tp", "pp", "pp", "cp", "cp"]) {
            let e = identity.validate().unwrap_err().to_string();
            assert!(
                e.contains(&format!("{part}_rank/{part}_size")),
                "{identity:?}: {e}"
            );
        }
    }

    #[test]
    fn namespaces_and_schemes_say_what_they_are() {
        let identity = StorageIdentity::single("m");
        let geometry = mha(Layout::PageFirst);
        let ns = Namespace::new(&identity, &geometry);
        assert_eq!(format!("{ns:?}"), format!("Namespace({})", ns.short_hex()));
        assert_eq!(NamingScheme::Hicache.to_string(), "hicache");
        assert_eq!(NamingScheme::Sglang.to_string(), "sglang");
    }

    #[test]
    fn key_validation_rejects_escapes() {
        assert!(PageKey::new("a".repeat(64)).is_ok());
        for bad in [
            "",
            "a/b",
            "../x",
            "..",
            ".hidden",
            "a\\b",
            "nul\0",
            "tab\t",
            "del\u{7f}",
        ] {
            let err = PageKey::new(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidKey { .. }), "{bad:?}");
        }
        // `..` inside one name cannot leave its dir (SGLang's model names hold such runs).
        for fine in ["a..b", "model..v2", "x..."] {
            assert!(PageKey::new(fine).is_ok(), "{fine:?}");
        }
        let long = "k".repeat(MAX_PAGE_KEY_LEN + 1);
        assert!(
            PageKey::new(long)
                .unwrap_err()
                .to_string()
                .contains("limit")
        );
        assert!(ObjectKey::new("k".repeat(MAX_OBJECT_KEY_LEN)).is_ok());
        assert!(ObjectKey::new("k".repeat(MAX_OBJECT_KEY_LEN + 1)).is_err());
    }

    /// The byte pass that clears plain ASCII keys must refuse exactly what the rule refuses:
    /// every char to U+07FF (C0 and C1 controls, DEL, separators, two-byte UTF-8) and some
    /// wider ones, alone and inside a name, as page keys and as object names.
    #[test]
    fn key_validation_follows_the_char_rule_for_every_char() {
        let wide = [
            '\u{2028}',
            '\u{feff}',
            '\u{fffd}',
            '\u{1f600}',
            '\u{10ffff}',
        ];
        for c in (0u32..0x800).filter_map(char::from_u32).chain(wide) {
            let refused = c == '/' || c == '\\' || c.is_control();
            for name in [
                format!("k{c}"),
                format!("k{c}k"),
                format!("{}{c}", "a".repeat(70)),
            ] {
                assert_eq!(PageKey::new(name.as_str()).is_err(), refused, "{name:?}");
                assert_eq!(ObjectKey::new(&name).is_err(), refused, "{name:?}");
                if !refused {
                    assert_eq!(ObjectKey::new(&name).unwrap().as_str(), name);
                }
            }
        }
    }

    #[test]
    fn namespace_separates_everything_that_changes_bytes() {
        let id = StorageIdentity::single("m");
        let base = Namespace::new(&id, &mha(Layout::PageFirst));
        assert_eq!(base, Namespace::new(&id, &mha(Layout::PageFirst)));
        assert_ne!(base, Namespace::new(&id, &mha(Layout::PageFirstDirect)));
        assert_ne!(base, Namespace::new(&id, &mha(Layout::LayerFirst)));
        assert_ne!(
            base,
            Namespace::new(&StorageIdentity::single("m2"), &mha(Layout::PageFirst))
        );
        let pp = StorageIdentity {
            pp_rank: 1,
            pp_size: 2,
            ..id.clone()
        };
        assert_ne!(base, Namespace::new(&pp, &mha(Layout::PageFirst)));
        let tp = StorageIdentity {
            tp_rank: 1,
            tp_size: 2,
            ..id.clone()
        };
        assert_ne!(base, Namespace::new(&tp, &mha(Layout::PageFirst)));
        let g = mha(Layout::PageFirst);
        let fp8 = g.with_dtype(Dtype::Fp8E4m3).unwrap();
        assert_ne!(base, Namespace::new(&id, &fp8));
        assert_ne!(base, Namespace::new(&id, &g.with_page_tokens(32).unwrap()));
    }

    #[test]
    fn mla_namespace_ignores_tp_rank() {
        let a = StorageIdentity {
            tp_rank: 0,
            tp_size: 4,
            ..StorageIdentity::single("ds")
        };
        let b = StorageIdentity {
            tp_rank: 2,
            tp_size: 8,
            ..a.clone()
        };
        assert_eq!(Namespace::new(&a, &mla()), Namespace::new(&b, &mla()));
    }

    #[test]
    fn sglang_names_match_nixl() {
        let key = PageKey::new("H").unwrap();
        let id = StorageIdentity {
            tp_rank: 0,
            tp_size: 2,
            ..StorageIdentity::single("Qwen/Qwen3-8B")
        };
        let g = mha(Layout::PageFirst);
        let ns = Namespace::new(&id, &g);
        let namer = ObjectNamer::new(
            NamingScheme::Sglang,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert_eq!(
            namer.part_object(&key, "_k").unwrap().as_str(),
            "H_Qwen-Qwen3-8B_0_2_k"
        );
        assert_eq!(
            namer.page_object(&key).unwrap().as_str(),
            "H_Qwen-Qwen3-8B_0_2"
        );
        let id = StorageIdentity::single("deepseek-ai/DeepSeek-V3");
        let g = mla();
        let namer = ObjectNamer::new(
            NamingScheme::Sglang,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert_eq!(
            namer.part_object(&key, "_k").unwrap().as_str(),
            "H_deepseek-ai-DeepSeek-V3_k"
        );
        let hc = ObjectNamer::new(
            NamingScheme::Hicache,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert_eq!(
            hc.page_object(&key).unwrap().as_str(),
            format!("H.{}", ns.short_hex())
        );
    }

    #[test]
    fn model_names_stay_one_path_component() {
        // SGLang naming turns `/` into `-`, so a hostile model name is one harmless component.
        let key = PageKey::new("H").unwrap();
        let id = StorageIdentity::single("../../etc");
        let g = mha(Layout::PageFirst);
        let ns = Namespace::new(&id, &g);
        let namer = ObjectNamer::new(
            NamingScheme::Sglang,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert_eq!(namer.page_object(&key).unwrap().as_str(), "H_..-..-etc_0_1");
        let id = StorageIdentity::single("a\nb");
        let namer = ObjectNamer::new(
            NamingScheme::Sglang,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert!(
            namer.page_object(&key).is_err(),
            "a control character is still refused"
        );
        let id = StorageIdentity::single("org/Model..v2");
        let namer = ObjectNamer::new(
            NamingScheme::Sglang,
            &ns,
            &id,
            g.attention().is_rank_replicated(),
        );
        assert_eq!(
            namer.page_object(&key).unwrap().as_str(),
            "H_org-Model..v2_0_1"
        );
    }
}
