//! Device preset parsing: any text is parsed and validated, or refused, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = accel_sim::preset::DevicePreset::from_toml("preset.toml", &text);
});
