//! The floor under the log's CPU per task on a local store (issue 17 target 4): the segments
//! of a logged run written again, byte for byte, to a fresh sled store, `per_flush` segments
//! to a batch with a flush after each (as the log writer stores them, with one small
//! watermark record per vnode in each batch), and the CPU time that takes: this process,
//! sled's threads included. No encoding, no fold, no tasks: only the store.
//!
//! ```text
//! knary run -n 9 -k 5 --threads 2 --store local:/tmp/run
//! cargo run --release -p veriflow-runtime --example sled_floor -- /tmp/run 4 585937
//! ```

use std::path::Path;

use veriflow_runtime::{SledStore, Store};

/// CPU time of this process so far (all its threads), from `/proc/self/stat` (10 ms ticks).
fn cpu_seconds() -> Result<f64, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("no command in /proc/self/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64, String> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| format!("no field {i} in /proc/self/stat"))
    };
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, per_flush, tasks] = args.as_slice() else {
        return Err(
            "usage: sled_floor <a run's local store dir> <segments per flush> <tasks>".into(),
        );
    };
    let per_flush: usize = per_flush
        .parse()
        .map_err(|e| format!("segments per flush: {e}"))?;
    let tasks: f64 = tasks.parse().map_err(|e| format!("tasks: {e}"))?;
    if per_flush == 0 {
        return Err("segments per flush: at least 1".into());
    }
    let source = SledStore::open_read_only(Path::new(dir)).map_err(|e| e.to_string())?;
    let segments = source.scan_prefix(b"seg/").map_err(|e| e.to_string())?;
    drop(source);
    let bytes: usize = segments.iter().map(|(k, v)| k.len() + v.len()).sum();
    let target = std::env::temp_dir().join(format!("sled-floor-{}", std::process::id()));
    let store = SledStore::open(&target).map_err(|e| e.to_string())?;
    let fences: Vec<(Vec<u8>, u64)> = Vec::new();
    let before = cpu_seconds()?;
    for (n, batch) in segments.chunks(per_flush).enumerate() {
        let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = batch.to_vec();
        // A watermark-sized record per batch (`watermark.rs`), under a key of its own.
        let mut key = b"wm/floor".to_vec();
        key.extend_from_slice(&(n as u64).to_be_bytes());
        pairs.push((key, vec![0; 40]));
        store
            .put_batch_fenced_content(&fences, &pairs, 0)
            .and_then(|()| store.flush())
            .map_err(|e| e.to_string())?;
    }
    let cpu = cpu_seconds()? - before;
    drop(store);
    let _ = std::fs::remove_dir_all(&target);
    println!(
        "{} segments, {:.1} MB, {} per flush: {:.3} s of CPU, {:.3} us per task, {:.1} ns per byte",
        segments.len(),
        bytes as f64 / 1e6,
        per_flush,
        cpu,
        cpu * 1e6 / tasks,
        cpu * 1e9 / bytes as f64
    );
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("sled_floor: {e}");
        std::process::exit(2);
    }
}
