//! The decoder network (upstream `Qwen3TTSTokenizerV2Decoder`) in streaming form: every
//! layer takes the newest columns of its input plus the per-stream state it needs from the
//! past, so decoding a sequence step by step gives the full-sequence result.
//!
//! Every layer computes a batch of streams at once: activations and states carry a row per
//! stream first. The rows of a step share its frame count and nothing else; each row's KV
//! window and empty-slot bias are its own, and the RoPE positions are relative to the window,
//! so the same tables serve every row whatever its age.

mod attention;
mod conv;
mod ops;
mod precision;
mod quantizer;
mod rms_norm;
mod snake_beta;
mod state;
mod transformer;
mod upsampler;
mod vocoder;

use tch::{Device, Tensor};

use super::checkpoint::WeightFile;
use super::config::DecoderConfig;
use super::error::ModelError;
use super::error::TorchResult;
use super::op_profiler::Scope;
use conv::{CausalConv, ConvShape};
use quantizer::Quantizer;
use transformer::Transformer;
use upsampler::UpsampleStage;
use vocoder::Vocoder;

pub use state::{State, StateLayout};
pub use transformer::StepTables;

/// The loaded decoder. Immutable after loading, so one copy serves every stream.
pub struct Network {
    config: DecoderConfig,
    device: Device,
    quantizer: Quantizer,
    pre_conv: CausalConv,
    transformer: Transformer,
    upsampler: Vec<UpsampleStage>,
    vocoder: Vocoder,
    layout: StateLayout,
}

// SAFETY: libtorch tensors may be read from several threads at once; the network's tensors
// are written only while loading, before the network is shared, and only read afterwards
// (every op here allocates its result, none works in place on a weight).
unsafe impl Sync for Network {}

#[cfg(test)]
impl Network {
    /// A committed fixture's network (tests/fixtures/`name`), float32 on the CPU.
    pub fn fixture(name: &str) -> Self {
        use crate::model::checkpoint::CheckpointFiles;
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        let files = CheckpointFiles::locate(&folder).unwrap();
        let config = DecoderConfig::from_file(&files.config).unwrap();
        let weights = WeightFile::open(&files.weights, Device::Cpu, tch::Kind::Float, None).unwrap();
        Self::load(&weights, &config).unwrap()
    }
}

impl Network {
    pub fn load(file: &WeightFile, config: &DecoderConfig) -> Result<Self, ModelError> {
        let c = config;
        let weights = file.root();
        let mut layout = StateLayout::default();
        let quantizer = Quantizer::load(&weights.at("quantizer"), c)?;
        let pre_conv = CausalConv::load(
            &weights.at("pre_conv"),
            &mut layout,
            ConvShape::dense(c.codebook_dim, c.latent_dim, 3),
        )?;
        let transformer = Transformer::load(&weights.at("pre_transformer"), c)?;
        let upsampler = c
            .upsampling_ratios
            .iter()
            .enumerate()
            .map(|(i, &ratio)| {
                let columns = c.upsampling_ratios[..i].iter().product();
                let stage = weights.at("upsample").at(i).at_rate(columns);
                UpsampleStage::load(&stage, &mut layout, c.latent_dim, ratio)
            })
            .collect::<Result<_, _>>()?;
        let vocoder_weights = weights
            .at("decoder")
            .at_rate(c.upsampling_ratios.iter().product());
        let vocoder = Vocoder::load(&vocoder_weights, &mut layout, c)?;
        Ok(Self {
            config: c.clone(),
            device: weights.device(),
            quantizer,
            pre_conv,
            transformer,
            upsampler,
            vocoder,
            layout,
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// `rows` fresh streams' state: silence in every context, an empty KV window.
    pub fn new_state(&self, rows: i64) -> TorchResult<State> {
        State::new(&self.layout, &self.config, rows, self.device)
    }

    /// Decodes the next frames of a batch of streams. `codes`: [B, T, Q] int64 on the
    /// network's device, already checked to lie in `0..codebook_size`; `state` of B rows;
    /// `tables` made for T frames. Returns [B, T * samples_per_frame] audio. Every step of
    /// B x T frames launches the same kernels on tensors of the same shapes, whatever the
    /// streams' past.
    pub fn step(&self, codes: &Tensor, state: &mut State, tables: &StepTables) -> TorchResult<Tensor> {
        let _no_grad = tch::no_grad_guard();
        let _step = Scope::enter(c"step");
        let [batch, frames, _] = codes.size()[..] else {
            panic!("codes of a step are [rows, frames, codebooks]");
        };
        assert_eq!(frames, tables.frames, "step tables made for another step size");
        assert_eq!(batch, state.rows(), "a state row per row of codes");

        let latent = {
            let _stage = Scope::enter(c"quantizer + pre_conv");
            self.pre_conv.forward(&self.quantizer.forward(codes)?, state)?
        };
        let latent = {
            let _stage = Scope::enter(c"pre_transformer");
            self.transformer
                .forward(&latent.f_transpose(1, 2)?, state, tables)?
        };
        let mut h = latent.f_transpose(1, 2)?;
        for stage in &self.upsampler {
            h = stage.forward(&h, state)?;
        }
        let wav = self.vocoder.forward(&h, state)?;
        wav.f_clamp(-1.0, 1.0)?.f_flatten(1, -1)
    }

    /// RoPE tables and the sliding-window mask for steps of `frames` frames (see
    /// [`StepTables`]).
    pub fn step_tables(&self, frames: usize) -> TorchResult<StepTables> {
        self.transformer.step_tables(frames)
    }
}
