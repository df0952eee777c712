//! What can go wrong loading a checkpoint, decoding codes and using CUDA graphs.

use std::path::PathBuf;

/// What every libtorch op returns.
pub type TorchResult<T> = Result<T, tch::TchError>;

/// Problems loading a checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid checkpoint: {0}")]
    Checkpoint(String),
    #[error("invalid decoder config: {0}")]
    Config(String),
    #[error("tensor {name} is missing from {path}")]
    MissingTensor { name: String, path: PathBuf },
    #[error("tensor {name} has shape {found:?}, the config implies {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("device {0}")]
    Device(String),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Problems decoding codes.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("got {codes} codes, not a whole number of frames of {codebooks} codes")]
    PartialFrame { codes: usize, codebooks: usize },
    #[error("frame {frame}, codebook {codebook}: code {value} is outside 0..{codebook_size}")]
    InvalidCode {
        frame: u64,
        codebook: usize,
        value: i64,
        codebook_size: usize,
    },
    #[error("the stream was finished; reset it before decoding more frames")]
    Finished,
    #[error("an earlier decode step failed; reset the stream")]
    Broken,
    #[error("{0}")]
    Graph(#[from] GraphError),
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
}

/// Why a graph could not be captured or replayed.
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("this build has no CUDA graphs (its libtorch has no CUDA, or no CUDA headers were found)")]
    Unavailable,
    #[error("CUDA graph: {0}")]
    Cuda(String),
    #[error("a graph replayed on state memory that moved after it was recorded")]
    Stale,
    #[error("while capturing a CUDA graph: {0}")]
    Torch(#[from] tch::TchError),
}
