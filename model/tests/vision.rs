//! The vision encoder (Qwen3-VL-MoE): its configuration, the processor's geometry, and a
//! cost-only encode at the released sizes.

use accel_sim::DevicePreset;
use dsl_core::Launcher;
use model::forward::vision::{cu_seqlens, encode_cost};
use model::vision::{load_vision_config, parse_vision_config, PixelLimits, VisionError};
use std::path::Path;

const CONFIG: &str = "testdata/qwen3_vl_235b_a22b_config.json";

#[test]
fn reads_the_235b_vision_config() {
    let cfg = load_vision_config(Path::new(CONFIG)).unwrap();
    assert_eq!(
        (cfg.depth, cfg.hidden_size, cfg.num_heads, cfg.head_dim()),
        (27, 1152, 16, 72)
    );
    assert_eq!(
        (cfg.patch_values(), cfg.merged_width(), cfg.pos_embed_side()),
        (1536, 4608, 48)
    );
    assert_eq!(cfg.deepstack_visual_indexes, [8, 16, 24]);
    assert!(cfg.gelu_tanh);
    // ~0.58B: patch embedding, 48² positions, 27 blocks, the merger and three DeepStack mergers.
    let p = cfg.params();
    assert!((570_000_000..590_000_000).contains(&p), "{p}");
}

