//! config.json parsing: any bytes are parsed or refused, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = model::config::parse_config(&text, "config.json");
});
