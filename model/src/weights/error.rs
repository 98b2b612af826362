//! [`WeightError`]: everything that can go wrong between a checkpoint directory and f32 tensors.
//! Every variant names the file and, where there is one, the tensor, and says what would fix it.

use std::fmt;

/// A checkpoint that cannot be read, or a tensor that is not what the model needs.
#[derive(Debug, Clone, PartialEq)]
pub enum WeightError {
    /// A file could not be opened, read, mapped or written.
    Io {
        /// The file.
        file: String,
        /// The operating system's message.
        message: String,
    },
    /// The directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    NoCheckpoint {
        /// The directory given.
        dir: String,
    },
    /// A safetensors header that is not what the format requires (length prefix, JSON, offsets).
    MalformedHeader {
        /// The file.
        file: String,
        /// What is wrong, as precisely as the reader can say.
        message: String,
    },
    /// The file is shorter than its header says: data of `tensor` would lie past its end (an
    /// interrupted download or copy).
    Truncated {
        /// The file.
        file: String,
        /// The first tensor whose bytes are (partly) missing.
        tensor: String,
        /// Bytes the header accounts for (8-byte prefix + header + data).
        needed_bytes: u64,
        /// Bytes the file has.
        file_bytes: u64,
    },
    /// `model.safetensors.index.json` is not the JSON transformers writes, or names a tensor its
    /// shard does not hold.
    MalformedIndex {
        /// The index file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The index maps tensors to a shard file that does not exist.
    MissingShard {
        /// The index file.
        index: String,
        /// The shard file it names (full path).
        shard: String,
        /// One tensor the index places in that shard.
        tensor: String,
        /// How many tensors the index places there.
        tensors: usize,
    },
    /// A tensor the model needs is not in the checkpoint.
    MissingTensor {
        /// The checkpoint directory (or file).
        file: String,
        /// The tensor's name.
        tensor: String,
        /// The shape the model expects, when known.
        expected: Option<Vec<usize>>,
        /// Names in the checkpoint close to it (a prefix typo, another layer layout), best first.
        close: Vec<String>,
    },
    /// A tensor's shape is not the one the model's configuration implies.
    WrongShape {
        /// The file holding it.
        file: String,
        /// The tensor.
        tensor: String,
        /// The shape the configuration implies.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype this reader does not convert for this use.
    UnsupportedDtype {
        /// The file holding it.
        file: String,
        /// The tensor.
        tensor: String,
        /// Its dtype as the header writes it (`"F8_E5M2"`, ...).
        dtype: String,
        /// What the reader accepts here.
        accepted: String,
    },
    /// Quantized data that the format's own checks reject (a NaN scale, a scale of the wrong
    /// shape): the message of `accel_sim::formats::FormatError`, which names the tensor.
    Format {
        /// The file holding the tensor.
        file: String,
        /// The tensor.
        tensor: String,
        /// The format check's message.
        message: String,
    },
    /// A tensor cannot be written (lengths disagree, an empty name, the writer failed).
    Write {
        /// The output file.
        file: String,
        /// The tensor, or `(file)` for file-level failures.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// [`crate::weights::verify`]: every problem found, not just the first.
    Verify {
        /// The checkpoint directory.
        dir: String,
        /// The configuration checked against.
        config: String,
        /// Missing tensors, wrong shapes and wrong dtypes, in expected-tensor order.
        problems: Vec<WeightError>,
    },
}

impl WeightError {
    /// The file (or directory) the error is about.
    pub fn file(&self) -> &str {
        match self {
            WeightError::Io { file, .. }
            | WeightError::MalformedHeader { file, .. }
            | WeightError::Truncated { file, .. }
            | WeightError::MalformedIndex { file, .. }
            | WeightError::MissingTensor { file, .. }
            | WeightError::WrongShape { file, .. }
            | WeightError::UnsupportedDtype { file, .. }
            | WeightError::Format { file, .. }
            | WeightError::Write { file, .. } => file,
            WeightError::NoCheckpoint { dir } | WeightError::Verify { dir, .. } => dir,
            WeightError::MissingShard { index, .. } => index,
        }
    }

    /// The tensor the error is about, if it is about one.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            WeightError::Truncated { tensor, .. }
            | WeightError::MissingShard { tensor, .. }
            | WeightError::MissingTensor { tensor, .. }
            | WeightError::WrongShape { tensor, .. }
            | WeightError::UnsupportedDtype { tensor, .. }
            | WeightError::Format { tensor, .. }
            | WeightError::Write { tensor, .. } => Some(tensor),
            _ => None,
        }
    }
}