#[test]
fn bad_vision_configs_name_the_field() {
    let e = parse_vision_config(r#"{"model_type": "qwen3_vl_moe"}"#, "c.json").unwrap_err();
    assert!(e.to_string().contains("vision_config"), "{e}");
    let text = std::fs::read_to_string(CONFIG).unwrap();
    for (from, to, field) in [
        ("\"num_heads\": 16", "\"num_heads\": 5", "num_heads"),
        (
            "\"num_position_embeddings\": 2304",
            "\"num_position_embeddings\": 2300",
            "num_position_embeddings",
        ),
        ("[8, 16, 24]", "[8, 16, 27]", "deepstack_visual_indexes"),
    ] {
        let e = parse_vision_config(&text.replace(from, to), "c.json").unwrap_err();
        assert!(e.to_string().contains(field), "{field}: {e}");
    }
}

#[test]
fn image_grids_follow_the_processor() {
    let cfg = load_vision_config(Path::new(CONFIG)).unwrap();
    let l = PixelLimits::QWEN3_VL;
    assert_eq!(cfg.image_grid("a", 1024, 1024, l).unwrap(), [1, 64, 64]);
    assert_eq!(cfg.image_grid("b", 1080, 1920, l).unwrap(), [1, 68, 120]);
    // Tiny images are scaled up to the minimum pixel count, never rejected as too small.
    assert_eq!(cfg.image_grid("c", 16, 16, l).unwrap(), [1, 16, 16]);
    match cfg.image_grid("zero.png", 0, 640, l) {
        Err(VisionError::Image { what, .. }) => assert_eq!(what, "zero.png"),
        other => panic!("expected an image error, got {other:?}"),
    }
    assert_eq!(cu_seqlens(&[[1, 4, 6], [2, 2, 2]]), [0, 24, 28, 32]);
}

#[test]
fn encoding_two_images_costs_every_operator_and_keeps_physics() {
    let cfg = load_vision_config(Path::new(CONFIG)).unwrap();
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let grids = [[1, 32, 32], [1, 16, 24]];
    let cost = encode_cost(&cfg, &grids, &launcher).unwrap();
    assert_eq!(cost.patches, 32 * 32 + 16 * 24);
    assert_eq!(cost.tokens, cost.patches / 4);
    let ops = &cost.stats.per_op;
    for op in [
        "vision.patch_embed",
        "vision.pos_embed",
        "vision.qkv",
        "vision.rope",
        "vision.attention",
        "vision.gelu",
        "vision.merger.fc2",
        "vision.deepstack_merger.fc2",
    ] {
        let (n, c) = ops
            .get(op)
            .copied()
            .unwrap_or_else(|| panic!("{op} not booked"));
        assert!(n > 0 && c > 0, "{op}: {n} launches, {c} cycles");
    }
    assert_eq!(ops["vision.attention"].0, 27);
    assert_eq!(ops["vision.deepstack_merger.fc2"].0, 3);
    // The attention's useful work at the matrix unit's peak is a floor on its time.
    let p = DevicePreset::load("npu-910b").unwrap();
    let flop: u64 = cost.stats.traffic["vision.attention"].flop;
    // The fastest matrix mode on every core: a floor whatever dtype the kernel runs at.
    let peak = p
        .matrix
        .flop_per_cycle
        .values()
        .fold(0.0f64, |a, b| a.max(*b))
        * p.cores as f64;
    let floor = flop as f64 / peak;
    assert!(flop > 0);
    assert!(
        ops["vision.attention"].1 as f64 >= floor,
        "attention beats the matrix unit"
    );
}

/// The tiny encoder written by transformers (`tests/reference/gen_vision.py`): day0's encoder on
/// its weights and pixel rows gives transformers' merged tokens and DeepStack features, two
/// images of different patch grids in one batch.
#[test]
fn tiny_encoder_matches_transformers() {
    use model::forward::vision::{encode_functional, VisionWeights};
    use model::weights::Checkpoint;
    let dir = Path::new("testdata/vision/qwen3_vl_moe_tiny");
    let cfg = load_vision_config(dir).unwrap();
    let ckpt = Checkpoint::open_file(&dir.join("golden.safetensors")).unwrap();
    let weights = VisionWeights::<f32>::load(&ckpt, &cfg, "model.visual.").unwrap();
    let grid = ckpt.i64("grid_thw").unwrap();
    let grids: Vec<[usize; 3]> = grid
        .chunks(3)
        .map(|g| [g[0] as usize, g[1] as usize, g[2] as usize])
        .collect();
    let n: usize = grids.iter().map(|g| g.iter().product::<usize>()).sum();
    let pv = ckpt.f32("pixel_values", &[n, cfg.patch_values()]).unwrap();
    let pixels = dsl_core::Tensor::from_f32(&[n, cfg.patch_values()], &pv).unwrap();
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let (out, stats) =
        encode_functional(&cfg, &weights, &pixels, &grids, &launcher, false).unwrap();
    let compare = |name: &str, got: &dsl_core::Tensor<f32>| {
        let want = ckpt.f32(name, got.shape()).unwrap();
        let got = got.to_vec().unwrap();
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        // 1e-5 of the largest value: f32 rounding gives ~4e-7; the tanh GELU in place of the
        // exact one (or the reverse) moves the tokens by ~8e-5.
        assert!(
            err <= 1e-5 * scale,
            "{name}: max |Δ| {err} against max |x| {scale}"
        );
    };
    assert_eq!(out.tokens.shape(), [n / 4, cfg.out_hidden_size]);
    compare("tokens", &out.tokens);
    assert_eq!(out.deepstack.len(), 2);
    for (j, d) in out.deepstack.iter().enumerate() {
        compare(&format!("deepstack.{j}"), d);
    }
    assert!(stats.total_cycles() > 0);
}

/// The processor on the committed test images against transformers' (`processor.safetensors`):
/// the same grid and the same patch rows within 1e-6, for an image already at its target size
/// and for one the processor resizes (width shrunk 50 → 48, height grown 30 → 32: both branches of
/// the antialiased bicubic).
#[test]
fn processor_matches_transformers_on_the_test_images() {
    use model::vision::processor::{load_image, preprocess, ProcessorConfig};
    use model::weights::Checkpoint;
    let dir = Path::new("testdata/vision/qwen3_vl_moe_tiny");
    let cfg = load_vision_config(dir).unwrap();
    let p = ProcessorConfig::load(dir, &cfg).unwrap();
    assert_eq!(p.limits.min_pixels, 256);
    let golden = Checkpoint::open_file(&dir.join("processor.safetensors")).unwrap();
    for name in ["a", "b"] {
        let path = dir.join(format!("image_{name}.png"));
        let (h, w, rgb) = load_image(&path, p.limits).unwrap();
        let img = preprocess(name, h, w, &rgb, &p).unwrap();
        let grid = golden.i64(&format!("grid_thw.{name}")).unwrap();
        assert_eq!(
            img.grid.map(|g| g as i64).to_vec(),
            grid,
            "image {name}: grid"
        );
        let rows = img.grid.iter().product::<usize>();
        let want = golden
            .f32(&format!("pixel_values.{name}"), &[rows, cfg.patch_values()])
            .unwrap();
        let diffs: Vec<f32> = img
            .pixels
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .collect();
        let max = diffs.iter().fold(0.0f32, |m, d| m.max(*d));
        assert!(max <= 1e-6, "image {name}: max |Δ| {max}");
    }
}

/// A JPEG (`image_c.jpg`, quality 95 without chroma subsampling) decodes to what PIL decodes
/// within two levels per channel, 98% of values equal (the `image` crate's zune-jpeg and PIL's
/// libjpeg round their integer IDCTs differently), and the processor's patch rows stay within
/// those two levels, normalised, of transformers'.
#[test]
fn jpeg_decodes_like_pil() {
    use model::vision::processor::{load_image, preprocess, ProcessorConfig};
    let dir = Path::new("testdata/vision/qwen3_vl_moe_tiny");
    let cfg = load_vision_config(dir).unwrap();
    let p = ProcessorConfig::load(dir, &cfg).unwrap();
    let bytes = std::fs::read(dir.join("jpeg.safetensors")).unwrap();
    let golden = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let pil = golden.tensor("rgb.c").unwrap();
    let (h, w, rgb) = load_image(&dir.join("image_c.jpg"), p.limits).unwrap();
    assert_eq!(pil.shape(), [h, w, 3]);
    let level = rgb
        .iter()
        .zip(pil.data())
        .map(|(a, b)| a.abs_diff(*b))
        .max()
        .unwrap();
    let same = rgb.iter().zip(pil.data()).filter(|(a, b)| a == b).count();
    assert!(
        level <= 2,
        "decoded RGB differs from PIL's by {level} levels"
    );
    assert!(
        100 * same >= 95 * rgb.len(),
        "{same} of {} values equal PIL's",
        rgb.len()
    );
    let img = preprocess("image_c.jpg", h, w, &rgb, &p).unwrap();
    assert_eq!(img.grid, [1, 12, 16]);
    let want: Vec<f32> = golden
        .tensor("pixel_values.c")
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(want.len(), img.pixels.len());
    // Two levels, normalised: 2/255 over the smallest channel std.
    let bound = (2.0 / 255.0) / p.std.iter().fold(f64::MAX, |m, s| m.min(*s)) + 1e-6;
    let max = img
        .pixels
        .iter()
        .zip(&want)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!((max as f64) <= bound, "pixel rows: max |Δ| {max} > {bound}");
}

/// Bad images are errors naming the file and what is wrong, never panics.
#[test]
fn bad_images_are_errors_naming_the_file() {
    use model::vision::processor::load_image;
    let tmp = tempfile::tempdir().unwrap();
    let text = tmp.path().join("notes.png");
    std::fs::write(&text, "not an image").unwrap();
    let small = PixelLimits {
        min_pixels: 16,
        max_pixels: 1000,
    };
    let e = load_image(&text, small).unwrap_err().to_string();
    assert!(e.contains("notes.png") && e.contains("PNG or JPEG"), "{e}");
    let big = Path::new("testdata/vision/qwen3_vl_moe_tiny/image_a.png");
    let e = load_image(big, small).unwrap_err().to_string();
    assert!(
        e.contains("image_a.png") && e.contains("max_pixels 1000"),
        "{e}"
    );
    let missing = tmp.path().join("missing.jpg");
    let e = load_image(&missing, small).unwrap_err().to_string();
    assert!(e.contains("missing.jpg"), "{e}");
}

/// The language model of the Qwen3-VL-235B configuration parses as a Qwen3-MoE: 94 GQA layers
/// with q/k norm and no output gate, 128 experts (8 active, softmax top-k renormalised, no shared
/// expert); 235B parameters in all, about 22B active (the name's "235B-A22B"), vision encoder
/// aside.
#[test]
fn the_235b_language_model_parses() {
    use model::config::{load_config, AttentionKind, RouterKind};
    let cfg = load_config(Path::new(CONFIG)).unwrap();
    assert_eq!(cfg.num_layers(), 94);
    assert!(cfg.layers.iter().all(|l| l.attention == AttentionKind::Gqa));
    let g = cfg.gqa.as_ref().unwrap();
    assert_eq!(
        (g.heads, g.kv_heads, g.head_dim, g.qk_norm, g.output_gate),
        (64, 4, 128, true, false)
    );
    let m = cfg.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.experts,
            m.experts_per_token,
            m.intermediate_size,
            m.shared_experts
        ),
        (128, 8, 1536, 0)
    );
    assert_eq!(m.router, RouterKind::SoftmaxTopk);
    assert!(m.norm_topk_prob);
    assert_eq!(cfg.rope.as_ref().unwrap().theta, 5e6);
    // 24 + 20 + 20 = the 64 frequencies of a 128-wide head; images at token 151655.
    assert_eq!(cfg.rope.as_ref().unwrap().mrope_section, Some([24, 20, 20]));
    assert_eq!(cfg.vision.as_ref().unwrap().image_token_id, 151655);
    // A section that is not three counts, or wider than the head's frequencies, names the field.
    let text = std::fs::read_to_string(CONFIG).unwrap();
    for (bad, why) in [
        ("[24, 20]", "three frequency counts"),
        ("[24, 20, 40]", "frequencies"),
    ] {
        let t = text.replace("[24, 20, 20]", bad);
        let e = model::config::parse_config(&t, "cfg.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mrope_section") && e.contains(why), "{e}");
    }
    let c = model::plan::params::count(&cfg);
    let (total, active) = (c.total() as f64 / 1e9, c.active() as f64 / 1e9);
    assert!((233.0..236.0).contains(&total), "total {total}B");
    assert!((21.0..23.0).contains(&active), "active {active}B");
    assert!(
        cfg.warnings
            .iter()
            .all(|w| !format!("{w:?}").contains("UnknownField")),
        "{:?}",
        cfg.warnings
    );
}

