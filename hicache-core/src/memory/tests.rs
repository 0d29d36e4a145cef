use super::*;

fn table_with(len: usize) -> (RegionTable, RegionId, usize) {
    let table = RegionTable::new("TEST");
    let region = MemoryRegion::from_aligned(AlignedBuf::zeroed(len, 4096).unwrap());
    let addr = region.addr();
    let id = table.insert(region);
    (table, id, addr)
}

#[test]
fn pins_check_registration_and_bounds() {
    let (table, id, addr) = table_with(8192);
    let ok = table.source(&Slice::new(id, 4096, 4096)).unwrap();
    assert_eq!(ok.addr(), addr + 4096);
    drop(ok);

    let err = table.source(&Slice::new(id, 4096, 4097)).unwrap_err();
    assert!(matches!(
        err,
        Error::SliceOutOfRange {
            offset: 4096,
            len: 4097,
            region_len: 8192,
            ..
        }
    ));
    let err = table.target(&Slice::new(id, u64::MAX, 2)).unwrap_err();
    assert!(matches!(err, Error::SliceOutOfRange { .. }));
    let err = table.source(&Slice::new(RegionId(99), 0, 1)).unwrap_err();
    assert!(matches!(
        err,
        Error::UnregisteredRegion {
            region: RegionId(99),
            ..
        }
    ));

    table.remove(id).unwrap();
    assert!(matches!(
        table.source(&Slice::new(id, 0, 1)),
        Err(Error::UnregisteredRegion { .. })
    ));
    assert!(table.remove(id).is_err());
}

#[test]
fn readers_share_writers_exclude() {
    let (table, id, _) = table_with(8192);
    let r1 = table.source(&Slice::new(id, 0, 4096)).unwrap();
    let r2 = table.source(&Slice::new(id, 100, 200)).unwrap();
    let err = table.target(&Slice::new(id, 4000, 200)).unwrap_err();
    assert!(
        matches!(err, Error::MemoryBusy { offset: 4000, .. }),
        "{err}"
    );
    // Adjacent ranges do not conflict.
    let w = table.target(&Slice::new(id, 4096, 4096)).unwrap();
    assert!(matches!(
        table.source(&Slice::new(id, 8191, 1)),
        Err(Error::MemoryBusy { .. })
    ));
    drop((r1, r2));
    let w2 = table.target(&Slice::new(id, 0, 4096)).unwrap();
    drop((w, w2));
    assert_eq!(table.get(id).unwrap().in_flight(), 0);
}

#[test]
fn deregistering_a_pinned_region_is_busy_until_the_pin_drops() {
    let (table, id, _) = table_with(4096);
    let region = table.get(id).unwrap();
    let pin = table.target(&Slice::new(id, 0, 4096)).unwrap();
    let err = table.remove(id).unwrap_err();
    assert!(
        matches!(err, Error::RegionBusy { in_flight: 1, .. }),
        "{err}"
    );
    let waiter = std::thread::spawn(move || region.wait_idle_blocking());
    std::thread::sleep(std::time::Duration::from_millis(20));
    drop(pin);
    waiter.join().unwrap();
    table.remove(id).unwrap();
}

#[test]
fn every_blocked_waiter_wakes_when_the_last_pin_goes_and_only_then() {
    let (table, id, _) = table_with(8192);
    let region = table.get(id).unwrap();
    let pins = [
        table.target(&Slice::new(id, 0, 4096)).unwrap(),
        table.target(&Slice::new(id, 4096, 4096)).unwrap(),
    ];
    let (tx, rx) = std::sync::mpsc::channel();
    let waiters: Vec<_> = (0..2)
        .map(|n| {
            let (region, tx) = (region.clone(), tx.clone());
            std::thread::spawn(move || {
                region.wait_idle_blocking();
                tx.send(n).unwrap();
            })
        })
        .collect();
    // Both are counted (blocked, or about to block under the lock) before any pin goes.
    while region.lock_pins().idle_waiters < 2 {
        std::thread::yield_now();
    }
    let [first, last] = pins;
    drop(first);
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(50))
            .is_err(),
        "a waiter returned while a pin was still held"
    );
    drop(last);
    for _ in 0..2 {
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("a blocked waiter was not woken by the last unpin");
    }
    for w in waiters {
        w.join().unwrap();
    }
    assert_eq!(region.lock_pins().idle_waiters, 0);
    // Idle already: returns at once, and is not counted.
    region.wait_idle_blocking();
    assert_eq!(region.lock_pins().idle_waiters, 0);
}

