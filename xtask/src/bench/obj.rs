//! The OBJ case: hicache OBJ against the bare `object_store` client, 1 MiB pages, on one moto
//! server started for the run.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use super::stats::{median, num, ratio, rounds};
use super::{ROUNDS, run_json};
use crate::root;

/// A moto S3 server on a free loopback port, killed on drop.
struct Moto(std::process::Child, u16);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_moto() -> Result<Moto, String> {
    use std::io::{Read, Write};
    let bin = root()
        .join("target")
        .join("s3-venv")
        .join("bin")
        .join("moto_server");
    if !bin.is_file() {
        return Err("moto_server is not installed (cargo xtask s3-servers)".into());
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let child = Command::new(&bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    let moto = Moto(child, port);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            write!(s, "PUT /hicache-bench HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
            let mut reply = String::new();
            s.read_to_string(&mut reply).map_err(|e| e.to_string())?;
            return if reply.contains(" 200 ") {
                Ok(moto)
            } else {
                Err(format!(
                    "create bucket: {}",
                    reply.lines().next().unwrap_or("")
                ))
            };
        }
        if std::time::Instant::now() > deadline {
            return Err("moto_server did not start".into());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// hicache OBJ vs the raw object_store loop, 1 MiB pages, on one moto server.
pub(super) fn obj_case(hicache: &Path, repeats: usize) -> Result<Value, String> {
    let moto = start_moto()?;
    let config = root().join("target").join("bench-obj.toml");
    std::fs::write(
        &config,
        format!("[plugin.obj]\nactive = true\nbucket = \"hicache-bench\"\nendpoint = \"http://127.0.0.1:{}\"\naccess_key = \"bench\"\nsecret_key = \"bench\"\n", moto.1),
    )
    .map_err(|e| e.to_string())?;
    let (page_bytes, pages, batch) = (1u64 << 20, 64u64, 32u64);
    println!("bench: obj/1MiB (moto): {pages} pages, batch {batch}, {repeats} repeat(s)");
    let (mut hw, mut hr, mut rw, mut rr) = (vec![], vec![], vec![], vec![]);
    let mut verified = true;
    for _ in 0..repeats {
        for baseline in [false, true] {
            let mut c = Command::new(hicache);
            c.args(["bench", "--config"]).arg(&config);
            c.args([
                "--model",
                "custom",
                "--page-bytes",
                &page_bytes.to_string(),
                "--pages",
                &pages.to_string(),
            ]);
            c.args([
                "--batch",
                &batch.to_string(),
                "--threads",
                "1",
                "--rounds",
                &ROUNDS.to_string(),
                "--ops",
                "write,read",
                "--json",
            ]);
            if baseline {
                c.args(["--baseline", "raw-obj"]);
            }
            let r = run_json(&mut c).map_err(|e| format!("obj bench: {e}"))?;
            verified &= r["verified"].as_bool().unwrap_or(false);
            let (w, rd) = if baseline {
                (&mut rw, &mut rr)
            } else {
                (&mut hw, &mut hr)
            };
            w.extend(rounds(&r, "write_rounds"));
            rd.extend(rounds(&r, "read_rounds"));
        }
    }
    let (h_w, h_r, r_w, r_r) = (
        median(hw.clone()),
        median(hr.clone()),
        median(rw.clone()),
        median(rr.clone()),
    );
    Ok(json!({
        "name": "obj/1MiB (moto)",
        "page_bytes": page_bytes,
        "pages": pages,
        "batch": batch,
        "verified": verified,
        "hicache_write_gbps": num(h_w),
        "hicache_read_gbps": num(h_r),
        "raw_write_gbps": num(r_w),
        "raw_read_gbps": num(r_r),
        "nixl_write_gbps": Value::Null,
        "nixl_read_gbps": Value::Null,
        "ratio_vs_raw": { "write": ratio(h_w, r_w), "read": ratio(h_r, r_r) },
        "ratio_vs_nixl": { "write": Value::Null, "read": Value::Null },
        "samples": { "hicache_write": hw, "hicache_read": hr, "raw_write": rw, "raw_read": rr },
    }))
}
