//! `hicache bench`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::bench::BenchOptions;

use super::args::{Baseline, BenchArgs, Op};
use super::json::JsonOut;
use super::plugins::facts_by_subject;
use super::runtime;

pub(crate) fn bench(
    cx: &super::Commands,
    config: hicache::Config,
    args: &BenchArgs,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    for (flag, value) in [
        ("--pages", args.pages.unwrap_or(1)),
        ("--batch", args.batch as u64),
        ("--threads", args.threads as u64),
        ("--rounds", args.rounds as u64),
    ] {
        if value == 0 {
            return Err(hicache::Error::invalid_config(
                flag,
                "the command line",
                "must be at least 1",
            ));
        }
    }
    let one = args.shape.geometry(1)?;
    let pages = args
        .pages
        .unwrap_or_else(|| ((256u64 << 20) / one.page_bytes()).clamp(16, 4096));
    bench_fits_in_memory(pages, one.page_bytes())?;
    let ops = &args.ops;
    let report = match args.baseline {
        Some(how @ (Baseline::Raw | Baseline::RawPublish)) => {
            let dir = config
                .storage_dirs
                .value
                .first()
                .cloned()
                .unwrap_or_else(|| PathBuf::from("."));
            std::fs::create_dir_all(&dir).map_err(|e| {
                hicache::Error::io(
                    hicache::Component::Tool("bench"),
                    "create dir",
                    Some(dir.clone()),
                    e,
                )
            })?;
            crate::bench::raw_baseline(
                &dir,
                one.page_bytes(),
                pages,
                args.threads,
                config.use_direct_io.value,
                args.rounds,
                match how {
                    Baseline::RawPublish => crate::bench::RawLoop::Publish,
                    _ => crate::bench::RawLoop::InPlace,
                },
            )?
        }
        #[cfg(feature = "obj")]
        Some(Baseline::RawObj) => {
            let registry = cx.registry(&config)?;
            let plugin = registry.get("OBJ").ok_or_else(|| {
                hicache::Error::backend(hicache::Component::Tool("bench"), "OBJ is not registered")
            })?;
            let params = hicache::raw::params_for(plugin, &config)?;
            let ctx = hicache::raw::PluginContext::new(&config, &params);
            let cfg = hicache::obj::ObjConfig::from_context(&ctx)?;
            runtime()?.block_on(crate::bench::raw_object_store(
                cfg,
                one.page_bytes(),
                pages,
                args.batch,
                args.rounds,
            ))?
        }
        None => {
            let memory_fs = config
                .storage_dirs
                .value
                .first()
                .is_some_and(|dir| crate::bench::memory_fs(dir));
            let registry = cx.registry(&config)?;
            let cache = std::sync::Arc::new(hicache::HiCache::open(
                &registry,
                config,
                hicache::HiCacheOptions::default(),
            )?);
            let opts = BenchOptions {
                geometry: one,
                pages,
                batch: args.batch,
                streams: args.threads,
                rounds: args.rounds,
                write: ops.contains(&Op::Write),
                read: ops.contains(&Op::Read),
                exists: ops.contains(&Op::Exists),
                keep: args.keep,
                progress: true,
                shared_pool: args.shared_pool,
                memory_fs,
            };
            runtime()?.block_on(crate::bench::run(cache, &opts))?
        }
    };
    let value = serde_json::to_value(&report).unwrap_or_default();
    if !json.emit(&value)? {
        println!(
            "{} [{}] {} pages x {} ({} a round), batch {}, {} in flight, {} rounds, direct I/O {}, mode {}",
            report.plugin,
            report.location,
            report.pages,
            hicache::ByteSize(report.page_bytes),
            hicache::ByteSize(report.pages.saturating_mul(report.page_bytes)),
            report.batch,
            report.streams,
            report.rounds,
            if report.direct_io { "on" } else { "off" },
            report.transfer_mode
        );
        for (subject, facts) in facts_by_subject(&report.plugin_facts) {
            println!("  {subject}: {facts}");
        }
        for (name, gbps, rounds) in [
            ("write", report.write_gbps, &report.write_rounds),
            ("read", report.read_gbps, &report.read_rounds),
        ] {
            if let Some(last) = rounds.last() {
                let per: Vec<String> = rounds.iter().map(|r| format!("{:.2}", r.gbps)).collect();
                let bytes: u64 = rounds.iter().map(|r| r.bytes).sum();
                let seconds: f64 = rounds.iter().map(|r| r.seconds).sum();
                println!(
                    "  {name:<5} {gbps:6.2} GB/s median ({}), {:.0} pages/s, batch p50 {:.2} ms p99 {:.2} ms, {} failed; {} in {seconds:.2} s in all",
                    per.join(" "),
                    last.pages_per_s,
                    last.p50_ms,
                    last.p99_ms,
                    last.failed_pages,
                    hicache::ByteSize(bytes),
                );
                for e in rounds.iter().flat_map(|r| &r.first_errors).take(8) {
                    println!("        first {name} failure: {e}");
                }
            }
        }
        if report.exists_keys_per_s > 0.0 {
            println!("  exists {:.0} keys/s", report.exists_keys_per_s);
        }
        if let Some(path) = &report.pool_path {
            let pool = if report.shared_pool {
                "shared-memory pool"
            } else {
                "pool"
            };
            println!("  {pool} bytes: {path}");
        }
        let mean =
            |per: Vec<f64>| (!per.is_empty()).then(|| per.iter().sum::<f64>() / per.len() as f64);
        let allocations = |rounds: &[crate::bench::PhaseStats]| {
            let page = mean(
                rounds
                    .iter()
                    .filter_map(|r| r.allocations_per_page)
                    .collect(),
            );
            let call = mean(
                rounds
                    .iter()
                    .filter_map(|r| r.allocations_per_call)
                    .collect(),
            );
            page.zip(call)
        };
        if let Some(rss) = report.peak_rss_bytes {
            let mut line = format!(
                "  memory: peak RSS {} (pool {})",
                hicache::ByteSize(rss),
                hicache::ByteSize(report.pool_bytes)
            );
            for (name, rounds) in [
                ("write", &report.write_rounds),
                ("read", &report.read_rounds),
            ] {
                if let Some((page, call)) = allocations(rounds) {
                    line.push_str(&format!(
                        ", {name} {page:.2} allocations per page ({call:.1} per call)"
                    ));
                }
            }
            println!("{line}");
        }
        println!(
            "  verified: {}",
            match (report.read_back, report.verified) {
                (false, _) => "not verified (nothing was read back)",
                (true, true) => "every byte",
                (true, false) => "NO - data mismatch or failed pages",
            }
        );
    }
    // A run that read nothing back has nothing to fail on; one that did must match.
    Ok(if report.verified || !report.read_back {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Every bench keeps two copies of its pages in memory (written and read back); refuse a
/// `--pages` that cannot fit rather than fail deep inside mmap or swap the machine to a halt.
pub(crate) fn bench_fits_in_memory(pages: u64, page_bytes: u64) -> hicache::Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let need = pages.checked_mul(page_bytes).and_then(|b| b.checked_mul(2));
    let available = crate::doctor::available_memory();
    match (need, available) {
        (Some(need), Some(avail)) if need <= avail => Ok(()),
        (Some(_), None) => Ok(()),
        (need, avail) => Err(hicache::Error::invalid_config(
            "--pages",
            "the command line",
            format!(
                "{pages} pages of {} need {} of memory (written and read back) \
                 but {} is available; lower --pages",
                hicache::ByteSize(page_bytes),
                need.map_or("more than 2^64 bytes".into(), |n| format!(
                    "{:.1} GiB",
                    gib(n)
                )),
                avail.map_or("an unknown amount".into(), |a| format!("{:.1} GiB", gib(a))),
            ),
        )),
    }
}

/// A size or ratio flag: a finite number above zero whose bytes fit in 64 bits.
pub(crate) fn gib_amount(flag: &str, value: f64) -> hicache::Result<()> {
    let max = (u64::MAX >> 30) as f64;
    if value.is_finite() && value > 0.0 && value < max {
        return Ok(());
    }
    Err(hicache::Error::invalid_config(
        flag,
        "the command line",
        format!("{value:e} is not a number above 0 and below {max:e}"),
    ))
}
