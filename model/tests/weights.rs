//! `model::weights`: safetensors files written here with the `safetensors` crate (single and
//! sharded), conversions checked against `accel_sim::formats`, every error case, the expected
//! tensor names against what transformers writes (`model/testdata/hf_names`, and the tiny golden
//! checkpoints in `model/testdata/tiny`).

use accel_sim::formats::{bf16, f16, packing, Overflow};
use model::config::{load_config, parse_config};
use model::weights::{
    check, expected_tensors, read_all_f32, verify, write_f32, Checkpoint, ExpectedTensor,
    ExpertLayout, Storage, WeightError,
};
use proptest::prelude::*;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// One tensor to write: name, dtype, shape, raw little-endian bytes.
type Raw = (String, Dtype, Vec<usize>, Vec<u8>);

fn write_st(path: &Path, tensors: &[Raw]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn raw_f32(name: &str, shape: &[usize], v: &[f32]) -> Raw {
    (name.into(), Dtype::F32, shape.to_vec(), f32_bytes(v))
}

/// Deterministic non-zero values in about ±4 (a small LCG: the tests need no RNG crate).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32) / (1u64 << 24) as f32; // [0, 1)
            (u - 0.5) * 8.0 + 0.01
        })
        .collect()
}

fn bytes_random(n: usize, seed: u64) -> Vec<u8> {
    values(n, seed)
        .iter()
        .map(|v| (v.to_bits() >> 7) as u8)
        .collect()
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn testdata(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

#[test]
fn f32_bf16_f16_round_trip_single_file() {
    let dir = tmp();
    let x = values(7 * 13, 1);
    let b: Vec<u16> = x
        .iter()
        .map(|v| bf16::encode(*v, Overflow::Saturate))
        .collect();
    let h: Vec<u16> = x
        .iter()
        .map(|v| f16::encode(*v, Overflow::Saturate))
        .collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            raw_f32("a.f32", &[7, 13], &x),
            ("a.bf16".into(), Dtype::BF16, vec![7, 13], u16_bytes(&b)),
            ("a.f16".into(), Dtype::F16, vec![91], u16_bytes(&h)),
        ],
    );
    let c = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(c.dir(), dir.path());
    assert_eq!(c.names(), vec!["a.bf16", "a.f16", "a.f32"]);
    assert!(c.contains("a.f16") && !c.contains("a"));
    let info = c.info("a.bf16").unwrap();
    assert_eq!(
        (info.dtype.as_str(), info.shape.as_slice()),
        ("BF16", &[7, 13][..])
    );
    assert_eq!(info.file, dir.path().join("model.safetensors"));
    assert_eq!(c.f32("a.f32", &[7, 13]).unwrap(), x);
    let want_b: Vec<f32> = b.iter().map(|&v| bf16::decode(v)).collect();
    let want_h: Vec<f32> = h.iter().map(|&v| f16::decode(v)).collect();
    assert_eq!(c.f32("a.bf16", &[7, 13]).unwrap(), want_b);
    assert_eq!(c.f32("a.f16", &[91]).unwrap(), want_h);
    // bf16 / f16 are within their rounding of the f32 source.
    for (w, v) in want_b.iter().zip(&x) {
        assert!((w - v).abs() <= v.abs() * 2f32.powi(-8));
    }
}

/// Two shards and an index, as transformers writes them.
fn write_sharded(dir: &Path) -> (Vec<f32>, Vec<f32>) {
    let (a, b) = (values(10, 2), values(6, 3));
    write_st(
        &dir.join("model-00001-of-00002.safetensors"),
        &[raw_f32("model.layers.0.w", &[2, 5], &a)],
    );
    write_st(
        &dir.join("model-00002-of-00002.safetensors"),
        &[raw_f32("model.layers.1.w", &[6], &b)],
    );
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        r#"{"metadata": {"total_size": 64}, "weight_map": {
            "model.layers.0.w": "model-00001-of-00002.safetensors",
            "model.layers.1.w": "model-00002-of-00002.safetensors"}}"#,
    )
    .unwrap();
    (a, b)
}

#[test]
fn sharded_checkpoint_reads_every_shard() {
    let dir = tmp();
    let (a, b) = write_sharded(dir.path());
    let c = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(c.names(), vec!["model.layers.0.w", "model.layers.1.w"]);
    assert_eq!(c.files().len(), 2);
    assert_eq!(
        c.info("model.layers.1.w").unwrap().file,
        dir.path().join("model-00002-of-00002.safetensors")
    );
    assert_eq!(c.f32("model.layers.0.w", &[2, 5]).unwrap(), a);
    assert_eq!(c.f32("model.layers.1.w", &[6]).unwrap(), b);
}

#[test]
fn fp8_block_scaled_weight_equals_accel_sim_dequant() {
    // 130 × 260: ragged edge blocks in both directions.
    let (rows, cols) = (130, 260);
    let x = values(rows * cols, 4);
    let q = packing::fp8_block_quant("w", &x, &[rows, cols], 128).unwrap();
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            (
                "w".into(),
                Dtype::F8_E4M3,
                vec![rows, cols],
                q.weight.clone(),
            ),
            raw_f32("w_scale_inv", &q.scale_shape, &q.scale_inv),
        ],
    );
    let c = Checkpoint::open(dir.path()).unwrap();
    let got = c.f32("w", &[rows, cols]).unwrap();
    let want = packing::fp8_block_dequant(
        "w",
        &q.weight,
        &[rows, cols],
        &q.scale_inv,
        &q.scale_shape,
        128,
    )
    .unwrap();
    assert_eq!(got, want);
    // And it is the original within FP8's precision (3 mantissa bits).
    let max_err = got
        .iter()
        .zip(&x)
        .map(|(g, v)| (g - v).abs() / v.abs().max(0.5))
        .fold(0.0f32, f32::max);
    assert!(max_err < 0.07, "max_err {max_err}");
}

