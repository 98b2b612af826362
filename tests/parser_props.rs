//! Issue #16 item 4: the parsers of untrusted inputs — config.json, safetensors, device presets —
//! never panic, whatever they are handed: bounded proptest versions of the `fuzz/` targets, run in
//! the normal suite. Each draws a valid file and damages it (bytes flipped, cut short, spliced;
//! fields set to values of the wrong type or size); the parser must answer `Ok` or an error. A
//! preset that parses must also run a small cost-only GEMM to an answer or an error.

use accel_sim::preset::DevicePreset;
use dsl_core::{Backend, Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use model::config::parse_config;
use model::weights::Checkpoint;
use proptest::prelude::*;
use std::path::Path;

fn repo(rel: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).expect("committed")
}

/// Byte-level damage to `text`: flips, cuts and splices at drawn positions.
fn damage(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, kind, value) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at % bytes.len();
        match kind % 4 {
            0 => bytes[i] ^= value | 1,
            1 => bytes.truncate(i),
            2 => bytes.insert(i, value),
            _ => {
                bytes.remove(i);
            }
        }
    }
    bytes
}

/// A JSON value of a drawn kind: numbers of every sign and size, strings, null, containers.
fn json_value(kind: u8, n: i64) -> serde_json::Value {
    use serde_json::json;
    match kind % 9 {
        0 => json!(n),
        1 => json!(-n.abs() - 1),
        2 => json!(n as f64 * 1.5),
        3 => json!(1e300),
        4 => json!(format!("{n}")),
        5 => serde_json::Value::Null,
        6 => json!([n, n]),
        7 => json!({ "type": "yarn", "factor": n }),
        _ => json!(u64::MAX),
    }
}

const CONFIGS: [&str; 3] = [
    "model/testdata/kimi_k2_config.json",
    "model/testdata/qwen3_next_config.json",
    "model/testdata/tiny/deepseek_v32/config.json",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Config fields set to values of any type and size, and damaged bytes: parsed or refused.
    #[test]
    fn config_parser_never_panics(
        which in 0usize..3,
        fields in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<i64>()), 0..4),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..3),
    ) {
        let text = repo(CONFIGS[which]);
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        for (key, kind, n) in &fields {
            let k = key.get(&keys).clone();
            v[k] = json_value(*kind, *n);
        }
        let bytes = damage(serde_json::to_vec(&v).unwrap(), &edits);
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_config(&text, "config.json");
    }

    /// A safetensors file built then damaged (header length, header JSON, data cut short):
    /// opening it and reading every tensor it lists gives values or errors.
    #[test]
    fn safetensors_reader_never_panics(
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 1..4),
        rows in 1usize..5, cols in 1usize..5,
    ) {
        let header = format!(
            "{{\"a\":{{\"dtype\":\"F32\",\"shape\":[{rows},{cols}],\"data_offsets\":[0,{}]}},\
             \"b\":{{\"dtype\":\"BF16\",\"shape\":[{cols}],\"data_offsets\":[{},{}]}}}}",
            4 * rows * cols,
            4 * rows * cols,
            4 * rows * cols + 2 * cols
        );
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(header.as_bytes());
        file.extend((0..4 * rows * cols + 2 * cols).map(|i| (i * 37 % 251) as u8 | 1));
        let file = damage(file, &edits);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        std::fs::write(&path, &file).unwrap();
        if let Ok(c) = Checkpoint::open_file(&path) {
            for name in c.names() {
                let shape = c.shape(&name).map(|s| s.to_vec()).unwrap_or_default();
                let _ = c.f32(&name, &shape);
            }
        }
    }

    /// A device preset with damaged lines (deleted, or a value replaced by zero, a negative or a
    /// huge number, or text): refused, or good enough to run a small cost-only GEMM to an answer or
    /// an error.
    #[test]
    fn preset_parser_never_panics(
        which in prop::sample::select(vec!["h800", "npu-910b", "systolic-128"]),
        lines in prop::collection::vec((any::<prop::sample::Index>(), 0u8..6), 1..4),
    ) {
        let text = repo(&format!("accel-sim/presets/{which}.toml"));
        let mut all: Vec<String> = text.lines().map(String::from).collect();
        for (line, how) in &lines {
            let i = line.index(all.len());
            let l = all[i].clone();
            let Some((key, _)) = l.split_once('=') else { continue };
            all[i] = match how {
                0 => String::new(),
                1 => format!("{key}= 0"),
                2 => format!("{key}= -3"),
                3 => format!("{key}= 1e300"),
                4 => format!("{key}= \"x\""),
                _ => format!("{key}= 18446744073709551615"),
            };
        }
        if let Ok(preset) = DevicePreset::from_toml("preset.toml", &all.join("\n")) {
            let launcher = Launcher::new(preset).with_backend(Backend::CostOnly);
            let case = GemmCase {
                m: 64, n: 64, k: 64, dtype: GemmDtype::Bf16, variant: GemmVariant::Naive,
                config: Config::new(), seed: 1,
            };
            let _ = run_gemm(&launcher, &case);
        }
    }
}
