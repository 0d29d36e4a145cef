//! `include/hicache_plugin.h` and `hicache_abi::abi` describe one ABI: a C program built
//! from the header prints every size, offset and constant, and each must equal the Rust
//! definition's. The plugins built from the header (see the conformance tests) prove the
//! symbol's name and type.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use hicache_abi::abi::*;

/// (C expression, Rust value) for every layout fact and constant.
fn expected() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    macro_rules! layout {
        ($ty:ident { $($field:ident),* $(,)? }) => {
            v.push((format!("sizeof({})", stringify!($ty)), size_of::<$ty>() as u64));
            v.push((format!("_Alignof({})", stringify!($ty)), align_of::<$ty>() as u64));
            $(
                v.push((
                    format!("offsetof({}, {})", stringify!($ty), stringify!($field).trim_start_matches("r#")),
                    offset_of!($ty, $field) as u64,
                ));
            )*
        };
    }
    layout!(hicache_param_spec {
        name,
        r#type,
        secret,
        doc,
        default_value
    });
    layout!(hicache_param_value { name, value });
    layout!(hicache_config {
        storage_dirs,
        n_storage_dirs,
        use_direct_io,
        params,
        n_params,
        reserved
    });
    layout!(hicache_error { message });
    layout!(hicache_probe { detail, hint });
    layout!(hicache_capability {
        io_alignment,
        max_object_size,
        max_segments,
        direct_io,
        gpu_direct,
        host_memory,
        device_memory,
        atomic_publish,
        persistent,
        reserved,
    });
    layout!(hicache_info {
        capability,
        location
    });
    layout!(hicache_usage {
        total_bytes,
        used_bytes,
        available_bytes
    });
    layout!(hicache_segment {
        addr,
        len,
        region,
        offset
    });
    layout!(hicache_item {
        key,
        key_len,
        n_segments,
        segments
    });
    layout!(hicache_batch { op, n_items, items });
    layout!(hicache_result {
        index,
        status,
        value,
        message
    });
    layout!(hicache_plugin_table_v1 {
        abi_version,
        struct_size,
        name,
        version,
        summary,
        kind,
        priority,
        params,
        n_params,
        reserved,
        probe,
        open,
        close,
        info,
        register_memory,
        deregister_memory,
        submit,
        usage,
        list,
    });
    layout!(hicache_listed {
        key,
        key_len,
        reserved,
        size,
        modified_ns
    });
    let constants: &[(&str, i64)] = &[
        ("HICACHE_PLUGIN_ABI_VERSION", ABI_VERSION.into()),
        ("HICACHE_OK", OK.into()),
        ("HICACHE_MISS_NOT_FOUND", MISS_NOT_FOUND.into()),
        ("HICACHE_MISS_SIZE", MISS_SIZE.into()),
        ("HICACHE_ERR_IO", ERR_IO.into()),
        ("HICACHE_ERR_UNAVAILABLE", ERR_UNAVAILABLE.into()),
        ("HICACHE_ERR_TIMEOUT", ERR_TIMEOUT.into()),
        ("HICACHE_ERR_UNSUPPORTED", ERR_UNSUPPORTED.into()),
        ("HICACHE_ERR_INVALID", ERR_INVALID.into()),
        ("HICACHE_ERR_PANIC", ERR_PANIC.into()),
        ("HICACHE_KIND_FILE", KIND_FILE.into()),
        ("HICACHE_KIND_OBJECT", KIND_OBJECT.into()),
        ("HICACHE_PARAM_BOOL", PARAM_BOOL.into()),
        ("HICACHE_PARAM_UINT", PARAM_UINT.into()),
        ("HICACHE_PARAM_FLOAT", PARAM_FLOAT.into()),
        ("HICACHE_PARAM_STR", PARAM_STR.into()),
        ("HICACHE_MEM_HOST", MEM_HOST.into()),
        ("HICACHE_MEM_DEVICE", MEM_DEVICE.into()),
        ("HICACHE_OP_WRITE", OP_WRITE.into()),
        ("HICACHE_OP_READ", OP_READ.into()),
        ("HICACHE_OP_EXISTS", OP_EXISTS.into()),
        ("HICACHE_OP_REMOVE", OP_REMOVE.into()),
        ("HICACHE_TEXT_LEN", TEXT_LEN as i64),
        ("HICACHE_NO_TIME", NO_TIME),
        ("HICACHE_CURSOR_MAX", CURSOR_MAX as i64),
    ];
    for (name, value) in constants {
        v.push(((*name).to_string(), *value as u64));
    }
    v.push(("HICACHE_UNKNOWN".into(), UNKNOWN));
    v
}

#[test]
fn the_header_and_the_rust_definitions_agree() {
    let facts = expected();
    let dir = tempfile::tempdir().unwrap();
    let mut program = String::from(
        "#include <inttypes.h>\n#include <stdio.h>\n#include <string.h>\n#include <stddef.h>\n#include \"hicache_plugin.h\"\nint main(void) {\n",
    );
    for (expr, _) in &facts {
        program.push_str(&format!(
            "    printf(\"%s=%\" PRIu64 \"\\n\", \"{expr}\", (uint64_t)({expr}));\n"
        ));
    }
    program.push_str(&format!(
        "    printf(\"entry=%s\\n\", strcmp(HICACHE_PLUGIN_ENTRY, \"{}\") == 0 ? \"same\" : HICACHE_PLUGIN_ENTRY);\n",
        std::str::from_utf8(&ENTRY[..ENTRY.len() - 1]).unwrap()
    ));
    // The entry's declared type must be the Rust entry type: assigning it to a pointer of
    // that type compiles only if they match.
    program.push_str(
        "    const hicache_plugin_table_v1 *(*entry)(void) = hicache_plugin_v1;\n    (void)entry;\n    return 0;\n}\n",
    );
    let src = dir.path().join("layout.c");
    std::fs::write(&src, program).unwrap();
    let exe = dir.path().join("layout");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    // Linking needs the entry symbol: -Wl,--unresolved-symbols lets the program link
    // without a plugin (it never calls the entry).
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(&include)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .arg("-Wl,--unresolved-symbols=ignore-all")
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (set CC): {e}"));
    assert!(status.success(), "the layout program did not compile");
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let printed: BTreeMap<String, String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            l.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let mut wrong = Vec::new();
    for (expr, rust) in &facts {
        let c = printed.get(expr).cloned().unwrap_or_default();
        if c != rust.to_string() {
            wrong.push(format!("{expr}: C {c}, Rust {rust}"));
        }
    }
    assert_eq!(printed.get("entry").map(String::as_str), Some("same"));
    assert!(
        wrong.is_empty(),
        "the header and abi.rs disagree:\n{}",
        wrong.join("\n")
    );
    assert_eq!(printed.len(), facts.len() + 1);
}

#[test]
fn the_shipped_header_is_the_one_in_the_crate() {
    let on_disk = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("include/hicache_plugin.h"),
    )
    .unwrap();
    assert_eq!(hicache_abi::HEADER, on_disk);
}
