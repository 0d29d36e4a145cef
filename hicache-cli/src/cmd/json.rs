//! `--json`: where JSON output goes.

use std::path::PathBuf;

/// Where JSON goes, if anywhere.
pub(crate) enum JsonOut {
    None,
    Stdout,
    File(PathBuf),
}

impl JsonOut {
    pub(crate) fn from(arg: &Option<Option<PathBuf>>) -> Self {
        match arg {
            None => JsonOut::None,
            // `-` is stdout, as for most Unix tools; a file named `-` is `./-`.
            Some(None) => JsonOut::Stdout,
            Some(Some(p)) if p.as_os_str() == "-" => JsonOut::Stdout,
            Some(Some(p)) => JsonOut::File(p.clone()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        !matches!(self, JsonOut::None)
    }

    /// Fails before any work when the JSON file cannot be written (a missing dir, no
    /// permission), instead of after a long benchmark.
    pub(crate) fn check_writable(&self) -> hicache::Result<()> {
        if let JsonOut::File(p) = self {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
                .map_err(|e| {
                    hicache::Error::io(
                        hicache::Component::Tool("hicache"),
                        "open the --json file",
                        Some(p.clone()),
                        e,
                    )
                })?;
        }
        Ok(())
    }

    /// Writes `value`; returns whether stdout was used (so text output is skipped).
    pub(crate) fn emit(&self, value: &serde_json::Value) -> hicache::Result<bool> {
        let text = serde_json::to_string_pretty(value).unwrap_or_default();
        match self {
            JsonOut::None => Ok(false),
            JsonOut::Stdout => {
                println!("{text}");
                Ok(true)
            }
            JsonOut::File(p) => {
                std::fs::write(p, text + "\n").map_err(|e| {
                    hicache::Error::io(
                        hicache::Component::Tool("hicache"),
                        "write JSON",
                        Some(p.clone()),
                        e,
                    )
                })?;
                Ok(false)
            }
        }
    }
}
