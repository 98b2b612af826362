//! Checking a checkpoint against what its configuration needs, reporting every problem at once.

use super::checkpoint::Checkpoint;
use super::convert::{
    mxfp4_logical_shape, FLOAT_DTYPES, FP8_SCALE_SUFFIX, MXFP4_BLOCKS_SUFFIX, MXFP4_SCALES_SUFFIX,
};
use super::error::WeightError;
use super::experts::ExpertLayout;
use super::names::{
    default_expert_layout, expected_parts, expert_banks, ExpectedTensor, Part, Storage,
};
use super::CloseNames;
use crate::config::ModelConfig;
use accel_sim::formats::packing::DEEPSEEK_FP8_BLOCK;
use std::collections::{BTreeMap, BTreeSet};

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyReport {
    /// Expected tensors looked at (an MXFP4 pair counts once).
    pub checked: usize,
    /// Missing tensors, wrong shapes and unsupported dtypes, in expected order.
    pub problems: Vec<WeightError>,
    /// Tensors the configuration does not explain (e.g. DeepSeek-V3's multi-token-prediction
    /// layer `model.layers.61.*`), sorted: reported, not an error. Empty tensors are never extras.
    pub extra: Vec<String>,
    /// The expert layout found (or assumed, when the bank is absent) per MoE layer.
    pub expert_layouts: Vec<(usize, ExpertLayout)>,
}

impl VerifyReport {
    /// The extra tensors grouped by layer (`model.layers.61.* (19 tensors)`) or listed by name
    /// when outside any layer: one line per group, for people.
    pub fn extra_summary(&self) -> Vec<String> {
        let mut groups: BTreeMap<String, usize> = BTreeMap::new();
        for name in &self.extra {
            let key = match layer_prefix(name) {
                Some(p) => format!("{p}.*"),
                None => name.clone(),
            };
            *groups.entry(key).or_default() += 1;
        }
        groups
            .into_iter()
            .map(|(k, n)| match (n, k.ends_with(".*")) {
                (1, false) => k,
                (1, true) => format!("{k} (1 tensor)"),
                _ => format!("{k} ({n} tensors)"),
            })
            .collect()
    }
}

/// `model.layers.N` (or a multimodal checkpoint's `model.language_model.layers.N`) of a name, if
/// it has one.
fn layer_prefix(name: &str) -> Option<&str> {
    let head = ["model.layers.", "model.language_model.layers."]
        .into_iter()
        .find(|h| name.starts_with(h))?;
    let rest = &name[head.len()..];
    let digits = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    if digits == 0 {
        return None;
    }
    Some(&name[..head.len() + digits])
}

/// Compares a checkpoint with the tensors `cfg` needs: every missing tensor, every shape and
/// dtype mismatch, and the tensors nothing expects. Routed experts may be in any
/// [`ExpertLayout`]; each bank is checked in the layout the checkpoint uses.
pub fn check(ckpt: &Checkpoint, cfg: &ModelConfig) -> VerifyReport {
    let banks = expert_banks(cfg);
    let fallback = cfg
        .moe
        .as_ref()
        .map(default_expert_layout)
        .unwrap_or(ExpertLayout::PerExpert);
    let layouts: Vec<ExpertLayout> = banks
        .iter()
        .map(|b| b.detect(ckpt).unwrap_or(fallback))
        .collect();
    let mut checker = Checker {
        ckpt,
        close: None,
        used: BTreeSet::new(),
        problems: Vec::new(),
        checked: 0,
    };
    for part in expected_parts(cfg) {
        match part {
            Part::Tensor(t) => checker.one(&t),
            Part::Bank(b) => {
                for t in banks[b].tensors(layouts[b]) {
                    checker.one(&t);
                }
            }
        }
    }
    // An empty tensor holds nothing to explain: transformers saves the empty modules a zero size
    // creates (DeepSeek's `shared_experts` with `n_shared_experts: 0` are `[0, hidden]` /
    // `[hidden, 0]`), which are not extras.
    let extra = ckpt
        .tensors
        .iter()
        .filter(|(n, t)| !checker.used.contains(n.as_str()) && !t.shape.contains(&0))
        .map(|(n, _)| n.clone())
        .collect();
    VerifyReport {
        checked: checker.checked,
        problems: checker.problems,
        extra,
        expert_layouts: banks.iter().map(|b| b.layer).zip(layouts).collect(),
    }
}

/// Checks a checkpoint against expected_tensors: every missing tensor and every shape/dtype
/// mismatch, all at once (not just the first), in one error value ([`WeightError::Verify`]).
/// Extra tensors are not errors; [`check`] lists them.
pub fn verify(ckpt: &Checkpoint, cfg: &ModelConfig) -> Result<(), WeightError> {
    let report = check(ckpt, cfg);
    if report.problems.is_empty() {
        return Ok(());
    }
    Err(WeightError::Verify {
        dir: ckpt.dir().display().to_string(),
        config: cfg.source.clone(),
        problems: report.problems,
    })
}

