//! Opening a checkpoint: safetensors files, the sharding index, memory maps.
//!
//! A safetensors file is an 8-byte little-endian header length `n`, `n` bytes of JSON (per
//! tensor: dtype, shape, `data_offsets` relative to the data area), then the data. The JSON is
//! parsed and validated by the `safetensors` crate's own [`Metadata`] (offsets contiguous, each
//! tensor's byte count equal to its shape times its dtype); this module reads only the length
//! prefix itself, to compare what the header describes with the file's real length **before**
//! mapping it, so that a truncated download is an error naming the first tensor it cuts instead
//! of a read past the end of a mapping.
//!
//! A sharded checkpoint has `model.safetensors.index.json` (`{"metadata": {...}, "weight_map":
//! {tensor: shard file}}`), as transformers' `save_pretrained` writes it; every shard it names must
//! exist and hold the tensors it is said to hold.

use super::error::{io_error, WeightError};
use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The single-file checkpoint name transformers writes.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharding index transformers writes next to the shards.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The safetensors crate's own limit on a header (100 MB); larger is refused as malformed.
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// Bytes of the header-length prefix.
const PREFIX_BYTES: u64 = 8;
/// Where transformers' multimodal wrappers (`*ForConditionalGeneration` of Llama 4, Mistral 3,
/// Gemma 3, LLaVA) save the language model, and the text model's own prefix.
const WRAPPED_TEXT_MODEL: (&str, &str) = ("language_model.model.", "model.");
/// Where those wrappers save the language model's head, and the text model's own name for it.
const WRAPPED_HEAD: (&str, &str) = ("language_model.lm_head.", "lm_head.");

/// Where one tensor lives and how it is stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The dtype as the header writes it (`"BF16"`, `"F8_E4M3"`, `"U8"`, ...).
    pub dtype: String,
    /// The shape, outermost first.
    pub shape: Vec<usize>,
    /// The file holding it.
    pub file: PathBuf,
}

/// One tensor's place in a mapped file.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// Index into [`Checkpoint::shards`].
    pub(crate) shard: usize,
    pub(crate) dtype: Dtype,
    pub(crate) shape: Vec<usize>,
    /// Absolute byte range in the mapped file.
    pub(crate) start: usize,
    pub(crate) end: usize,
}

/// One mapped safetensors file.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) path: PathBuf,
    map: Mmap,
}

/// An opened checkpoint directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json` (`weight_map`), memory-mapped. Tensors are read (and converted)
/// on demand by [`Checkpoint::f32`], [`Checkpoint::i64`], [`Checkpoint::mxfp4_f32`], ...; opening
/// reads only the headers.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    pub(crate) shards: Vec<Shard>,
    pub(crate) tensors: BTreeMap<String, Entry>,
}

impl Checkpoint {
    /// Opens the checkpoint in `dir`: `model.safetensors` if present (as transformers prefers
    /// it), else `model.safetensors.index.json` and every shard it names; a path to a single
    /// safetensors file opens that file ([`Checkpoint::open_file`]). Errors: no checkpoint,
    /// malformed header or index, truncated file, missing shard, a tensor the index places in a
    /// shard that lacks it.
    ///
    /// A multimodal release saved in transformers' wrapper layout (the language model under
    /// `language_model.model.`, its head `language_model.lm_head.`: Llama 4, Mistral 3, Gemma 3,
    /// LLaVA) is read under the text model's names (`model.`, `lm_head.`), as transformers'
    /// checkpoint conversion does; its other parts (vision tower, projector) keep their names.
    pub fn open(dir: &Path) -> Result<Checkpoint, WeightError> {
        Checkpoint::open_as_saved(dir).map(Checkpoint::with_text_model_names)
    }

    /// [`Checkpoint::open`] without renaming anything.
    fn open_as_saved(dir: &Path) -> Result<Checkpoint, WeightError> {
        // A path to one safetensors file is taken as that file (a common way to point at a model).
        if dir.is_file() {
            return Checkpoint::open_file(dir);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            return Checkpoint::open_file(&single).map(|mut c| {
                c.dir = dir.to_path_buf();
                c
            });
        }
        let index = dir.join(INDEX_FILE);
        if index.is_file() {
            return open_sharded(dir, &index);
        }
        if !dir.is_dir() {
            return Err(WeightError::Io {
                file: dir.display().to_string(),
                message: "no such file or directory (give the model directory holding the \
                          safetensors files)"
                    .into(),
            });
        }
        Err(WeightError::NoCheckpoint {
            dir: dir.display().to_string(),
        })
    }

