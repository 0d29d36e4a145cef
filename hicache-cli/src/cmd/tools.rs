//! `hicache doctor`, `hicache scrub` and `hicache usage`.

use std::process::ExitCode;

use super::args::{DoctorArgs, ScrubArgs, UsageArgs};
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

/// Whether `scrub` walks the storage dirs file by file: for POSIX (named, or `auto` with
/// dirs configured) unless `--listing` asks for the plugin's listing.
fn walks_files(config: &hicache::Config, args: &ScrubArgs) -> bool {
    if args.listing {
        return false;
    }
    match &config.plugin.value {
        hicache::PluginChoice::Auto => !config.storage_dirs.value.is_empty(),
        hicache::PluginChoice::Named(name) => name == "POSIX",
    }
}

pub(crate) fn scrub(
    cx: &super::Commands,
    config: &hicache::Config,
    args: &ScrubArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let (report, what) = if walks_files(config, args) {
        let opts = crate::scrub::ScrubOptions {
            dirs: config.storage_dirs.value.clone(),
            delete: args.delete,
            namespace: args.namespace.clone(),
            temp_age: std::time::Duration::from_secs(args.temp_age_s),
            progress: true,
        };
        (crate::scrub::scrub(&opts)?, "files")
    } else {
        // Checked before the plugin opens, as the file walk checks it.
        if let Some(ns) = &args.namespace {
            crate::scrub::parse_namespace(ns)?;
        }
        let (backend, _) = cx.registry(config)?.open(config)?;
        let opts = crate::scrub::ListScrubOptions {
            prefix: args.prefix.clone(),
            delete: args.delete,
            namespace: args.namespace.clone(),
            progress: true,
            ..Default::default()
        };
        let report = runtime()?.block_on(crate::scrub::scrub_backend(backend.as_ref(), &opts))?;
        (report, "objects")
    };
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        println!(
            "{} {what}: {} valid ({}), {} raw (no envelope), {} torn, {} corrupt, {} foreign, {} stale temporary, {} unreadable (kept), {} symlinks (not followed), {} not files (kept)",
            report.files,
            report.valid,
            hicache::ByteSize(report.valid_bytes),
            report.raw,
            report.count("torn"),
            report.count("corrupt"),
            report.count("foreign"),
            report.count("stale-temp"),
            report.count("unreadable"),
            report.count("symlink"),
            report.count("not-a-file")
        );
        if report.unchecked > 0 {
            println!(
                "  {} of the valid objects carry no payload checksum (written from GPU memory): their envelope, name, namespace and length were checked, their payload bytes cannot be",
                report.unchecked
            );
        }
        if report.skipped > 0 {
            println!(
                "  {} listed objects not found whole when read (removed or rewritten meanwhile, or stored where the plugin's reads do not look): skipped",
                report.skipped
            );
        }
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

pub(crate) fn usage(
    cx: &super::Commands,
    config: &hicache::Config,
    args: &UsageArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let (backend, _) = cx.registry(config)?.open(config)?;
    let report = runtime()?.block_on(crate::usage::usage(
        backend.as_ref(),
        &args.prefix,
        1000,
        config.cleaner_scope.value,
        true,
    ))?;
    let value = serde_json::to_value(&report).unwrap_or_default();
    if json.emit(&value)? {
        return Ok(ExitCode::SUCCESS);
    }
    let bytes =
        |b: Option<u64>| b.map_or("unknown".to_string(), |b| hicache::ByteSize(b).to_string());
    println!("{} at {}", report.plugin, report.location);
    println!(
        "capacity: {} used of {}, {} available",
        bytes(report.capacity.used_bytes),
        bytes(report.capacity.total_bytes),
        bytes(report.capacity.available_bytes)
    );
    let ages = |u: &crate::usage::NamespaceUsage| {
        let written = match (u.oldest_age_s, u.newest_age_s) {
            (Some(old), Some(new)) => format!(", written {new}s to {old}s ago"),
            _ => String::new(),
        };
        match (u.oldest_use_age_s, u.newest_use_age_s) {
            (Some(old), Some(new)) => format!("{written}, used {new}s to {old}s ago"),
            _ => written,
        }
    };
    let under = if report.prefix.is_empty() {
        String::new()
    } else {
        format!(" under {:?}", report.prefix)
    };
    println!(
        "objects{under}: {} ({}){}",
        report.total.objects,
        hicache::ByteSize(report.total.bytes),
        ages(&report.total)
    );
    for ns in &report.namespaces {
        println!(
            "  {:<18} {:>10} objects {:>12}{}",
            ns.namespace.as_deref().unwrap_or("(no namespace)"),
            ns.objects,
            hicache::ByteSize(ns.bytes).to_string(),
            ages(ns)
        );
    }
    if !report.next_to_evict.is_empty() {
        println!(
            "next to evict (scope {}, least recently used first):",
            config.cleaner_scope.value
        );
        for g in &report.next_to_evict {
            println!(
                "  {} ({} objects, {})",
                g.page,
                g.objects.len(),
                hicache::ByteSize(g.bytes)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
