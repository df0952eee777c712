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
mod quantizer;
mod rms_norm;
mod snake_beta;
mod transformer;
mod upsampler;
mod vocoder;

use tch::{Device, Kind, Tensor};

use super::checkpoint::WeightFile;
use super::config::DecoderConfig;
use super::error::ModelError;
use super::kernels::TorchResult;
use super::op_profiler::Scope;
use conv::{CausalConv, ConvShape};
use quantizer::Quantizer;
use transformer::{Transformer, key_slots};
use upsampler::UpsampleStage;
use vocoder::Vocoder;

pub use transformer::StepTables;

/// Activations, states and element-wise math are float32 whatever the dtype asked for; the
/// weight products run in the weights' kind (bf16/f16 halve the weight traffic), except f16 on
/// the CPU, whose products keep float32 activations (`ops::Matrix`). Keeping activations in
/// float32 matters: SnakeBeta's sin(exp(alpha) * x) magnifies the rounding of x.
const ACTIVATION_KIND: Kind = Kind::Float;

/// Shapes of the per-stream context tensors: one entry per stateful convolution, in network
/// order, each [channels, columns] for one row.
#[derive(Default)]
pub struct StateLayout {
    contexts: Vec<[i64; 2]>,
}

impl StateLayout {
    /// Reserves a context of [channels, columns] per row; none for no columns.
    fn reserve(&mut self, channels: usize, columns: usize) -> Option<usize> {
        (columns > 0).then(|| {
            self.contexts.push([channels as i64, columns as i64]);
            self.contexts.len() - 1
        })
    }
}

/// What streams carry from one step to the next: a row per stream. The streams of a model keep
/// their rows in one state (the engine's arena); a batched step selects its streams' rows into
/// a state of its own and puts them back afterwards.
pub struct State {
    /// Past input columns of each causal conv (left context), and the overlap each transposed
    /// conv carries into its next output block: [rows, channels, columns].
    contexts: Vec<Tensor>,
    /// Un-rotated keys and values of the last `sliding_window - 1` positions, per layer, in
    /// buffers of that size filled from the end ([rows, kv heads, slots, head_dim]): RoPE is
    /// applied afresh each step with positions counted from the oldest slot.
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// [rows, slots]: 0 where the KV buffers hold a position, -inf where they are still empty
    /// (the stream's start), added to the attention scores. Keeping this on the device instead
    /// of a count gives every step the same shapes and no host input: a CUDA graph can replay
    /// it.
    key_bias: Tensor,
}

impl State {
    pub fn rows(&self) -> i64 {
        self.key_bias.size()[0]
    }

    /// Where its tensors lie: a CUDA graph recorded on this state reads and writes there.
    pub fn addresses(&self) -> Vec<usize> {
        self.tensors().map(|t| t.data_ptr() as usize).collect()
    }

    pub fn bytes(&self) -> usize {
        self.tensors()
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
    }

    /// Back to fresh streams' state, in place: the tensors keep their memory, which a captured
    /// CUDA graph refers to.
    pub fn clear(&mut self) -> TorchResult<()> {
        for tensor in self.tensors_mut() {
            _ = tensor.f_zero_()?;
        }
        _ = self.key_bias.f_fill_(f64::NEG_INFINITY)?;
        Ok(())
    }

    /// Row `row` as a state of one row that shares this one's memory: steps on it update
    /// this state in place.
    pub fn row(&self, row: i64) -> TorchResult<State> {
        self.map(|tensor| tensor.f_narrow(0, row, 1))
    }

    /// The rows listed in `index` (int64, on the state's device), in its order, as one state
    /// (a copy).
    pub fn select(&self, index: &Tensor) -> TorchResult<State> {
        self.map(|tensor| tensor.f_index_select(0, index))
    }

    /// Writes the rows of `rows` back to the rows of this state listed in `index`.
    pub fn put(&mut self, index: &Tensor, rows: &State) -> TorchResult<()> {
        for (target, source) in self.tensors_mut().zip(rows.tensors()) {
            _ = target.f_index_copy_(0, index, source)?;
        }
        Ok(())
    }

    /// This state's rows in a new state of `rows` rows (at least as many), the rows added
    /// fresh.
    pub fn grown(&self, network: &Network, rows: i64) -> TorchResult<State> {
        let mut grown = network.new_state(rows)?;
        for (target, source) in grown.tensors_mut().zip(self.tensors()) {
            target.f_narrow(0, 0, self.rows())?.f_copy_(source)?;
        }
        Ok(grown)
    }

    /// The rows listed in `rows`, in that order, as a state in memory of its own (a copy: the
    /// arena shrinks to it, its other rows freed with this state).
    pub fn select_rows(&self, rows: &[i64]) -> TorchResult<State> {
        let index = Tensor::f_from_slice(rows)?.f_to_device(self.key_bias.device())?;
        self.select(&index)
    }

    fn map(&self, each: impl Fn(&Tensor) -> TorchResult<Tensor>) -> TorchResult<State> {
        let all = |tensors: &[Tensor]| tensors.iter().map(&each).collect::<TorchResult<Vec<_>>>();
        Ok(State {
            contexts: all(&self.contexts)?,
            keys: all(&self.keys)?,
            values: all(&self.values)?,
            key_bias: each(&self.key_bias)?,
        })
    }

    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.contexts
            .iter()
            .chain(&self.keys)
            .chain(&self.values)
            .chain([&self.key_bias])
    }

    fn tensors_mut(&mut self) -> impl Iterator<Item = &mut Tensor> {
        self.contexts
            .iter_mut()
            .chain(&mut self.keys)
            .chain(&mut self.values)
            .chain([&mut self.key_bias])
    }
}

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
        let weights = WeightFile::open(&files.weights, Device::Cpu, tch::Kind::Float, false).unwrap();
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
        let options = (ACTIVATION_KIND, self.device);
        let contexts = self
            .layout
            .contexts
            .iter()
            .map(|&[channels, columns]| Tensor::f_zeros([rows, channels, columns], options))
            .collect::<TorchResult<_>>()?;
        let c = &self.config;
        let slots = key_slots(c);
        let empty_kv = || {
            Tensor::f_zeros(
                [rows, c.num_key_value_heads as i64, slots, c.head_dim as i64],
                options,
            )
        };
        let layers = c.num_hidden_layers;
        Ok(State {
            contexts,
            keys: (0..layers).map(|_| empty_kv()).collect::<TorchResult<_>>()?,
            values: (0..layers).map(|_| empty_kv()).collect::<TorchResult<_>>()?,
            key_bias: Tensor::f_full([rows, slots], f64::NEG_INFINITY, options)?,
        })
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