    /// The checkpoint with a wrapper-layout language model (no `model.` tensor, some under
    /// [`WRAPPED_TEXT_MODEL`]) renamed to the text model's names; any other checkpoint as is.
    fn with_text_model_names(mut self) -> Checkpoint {
        let wrapped = !self.tensors.keys().any(|n| n.starts_with("model."))
            && self
                .tensors
                .keys()
                .any(|n| n.starts_with(WRAPPED_TEXT_MODEL.0));
        if !wrapped {
            return self;
        }
        self.tensors = std::mem::take(&mut self.tensors)
            .into_iter()
            .map(|(name, e)| {
                let renamed =
                    [WRAPPED_TEXT_MODEL, WRAPPED_HEAD]
                        .into_iter()
                        .find_map(|(from, to)| {
                            name.strip_prefix(from).map(|rest| format!("{to}{rest}"))
                        });
                (renamed.unwrap_or(name), e)
            })
            .collect();
        self
    }

    /// Opens one safetensors file on its own (golden files, reference activations); [`dir`]
    /// is then the file itself.
    ///
    /// [`dir`]: Checkpoint::dir
    pub fn open_file(path: &Path) -> Result<Checkpoint, WeightError> {
        let (shard, entries) = map_file(path)?;
        let tensors = entries
            .into_iter()
            .map(|(name, mut e)| {
                e.shard = 0;
                (name, e)
            })
            .collect();
        Ok(Checkpoint {
            dir: path.to_path_buf(),
            shards: vec![shard],
            tensors,
        })
    }

    /// The directory (or single file) this checkpoint was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the checkpoint holds a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    /// The files the checkpoint's tensors live in, sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        let set: BTreeSet<&PathBuf> = self.shards.iter().map(|s| &s.path).collect();
        set.into_iter().cloned().collect()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the checkpoint holds no tensor at all.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// A tensor's dtype, shape and file, without reading its data.
    pub fn info(&self, name: &str) -> Option<TensorInfo> {
        self.tensors.get(name).map(|e| TensorInfo {
            dtype: e.dtype.to_string(),
            shape: e.shape.clone(),
            file: self.shards[e.shard].path.clone(),
        })
    }

    /// The shape of a tensor, if present.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.shape.as_slice())
    }

    /// The entry of `name`, or [`WeightError::MissingTensor`] (with close names).
    pub(crate) fn entry(
        &self,
        name: &str,
        expected: Option<&[usize]>,
    ) -> Result<&Entry, WeightError> {
        self.tensors
            .get(name)
            .ok_or_else(|| self.missing(name, expected))
    }

    /// The missing-tensor error for `name`, with the names in the checkpoint closest to it.
    pub(crate) fn missing(&self, name: &str, expected: Option<&[usize]>) -> WeightError {
        WeightError::MissingTensor {
            file: self.dir.display().to_string(),
            tensor: name.to_string(),
            expected: expected.map(<[usize]>::to_vec),
            close: super::close_names(name, self.tensors.keys().map(String::as_str)),
        }
    }

    /// The raw little-endian bytes of a tensor (in bounds: checked when the file was opened).
    pub(crate) fn bytes(&self, e: &Entry) -> &[u8] {
        &self.shards[e.shard].map[e.start..e.end]
    }

    /// The file a tensor lives in, for error messages.
    pub(crate) fn file_of(&self, e: &Entry) -> String {
        self.shards[e.shard].path.display().to_string()
    }
}