/// `day0 coverage` of a multimodal config lists the vision operators with their kernels, and
/// nothing is missing for Qwen3-VL-235B.
#[test]
fn coverage_lists_the_vision_operators() {
    let c = model::coverage::inventory(Path::new(CONFIG)).unwrap();
    let row = |op: &str| {
        c.rows.iter().find(|r| r.op == op).unwrap_or_else(|| {
            panic!(
                "no {op} row in {:?}",
                c.rows.iter().map(|r| &r.op).collect::<Vec<_>>()
            )
        })
    };
    assert_eq!(row("vision.attention").kernels, ["varlen_attention"]);
    assert_eq!(row("vision.attention").layers, 27);
    assert_eq!(row("vision.patch_embed").kernels, ["linear_bias"]);
    assert_eq!(row("vision.pos_embed").kernels, ["pos_embed_bilinear"]);
    assert_eq!(row("vision.deepstack").kernels, ["scatter_rows"]);
    assert_eq!(row("vision.gelu").kernels, ["gelu"]);
    assert!(c.missing().is_empty(), "{:?}", c.missing());
    // A text-only model has no vision rows.
    let k = model::coverage::inventory(Path::new("testdata/kimi_k2_config.json")).unwrap();
    assert!(k.rows.iter().all(|r| !r.op.starts_with("vision.")));
}

