//! What the test totals hide: how many distinct conformance cases and variants each plugin
//! ran. A total of a thousand trials may be eighty cases over a dozen variants.

use std::collections::{BTreeMap, BTreeSet};

/// Per plugin, read from the suite's banner (`conformance: plugin P variant V: N cases`)
/// and its trial lines (`test conformance::[V::]case ... ok`).
#[derive(Default)]
pub(crate) struct Breadth {
    plugins: BTreeMap<String, Plugin>,
    /// The plugin and last variant named by the banner of the binary being read.
    current: Option<(String, String)>,
}

#[derive(Default)]
struct Plugin {
    variants: BTreeSet<String>,
    cases: BTreeSet<String>,
    passed: u64,
    skipped: u64,
    failed: u64,
}

impl Breadth {
    pub(crate) fn add_line(&mut self, line: &str) {
        if let Some(rest) = line.strip_prefix("conformance: plugin ") {
            let mut words = rest.split_whitespace();
            if let (Some(plugin), Some("variant"), Some(variant)) =
                (words.next(), words.next(), words.next())
            {
                let variant = variant.trim_end_matches(':').to_string();
                self.current = Some((plugin.to_string(), variant));
            }
            return;
        }
        let Some(rest) = line.strip_prefix("test conformance::") else {
            return;
        };
        let Some((name, outcome)) = rest.split_once(" ... ") else {
            return;
        };
        let Some((plugin, banner_variant)) = self.current.clone() else {
            return;
        };
        let (variant, case) = match name.trim().split_once("::") {
            Some((v, c)) => (v.to_string(), c.to_string()),
            None => (banner_variant, name.trim().to_string()),
        };
        let p = self.plugins.entry(plugin).or_default();
        match outcome
            .split_whitespace()
            .next()
            .map(|w| w.trim_end_matches(','))
        {
            Some("ok") => p.passed += 1,
            Some("ignored") => p.skipped += 1,
            Some("FAILED") => p.failed += 1,
            _ => return,
        }
        p.variants.insert(variant);
        p.cases.insert(case);
    }

    pub(crate) fn merge(&mut self, other: Breadth) {
        for (name, o) in other.plugins {
            let p = self.plugins.entry(name).or_default();
            p.variants.extend(o.variants);
            p.cases.extend(o.cases);
            p.passed += o.passed;
            p.skipped += o.skipped;
            p.failed += o.failed;
        }
    }

    /// One line per plugin: distinct cases × variants, and what the trials did.
    pub(crate) fn report(&self) -> String {
        self.plugins
            .iter()
            .map(|(name, p)| {
                format!(
                    "  {name}: {} distinct cases over {} variants ({}) = {} trials: {} passed, {} skipped, {} failed\n",
                    p.cases.len(),
                    p.variants.len(),
                    p.variants.iter().cloned().collect::<Vec<_>>().join(", "),
                    p.passed + p.skipped + p.failed,
                    p.passed,
                    p.skipped,
                    p.failed
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Breadth;

    #[test]
    fn counts_distinct_cases_and_variants_per_plugin() {
        let mut b = Breadth::default();
        for line in [
            "conformance: plugin POSIX variant ext4: 2 cases",
            "conformance: plugin POSIX variant tmpfs: 2 cases",
            "test conformance::ext4::backend_remove ... ok",
            "test conformance::tmpfs::backend_remove ... ok",
            "test conformance::ext4::backend_usage ... ignored, no figures",
            "test conformance::tmpfs::backend_usage ... FAILED",
        ] {
            b.add_line(line);
        }
        let mut single = Breadth::default();
        for line in [
            "conformance: plugin ACME variant default: 1 cases",
            "test conformance::backend_remove ... ok",
            "test other::thing ... ok",
        ] {
            single.add_line(line);
        }
        b.merge(single);
        let report = b.report();
        assert!(
            report
                .contains("ACME: 1 distinct cases over 1 variants (default) = 1 trials: 1 passed"),
            "{report}"
        );
        assert!(
            report.contains(
                "POSIX: 2 distinct cases over 2 variants (ext4, tmpfs) = 4 trials: 2 passed, 1 skipped, 1 failed"
            ),
            "{report}"
        );
    }
}