/// Opens the shards named by `index` and merges their tensors per the index's `weight_map`.
fn open_sharded(dir: &Path, index: &Path) -> Result<Checkpoint, WeightError> {
    let index_name = index.display().to_string();
    let malformed = |message: String| WeightError::MalformedIndex {
        file: index_name.clone(),
        message,
    };
    let text = std::fs::read_to_string(index).map_err(|e| io_error(index, e))?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        malformed(format!(
            "not valid JSON at line {}, column {}: {e}",
            e.line(),
            e.column()
        ))
    })?;
    let map = json
        .get("weight_map")
        .ok_or_else(|| malformed("no `weight_map` object (tensor name → shard file)".into()))?
        .as_object()
        .ok_or_else(|| {
            malformed("`weight_map` must be an object (tensor name → shard file)".into())
        })?;
    // Shard file → the tensors the index places there, in index order.
    let mut by_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            malformed(format!(
                "`weight_map[\"{tensor}\"]` must be a shard file name (a string), found {file}"
            ))
        })?;
        let p = Path::new(file);
        if file.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(malformed(format!(
                "`weight_map[\"{tensor}\"]` = {file:?}: shard files must be relative paths \
                 inside the checkpoint directory"
            )));
        }
        by_shard
            .entry(file.to_string())
            .or_default()
            .push(tensor.clone());
    }
    let mut shards = Vec::with_capacity(by_shard.len());
    let mut tensors = BTreeMap::new();
    for (file, names) in by_shard {
        let path = dir.join(&file);
        if !path.is_file() {
            return Err(WeightError::MissingShard {
                index: index_name.clone(),
                shard: path.display().to_string(),
                tensor: names[0].clone(),
                tensors: names.len(),
            });
        }
        let (shard, mut entries) = map_file(&path)?;
        let id = shards.len();
        for name in names {
            let mut e = entries.remove(&name).ok_or_else(|| {
                malformed(format!(
                    "places tensor `{name}` in {file}, which does not hold it"
                ))
            })?;
            e.shard = id;
            tensors.insert(name, e);
        }
        shards.push(shard);
    }
    Ok(Checkpoint {
        dir: dir.to_path_buf(),
        shards,
        tensors,
    })
}

/// Reads a file's header, checks the file holds every byte the header describes, maps it.
/// Entries come back with `shard` 0 (the caller renumbers).
pub(crate) fn map_file(path: &Path) -> Result<(Shard, BTreeMap<String, Entry>), WeightError> {
    let name = path.display().to_string();
    let malformed = |message: String| WeightError::MalformedHeader {
        file: name.clone(),
        message,
    };
    let truncated = |tensor: &str, needed: u64, have: u64| WeightError::Truncated {
        file: name.clone(),
        tensor: tensor.to_string(),
        needed_bytes: needed,
        file_bytes: have,
    };
    let mut file = File::open(path).map_err(|e| io_error(path, e))?;
    let file_bytes = file.metadata().map_err(|e| io_error(path, e))?.len();
    if file_bytes < PREFIX_BYTES {
        return Err(truncated("(header length)", PREFIX_BYTES, file_bytes));
    }
    let mut prefix = [0u8; PREFIX_BYTES as usize];
    file.read_exact(&mut prefix)
        .map_err(|e| io_error(path, e))?;
    let header_bytes = u64::from_le_bytes(prefix);
    if header_bytes > MAX_HEADER_BYTES {
        return Err(malformed(format!(
            "header length {header_bytes} exceeds the format's limit of {MAX_HEADER_BYTES} bytes \
             (not a safetensors file?)"
        )));
    }
    let data_start = PREFIX_BYTES + header_bytes;
    if file_bytes < data_start {
        return Err(truncated("(header)", data_start, file_bytes));
    }
    let mut header = vec![0u8; header_bytes as usize];
    file.read_exact(&mut header)
        .map_err(|e| io_error(path, e))?;
    let text =
        std::str::from_utf8(&header).map_err(|e| malformed(format!("header is not UTF-8: {e}")))?;
    // The crate's own header type: parses the JSON and validates offsets against shapes/dtypes.
    let meta: Metadata =
        serde_json::from_str(text).map_err(|e| malformed(format!("header JSON rejected: {e}")))?;
    let needed = data_start + meta.data_len() as u64;
    let infos = meta.tensors();
    if file_bytes < needed {
        // The first tensor (by offset) whose data runs past the end of the file.
        let have_data = (file_bytes - data_start) as usize;
        let cut = meta
            .offset_keys()
            .into_iter()
            .find(|k| infos[k].data_offsets.1 > have_data)
            .unwrap_or_default();
        return Err(truncated(&cut, needed, file_bytes));
    }
    if file_bytes > needed {
        return Err(malformed(format!(
            "{} bytes after the last tensor's data (the header describes {needed} bytes, the \
             file has {file_bytes})",
            file_bytes - needed
        )));
    }
    // SAFETY: the file is opened read-only and the mapping is only read; every range read from it
    // was checked above to lie inside the file's length. Another process truncating the file while
    // it is mapped would still fault, as with any mapped reader (transformers' included).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| io_error(path, e))?;
    let base = data_start as usize;
    let entries = infos
        .into_iter()
        .map(|(k, info)| {
            let (s, e) = info.data_offsets;
            (
                k,
                Entry {
                    shard: 0,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: base + s,
                    end: base + e,
                },
            )
        })
        .collect();
    Ok((
        Shard {
            path: path.to_path_buf(),
            map,
        },
        entries,
    ))
}