impl fmt::Display for WeightError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightError::Io { file, message } => write!(f, "{file}: {message}"),
            WeightError::NoCheckpoint { dir } => write!(
                f,
                "{dir}: no checkpoint: expected `model.safetensors` or \
                 `model.safetensors.index.json` (with its shards) in this directory"
            ),
            WeightError::MalformedHeader { file, message } => {
                write!(f, "{file}: not a valid safetensors file: {message}")
            }
            WeightError::Truncated {
                file,
                tensor,
                needed_bytes,
                file_bytes,
            } => write!(
                f,
                "{file}: truncated: the header describes {needed_bytes} bytes but the file has \
                 {file_bytes} ({} missing; tensor `{tensor}` is cut off) — re-download or re-copy it",
                needed_bytes.saturating_sub(*file_bytes)
            ),
            WeightError::MalformedIndex { file, message } => {
                write!(f, "{file}: malformed index: {message}")
            }
            WeightError::MissingShard {
                index,
                shard,
                tensor,
                tensors,
            } => write!(
                f,
                "{index}: names shard {shard}, which does not exist ({tensors} tensor(s) live \
                 there, e.g. `{tensor}`) — the download is incomplete"
            ),
            WeightError::MissingTensor {
                file,
                tensor,
                expected,
                close,
            } => {
                write!(f, "{file}: tensor `{tensor}` is missing")?;
                if let Some(shape) = expected {
                    write!(f, " (expected shape {shape:?})")?;
                }
                if !close.is_empty() {
                    let list: Vec<String> = close.iter().map(|c| format!("`{c}`")).collect();
                    write!(f, "; close names in the checkpoint: {}", list.join(", "))?;
                }
                Ok(())
            }
            WeightError::WrongShape {
                file,
                tensor,
                expected,
                found,
            } => write!(
                f,
                "{file}: tensor `{tensor}` has shape {found:?}, but the configuration implies \
                 {expected:?} (is config.json the one this checkpoint was saved with?)"
            ),
            WeightError::UnsupportedDtype {
                file,
                tensor,
                dtype,
                accepted,
            } => write!(
                f,
                "{file}: tensor `{tensor}` is stored as {dtype}; accepted here: {accepted}"
            ),
            WeightError::Format {
                file,
                tensor,
                message,
            } => write!(f, "{file}: tensor `{tensor}`: {message}"),
            WeightError::Write {
                file,
                tensor,
                message,
            } => write!(f, "{file}: cannot write tensor `{tensor}`: {message}"),
            WeightError::Verify {
                dir,
                config,
                problems,
            } => {
                write!(
                    f,
                    "{dir}: checkpoint does not match {config}: {} problem(s)",
                    problems.len()
                )?;
                for p in problems {
                    write!(f, "\n  - {}", p.without_file())?;
                }
                Ok(())
            }
        }
    }
}

impl WeightError {
    /// The message without its leading `file: ` (inside a [`WeightError::Verify`] list, whose
    /// header already names the directory), unless the file is a shard worth naming.
    fn without_file(&self) -> String {
        let full = self.to_string();
        let prefix = format!("{}: ", self.file());
        match (self, full.strip_prefix(&prefix)) {
            (WeightError::MissingTensor { .. }, Some(rest)) => rest.to_string(),
            _ => full,
        }
    }
}

impl std::error::Error for WeightError {}

/// An I/O error on `file` as a [`WeightError::Io`].
pub(crate) fn io_error(file: &std::path::Path, e: std::io::Error) -> WeightError {
    WeightError::Io {
        file: file.display().to_string(),
        message: e.to_string(),
    }
}