#[test]
fn fp8_without_scale_and_other_dtypes_are_refused_by_name() {
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            ("lone".into(), Dtype::F8_E4M3, vec![2, 2], vec![0x38; 4]),
            ("e5".into(), Dtype::F8_E5M2, vec![4], vec![0x3C; 4]),
            ("ids".into(), Dtype::I64, vec![2], vec![1; 16]),
        ],
    );
    let c = Checkpoint::open(dir.path()).unwrap();
    for (name, shape, dtype) in [
        ("lone", vec![2, 2], "F8_E4M3"),
        ("e5", vec![4], "F8_E5M2"),
        ("ids", vec![2], "I64"),
    ] {
        let err = c.f32(name, &shape).unwrap_err();
        assert!(
            matches!(&err, WeightError::UnsupportedDtype { tensor, dtype: d, .. } if tensor == name && d == dtype),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&format!("`{name}`")) && msg.contains(dtype),
            "{msg}"
        );
    }
    assert!(c
        .f32("lone", &[2, 2])
        .unwrap_err()
        .to_string()
        .contains("lone_scale_inv"));
}

#[test]
fn mxfp4_equals_gpt_oss_dequant_and_raw_is_as_stored() {
    let (e, rows, g) = (2, 3, 2);
    let blocks = bytes_random(e * rows * g * 16, 5);
    // Scales around 2^0 (127), never the E8M0 NaN.
    let scales: Vec<u8> = bytes_random(e * rows * g, 6)
        .iter()
        .map(|b| 120 + b % 16)
        .collect();
    let dir = tmp();
    let p = "model.layers.0.mlp.experts.down_proj";
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            (
                format!("{p}_blocks"),
                Dtype::U8,
                vec![e, rows, g, 16],
                blocks.clone(),
            ),
            (
                format!("{p}_scales"),
                Dtype::U8,
                vec![e, rows, g],
                scales.clone(),
            ),
        ],
    );
    let c = Checkpoint::open(dir.path()).unwrap();
    let (want, want_shape) =
        packing::gpt_oss_dequant(p, &blocks, &[e, rows, g, 16], &scales, &[e, rows, g]).unwrap();
    assert_eq!(want_shape, vec![e, g * 32, rows]);
    assert_eq!(c.mxfp4_f32(p, &want_shape).unwrap(), want);
    let (b, bs, s, ss) = c.mxfp4_raw(p).unwrap();
    assert_eq!(
        (b, bs, s, ss),
        (blocks, vec![e, rows, g, 16], scales, vec![e, rows, g])
    );
    let err = c.mxfp4_f32(p, &[e, rows, g * 32]).unwrap_err();
    assert!(
        matches!(&err, WeightError::WrongShape { tensor, found, .. } if tensor == p && *found == want_shape),
        "{err:?}"
    );
    let err = c
        .mxfp4_f32("model.layers.0.mlp.experts.gate_up_proj", &[1])
        .unwrap_err();
    assert!(
        matches!(&err, WeightError::MissingTensor { tensor, .. } if tensor.ends_with("gate_up_proj_blocks")),
        "{err:?}"
    );
}

#[test]
fn mxfp4_nan_scale_is_a_format_error_naming_the_scales() {
    let dir = tmp();
    let p = "x";
    let mut scales = vec![127u8; 4];
    scales[3] = 0xFF;
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            (
                "x_blocks".into(),
                Dtype::U8,
                vec![1, 4, 1, 16],
                vec![0x11; 64],
            ),
            ("x_scales".into(), Dtype::U8, vec![1, 4, 1], scales),
        ],
    );
    let err = Checkpoint::open(dir.path())
        .unwrap()
        .mxfp4_f32(p, &[1, 32, 4])
        .unwrap_err();
    assert!(matches!(err, WeightError::Format { .. }), "{err:?}");
    assert!(err.to_string().contains("x_scales"), "{err}");
}

#[test]
fn missing_tensor_names_it_the_expected_shape_and_close_names() {
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[raw_f32(
            "model.layers.0.self_attn.q_a_proj.weight",
            &[2, 2],
            &values(4, 7),
        )],
    );
    let c = Checkpoint::open(dir.path()).unwrap();
    let err = c
        .f32("model.layer.0.self_attn.q_a_proj.weight", &[2, 2])
        .unwrap_err();
    match &err {
        WeightError::MissingTensor {
            tensor,
            expected,
            close,
            ..
        } => {
            assert_eq!(tensor, "model.layer.0.self_attn.q_a_proj.weight");
            assert_eq!(expected.as_deref(), Some(&[2, 2][..]));
            assert_eq!(
                close,
                &vec!["model.layers.0.self_attn.q_a_proj.weight".to_string()]
            );
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("`model.layer.0.self_attn.q_a_proj.weight` is missing")
            && msg.contains("[2, 2]")
            && msg.contains("close names"),
        "{msg}"
    );
    // A name from another layer is not "close".
    let err = c
        .f32("model.layers.1.self_attn.q_a_proj.weight", &[2, 2])
        .unwrap_err();
    assert!(matches!(err, WeightError::MissingTensor { ref close, .. } if close.is_empty()));
}

