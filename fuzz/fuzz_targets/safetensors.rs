//! safetensors reading: any file is opened and every tensor it lists read, or refused, never a
//! panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, data).expect("written");
    if let Ok(c) = model::weights::Checkpoint::open_file(&path) {
        for name in c.names() {
            let shape = c.shape(&name).map(|s| s.to_vec()).unwrap_or_default();
            let _ = c.f32(&name, &shape);
        }
    }
});