struct Checker<'a> {
    ckpt: &'a Checkpoint,
    /// Built on the first missing tensor (most checks never need it).
    close: Option<CloseNames>,
    used: BTreeSet<String>,
    problems: Vec<WeightError>,
    checked: usize,
}

impl Checker<'_> {
    fn one(&mut self, t: &ExpectedTensor) {
        self.checked += 1;
        match t.storage {
            Storage::Float => self.float(t),
            Storage::Mxfp4 => self.mxfp4(t),
        }
    }

    fn missing(&mut self, name: &str, shape: &[usize]) {
        let ckpt = self.ckpt;
        let close = self
            .close
            .get_or_insert_with(|| CloseNames::new(ckpt.tensors.keys().map(String::as_str)))
            .find(name);
        self.problems.push(WeightError::MissingTensor {
            file: ckpt.dir().display().to_string(),
            tensor: name.to_string(),
            expected: Some(shape.to_vec()),
            close,
        });
    }

    fn float(&mut self, t: &ExpectedTensor) {
        let ckpt = self.ckpt;
        let Some(e) = ckpt.tensors.get(&t.name) else {
            if t.required {
                self.missing(&t.name, &t.shape);
            }
            return;
        };
        self.used.insert(t.name.clone());
        if let Err(err) = ckpt.check_shape(&t.name, e, &t.shape) {
            self.problems.push(err);
        }
        let dtype = e.dtype.to_string();
        if FLOAT_DTYPES.split(", ").any(|d| d == dtype) {
            return;
        }
        let sname = format!("{}{FP8_SCALE_SUFFIX}", t.name);
        match (dtype.as_str(), ckpt.tensors.get(&sname)) {
            ("F8_E4M3", Some(s)) => {
                self.used.insert(sname.clone());
                let sdtype = s.dtype.to_string();
                if !FLOAT_DTYPES.split(", ").any(|d| d == sdtype) {
                    self.problems.push(WeightError::UnsupportedDtype {
                        file: ckpt.file_of(s),
                        tensor: sname.clone(),
                        dtype: sdtype,
                        accepted: FLOAT_DTYPES.into(),
                    });
                }
                if t.shape.len() == 2 {
                    let b = DEEPSEEK_FP8_BLOCK;
                    let want = [t.shape[0].div_ceil(b), t.shape[1].div_ceil(b)];
                    if let Err(err) = ckpt.check_shape(&sname, s, &want) {
                        self.problems.push(err);
                    }
                }
            }
            _ => self.problems.push(WeightError::UnsupportedDtype {
                file: ckpt.file_of(e),
                tensor: t.name.clone(),
                dtype,
                accepted: format!("{FLOAT_DTYPES}, or F8_E4M3 with a `{sname}` block-scale tensor"),
            }),
        }
    }

    fn mxfp4(&mut self, t: &ExpectedTensor) {
        let ckpt = self.ckpt;
        let bname = format!("{}{MXFP4_BLOCKS_SUFFIX}", t.name);
        let sname = format!("{}{MXFP4_SCALES_SUFFIX}", t.name);
        let (b, s) = (ckpt.tensors.get(&bname), ckpt.tensors.get(&sname));
        if b.is_none() {
            self.missing(&bname, &t.shape);
        }
        if s.is_none() {
            self.missing(&sname, &t.shape);
        }
        let (Some(b), Some(s)) = (b, s) else { return };
        self.used.insert(bname.clone());
        self.used.insert(sname.clone());
        for (name, e, ok) in [(&bname, b, "U8"), (&sname, s, "U8 or F8_E8M0")] {
            let dtype = e.dtype.to_string();
            if !ok.split(" or ").any(|d| d == dtype) {
                self.problems.push(WeightError::UnsupportedDtype {
                    file: ckpt.file_of(e),
                    tensor: name.clone(),
                    dtype,
                    accepted: ok.into(),
                });
            }
        }
        let logical = mxfp4_logical_shape(&b.shape);
        if logical.as_deref() != Some(t.shape.as_slice()) {
            self.problems.push(WeightError::WrongShape {
                file: ckpt.file_of(b),
                tensor: t.name.clone(),
                expected: t.shape.clone(),
                found: logical.unwrap_or_else(|| b.shape.clone()),
            });
        } else if s.shape != b.shape[..b.shape.len() - 1] {
            let want = b.shape[..b.shape.len() - 1].to_vec();
            if let Err(err) = ckpt.check_shape(&sname, s, &want) {
                self.problems.push(err);
            }
        }
    }
}