#[test]
fn wrong_shape_names_tensor_file_expected_and_found() {
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[raw_f32("w", &[3, 4], &values(12, 8))],
    );
    let err = Checkpoint::open(dir.path())
        .unwrap()
        .f32("w", &[4, 3])
        .unwrap_err();
    assert_eq!(
        err,
        WeightError::WrongShape {
            file: dir.path().join("model.safetensors").display().to_string(),
            tensor: "w".into(),
            expected: vec![4, 3],
            found: vec![3, 4],
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("`w`") && msg.contains("[3, 4]") && msg.contains("[4, 3]"),
        "{msg}"
    );
}

#[test]
fn truncated_file_is_detected_before_mapping_and_names_the_cut_tensor() {
    let dir = tmp();
    let path = dir.path().join("model.safetensors");
    // Same dtype: the crate orders data by name, so `b` is last.
    write_st(
        &path,
        &[
            raw_f32("a", &[8], &values(8, 9)),
            raw_f32("b", &[8], &values(8, 10)),
        ],
    );
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 5]).unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    match &err {
        WeightError::Truncated {
            tensor,
            needed_bytes,
            file_bytes,
            ..
        } => {
            assert_eq!(tensor, "b");
            assert_eq!(*needed_bytes, full.len() as u64);
            assert_eq!(*file_bytes, full.len() as u64 - 5);
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("truncated") && err.to_string().contains("`b`"));
    // Cut inside the header, and cut inside the length prefix.
    std::fs::write(&path, &full[..20]).unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()).unwrap_err(),
        WeightError::Truncated { ref tensor, .. } if tensor == "(header)"
    ));
    std::fs::write(&path, &full[..3]).unwrap();
    assert!(matches!(
        Checkpoint::open(dir.path()).unwrap_err(),
        WeightError::Truncated { .. }
    ));
}

