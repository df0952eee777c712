//! What streams carry from one step to the next (a row per stream), its layout, and the float
//! kind of activations.

use tch::{Device, Kind, Tensor};

use crate::model::config::DecoderConfig;
use crate::model::error::TorchResult;

/// Activations, states and element-wise math are float32 whatever the dtype asked for; the
/// weight products run in the weights' kind (bf16/f16 halve the weight traffic), except f16 on
/// the CPU, whose products keep float32 activations (`ops::Matrix`). Keeping activations in
/// float32 matters: SnakeBeta's sin(exp(alpha) * x) magnifies the rounding of x.
pub(super) const ACTIVATION_KIND: Kind = Kind::Float;

/// Positions the KV window keeps from step to step.
pub fn key_slots(config: &DecoderConfig) -> i64 {
    config.sliding_window as i64 - 1
}

/// Shapes of the per-stream context tensors: one entry per stateful convolution, in network
/// order, each [channels, columns] for one row.
#[derive(Default)]
pub struct StateLayout {
    pub(super) contexts: Vec<[i64; 2]>,
}

impl StateLayout {
    /// Reserves a context of [channels, columns] per row; none for no columns.
    pub(super) fn reserve(&mut self, channels: usize, columns: usize) -> Option<usize> {
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
    pub(super) contexts: Vec<Tensor>,
    /// Un-rotated keys and values of the last `sliding_window - 1` positions, per layer, in
    /// buffers of that size filled from the end ([rows, kv heads, slots, head_dim]): RoPE is
    /// applied afresh each step with positions counted from the oldest slot.
    pub(super) keys: Vec<Tensor>,
    pub(super) values: Vec<Tensor>,
    /// [rows, slots]: 0 where the KV buffers hold a position, -inf where they are still empty
    /// (the stream's start), added to the attention scores. Keeping this on the device instead
    /// of a count gives every step the same shapes and no host input: a CUDA graph can replay
    /// it.
    pub(super) key_bias: Tensor,
}

impl State {
    /// `rows` fresh streams' state for a network of `layout` and `config`: silence in every
    /// context, an empty KV window.
    pub(super) fn new(
        layout: &StateLayout,
        config: &DecoderConfig,
        rows: i64,
        device: Device,
    ) -> TorchResult<State> {
        let options = (ACTIVATION_KIND, device);
        let contexts = layout
            .contexts
            .iter()
            .map(|&[channels, columns]| Tensor::f_zeros([rows, channels, columns], options))
            .collect::<TorchResult<_>>()?;
        let c = config;
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

    /// Rows `first..first + count` as a state that shares this one's memory: steps on it
    /// update this state in place.
    pub fn rows_from(&self, first: i64, count: i64) -> TorchResult<State> {
        self.map(|tensor| tensor.f_narrow(0, first, count))
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

    /// This state's rows as the first rows of `grown` (a fresh state of at least as many rows).
    pub fn grown_into(&self, mut grown: State) -> TorchResult<State> {
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