#[test]
fn a_pin_keeps_owned_memory_alive_after_removal_of_every_handle() {
    let (table, id, _) = table_with(4096);
    let mut pin = table.target(&Slice::new(id, 0, 16)).unwrap();
    drop(table);
    pin.copy_from(0, &[7; 16]).unwrap();
    assert_eq!(pin.host_bytes().unwrap(), &[7; 16]);
    assert!(pin.copy_from(8, &[1; 9]).is_err());
    assert!(pin.copy_from(usize::MAX, &[1]).is_err());
}

#[test]
fn gather_and_scatter_round_trip() {
    let (table, id, _) = table_with(8192);
    let segs = [Slice::new(id, 4096, 3), Slice::new(id, 0, 2)];
    table.scatter(&segs, &[1, 2, 3, 4, 5]).unwrap();
    assert_eq!(table.gather(&segs).unwrap(), vec![1, 2, 3, 4, 5]);
    assert!(table.scatter(&segs, &[1, 2]).is_err());
    assert_eq!(table.get(id).unwrap().in_flight(), 0);
}

#[test]
fn device_memory_has_no_cpu_view() {
    let table = RegionTable::new("TEST");
    // SAFETY: the address is never dereferenced: device memory refuses CPU access.
    let region = unsafe {
        MemoryRegion::from_raw(
            std::ptr::without_provenance_mut(0x1000),
            4096,
            MemKind::Device { device: 0 },
        )
    };
    let id = table.insert(region);
    let s = table.source(&Slice::new(id, 0, 4096)).unwrap();
    assert!(matches!(s.host_bytes(), Err(Error::Unsupported { .. })));
    assert!(s.into_host_bytes().is_err());
}

#[tokio::test]
async fn wait_available_returns_once_the_conflict_is_gone() {
    let (table, id, _) = table_with(4096);
    let region = table.get(id).unwrap();
    let pin = table.target(&Slice::new(id, 0, 100)).unwrap();
    // No conflict: returns at once.
    region.wait_available(100, 100, Access::Write).await;
    let r = region.clone();
    let waiter = tokio::spawn(async move { r.wait_available(50, 10, Access::Read).await });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(!waiter.is_finished());
    drop(pin);
    waiter.await.unwrap();
    region.wait_idle().await;
}

#[test]
fn alignment_checks() {
    let (table, id, _) = table_with(8192);
    assert!(
        table
            .source_aligned(&Slice::new(id, 0, 4096), 4096, "s")
            .is_ok()
    );
    let err = table
        .source_aligned(&Slice::new(id, 1, 4096), 4096, "segment 0 of key k")
        .unwrap_err();
    assert!(err.to_string().contains("segment 0 of key k"), "{err}");
    assert!(
        table
            .target_aligned(&Slice::new(id, 0, 100), 4096, "s")
            .is_err()
    );
    assert!(
        table
            .target_aligned(&Slice::new(id, 1, 100), 1, "s")
            .is_ok()
    );
    assert_eq!(align_up(1, 4096), 4096);
    assert_eq!(align_up(4096, 4096), 4096);
    assert_eq!(align_up(5, 1), 5);
}