#[test]
fn malformed_headers_are_errors_naming_the_file() {
    let dir = tmp();
    let path = dir.path().join("model.safetensors");
    let file = path.display().to_string();
    let with_header = |h: &str, data: usize| {
        let mut v = (h.len() as u64).to_le_bytes().to_vec();
        v.extend(h.as_bytes());
        v.extend(std::iter::repeat_n(0u8, data));
        v
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (with_header("{not json", 0), "JSON"),
        // Offsets that disagree with shape × dtype.
        (
            with_header(
                r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#,
                4,
            ),
            "header",
        ),
        (u64::MAX.to_le_bytes().to_vec(), "limit"),
        (
            with_header(
                r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                9,
            ),
            "after the last tensor",
        ),
    ];
    for (bytes, needle) in cases {
        std::fs::write(&path, bytes).unwrap();
        let err = Checkpoint::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, WeightError::MalformedHeader { file: f, .. } if *f == file),
            "{err:?}"
        );
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[test]
fn index_errors_missing_shard_and_no_checkpoint() {
    let dir = tmp();
    write_sharded(dir.path());
    let index = dir.path().join("model.safetensors.index.json");
    let index_name = index.display().to_string();
    let malformed = |text: &str, needle: &str| {
        std::fs::write(&index, text).unwrap();
        let err = Checkpoint::open(dir.path()).unwrap_err();
        assert!(
            matches!(&err, WeightError::MalformedIndex { file, .. } if *file == index_name),
            "{err:?}"
        );
        assert!(err.to_string().contains(needle), "{err}");
    };
    malformed("{\"weight_map\": ", "not valid JSON");
    malformed("{\"metadata\": {}}", "weight_map");
    malformed(r#"{"weight_map": {"w": 3}}"#, "`weight_map[\"w\"]`");
    malformed(
        r#"{"weight_map": {"w": "../elsewhere.safetensors"}}"#,
        "relative paths",
    );
    malformed(
        r#"{"weight_map": {"model.layers.9.w": "model-00001-of-00002.safetensors"}}"#,
        "`model.layers.9.w`",
    );
    std::fs::write(
        &index,
        r#"{"weight_map": {"model.layers.0.w": "model-00001-of-00002.safetensors",
                           "b": "model-00009-of-00009.safetensors",
                           "c": "model-00009-of-00009.safetensors"}}"#,
    )
    .unwrap();
    let err = Checkpoint::open(dir.path()).unwrap_err();
    match &err {
        WeightError::MissingShard {
            shard,
            tensor,
            tensors,
            ..
        } => {
            assert!(shard.ends_with("model-00009-of-00009.safetensors"));
            assert_eq!((tensor.as_str(), *tensors), ("b", 2));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("model-00009-of-00009.safetensors"));
    let empty = tmp();
    let err = Checkpoint::open(empty.path()).unwrap_err();
    assert!(matches!(err, WeightError::NoCheckpoint { .. }), "{err:?}");
    assert!(err.to_string().contains("model.safetensors"));
    let nowhere = empty.path().join("no-such-model");
    let err = Checkpoint::open(&nowhere).unwrap_err();
    assert!(
        matches!(&err, WeightError::Io { file, .. } if file.ends_with("no-such-model")),
        "{err:?}"
    );
    // A path to one shard opens that file alone.
    let one = Checkpoint::open(&dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    assert_eq!(one.names(), vec!["model.layers.1.w"]);
}

#[test]
fn write_then_read_all_f32_and_integer_ids() {
    let dir = tmp();
    let path = dir.path().join("logits.safetensors");
    let (l, h) = (values(3 * 5, 11), values(4, 12));
    write_f32(
        &path,
        &[("logits", &[3, 5], &l), ("hidden", &[4], &h)],
        &[("producer", "day0")],
    )
    .unwrap();
    let all = read_all_f32(&path).unwrap();
    assert_eq!(
        all,
        vec![
            ("hidden".to_string(), vec![4], h.clone()),
            ("logits".to_string(), vec![3, 5], l.clone()),
        ]
    );
    // Golden files keep input_ids as I64.
    let ids: Vec<i64> = vec![5, 0, 96, 1 << 20];
    let path2 = dir.path().join("golden.safetensors");
    write_st(
        &path2,
        &[
            (
                "input_ids".into(),
                Dtype::I64,
                vec![4],
                ids.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            raw_f32("logits", &[3, 5], &l),
        ],
    );
    let g = Checkpoint::open_file(&path2).unwrap();
    assert_eq!(g.i64("input_ids").unwrap(), ids);
    assert!(matches!(
        g.i64("logits").unwrap_err(),
        WeightError::UnsupportedDtype { .. }
    ));
    let all = read_all_f32(&path2).unwrap();
    assert_eq!(all[0].2, vec![5.0, 0.0, 96.0, (1 << 20) as f32]);
    // Writer errors name the tensor.
    let err = write_f32(&path, &[("bad", &[2, 2], &l[..3])], &[]).unwrap_err();
    assert!(
        matches!(&err, WeightError::Write { tensor, .. } if tensor == "bad"),
        "{err:?}"
    );
    let err = write_f32(&path, &[("x", &[1], &l[..1]), ("x", &[1], &l[..1])], &[]).unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random shapes (rank 1–3, extents 1–17) and values round-trip exactly: F32 bit for bit,
    /// BF16 as its decoded value.
    #[test]
    fn random_tensors_round_trip_exactly(
        shape in prop::collection::vec(1usize..18, 1..4),
        seed in any::<u64>(),
    ) {
        let n: usize = shape.iter().product();
        let x: Vec<f32> = values(n, seed);
        prop_assume!(x.iter().all(|v| *v != 0.0));
        let b: Vec<u16> = x.iter().map(|v| bf16::encode(*v, Overflow::Saturate)).collect();
        let dir = tmp();
        write_st(&dir.path().join("model.safetensors"), &[
            raw_f32("f", &shape, &x),
            ("b".into(), Dtype::BF16, shape.clone(), u16_bytes(&b)),
        ]);
        let c = Checkpoint::open(dir.path()).unwrap();
        let got = c.f32("f", &shape).unwrap();
        prop_assert_eq!(
            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let want_b: Vec<f32> = b.iter().map(|&v| bf16::decode(v)).collect();
        prop_assert_eq!(c.f32("b", &shape).unwrap(), want_b);
    }
}

/// The expected shape of `name` (which must be listed).
fn shape_of<'a>(t: &'a [ExpectedTensor], name: &str) -> &'a [usize] {
    &t.iter().find(|e| e.name == name).unwrap().shape
}

/// Counts of expected tensors per kind for the committed full-size configs.
#[test]
fn expected_tensor_counts_for_committed_configs() {
    let count = |file: &str| {
        let cfg = load_config(&testdata(file)).unwrap();
        (cfg.clone(), expected_tensors(&cfg))
    };
    // Kimi-K2: 61 layers = 1 dense + 60 MoE, 384 experts, q_lora_rank set, untied lm_head.
    // Per layer: 2 norms + 7 MLA; dense 3; MoE gate + bias + 3 shared + 384 × 3 routed.
    let (cfg, t) = count("kimi_k2_config.json");
    assert_eq!(cfg.num_layers(), 61);
    assert_eq!(t.len(), 3 + 61 * 9 + 3 + 60 * (5 + 384 * 3));
    let routed = t
        .iter()
        .filter(|e| e.name.contains(".mlp.experts."))
        .count();
    assert_eq!(routed, 60 * 384 * 3);
    assert!(t.iter().all(|e| e.required && e.storage == Storage::Float));
    let dense = t
        .iter()
        .filter(|e| e.name.ends_with(".mlp.gate_proj.weight"))
        .count();
    assert_eq!(dense, 1);
    // The published checkpoint's shape.
    assert_eq!(
        shape_of(&t, "model.layers.0.self_attn.kv_b_proj.weight"),
        [16384, 512]
    );
    // DeepSeek-V3.2: 3 dense + 58 MoE of 256 experts; +5 indexer tensors per layer.
    let (_, t) = count("deepseek_v32_config.json");
    assert_eq!(t.len(), 3 + 61 * (9 + 5) + 3 * 3 + 58 * (5 + 256 * 3));
    // The published checkpoint's shape.
    assert_eq!(
        shape_of(&t, "model.layers.60.self_attn.indexer.wq_b.weight"),
        [8192, 1536]
    );
    // Qwen3-Next: 48 layers, 12 gated GQA (6 tensors) + 36 Gated DeltaNet (7), all MoE with
    // 512 experts, gate + 3 shared + shared gate.
    let (_, t) = count("qwen3_next_config.json");
    assert_eq!(t.len(), 3 + 48 * 2 + 12 * 6 + 36 * 7 + 48 * (5 + 512 * 3));
    // Kimi Linear: 27 layers, 7 MLA (q_proj: 5 tensors) + 20 KDA (15), 1 dense + 26 MoE of 256.
    let (_, t) = count("kimi_linear_config.json");
    assert_eq!(
        t.len(),
        3 + 27 * 2 + 7 * 5 + 20 * 15 + 3 + 26 * (5 + 256 * 3)
    );
    // day0 hybrid: MXFP4 experts appear as two fused MXFP4 tensors per MoE layer.
    let (cfg, t) = count("day0_hybrid_config.json");
    let moe_layers = cfg
        .layers
        .iter()
        .filter(|l| l.ffn == model::config::FfnKind::Moe)
        .count();
    let mx: Vec<_> = t.iter().filter(|e| e.storage == Storage::Mxfp4).collect();
    assert_eq!(mx.len(), 2 * moe_layers);
    assert!(moe_layers > 0);
}

/// Writes a checkpoint holding exactly `tensors` (f32, non-zero data).
fn write_listing(dir: &Path, tensors: &[(String, Vec<usize>)]) {
    let raws: Vec<Raw> = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, s))| raw_f32(n, s, &values(s.iter().product(), i as u64)))
        .collect();
    write_st(&dir.join("model.safetensors"), &raws);
}

