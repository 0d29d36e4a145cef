//! Runs every case of the suite against a backend with each planted bug and prints which
//! bugs each case catches, as markdown: `cargo run -p hicache-testkit --example bug_matrix`.
//! `--cases a,b` limits the cases, `--bugs X,Y` the bugs.

use hicache_testkit::broken::Bug;
use hicache_testkit::broken_suite;
use hicache_testkit::{CaseError, Suite};

fn list(args: &[String], flag: &str) -> Option<Vec<String>> {
    let at = args.iter().position(|a| a == flag)?;
    Some(args.get(at + 1)?.split(',').map(str::to_string).collect())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cases: Vec<&str> = Suite::new("X")
        .case_names()
        .into_iter()
        .filter(|c| list(&args, "--cases").is_none_or(|l| l.iter().any(|x| x == c)))
        .collect();
    let bugs: Vec<Bug> = Bug::ALL
        .iter()
        .copied()
        .filter(|b| list(&args, "--bugs").is_none_or(|l| l.contains(&format!("{b:?}"))))
        .collect();
    // A case must fail on a broken plugin, never panic: panics are listed on their own.
    std::panic::set_hook(Box::new(|_| {}));
    println!("| case | caught by | skipped under | panicked under |");
    println!("|---|---|---|---|");
    for case in cases {
        let (mut caught, mut skipped, mut panicked) = (Vec::new(), Vec::new(), Vec::new());
        for bug in &bugs {
            let suite = broken_suite(*bug);
            let run =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| suite.run_case(case)));
            match run {
                Ok(Err(CaseError::Failed(_))) => caught.push(format!("{bug:?}")),
                Ok(Err(CaseError::Skipped(_))) => skipped.push(format!("{bug:?}")),
                Ok(Ok(())) => {}
                Err(_) => panicked.push(format!("{bug:?}")),
            }
        }
        println!(
            "| {case} | {} | {} | {} |",
            caught.join(", "),
            skipped.join(", "),
            panicked.join(", ")
        );
    }
}
