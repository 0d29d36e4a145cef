//! The OBJ parameters as a user writes them in a config file: every declared parameter
//! reaches the plugin, and `client = "aws-sdk"` selects the SDK client (or, in a build
//! without it, says which feature provides it).

use hicache_core::raw::PluginContext;
use hicache_core::raw::params_for;
use hicache_core::{ConfigLoader, EnvSnapshot};
use hicache_obj::{ClientKind, DESCRIPTOR, ObjBackend, ObjConfig, ObjParams};

/// Loads `toml` from a file, as `hicache --config` would, with an empty environment.
fn config_file(toml: &str) -> (tempfile::TempDir, hicache_core::Config) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hicache.toml");
    std::fs::write(&path, toml).unwrap();
    let config = ConfigLoader::new()
        .file(&path)
        .env(EnvSnapshot::default())
        .load()
        .unwrap();
    (dir, config)
}

fn obj_config(toml: &str) -> hicache_core::Result<ObjConfig> {
    let (_dir, config) = config_file(toml);
    let params = params_for(&DESCRIPTOR, &config)?;
    ObjConfig::from_context(&PluginContext::new(&config, &params))
}

const S3: &str = r#"
[plugin.obj]
active = true
bucket = "pages"
endpoint = "http://127.0.0.1:9"
access_key = "id"
secret_key = "key"
"#;

#[test]
fn client_aws_sdk_from_a_config_file() {
    let cfg = obj_config(&format!("{S3}client = \"aws-sdk\"\n")).unwrap();
    assert_eq!(cfg.client, ClientKind::AwsSdk);
    let built = ObjBackend::new(cfg);
    #[cfg(feature = "aws-sdk")]
    built.expect("the SDK client is built without contacting the server");
    #[cfg(not(feature = "aws-sdk"))]
    match built {
        Err(hicache_core::Error::InvalidConfig { key, hint, .. }) => {
            assert_eq!(key, "client");
            assert!(hint.unwrap().contains("`aws-sdk` feature"));
        }
        other => panic!("a build without the SDK accepted client = aws-sdk: {other:?}"),
    }

    let cfg = obj_config(&format!("{S3}client = \"object_store\"\n")).unwrap();
    assert_eq!(cfg.client, ClientKind::ObjectStore);
    let e = obj_config(&format!("{S3}client = \"crt\"\n")).unwrap_err();
    assert!(e.to_string().contains("object_store, aws-sdk"), "{e}");
}

#[test]
fn anonymous_from_a_config_file() {
    let cfg =
        obj_config("[plugin.obj]\nactive = true\nbucket = \"public\"\nanonymous = true\n").unwrap();
    assert!(cfg.anonymous);
    assert!(!obj_config(S3).unwrap().anonymous);
    // The SDK client always signs: asking it for unsigned requests is an error, not a
    // silently signed request.
    let e = obj_config(&format!("{S3}anonymous = true\nclient = \"aws-sdk\"\n")).unwrap_err();
    assert!(e.to_string().contains("anonymous"), "{e}");
}

#[test]
fn every_declared_parameter_reaches_the_plugin() {
    hicache_testkit::params::check_declared_params::<ObjParams>(&DESCRIPTOR);
}
