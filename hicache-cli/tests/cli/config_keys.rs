//! `hicache config keys`: the reference even when the config is broken, and hostile flags.

use crate::{hicache, json_output};

/// `config keys` lists every key of the build's reference, needs no valid config, and its
/// Markdown is the generated reference.
#[test]
fn config_keys_lists_the_reference_even_when_the_config_is_broken() {
    let tmp = tempfile::tempdir().unwrap();
    let broken = tmp.path().join("broken.toml");
    std::fs::write(&broken, "storge_dir = \"/x\"\n").unwrap();
    let json = json_output(
        hicache()
            .args(["config", "keys", "--json", "--config"])
            .arg(&broken),
    );
    let listed: Vec<&str> = json["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    let reference = hicache::reference();
    assert_eq!(listed.len(), reference.len());
    for k in &reference {
        assert!(listed.contains(&k.key.as_str()), "{} missing", k.key);
    }
    assert!(listed.contains(&"storage_dir") && listed.contains(&"plugin.posix.engine"));

    let human = hicache().args(["config", "keys"]).output().unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    for k in &reference {
        assert!(text.contains(&k.key), "{} missing from\n{text}", k.key);
    }
    assert!(
        text.contains("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR (SGLang)"),
        "{text}"
    );

    let md = hicache()
        .args(["config", "keys", "--markdown"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&md.stdout),
        hicache::config_keys_markdown(&reference)
    );

    // The same broken config stops every other command at load, naming the key once.
    let out = hicache()
        .args(["config", "show", "--config"])
        .arg(&broken)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("did you mean `storage_dir`"), "{err}");
    assert_eq!(err.matches("storge_dir").count(), 1, "{err}");
}

/// `config keys` refuses flags that cannot apply together and a JSON file it cannot write,
/// with an error and a non-zero exit, and writes nothing to stdout then.
#[test]
fn config_keys_refuses_hostile_flags() {
    let both = hicache()
        .args(["config", "keys", "--markdown", "--json"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    let err = String::from_utf8_lossy(&both.stderr);
    assert!(
        err.contains("--markdown") && err.contains("--json"),
        "{err}"
    );
    assert!(both.stdout.is_empty());

    let unwritable = hicache()
        .args(["config", "keys", "--json", "/nonexistent-dir/keys.json"])
        .output()
        .unwrap();
    assert!(!unwritable.status.success());
    let err = String::from_utf8_lossy(&unwritable.stderr);
    assert!(err.contains("/nonexistent-dir/keys.json"), "{err}");
    assert!(unwritable.stdout.is_empty());

    let unknown = hicache()
        .args(["config", "keys", "--markdwn"])
        .output()
        .unwrap();
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("--markdown"));
}