/// Checks `ckpt` against `cfg`: no problem, no extra tensor, and `verify` agrees.
fn assert_clean(
    ckpt: &Checkpoint,
    cfg: &model::config::ModelConfig,
    what: &str,
) -> model::weights::VerifyReport {
    let report = check(ckpt, cfg);
    assert!(report.problems.is_empty(), "{what}: {:?}", report.problems);
    assert!(report.extra.is_empty(), "{what}: {:?}", report.extra);
    verify(ckpt, cfg).unwrap();
    report
}

/// The names and shapes transformers 5.24 writes (listed by `model/testdata/hf_names/generate.py`)
/// are exactly what `expected_tensors` says, and such a checkpoint verifies with nothing extra.
#[test]
fn expected_tensors_match_what_transformers_writes() {
    for name in [
        "deepseek_v3_no_q_lora_tied",
        "deepseek_v32",
        "qwen3_next_mlp_only",
        "kimi_linear",
    ] {
        let path = testdata(&format!("hf_names/{name}.json"));
        let listing: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let cfg = parse_config(&listing["config"].to_string(), name).unwrap();
        let written: Vec<(String, Vec<usize>)> = listing["tensors"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| {
                let shape = v["shape"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| d.as_u64().unwrap() as usize)
                    .collect();
                (k.clone(), shape)
            })
            .collect();
        let mut expected: Vec<(String, Vec<usize>)> = expected_tensors(&cfg)
            .into_iter()
            .filter(|t| t.required || written.iter().any(|(n, _)| *n == t.name))
            .map(|t| (t.name, t.shape))
            .collect();
        expected.sort();
        assert_eq!(expected, written, "{name}");
        let dir = tmp();
        write_listing(dir.path(), &written);
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        assert_clean(&ckpt, &cfg, name);
    }
}

/// The tiny checkpoints transformers wrote for the golden tests (single file and sharded): every
/// directory under `testdata/tiny`, the awkward shapes (`awk_*`: empty shared experts, no MoE,
/// dense layers among MoE ones, kimi_k2...) included.
#[test]
fn tiny_golden_checkpoints_verify() {
    let mut names: Vec<String> = std::fs::read_dir(testdata("tiny"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("config.json").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.len() >= 4, "{names:?}");
    for name in &names {
        let name = name.as_str();
        let dir = testdata(&format!("tiny/{name}"));
        let cfg = load_config(&dir).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let report = assert_clean(&ckpt, &cfg, name);
        // transformers 5 saves per-expert tensors, except for Qwen3-VL-MoE, whose checkpoints
        // keep the fused experts (`gate_up_proj [E, 2I, H]`, `down_proj [E, H, I]`), and gpt-oss,
        // whose fused experts are input-major (`[E, H, 2I]`, `[E, I, H]`; MXFP4 in releases), as
        // Llama 4's are.
        let want = match cfg.family {
            model::config::Family::Qwen3VlMoe => ExpertLayout::Fused,
            model::config::Family::GptOss | model::config::Family::Llama4 => {
                ExpertLayout::FusedInOut
            }
            _ => ExpertLayout::PerExpert,
        };
        assert!(
            report.expert_layouts.iter().all(|(_, l)| *l == want),
            "{name}: {:?}",
            report.expert_layouts
        );
        // Every expected tensor reads as f32 with its expected shape.
        for t in expected_tensors(&cfg) {
            if ckpt.contains(&t.name) {
                let v = ckpt.f32(&t.name, &t.shape).unwrap();
                assert_eq!(v.len(), t.shape.iter().product::<usize>());
            }
        }
    }
    let sharded = Checkpoint::open(&testdata("tiny/deepseek_v32")).unwrap();
    assert_eq!(sharded.files().len(), 4);
}

/// A small DeepSeek-V3 configuration for verify tests: 3 layers (1 dense + 2 MoE of 4 experts).
fn small_v3(extra: &str) -> model::config::ModelConfig {
    let text = format!(
        r#"{{"model_type": "deepseek_v3", "hidden_size": 64, "vocab_size": 97,
            "num_hidden_layers": 3, "num_attention_heads": 4, "q_lora_rank": 48,
            "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
            "v_head_dim": 16, "intermediate_size": 96, "moe_intermediate_size": 32,
            "first_k_dense_replace": 1, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "n_group": 2, "topk_group": 1 {extra}}}"#
    );
    parse_config(&text, "small_v3.json").unwrap()
}

