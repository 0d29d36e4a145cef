//! `hicache config show` and `hicache config keys`.

use std::process::ExitCode;

use hicache::PluginChoice;

use super::json::JsonOut;

/// Plugin parameters the plugin would refuse, as `bench` and `doctor` would report them: the
/// requested plugin's (sections and flat form), and every other section's.
pub(crate) fn parameter_problems(
    cx: &super::Commands,
    config: &hicache::Config,
) -> hicache::Result<Vec<String>> {
    let registry = cx.registry(config)?;
    let mut problems = Vec::new();
    for plugin in registry.plugins() {
        let named = matches!(&config.plugin.value,
            PluginChoice::Named(n) if n.eq_ignore_ascii_case(plugin.name));
        // Flat parameters belong to the requested plugin only.
        let own_section = config.section(plugin.name).is_some() && config.flat_params.is_empty();
        if (named || own_section)
            && let Err(e) = hicache::raw::params_for(plugin, config)
        {
            problems.push(e.to_string());
        }
    }
    Ok(problems)
}

pub(crate) fn config_keys(markdown: bool, json: &JsonOut) -> hicache::Result<ExitCode> {
    let keys = hicache::reference();
    if markdown {
        print!("{}", hicache::config_keys_markdown(&keys));
        return Ok(ExitCode::SUCCESS);
    }
    if json.emit(&serde_json::json!({ "keys": keys }))? {
        return Ok(ExitCode::SUCCESS);
    }
    let width = keys.iter().map(|k| k.key.len()).max().unwrap_or(0);
    for k in &keys {
        let default = k
            .default
            .as_deref()
            .map(|d| format!("  [default {d}]"))
            .unwrap_or_default();
        println!("{:<width$}  {}{default}", k.key, k.ty);
        let mut env: Vec<String> = k.env.clone();
        if let Some(alias) = &k.sglang_env {
            env.push(format!("{alias} (SGLang)"));
        }
        let env = if env.is_empty() {
            String::new()
        } else {
            format!("env {}; ", env.join(", "))
        };
        println!("{:<width$}  {env}read by {}", "", k.read_by);
        let secret = if k.secret {
            " (secret: never shown)"
        } else {
            ""
        };
        println!("{:<width$}  {}{secret}", "", k.doc);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn config_show(
    cx: &super::Commands,
    config: &hicache::Config,
    json: &JsonOut,
) -> hicache::Result<ExitCode> {
    let entries = config.entries();
    let problems = parameter_problems(cx, config)?;
    let code = if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    for p in &problems {
        eprintln!("error: {p}");
    }
    if json.enabled() {
        let out = serde_json::json!({
            "settings": entries,
            "warnings": config.warnings,
            "errors": problems,
        });
        if json.emit(&out)? {
            return Ok(code);
        }
    }
    let width = entries.iter().map(|e| e.key.len()).max().unwrap_or(0);
    for e in &entries {
        let mut line = format!("{:<width$}  {}  [{}]", e.key, e.value, e.source);
        for (source, value) in &e.overridden {
            line.push_str(&format!(" (overrides {value} from {source})"));
        }
        println!("{line}");
    }
    for w in &config.warnings {
        println!("warning: {w}");
    }
    Ok(code)
}
