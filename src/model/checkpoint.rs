//! Finding a checkpoint on disk and reading the decoder's tensors from it.

use std::ffi::CString;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use super::error::ModelError;

/// Prefix of the decoder's tensors in the tokenizer's `model.safetensors`.
const DECODER_PREFIX: &str = "decoder.";

/// The two files of a tokenizer checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFiles {
    pub config: PathBuf,
    pub weights: PathBuf,
}

impl CheckpointFiles {
    /// Accepts a tokenizer folder (`config.json` + `model.safetensors`) or the root of a full
    /// Qwen3-TTS checkpoint, whose tokenizer lives in `speech_tokenizer/`. The root of a full
    /// checkpoint has a `config.json` of its own (the talker's), so the tokenizer folder wins
    /// whenever it exists.
    pub fn locate(path: &Path) -> Result<Self, ModelError> {
        if !path.is_dir() {
            return Err(ModelError::Checkpoint(format!(
                "{} is not a directory (expected a Qwen3-TTS tokenizer checkpoint folder)",
                path.display()
            )));
        }
        let nested = path.join("speech_tokenizer");
        let folder = if nested.is_dir() { nested } else { path.to_owned() };
        let files = Self {
            config: folder.join("config.json"),
            weights: folder.join("model.safetensors"),
        };
        for file in [&files.config, &files.weights] {
            if !file.is_file() {
                return Err(ModelError::Checkpoint(format!(
                    "{} is missing (a checkpoint folder holds config.json and model.safetensors, \
                     or is a full Qwen3-TTS checkpoint with a speech_tokenizer/ folder)",
                    file.display()
                )));
            }
        }
        Ok(files)
    }
}

/// The decoder's tensors of a `model.safetensors`, read on demand and converted to the
/// compute device and kind.
pub struct WeightFile {
    path: PathBuf,
    map: Mmap,
    /// Bytes before the tensor data: the 8-byte header length and the JSON header.
    data_start: usize,
    metadata: Metadata,
    device: Device,
    kind: Kind,
    weight_rounding: Option<Kind>,
}

impl WeightFile {
    /// `weight_rounding`: the 16-bit kind the network rounds its weight-bound product weights to
    /// (see [`Weights::weight_rounding`]).
    pub fn open(
        path: &Path,
        device: Device,
        kind: Kind,
        weight_rounding: Option<Kind>,
    ) -> Result<Self, ModelError> {
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        // SAFETY: the map is only read, and only while loading; checkpoints are not rewritten
        // in place while a decoder loads them.
        let map = unsafe { Mmap::map(&file) }.map_err(|source| ModelError::Io {
            path: path.to_owned(),
            source,
        })?;
        // Also checks that every tensor's bytes lie inside the file (a truncated file fails).
        let (header_len, metadata) = SafeTensors::read_metadata(&map).map_err(|err| {
            ModelError::Checkpoint(format!(
                "{} is not a valid safetensors file: {err}",
                path.display()
            ))
        })?;
        Ok(Self {
            path: path.to_owned(),
            map,
            data_start: 8 + header_len,
            metadata,
            device,
            kind,
            weight_rounding,
        })
    }

    /// The decoder's tensors, named from the top (`decoder.` is implied).
    pub fn root(&self) -> Weights<'_> {
        Weights {
            file: self,
            prefix: String::new(),
            columns_per_frame: 1,
        }
    }

    fn read(&self, name: &str, shape: &[usize], kind: Kind) -> Result<Tensor, ModelError> {
        let full_name = format!("{DECODER_PREFIX}{name}");
        let info = self
            .metadata
            .info(&full_name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: full_name.clone(),
                path: self.path.clone(),
            })?;
        if info.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: full_name,
                expected: shape.to_vec(),
                found: info.shape.clone(),
            });
        }
        let stored = stored_kind(info.dtype).ok_or_else(|| {
            ModelError::Checkpoint(format!(
                "tensor {full_name} is stored as {:?}; only F32, BF16 and F16 are supported",
                info.dtype
            ))
        })?;
        let (begin, end) = info.data_offsets;
        let bytes = &self.map[self.data_start + begin..self.data_start + end];
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let tensor = Tensor::f_from_data_size(bytes, &dims, stored)?;
        Ok(tensor.f_to_device(self.device)?.f_to_kind(kind)?)
    }
}

/// The kind a tensor stored as `dtype` is read in: F32, BF16 and F16 only.
fn stored_kind(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        _ => None,
    }
}

/// The tensors of one layer: names relative to its prefix, as upstream's module tree nests them
/// (`weights.at("pre_transformer").at("layers").at(3)` reads `pre_transformer.layers.3.*`).
#[derive(Clone)]
pub struct Weights<'a> {
    file: &'a WeightFile,
    prefix: String,
    /// Columns of the layer's input per frame of codes (1 up to the upsampler).
    columns_per_frame: usize,
}

impl<'a> Weights<'a> {
    /// The sub-layer `name` (a field name or an index).
    pub fn at(&self, name: impl std::fmt::Display) -> Weights<'a> {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Weights {
            file: self.file,
            prefix,
            columns_per_frame: self.columns_per_frame,
        }
    }

    /// This layer's tensor `name` with the given shape, on the compute device and kind.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor, ModelError> {
        self.get_as(name, shape, self.file.kind)
    }

    /// The kind this layer's tensor `name` is stored in, if the file has it in a kind it reads.
    pub fn stored_kind(&self, name: &str) -> Option<Kind> {
        let info = self
            .file
            .metadata
            .info(&format!("{DECODER_PREFIX}{}", self.at(name).prefix))?;
        stored_kind(info.dtype)
    }

    /// Like [`Self::get`] but converted to `kind` (for tables kept at higher precision).
    pub fn get_as(&self, name: &str, shape: &[usize], kind: Kind) -> Result<Tensor, ModelError> {
        self.file.read(&self.at(name).prefix, shape, kind)
    }

    pub fn device(&self) -> Device {
        self.file.device
    }

    /// The compute kind that [`Self::get`] converts to.
    pub fn kind(&self) -> Kind {
        self.file.kind
    }

    /// The same layer, its input at `columns` per frame of codes (the sub-layers inherit it).
    pub fn at_rate(&self, columns: usize) -> Weights<'a> {
        Weights {
            columns_per_frame: columns,
            ..self.clone()
        }
    }

    pub fn columns_per_frame(&self) -> usize {
        self.columns_per_frame
    }

    /// The layer's path in upstream's module tree (`decoder.upsample.0`): its name in the op
    /// profile.
    pub fn module_name(&self) -> CString {
        CString::new(self.prefix.as_str()).expect("module paths are made of names without NUL")
    }

    /// The 16-bit kind the network rounds its weight-bound product weights to, if any: float16
    /// for dtype f16 and bfloat16 for bf16 on the CPU (see `network::precision`).
    pub fn weight_rounding(&self) -> Option<Kind> {
        self.file.weight_rounding
    }
}