#[test]
fn verify_reports_every_problem_at_once_and_tolerates_extras() {
    let cfg = small_v3("");
    let mut tensors: Vec<(String, Vec<usize>)> = expected_tensors(&cfg)
        .into_iter()
        .map(|t| (t.name, t.shape))
        .collect();
    // One missing (a prefix typo), one wrong shape, one wrong dtype, plus an MTP-like layer.
    let typo = "model.layers.1.self_attn.kv_a_layernorm.weight";
    tensors.iter_mut().for_each(|(n, _)| {
        if n == typo {
            *n = "model.layers.1.self_attn.kv_a_layernorm.weigth".into();
        }
    });
    let wrong = "model.layers.2.mlp.experts.3.down_proj.weight";
    tensors
        .iter_mut()
        .filter(|(n, _)| n == wrong)
        .for_each(|(_, s)| *s = vec![32, 64]);
    tensors.retain(|(n, _)| n != "model.norm.weight");
    tensors.push(("model.layers.3.mtp.weight".into(), vec![4]));
    tensors.push(("model.layers.3.mtp.bias".into(), vec![4]));
    let dir = tmp();
    let mut raws: Vec<Raw> = tensors
        .iter()
        .enumerate()
        .map(|(i, (n, s))| raw_f32(n, s, &values(s.iter().product(), i as u64)))
        .collect();
    raws.push((
        "model.norm.weight".into(),
        Dtype::I32,
        vec![64],
        vec![0; 256],
    ));
    write_st(&dir.path().join("model.safetensors"), &raws);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let report = check(&ckpt, &cfg);
    assert_eq!(
        report.extra,
        vec![
            "model.layers.1.self_attn.kv_a_layernorm.weigth",
            "model.layers.3.mtp.bias",
            "model.layers.3.mtp.weight"
        ]
    );
    assert!(report
        .extra_summary()
        .contains(&"model.layers.3.* (2 tensors)".to_string()));
    let err = verify(&ckpt, &cfg).unwrap_err();
    let WeightError::Verify { problems, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        matches!(&problems[0], WeightError::MissingTensor { tensor, close, .. }
        if tensor == typo && close[0] == "model.layers.1.self_attn.kv_a_layernorm.weigth")
    );
    assert!(
        matches!(&problems[1], WeightError::WrongShape { tensor, expected, found, .. }
        if tensor == wrong && *expected == vec![64, 32] && *found == vec![32, 64])
    );
    assert!(
        matches!(&problems[2], WeightError::UnsupportedDtype { tensor, dtype, .. }
        if tensor == "model.norm.weight" && dtype == "I32")
    );
    let msg = err.to_string();
    assert!(
        msg.contains("3 problem(s)") && msg.contains(typo) && msg.contains(wrong),
        "{msg}"
    );
}

#[test]
fn verify_accepts_fused_experts_and_fp8_block_weights() {
    let cfg = small_v3("");
    let (e, h, i) = (4, 64, 32);
    let mut tensors: Vec<(String, Vec<usize>)> = expected_tensors(&cfg)
        .into_iter()
        .filter(|t| !t.name.contains("mlp.experts."))
        .map(|t| (t.name, t.shape))
        .collect();
    // Layer 1 fused (transformers' in-memory layout); layer 2 per expert with one FP8 weight.
    tensors.push((
        "model.layers.1.mlp.experts.gate_up_proj".into(),
        vec![e, 2 * i, h],
    ));
    tensors.push(("model.layers.1.mlp.experts.down_proj".into(), vec![e, h, i]));
    for x in 0..e {
        for (p, s) in [
            ("gate_proj", [i, h]),
            ("up_proj", [i, h]),
            ("down_proj", [h, i]),
        ] {
            if !(x == 0 && p == "gate_proj") {
                tensors.push((
                    format!("model.layers.2.mlp.experts.{x}.{p}.weight"),
                    s.to_vec(),
                ));
            }
        }
    }
    let dir = tmp();
    let mut raws: Vec<Raw> = tensors
        .iter()
        .enumerate()
        .map(|(k, (n, s))| raw_f32(n, s, &values(s.iter().product(), k as u64)))
        .collect();
    let fp8 = packing::fp8_block_quant("w", &values(i * h, 99), &[i, h], 128).unwrap();
    raws.push((
        "model.layers.2.mlp.experts.0.gate_proj.weight".into(),
        Dtype::F8_E4M3,
        vec![i, h],
        fp8.weight,
    ));
    raws.push(raw_f32(
        "model.layers.2.mlp.experts.0.gate_proj.weight_scale_inv",
        &fp8.scale_shape,
        &fp8.scale_inv,
    ));
    write_st(&dir.path().join("model.safetensors"), &raws);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let report = assert_clean(&ckpt, &cfg, "fused + fp8");
    assert_eq!(
        report.expert_layouts,
        vec![(1, ExpertLayout::Fused), (2, ExpertLayout::PerExpert)]
    );
    // A scale of the wrong shape is reported against the scale tensor.
    let mut bad = raws.clone();
    bad.retain(|r| !r.0.ends_with("_scale_inv"));
    bad.push(raw_f32(
        "model.layers.2.mlp.experts.0.gate_proj.weight_scale_inv",
        &[2, 1],
        &[1.0, 1.0],
    ));
    let dir2 = tmp();
    write_st(&dir2.path().join("model.safetensors"), &bad);
    let err = verify(&Checkpoint::open(dir2.path()).unwrap(), &cfg).unwrap_err();
    assert!(err.to_string().contains("weight_scale_inv"), "{err}");
}

