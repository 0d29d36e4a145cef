//! `hicache plugins`.

use std::process::ExitCode;

use hicache::{PluginChoice, Verdict};

use super::json::JsonOut;

pub(crate) fn plugins(
    cx: &super::Commands,
    config: &hicache::Config,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let registry = cx.registry(config)?;
    let considered = registry.probe_all(config);
    // The plugin `auto` would choose: the first usable one in selection order.
    let auto_choice = considered
        .iter()
        .find(|c| c.verdict.is_usable())
        .map(|c| c.name.clone());
    let requested = match &config.plugin.value {
        PluginChoice::Auto => None,
        PluginChoice::Named(n) => Some(n.clone()),
    };
    if let Some(name) = &requested
        && !considered.iter().any(|c| c.name.eq_ignore_ascii_case(name))
    {
        return Err(hicache::Error::unknown_plugin(
            name,
            considered.iter().map(|c| c.name.as_str()),
        ));
    }
    // A failed listing exits non-zero: the requested plugin is unusable here, or `auto`
    // finds nothing usable.
    let usable = match &requested {
        Some(name) => considered
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(name) && c.verdict.is_usable()),
        None => auto_choice.is_some(),
    };
    let code = if usable {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if json.enabled() {
        let rows: Vec<serde_json::Value> = considered
            .iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "kind": c.kind,
                    "priority": c.priority,
                    "source": c.origin,
                    "usable": c.verdict.is_usable(),
                    "verdict": c.verdict,
                    "facts": c.facts,
                    "auto_choice": Some(&c.name) == auto_choice.as_ref(),
                })
            })
            .collect();
        let out = serde_json::json!({
            "plugins": rows,
            "auto_choice": auto_choice,
            "requested": config.plugin.value.to_string(),
            "usable": usable,
            "not_loaded": registry.rejected(),
            "warnings": registry.unregistered_sections(config),
        });
        if json.emit(&out)? {
            return Ok(code);
        }
    }
    if considered.is_empty() {
        println!(
            "no plugin is compiled into this build or loaded from a plugin dir (enable a feature of the `hicache` crate, or set `plugin_dirs`)"
        );
        print_rejected(registry.rejected());
        print_warnings(&registry.unregistered_sections(config));
        return Ok(code);
    }
    println!(
        "{:<2}{:<8} {:<5} {:>8}  VERDICT",
        "", "PLUGIN", "KIND", "PRIORITY"
    );
    for c in &considered {
        let mark = if Some(&c.name) == auto_choice.as_ref() {
            "*"
        } else {
            ""
        };
        let (verdict, detail) = match &c.verdict {
            Verdict::Usable { detail } => ("usable".to_string(), detail.clone()),
            Verdict::Unusable { reason, hint } => (
                "unusable".to_string(),
                match hint {
                    Some(h) => format!("{reason} (hint: {h})"),
                    None => reason.clone(),
                },
            ),
        };
        println!(
            "{mark:<2}{:<8} {:<5} {:>8}  {verdict}: {detail}",
            c.name,
            c.kind.to_string(),
            c.priority
        );
        println!("{:<25}source: {}", "", c.origin);
        for (subject, facts) in facts_by_subject(&c.facts) {
            println!("{:<25}{subject}: {facts}", "");
        }
    }
    print_rejected(registry.rejected());
    print_warnings(&registry.unregistered_sections(config));
    match (&requested, &auto_choice) {
        (Some(name), _) if usable => {
            println!("\nrequested plugin: {name} (from {})", config.plugin.source)
        }
        (Some(name), _) => println!(
            "\nrequested plugin: {name} (from {}) is unusable here",
            config.plugin.source
        ),
        (None, Some(name)) => println!("\n* = what `auto` chooses here: {name}"),
        (None, None) => println!("\n`auto` finds no usable plugin here"),
    }
    Ok(code)
}

/// Config sections for plugins this program does not have.
fn print_warnings(warnings: &[String]) {
    for w in warnings {
        println!("\nwarning: {w}");
    }
}

/// The plugin files that were not loaded, each with why.
fn print_rejected(rejected: &[hicache::Rejected]) {
    if rejected.is_empty() {
        return;
    }
    println!("\nnot loaded:");
    for r in rejected {
        println!("  {}", r.reason);
    }
}

/// A probe's facts, one line per subject in the order found: `("/data", "filesystem ext4,
/// free 10 GiB")`.
pub(crate) fn facts_by_subject(facts: &[hicache::Fact]) -> Vec<(&str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    for f in facts {
        let item = format!("{} {}", f.name, f.value);
        match out.iter_mut().find(|(s, _)| *s == f.subject) {
            Some((_, line)) => {
                line.push_str(", ");
                line.push_str(&item);
            }
            None => out.push((&f.subject, item)),
        }
    }
    out
}
