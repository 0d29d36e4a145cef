//! `hicache doctor` and `hicache scrub`.

use std::process::ExitCode;

use super::args::{DoctorArgs, ScrubArgs};
use super::bench::gib_amount;
use super::json::JsonOut;
use super::runtime;

pub(crate) fn doctor(
    cx: &super::Commands,
    config: &hicache::Config,
    args: &DoctorArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let geometry = args.shape.geometry(4)?;
    for (flag, value) in [
        ("--ratio", Some(args.ratio)),
        ("--device-kv-gib", Some(args.device_kv_gib)),
        ("--host-gib", args.host_gib),
    ] {
        if let Some(v) = value {
            gib_amount(flag, v)?;
        }
    }
    let gib = (1u64 << 30) as f64;
    let (host_pool_bytes, host_pool_origin) = match args.host_gib {
        Some(g) => ((g * gib) as u64, format!("--host-gib {g}")),
        None => (
            (args.ratio * args.device_kv_gib * gib) as u64,
            format!(
                "ratio {} x device KV {} GiB",
                args.ratio, args.device_kv_gib
            ),
        ),
    };
    let opts = crate::doctor::DoctorOptions {
        geometry,
        host_pool_bytes,
        host_pool_origin,
        round_trip_pages: 4,
        progress: true,
    };
    let registry = cx.registry(config);
    let report = runtime()?.block_on(crate::doctor::run(registry, config, &opts));
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        for (i, step) in report.steps.iter().enumerate() {
            println!(
                "{}) {:<13} {}",
                i + 1,
                step.name,
                crate::doctor::label(step.status)
            );
            for d in &step.details {
                println!("     {d}");
            }
            for f in &step.fixes {
                println!("     fix: {f}");
            }
        }
        println!(
            "{}",
            if report.ok() {
                "doctor: all checks passed"
            } else {
                "doctor: problems found (see FAIL above)"
            }
        );
    }
    Ok(if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

pub(crate) fn scrub(
    config: &hicache::Config,
    args: &ScrubArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let opts = crate::scrub::ScrubOptions {
        dirs: config.storage_dirs.value.clone(),
        delete: args.delete,
        namespace: args.namespace.clone(),
        temp_age: std::time::Duration::from_secs(args.temp_age_s),
        progress: true,
    };
    let report = crate::scrub::scrub(&opts)?;
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        println!(
            "{} files: {} valid ({}), {} raw (no envelope), {} torn, {} corrupt, {} foreign, {} stale temporary, {} unreadable (kept), {} symlinks (not followed)",
            report.files,
            report.valid,
            hicache::ByteSize(report.valid_bytes),
            report.raw,
            report.count("torn"),
            report.count("corrupt"),
            report.count("foreign"),
            report.count("stale-temp"),
            report.count("unreadable"),
            report.count("symlink")
        );
        for f in &report.findings {
            println!(
                "  {:<10} {} — {}{}",
                f.kind,
                f.path.display(),
                f.reason,
                if f.deleted { " (deleted)" } else { "" }
            );
        }
    }
    Ok(if report.findings.iter().all(|f| f.deleted) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
