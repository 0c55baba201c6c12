#![no_main]
//! Any bytes as convert's key log (`convert-keys.jsonl`), read from a file as a rerun reads it:
//! lines decode or are skipped, and every key the log gives maps back to its unit.

use hspack::convert::keys::{KeyLog, KEYS_FILE};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("hspack-fuzz-keylog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(KEYS_FILE), data).unwrap();
    // Read as the run into the dataset its first line names reads it (a log of another
    // dataset is deleted unread): the dataset of the first line that names one, if any.
    let dataset = std::str::from_utf8(data).ok().and_then(|text| {
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find_map(|v| v.get("dataset")?.as_str().map(String::from))
    });
    if let Ok(log) = KeyLog::open(&dir, None, "", dataset.as_deref()) {
        // The way earlier runs keyed samples is read from the lines, whatever they say.
        let _ = log.keyed_before();
        let _ = log.split_before();
        if let Ok(text) = std::str::from_utf8(data) {
            for line in text.lines() {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                    if let Some(unit) = v.get("unit").and_then(|u| u.as_str()) {
                        let files = v.get("files").and_then(|f| f.as_str()).unwrap_or("");
                        if let Some(key) = log.key_of(unit, files) {
                            assert!(log.unit_of(key).is_some());
                        }
                    }
                }
            }
        }
    }
});
