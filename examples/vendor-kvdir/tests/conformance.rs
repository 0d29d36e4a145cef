//! The whole conformance suite against KVDIR, linked in.

hicache_testkit::conformance_suite!("KVDIR", |env: &hicache_testkit::TrialEnv| kvdir::open(
    env.dir()
));