/// The tiny Qwen3-VL-MoE checkpoint on a prompt holding both test images
/// (`golden_image.safetensors`, tests/reference/gen_vision.py, transformers 5.25 in f32): the
/// images through the checkpoint's own processor config give transformers' patch rows (1e-6);
/// the prompt with one placeholder per image widens to transformers' ids; every encoder block's
/// output, the encoder's tokens and DeepStack features, the embedding with the image tokens in place, every layer's output
/// (DeepStack added after layers 0 and 1) and the logits match within 1e-4; the 16 greedy tokens
/// (decoding at the multi-axis positions after the images: `rope_delta` −46) are exact and each
/// step's logits match within 1e-4.
#[test]
fn image_prompt_matches_transformers() {
    use model::forward::validate::validate;
    use model::forward::Runner;
    use model::vision::processor::{load_image, preprocess, ProcessorConfig};
    use model::vision::{expand_image_tokens, mrope_positions};
    use model::weights::read_all_f32;
    const TOL: f64 = 1e-4;
    let dir = Path::new("testdata/tiny/qwen3_vl_moe");
    let g = read_all_f32(&dir.join("golden_image.safetensors")).unwrap();
    let t = |name: &str| -> &[f32] { &g.iter().find(|(n, _, _)| n == name).unwrap().2 };
    let ids = |name: &str| -> Vec<i64> { t(name).iter().map(|v| *v as i64).collect() };
    let (prompt, want_ids) = (ids("prompt_tokens"), ids("input_ids"));

    // The processor, configured by the checkpoint directory, on the committed images.
    let cfg = model::config::load_config(&dir.join("config.json")).unwrap();
    let vcfg = cfg.vision.clone().unwrap();
    let p = ProcessorConfig::load(dir, &vcfg).unwrap();
    let images: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            let path =
                Path::new("testdata/vision/qwen3_vl_moe_tiny").join(format!("image_{name}.png"));
            let (h, w, rgb) = load_image(&path, p.limits).unwrap();
            preprocess(name, h, w, &rgb, &p).unwrap()
        })
        .collect();
    let pixels: Vec<f32> = images.iter().flat_map(|i| i.pixels.clone()).collect();
    let max = pixels
        .iter()
        .zip(t("pixel_values"))
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert_eq!(pixels.len(), t("pixel_values").len());
    assert!(max <= 1e-6, "pixel rows: max |Δ| {max}");
    let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid).collect();
    let want_grid: Vec<usize> = t("image_grid_thw").iter().map(|v| *v as usize).collect();
    assert_eq!(grids.concat(), want_grid);

    // Placeholders widened and multi-axis positions as transformers' get_rope_index.
    let (widened, spans) = expand_image_tokens(
        &prompt,
        vcfg.image_token_id,
        &grids,
        vcfg.spatial_merge_size,
    )
    .unwrap();
    assert_eq!(widened, want_ids);
    let (pos, delta) = mrope_positions(&spans, vcfg.spatial_merge_size);
    let want_pos = t("position_ids");
    let n = want_ids.len();
    for (i, p) in pos.iter().enumerate() {
        for axis in 0..3 {
            assert_eq!(
                p[axis] as f32,
                want_pos[axis * n + i],
                "token {i} axis {axis}"
            );
        }
    }
    assert_eq!(delta as f32, t("rope_delta")[0]);

    // Encoder, prefill and every layer against transformers (validate runs the images).
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let mut r = Runner::load(dir, launcher.clone(), n).unwrap();
    let v = validate(&mut r, &prompt, &g, TOL).unwrap();
    let names: Vec<&str> = v.diffs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "vision.hidden_states.0",
            "vision.hidden_states.1",
            "vision.hidden_states.2",
            "vision.tokens",
            "vision.deepstack.0",
            "vision.deepstack.1",
            "embedding",
            "layer 0",
            "layer 1",
            "logits"
        ]
    );
    if let Some(d) = v.first_flagged() {
        panic!(
            "{} max rel error {:.3e} at {}",
            d.name, d.max_rel, d.worst_position
        );
    }
    assert_eq!(v.tokens, n);

    // Greedy generation after the images.
    let want_gen = ids("generated");
    let mut r = Runner::load(dir, launcher, n + want_gen.len()).unwrap();
    let enc = r.encode_images(&images).unwrap();
    let (gen, run_ids) = r
        .generate_with_images(&prompt, &enc, want_gen.len())
        .unwrap();
    assert_eq!(run_ids, want_ids);
    let got: Vec<i64> = gen.tokens.iter().map(|&t| t as i64).collect();
    assert_eq!(got, want_gen, "greedy tokens");
    let vocab = cfg.vocab_size;
    let want_logits = t("decode_logits");
    for (s, logits) in gen.step_logits.iter().enumerate() {
        let want: Vec<f64> = want_logits[s * vocab..(s + 1) * vocab]
            .iter()
            .map(|v| *v as f64)
            .collect();
        let err = kernels::reference::rel_error(logits, &want);
        assert!(err <= TOL, "decode step {s}: rel error {err:.3e}");
    }
    assert!(gen.prefill.per_op.contains_key("vision.attention"));
    assert!(gen.prefill.per_op.contains_key("vision.deepstack"));
}

