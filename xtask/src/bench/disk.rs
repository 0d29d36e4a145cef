//! What the block device under a bench dir saw during each contender's runs: requests
//! completed, their mean size, and how many the block layer merged, from `/proc/diskstats`.
//!
//! Why: two contenders that move the same pages can hand the device very different
//! requests. NIXL's POSIX plugin submits a batch of pages at once, and where its files lie
//! next to each other on disk the block layer merges their requests into one; a thread per
//! page cannot be merged that way. The GB/s alone do not show that.
//!
//! The counters are the device's, not the process's: they include everything on that
//! device while a contender runs, its untimed setup (creating files, the evictions between
//! rounds) and the filesystem's metadata writes included. A dir on a filesystem without a
//! block device (tmpfs) has no counters.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde_json::{Value, json};

/// One device's counters at a moment (the fields of its `/proc/diskstats` line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) reads: u64,
    pub(super) reads_merged: u64,
    pub(super) read_sectors: u64,
    pub(super) writes: u64,
    pub(super) writes_merged: u64,
    pub(super) write_sectors: u64,
}

impl Counts {
    /// What happened between `earlier` and `self` (a counter that went back, which a
    /// device's removal and return could cause, counts as 0).
    fn since(self, earlier: Counts) -> Counts {
        Counts {
            reads: self.reads.saturating_sub(earlier.reads),
            reads_merged: self.reads_merged.saturating_sub(earlier.reads_merged),
            read_sectors: self.read_sectors.saturating_sub(earlier.read_sectors),
            writes: self.writes.saturating_sub(earlier.writes),
            writes_merged: self.writes_merged.saturating_sub(earlier.writes_merged),
            write_sectors: self.write_sectors.saturating_sub(earlier.write_sectors),
        }
    }

    fn add(&mut self, other: Counts) {
        self.reads += other.reads;
        self.reads_merged += other.reads_merged;
        self.read_sectors += other.read_sectors;
        self.writes += other.writes;
        self.writes_merged += other.writes_merged;
        self.write_sectors += other.write_sectors;
    }
}

/// The counters of device `major:minor` in `/proc/diskstats` text, if it has a line there.
pub(super) fn parse(text: &str, major: u64, minor: u64) -> Option<Counts> {
    text.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
        if n(0)? != major || n(1)? != minor {
            return None;
        }
        // Fields after major, minor and name: reads, reads merged, sectors read, ms
        // reading, writes, writes merged, sectors written (sectors of 512 bytes).
        Some(Counts {
            reads: n(3)?,
            reads_merged: n(4)?,
            read_sectors: n(5)?,
            writes: n(7)?,
            writes_merged: n(8)?,
            write_sectors: n(9)?,
        })
    })
}

/// The block device a dir lives on, as `/proc/diskstats` names it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Device {
    major: u64,
    minor: u64,
}

impl Device {
    /// The device under `dir`; None where it has no diskstats line (tmpfs, overlayfs) or the
    /// file cannot be read.
    pub(super) fn of(dir: &Path) -> Option<Device> {
        let dev = std::fs::metadata(dir).ok()?.dev();
        let device = Device {
            major: u64::from(libc::major(dev)),
            minor: u64::from(libc::minor(dev)),
        };
        device.counts().map(|_| device)
    }

    /// The device's counters now.
    pub(super) fn counts(&self) -> Option<Counts> {
        let text = std::fs::read_to_string("/proc/diskstats").ok()?;
        parse(&text, self.major, self.minor)
    }
}

/// The requests one contender's runs made, summed over its runs.
#[derive(Debug, Default)]
pub(super) struct Requests {
    total: Option<Counts>,
}

impl Requests {
    /// Runs `f`, adding what the device did meanwhile (nothing without a device).
    pub(super) fn around<T>(&mut self, device: Option<Device>, f: impl FnOnce() -> T) -> T {
        let before = device.and_then(|d| d.counts());
        let out = f();
        if let (Some(before), Some(after)) = (before, device.and_then(|d| d.counts())) {
            self.total
                .get_or_insert_with(Counts::default)
                .add(after.since(before));
        }
        out
    }

    /// Requests, mean KiB per request and merged requests, per direction; null without a
    /// device.
    pub(super) fn json(&self) -> Value {
        let Some(c) = self.total else {
            return Value::Null;
        };
        let per = |requests: u64, merged: u64, sectors: u64| {
            json!({
                "requests": requests,
                "kib_per_request": if requests > 0 {
                    json!(sectors as f64 / 2.0 / requests as f64)
                } else {
                    Value::Null
                },
                "merged": merged,
            })
        };
        json!({
            "read": per(c.reads, c.reads_merged, c.read_sectors),
            "write": per(c.writes, c.writes_merged, c.write_sectors),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "\
 253       0 vda 81963 30 10332480 80321 81922 2 10329088 43000 0 51000 123321 0 0 0 0 0 0
 253       1 vda1 5602 79019 10530816 82237 18829 64318 10468096 5000 0 4000 87237 0 0 0 0 0 0
   7       0 loop0 x y
";

    #[test]
    fn a_device_is_found_by_its_numbers_and_its_fields_read_in_order() {
        assert_eq!(
            parse(STATS, 253, 1),
            Some(Counts {
                reads: 5602,
                reads_merged: 79019,
                read_sectors: 10530816,
                writes: 18829,
                writes_merged: 64318,
                write_sectors: 10468096,
            })
        );
        assert_eq!(parse(STATS, 253, 0).map(|c| c.reads), Some(81963));
        // Absent, and a line whose fields are not numbers.
        assert_eq!(parse(STATS, 8, 0), None);
        assert_eq!(parse(STATS, 7, 0), None);
        assert_eq!(parse("", 253, 0), None);
    }

    #[test]
    fn runs_add_up_and_sizes_are_per_request() {
        let mut r = Requests::default();
        assert_eq!(r.json(), Value::Null);
        let a = Counts {
            reads: 10,
            read_sectors: 2560,
            ..Counts::default()
        };
        let b = Counts {
            reads: 30,
            reads_merged: 5,
            read_sectors: 3840,
            writes: 7,
            write_sectors: 1000,
            ..Counts::default()
        };
        r.total = Some(b.since(a));
        if let Some(t) = r.total.as_mut() {
            t.add(b.since(a));
        }
        let j = r.json();
        assert_eq!(j["read"]["requests"], json!(40));
        assert_eq!(j["read"]["merged"], json!(10));
        // 2 × 1280 sectors over 40 requests: 32 KiB each.
        assert_eq!(j["read"]["kib_per_request"], json!(32.0));
        assert_eq!(j["write"]["requests"], json!(14));
        // A counter that went back counts as nothing.
        assert_eq!(a.since(b).reads, 0);
    }

    #[test]
    fn a_dir_without_a_block_device_has_no_counters() {
        // /proc is a pseudo filesystem: no diskstats line.
        assert!(Device::of(Path::new("/proc")).is_none());
        assert!(Device::of(Path::new("/no/such/dir")).is_none());
        let mut r = Requests::default();
        assert_eq!(r.around(None, || 5), 5);
        assert_eq!(r.json(), Value::Null);
    }
}