#[test]
fn verify_checks_mxfp4_experts_of_the_hybrid_config() {
    // A small day0 hybrid: MLA/dense, GDN/MoE, DSA/MoE; 4 MXFP4 experts of 32 × 64.
    let cfg = parse_config(
        r#"{"model_type": "day0_hybrid", "hidden_size": 64, "vocab_size": 97, "rope_theta": 10000,
            "mla": {"num_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
                    "qk_rope_head_dim": 8, "v_head_dim": 8},
            "indexer": {"n_heads": 2, "head_dim": 8, "topk": 4},
            "linear_attention": {"num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 8,
                                 "value_head_dim": 8, "decay": "scalar"},
            "dense_mlp": {"intermediate_size": 96},
            "moe": {"num_experts": 4, "experts_per_token": 2, "intermediate_size": 32,
                    "shared_experts": 1, "router": "sigmoid_group_topk", "expert_format": "mxfp4"},
            "layers": [{"attention": "mla", "ffn": "dense"}, {"attention": "linear", "ffn": "moe"},
                       {"attention": "dsa", "ffn": "moe"}]}"#,
        "small_hybrid.json",
    )
    .unwrap();
    // Write only the MXFP4 experts of the first MoE layer, correctly, and one of the second with
    // the wrong number of rows; the rest is absent, which verify must list too.
    let expected = expected_tensors(&cfg);
    let mx: Vec<_> = expected
        .iter()
        .filter(|t| t.storage == Storage::Mxfp4)
        .collect();
    let mut raws: Vec<Raw> = Vec::new();
    for (k, t) in mx.iter().take(3).enumerate() {
        // Logical [E, G·32, rows] ← blocks [E, rows, G, 16].
        let (e, cols, rows) = (t.shape[0], t.shape[1], t.shape[2] + usize::from(k == 2));
        let g = cols / 32;
        raws.push((
            format!("{}_blocks", t.name),
            Dtype::U8,
            vec![e, rows, g, 16],
            vec![0x21; e * rows * g * 16],
        ));
        raws.push((
            format!("{}_scales", t.name),
            Dtype::U8,
            vec![e, rows, g],
            vec![127; e * rows * g],
        ));
    }
    let dir = tmp();
    write_st(&dir.path().join("model.safetensors"), &raws);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let report = check(&ckpt, &cfg);
    let wrong: Vec<_> = report
        .problems
        .iter()
        .filter(|p| matches!(p, WeightError::WrongShape { .. }))
        .collect();
    assert_eq!(wrong.len(), 1, "{wrong:?}");
    assert_eq!(wrong[0].tensor(), Some(mx[2].name.as_str()));
    let missing = report
        .problems
        .iter()
        .filter(|p| matches!(p, WeightError::MissingTensor { .. }))
        .count();
    // Everything but the three MXFP4 tensors written (each MXFP4 tensor missing counts twice:
    // blocks and scales).
    let float_required = expected
        .iter()
        .filter(|t| t.storage == Storage::Float && t.required)
        .count();
    assert_eq!(missing, float_required + 2 * (mx.len() - 3));
    assert!(report.extra.is_empty());
    // The correct ones read back as the format module dequantises them.
    let first = ckpt.mxfp4_f32(&mx[0].name, &mx[0].shape).unwrap();
    assert!(first.iter().all(|v| *v == 0.5 || *v == 1.0));
}