/// The released Qwen3-VL-MoE checkpoints store the fused experts input-major (transformers
/// 4.57: `gate_up_proj [E, H, 2I]`, `down_proj [E, I, H]`; transformers 5 transposes them on
/// load). The tiny checkpoint rewritten that way runs the image prompt to the same numbers; its
/// `gate_up_proj` is square (`H = 2I`), so `down_proj` tells the layouts apart.
#[test]
fn released_expert_layout_runs_the_same() {
    use model::forward::validate::validate;
    use model::forward::Runner;
    use model::weights::{read_all_f32, write_f32, Checkpoint, ExpertLayout};
    let src = Path::new("testdata/tiny/qwen3_vl_moe");
    let tmp = tempfile::tempdir().unwrap();
    for f in ["config.json", "preprocessor_config.json"] {
        std::fs::copy(src.join(f), tmp.path().join(f)).unwrap();
    }
    let mut tensors = read_all_f32(&src.join("model.safetensors")).unwrap();
    let mut transposed = 0;
    for (name, shape, data) in &mut tensors {
        if name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj") {
            let (e, r, c) = (shape[0], shape[1], shape[2]);
            let mut t = vec![0.0; data.len()];
            for x in 0..e {
                for i in 0..r {
                    for j in 0..c {
                        t[(x * c + j) * r + i] = data[(x * r + i) * c + j];
                    }
                }
            }
            *data = t;
            *shape = vec![e, c, r];
            transposed += 1;
        }
    }
    assert_eq!(transposed, 4);
    let views: Vec<(&str, &[usize], &[f32])> = tensors
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice()))
        .collect();
    write_f32(&tmp.path().join("model.safetensors"), &views, &[]).unwrap();
    let cfg = model::config::load_config(&tmp.path().join("config.json")).unwrap();
    let report = model::weights::check(&Checkpoint::open(tmp.path()).unwrap(), &cfg);
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    assert!(report
        .expert_layouts
        .iter()
        .all(|(_, l)| *l == ExpertLayout::FusedInOut));
    let golden = read_all_f32(&src.join("golden_image.safetensors")).unwrap();
    let ids: Vec<i64> = golden
        .iter()
        .find(|(n, _, _)| n == "input_ids")
        .unwrap()
        .2
        .iter()
        .map(|v| *v as i64)
        .collect();
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let mut r = Runner::load(tmp.path(), launcher, ids.len()).unwrap();
    let v = validate(&mut r, &ids, &golden, 1e-4).unwrap();
    assert!(v.first_flagged().is_none(), "{:?}", v.first_flagged());
    assert_eq!(v.diffs.len(), 10);
}
