//! The config loader on arbitrary input, in each of its forms: a TOML file, a JSON file,
//! SGLang's inline `extra_config` JSON, environment variables and `set` pairs. Loading ends
//! in a config or a typed error, never a panic; a loaded config can be shown.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use hicache_core::{ConfigLoader, EnvSnapshot};
use libfuzzer_sys::fuzz_target;

/// A private dir for this process's config files.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // `cargo xtask fuzz` names a scratch dir it removes afterwards.
        let base =
            std::env::var_os("HICACHE_FUZZ_SCRATCH").map_or_else(std::env::temp_dir, PathBuf::from);
        let dir = base.join(format!("hicache-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    })
}

fn show(loader: ConfigLoader) {
    if let Ok(config) = loader.load() {
        for entry in config.entries() {
            let _ = format!("{entry:?}");
        }
        let _ = format!("{config:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&form, body)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(body);
    match form % 5 {
        0 | 1 => {
            let name = if form % 5 == 0 { "c.toml" } else { "c.json" };
            let path = scratch().join(name);
            std::fs::write(&path, body).expect("write the config file");
            show(ConfigLoader::new().file(&path));
        }
        2 => show(ConfigLoader::new().extra_config(&text)),
        3 => {
            let pairs: Vec<(&str, &str)> = text.lines().filter_map(|l| l.split_once('=')).collect();
            show(ConfigLoader::new().env(EnvSnapshot::from_pairs(pairs)));
        }
        _ => {
            let (key, value) = text.split_once('=').unwrap_or((&text, ""));
            show(ConfigLoader::new().set(key, value));
        }
    }
});