#[test]
fn aligned_buf_copies_are_bounds_checked() {
    let mut buf = AlignedBuf::zeroed(100, 4096).unwrap();
    assert_eq!(buf.as_ptr() as usize % 4096, 0);
    buf.copy_from(90, &[7; 10]).unwrap();
    let mut out = [0u8; 10];
    buf.copy_to(90, &mut out).unwrap();
    assert_eq!(out, [7; 10]);
    assert!(buf.copy_from(95, &[1; 10]).is_err());
    assert!(buf.copy_to(usize::MAX, &mut out).is_err());
}

/// The pin set against a brute-force check of every pinned range, pinned and released in a
/// scrambled order (the sorted set must find an overlap wherever it starts).
#[test]
fn the_pin_set_finds_every_overlap_whatever_the_order() {
    let mut set = PinSet::default();
    let mut live: Vec<((u64, u64), (u64, Access))> = Vec::new();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..4000u64 {
        let start = next() % 1000;
        let end = start + 1 + next() % 60;
        let access = if next() % 3 == 0 {
            Access::Write
        } else {
            Access::Read
        };
        let expected = live
            .iter()
            .find(|(k, (e, a))| {
                k.0 < end && *e > start && (access == Access::Write || *a == Access::Write)
            })
            .map(|(_, (_, a))| *a);
        assert_eq!(
            set.conflict(start, end, access).is_some(),
            expected.is_some(),
            "round {round}: {start}..{end} {access}"
        );
        if expected.is_none() {
            let key = (start, set.next);
            set.next += 1;
            set.longest = set.longest.max(end - start);
            set.insert(key, (end, access));
            live.push((key, (end, access)));
        }
        if !live.is_empty() && next() % 2 == 0 {
            let (key, _) = live.swap_remove((next() % live.len() as u64) as usize);
            set.remove(key);
        }
        assert_eq!(set.ranges.len(), live.len());
        assert!(set.ranges.windows(2).all(|w| w[0].0 < w[1].0));
    }
}

#[test]
fn a_shared_region_is_its_file_mapped_shared_and_the_file_goes_with_the_last_clone() {
    let dir = tempfile::tempdir().unwrap();
    let region = MemoryRegion::shared_host_in(dir.path(), 3 * 4096).unwrap();
    let file = region.shared_file().unwrap().clone();
    assert_eq!(file.len(), 3 * 4096);
    assert!(file.path().starts_with(dir.path()), "{file:?}");
    assert_eq!(region.addr() % 4096, 0);
    let mode = std::fs::metadata(file.path()).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    // Bytes written through the region are the file's bytes: another mapping (another
    // process, in real use) reads them.
    region
        .target(4096, 5, "test")
        .unwrap()
        .copy_from(0, b"hello")
        .unwrap();
    let seen = std::fs::read(file.path()).unwrap();
    assert_eq!(&seen[4096..4101], b"hello");
    let clone = region.clone();
    drop(region);
    assert!(file.path().exists(), "a clone still maps it");
    drop(clone);
    assert!(!file.path().exists(), "unlinked with the last clone");
    // Plain regions share nothing.
    let plain = MemoryRegion::from_aligned(AlignedBuf::zeroed(4096, 4096).unwrap());
    assert!(plain.shared_file().is_none());
}

#[test]
fn shared_regions_refuse_bad_dirs_and_sizes_with_the_path_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let e = MemoryRegion::shared_host_in(&missing, 4096).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, Error::InvalidPool { .. })
            && text.contains("no-such-dir")
            && text.contains("writable tmpfs"),
        "{text}"
    );
    let e = MemoryRegion::shared_host_in(dir.path(), 0).unwrap_err();
    assert!(e.to_string().contains("0 bytes"), "{e}");
    // More than any file or address space holds: refused, the file removed.
    let e = MemoryRegion::shared_host_in(dir.path(), 1 << 62).unwrap_err();
    assert!(e.to_string().contains("hicache-"), "{e}");
    // A file where the dir should be.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").unwrap();
    assert!(MemoryRegion::shared_host_in(&file, 4096).is_err());
    // Nothing was left behind.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "{left:?}");
}