/// Routed experts written per expert, fused, and as MXFP4 read back as the same per-expert
/// matrices.
#[test]
fn expert_banks_load_the_same_weights_from_every_layout() {
    let cfg = small_v3("");
    let bank = &model::weights::expert_banks(&cfg)[0];
    let (e, h, i) = (bank.experts, bank.hidden, bank.intermediate);
    let (gate, up, down) = (
        values(e * i * h, 21),
        values(e * i * h, 22),
        values(e * h * i, 23),
    );
    // Per expert.
    let mut raws = Vec::new();
    for x in 0..e {
        let g = &gate[x * i * h..(x + 1) * i * h];
        let u = &up[x * i * h..(x + 1) * i * h];
        let d = &down[x * h * i..(x + 1) * h * i];
        let p = &bank.prefix;
        raws.push(raw_f32(&format!("{p}.{x}.gate_proj.weight"), &[i, h], g));
        raws.push(raw_f32(&format!("{p}.{x}.up_proj.weight"), &[i, h], u));
        raws.push(raw_f32(&format!("{p}.{x}.down_proj.weight"), &[h, i], d));
    }
    let dir = tmp();
    write_st(&dir.path().join("model.safetensors"), &raws);
    let per = bank
        .load_f32(&Checkpoint::open(dir.path()).unwrap())
        .unwrap();
    assert_eq!(per.layout, ExpertLayout::PerExpert);
    assert_eq!((&per.gate, &per.up, &per.down), (&gate, &up, &down));
    // Fused: [E, 2I, H] with gate rows first.
    let gate_up: Vec<f32> = (0..e)
        .flat_map(|x| {
            gate[x * i * h..(x + 1) * i * h]
                .iter()
                .chain(&up[x * i * h..(x + 1) * i * h])
                .copied()
                .collect::<Vec<_>>()
        })
        .collect();
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            raw_f32(
                &format!("{}.gate_up_proj", bank.prefix),
                &[e, 2 * i, h],
                &gate_up,
            ),
            raw_f32(&format!("{}.down_proj", bank.prefix), &[e, h, i], &down),
        ],
    );
    let fused = bank
        .load_f32(&Checkpoint::open(dir.path()).unwrap())
        .unwrap();
    assert_eq!(fused.layout, ExpertLayout::Fused);
    assert_eq!((&fused.gate, &fused.up, &fused.down), (&gate, &up, &down));
    // Fused input-major (the released Qwen3-VL-MoE checkpoints): [E, H, 2I] with gate columns
    // first, [E, I, H].
    let mut gate_up_t = vec![0.0; e * h * 2 * i];
    let mut down_t = vec![0.0; e * i * h];
    for x in 0..e {
        for r in 0..i {
            for c in 0..h {
                gate_up_t[(x * h + c) * 2 * i + r] = gate[(x * i + r) * h + c];
                gate_up_t[(x * h + c) * 2 * i + i + r] = up[(x * i + r) * h + c];
                down_t[(x * i + r) * h + c] = down[(x * h + c) * i + r];
            }
        }
    }
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            raw_f32(
                &format!("{}.gate_up_proj", bank.prefix),
                &[e, h, 2 * i],
                &gate_up_t,
            ),
            raw_f32(&format!("{}.down_proj", bank.prefix), &[e, i, h], &down_t),
        ],
    );
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let in_out = bank.load_f32(&ckpt).unwrap();
    assert_eq!(in_out.layout, ExpertLayout::FusedInOut);
    assert_eq!(
        (&in_out.gate, &in_out.up, &in_out.down),
        (&gate, &up, &down)
    );
    let report = model::weights::check(&ckpt, &cfg);
    assert!(report
        .expert_layouts
        .contains(&(bank.layer, ExpertLayout::FusedInOut)));
    assert!(report
        .problems
        .iter()
        .all(|p| !p.to_string().contains(&bank.prefix)));
    // MXFP4: random packed bytes; the expected matrices are gpt_oss_dequant's output transposed
    // back to [out, in] per expert.
    let p = &bank.prefix;
    let packed = |rows: usize, cols: usize, seed: u64| {
        let g = cols / 32;
        let blocks = bytes_random(e * rows * g * 16, seed);
        let scales: Vec<u8> = bytes_random(e * rows * g, seed + 1)
            .iter()
            .map(|b| 122 + b % 10)
            .collect();
        (blocks, vec![e, rows, g, 16], scales, vec![e, rows, g])
    };
    let gu = packed(2 * i, h, 31);
    let dn = packed(h, i, 41);
    let dir = tmp();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            (
                format!("{p}.gate_up_proj_blocks"),
                Dtype::U8,
                gu.1.clone(),
                gu.0.clone(),
            ),
            (
                format!("{p}.gate_up_proj_scales"),
                Dtype::U8,
                gu.3.clone(),
                gu.2.clone(),
            ),
            (
                format!("{p}.down_proj_blocks"),
                Dtype::U8,
                dn.1.clone(),
                dn.0.clone(),
            ),
            (
                format!("{p}.down_proj_scales"),
                Dtype::U8,
                dn.3.clone(),
                dn.2.clone(),
            ),
        ],
    );
    let mx = bank
        .load_f32(&Checkpoint::open(dir.path()).unwrap())
        .unwrap();
    assert_eq!(mx.layout, ExpertLayout::Mxfp4);
    let (gu_t, gu_shape) = packing::gpt_oss_dequant("gu", &gu.0, &gu.1, &gu.2, &gu.3).unwrap();
    let (dn_t, dn_shape) = packing::gpt_oss_dequant("dn", &dn.0, &dn.1, &dn.2, &dn.3).unwrap();
    assert_eq!((gu_shape, dn_shape), (vec![e, h, 2 * i], vec![e, i, h]));
    for x in 0..e {
        for r in 0..i {
            for c in 0..h {
                let at = (x * i + r) * h + c;
                assert_eq!(mx.gate[at], gu_t[(x * h + c) * 2 * i + r]);
                assert_eq!(mx.up[at], gu_t[(x * h + c) * 2 * i + i + r]);
                assert_eq!(mx.down[(x * h + c) * i + r], dn_t[(x * i + r) * h + c]);
            }
        }
    }
    assert!(mx.gate.iter().any(|v| *v != 0.0));
    // No bank at all: the first per-expert tensor is named.
    let empty = tmp();
    write_st(
        &empty.path().join("model.safetensors"),
        &[raw_f32("x", &[1], &[1.0])],
    );
    let err = bank
        .load_f32(&Checkpoint::open(empty.path()).unwrap())
        .unwrap_err();
    assert!(
        matches!(&err, WeightError::MissingTensor { tensor, .. } if tensor.ends_with(".0.gate_proj.weight")),
        "{err:?}"
    );
}
