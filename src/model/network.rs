//! The decoder network (upstream `Qwen3TTSTokenizerV2Decoder`) in streaming form: every
//! layer takes the newest columns of its input plus the per-stream state it needs from the
//! past, so decoding a sequence step by step gives the full-sequence result.

use tch::{Device, Kind, Tensor};

use super::ModelError;
use super::checkpoint::WeightFile;
use super::config::DecoderConfig;

type TorchResult<T> = Result<T, tch::TchError>;

/// Activations, states and element-wise math are float32 whatever the dtype asked for; the
/// weight products run in the weights' kind (bf16/f16 halve the weight traffic). Keeping
/// activations in float32 matters: SnakeBeta's sin(exp(alpha) * x) magnifies the rounding of x.
const ACTIVATION_KIND: Kind = Kind::Float;

/// `op` (a product with weights stored in `weight_kind`) on float32 activations.
fn with_weights(
    x: &Tensor,
    weight_kind: Kind,
    op: impl FnOnce(&Tensor) -> TorchResult<Tensor>,
) -> TorchResult<Tensor> {
    if weight_kind == ACTIVATION_KIND {
        return op(x);
    }
    op(&x.f_to_kind(weight_kind)?)?.f_to_kind(ACTIVATION_KIND)
}

/// `weight` [out, in] times each row of `rows` [T, in], plus `bias` [out, 1]: [out, T].
///
/// The product a step needs is a weight against a few columns, where the weight's bytes are the
/// cost. MKL streams a weight at near memory speed only in this arrangement: the weight as it is
/// stored ([out, in], row-major) on the left and the activations row-major on the right, read
/// transposed. The other arrangements (activations on the left, or a column-major right side)
/// ran 2-5x slower for 2 to 32 columns on the released geometry's shapes.
///
/// On the CPU a single row goes in twice: MKL computes one column as a matrix-vector product
/// on one core (about 11 GB/s here), two as a matrix product on every core (about 26 GB/s).
fn project(weight: &Tensor, rows: &Tensor, bias: Option<&Tensor>) -> TorchResult<Tensor> {
    let single = rows.size()[0] == 1 && rows.device() == Device::Cpu;
    let rows = if single {
        rows.f_expand([2, -1], false)?.f_contiguous()?
    } else {
        rows.f_contiguous()?
    };
    let columns = rows.f_transpose(0, 1)?;
    let product = match bias {
        Some(bias) => bias.f_addmm(weight, &columns)?,
        None => weight.f_mm(&columns)?,
    };
    if single {
        product.f_narrow(1, 0, 1)?.f_contiguous()
    } else {
        Ok(product)
    }
}

/// Shapes of the per-stream tensors: one entry per stateful convolution, in network order.
#[derive(Default)]
struct StateLayout {
    contexts: Vec<[i64; 3]>,
}

impl StateLayout {
    /// Reserves a [1, channels, columns] state tensor.
    fn reserve(&mut self, channels: usize, columns: usize) -> Option<usize> {
        (columns > 0).then(|| {
            self.contexts.push([1, channels as i64, columns as i64]);
            self.contexts.len() - 1
        })
    }
}

/// What a stream carries from one step to the next.
pub struct StreamState {
    /// Past input columns of each causal conv (left context), and the overlap each transposed
    /// conv carries into its next output block.
    contexts: Vec<Tensor>,
    /// Un-rotated keys and values of the last `sliding_window - 1` positions, per layer, in
    /// buffers of that size filled from the end: RoPE is applied afresh each step with
    /// positions counted from the oldest slot.
    keys: Vec<Tensor>,
    values: Vec<Tensor>,
    /// [slots]: 0 where the KV buffers hold a position, -inf where they are still empty (the
    /// stream's start), added to the attention scores. Keeping this on the device instead of
    /// a count gives every step the same shapes and no host input: a CUDA graph can replay it.
    key_bias: Tensor,
}

impl StreamState {
    pub fn bytes(&self) -> usize {
        self.tensors()
            .map(|t| t.numel() * t.kind().elt_size_in_bytes())
            .sum()
    }

    /// Back to a fresh stream's state, in place: the tensors keep their memory, which a
    /// captured CUDA graph refers to.
    pub fn clear(&mut self) -> TorchResult<()> {
        for tensor in self
            .contexts
            .iter_mut()
            .chain(&mut self.keys)
            .chain(&mut self.values)
        {
            _ = tensor.f_zero_()?;
        }
        _ = self.key_bias.f_fill_(f64::NEG_INFINITY)?;
        Ok(())
    }

    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.contexts
            .iter()
            .chain(&self.keys)
            .chain(&self.values)
            .chain([&self.key_bias])
    }
}

/// What a step of a given number of frames needs besides codes and state, the same for every
/// such step of every stream: RoPE tables and the sliding-window mask. Made once per step size
/// (uploaded once, and the fixed inputs of a captured CUDA graph).
pub struct StepTables {
    frames: i64,
    query_cos: Tensor,
    query_sin: Tensor,
    key_cos: Tensor,
    key_sin: Tensor,
    /// [frames, slots + frames]: 0 where a new position may see a key, -inf elsewhere.
    window_mask: Tensor,
    /// [frames] zeros: the new positions' own keys always count.
    new_key_bias: Tensor,
}

/// A 1-D convolution padded causally: `(kernel - 1) * dilation` columns of the past on the left.
struct CausalConv {
    weight: Tensor,
    /// The weight as one [out, in * kernel] matrix (a view), for short inputs (see `forward`).
    weight_matrix: Tensor,
    bias: Tensor,
    /// The bias as a column, [out, 1].
    bias_column: Tensor,
    in_channels: i64,
    kernel: i64,
    dilation: i64,
    groups: i64,
    context: i64,
    slot: Option<usize>,
}

impl CausalConv {
    #[allow(clippy::too_many_arguments)]
    fn load(
        weights: &WeightFile,
        layout: &mut StateLayout,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Self, ModelError> {
        let context = (kernel - 1) * dilation;
        let weight = weights.get(
            &format!("{prefix}.conv.weight"),
            &[out_channels, in_channels / groups, kernel],
        )?;
        let weight_matrix = weight.f_view([out_channels as i64, -1])?;
        let bias = weights.get(&format!("{prefix}.conv.bias"), &[out_channels])?;
        Ok(Self {
            weight,
            weight_matrix,
            bias_column: bias.f_view([-1, 1])?,
            bias,
            in_channels: in_channels as i64,
            kernel: kernel as i64,
            dilation: dilation as i64,
            groups: groups as i64,
            context: context as i64,
            slot: layout.reserve(in_channels, context),
        })
    }

    fn forward(&self, x: &Tensor, state: &mut StreamState) -> TorchResult<Tensor> {
        let input = match self.slot {
            Some(slot) => {
                let full = Tensor::f_cat(&[&state.contexts[slot], x], 2)?;
                let len = full.size()[2];
                // Written in place: a stream's state keeps its allocations from start to end.
                state.contexts[slot].f_copy_(&full.f_narrow(2, len - self.context, self.context)?)?;
                full
            }
            None => x.shallow_clone(),
        };
        let columns = x.size()[2];
        with_weights(&input, self.weight.kind(), |input| {
            // As one matrix product over the gathered taps: on CPU where the weight dominates
            // (few output columns against many input channels: the low-rate layers of a small
            // step), as it reads the weight faster than the convolution kernels do; on CUDA
            // always, as cuBLAS keeps float32 exact where cuDNN defaults to TF32.
            if self.groups == 1 && (input.device().is_cuda() || columns * 16 <= self.in_channels) {
                let taps = input
                    .f_squeeze_dim(0)?
                    .f_unfold(1, self.context + 1, 1)?
                    .f_slice(2, 0, self.context + 1, self.dilation)?
                    .f_permute([1, 0, 2])?
                    .f_reshape([columns, self.in_channels * self.kernel])?;
                return project(&self.weight_matrix, &taps, Some(&self.bias_column))?.f_unsqueeze(0);
            }
            input.f_conv1d(
                &self.weight,
                Some(&self.bias),
                [1],
                [0],
                [self.dilation],
                self.groups,
            )
        })
    }
}

/// A transposed conv (stride `s`, kernel `s` or `2s`) trimmed on the right to `s` samples per
/// input column, computed as one matrix product per step. With kernel `2s` each input column
/// also adds into the next column's block: that overlap is carried to the next step.
struct CausalTransConv {
    /// [out * kernel, in]: row `o * kernel + j` is output channel `o`'s tap `j`.
    weight_matrix: Tensor,
    bias: Tensor,
    out_channels: i64,
    stride: i64,
    kernel: i64,
    slot: Option<usize>,
}

impl CausalTransConv {
    fn load(
        weights: &WeightFile,
        layout: &mut StateLayout,
        prefix: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        stride: usize,
    ) -> Result<Self, ModelError> {
        debug_assert!(kernel == stride || kernel == 2 * stride);
        let weight = weights.get(
            &format!("{prefix}.conv.weight"),
            &[in_channels, out_channels, kernel],
        )?;
        Ok(Self {
            weight_matrix: weight
                .f_reshape([in_channels as i64, -1])?
                .f_transpose(0, 1)?
                .f_contiguous()?,
            bias: weights
                .get(&format!("{prefix}.conv.bias"), &[out_channels])?
                .f_view([1, -1, 1])?,
            out_channels: out_channels as i64,
            stride: stride as i64,
            kernel: kernel as i64,
            // The carried overlap: `kernel - stride` samples of every output channel.
            slot: layout.reserve(out_channels, kernel - stride),
        })
    }

    fn forward(&self, x: &Tensor, state: &mut StreamState) -> TorchResult<Tensor> {
        let columns = x.size()[2];
        // [out, kernel, T]: what each new input column contributes to each output tap.
        let taps = with_weights(
            &x.f_squeeze_dim(0)?.f_transpose(0, 1)?,
            self.weight_matrix.kind(),
            |rows| project(&self.weight_matrix, rows, None),
        )?
        .f_view([self.out_channels, self.kernel, columns])?;
        let mut blocks = taps.f_narrow(1, 0, self.stride)?;
        if let Some(slot) = self.slot {
            // Block t also gets the second half of column t - 1's taps; the first block gets
            // the carry of the previous step.
            let mut carry = state.contexts[slot].f_view([self.out_channels, self.stride, 1])?;
            let overlap = taps.f_narrow(1, self.stride, self.stride)?;
            let earlier = Tensor::f_cat(&[&carry, &overlap.f_narrow(2, 0, columns - 1)?], 2)?;
            carry.f_copy_(&overlap.f_narrow(2, columns - 1, 1)?)?;
            blocks = blocks.f_add(&earlier)?;
        }
        // [out, s, T] -> [1, out, T * s]
        blocks
            .f_permute([0, 2, 1])?
            .f_reshape([1, self.out_channels, columns * self.stride])?
            .f_add(&self.bias)
    }
}

/// `x + 1 / (exp(beta) + 1e-9) * sin(exp(alpha) * x)^2`, with both factors precomputed.
struct SnakeBeta {
    frequency: Tensor,
    inverse_magnitude: Tensor,
}

impl SnakeBeta {
    fn load(weights: &WeightFile, prefix: &str, channels: usize) -> Result<Self, ModelError> {
        let alpha = weights.get_as(&format!("{prefix}.alpha"), &[channels], Kind::Double)?;
        let beta = weights.get_as(&format!("{prefix}.beta"), &[channels], Kind::Double)?;
        Ok(Self {
            frequency: alpha.f_exp()?.f_view([1, -1, 1])?.f_to_kind(ACTIVATION_KIND)?,
            inverse_magnitude: beta
                .f_exp()?
                .f_add_scalar(1e-9)?
                .f_reciprocal()?
                .f_view([1, -1, 1])?
                .f_to_kind(ACTIVATION_KIND)?,
        })
    }

    fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let wave = x.f_mul(&self.frequency)?.f_sin()?.f_square()?;
        x.f_add(&wave.f_mul(&self.inverse_magnitude)?)
    }
}

struct Linear {
    weight: Tensor,
    /// [out, 1]
    bias: Option<Tensor>,
}

impl Linear {
    fn load(
        weights: &WeightFile,
        prefix: &str,
        in_features: usize,
        out_features: usize,
        bias: bool,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get(&format!("{prefix}.weight"), &[out_features, in_features])?,
            bias: if bias {
                Some(
                    weights
                        .get(&format!("{prefix}.bias"), &[out_features])?
                        .f_view([-1, 1])?,
                )
            } else {
                None
            },
        })
    }

    /// One layer computing all of `parts` (same input), their outputs one after another.
    fn stacked(parts: &[Linear]) -> TorchResult<Self> {
        let weights: Vec<&Tensor> = parts.iter().map(|part| &part.weight).collect();
        let biases: Option<Vec<&Tensor>> = parts.iter().map(|part| part.bias.as_ref()).collect();
        Ok(Self {
            weight: Tensor::f_cat(&weights, 0)?,
            bias: biases.map(|biases| Tensor::f_cat(&biases, 0)).transpose()?,
        })
    }

    /// `x`: [1, T, in] -> [1, T, out].
    fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        with_weights(x, self.weight.kind(), |x| {
            project(&self.weight, &x.f_squeeze_dim(0)?, self.bias.as_ref())?
                .f_transpose(0, 1)?
                .f_contiguous()?
                .f_unsqueeze(0)
        })
    }
}

/// RMSNorm, on float32 activations like everything element-wise here.
struct RmsNorm {
    weight: Tensor,
    eps: f64,
}

impl RmsNorm {
    fn load(weights: &WeightFile, prefix: &str, size: usize, eps: f64) -> Result<Self, ModelError> {
        Ok(Self {
            weight: weights.get_as(&format!("{prefix}.weight"), &[size], Kind::Float)?,
            eps,
        })
    }

    fn forward(&self, x: &Tensor) -> TorchResult<Tensor> {
        let variance = x.f_square()?.f_mean_dim(-1, true, ACTIVATION_KIND)?;
        self.weight
            .f_mul(&x.f_mul(&variance.f_add_scalar(self.eps)?.f_rsqrt()?)?)
    }
}

struct TransformerLayer {
    input_norm: RmsNorm,
    /// q_proj, k_proj and v_proj stacked: one product reads the three weights.
    qkv_proj: Linear,
    o_proj: Linear,
    attention_scale: Tensor,
    post_attention_norm: RmsNorm,
    /// gate_proj and up_proj stacked.
    gate_up_proj: Linear,
    down_proj: Linear,
    mlp_scale: Tensor,
}

impl TransformerLayer {
    fn load(weights: &WeightFile, config: &DecoderConfig, layer: usize) -> Result<Self, ModelError> {
        let p = format!("pre_transformer.layers.{layer}");
        let hidden = config.hidden_size;
        let q_width = config.num_attention_heads * config.head_dim;
        let kv_width = config.num_key_value_heads * config.head_dim;
        let bias = config.attention_bias;
        let eps = config.rms_norm_eps;
        Ok(Self {
            input_norm: RmsNorm::load(weights, &format!("{p}.input_layernorm"), hidden, eps)?,
            qkv_proj: Linear::stacked(&[
                Linear::load(weights, &format!("{p}.self_attn.q_proj"), hidden, q_width, bias)?,
                Linear::load(weights, &format!("{p}.self_attn.k_proj"), hidden, kv_width, bias)?,
                Linear::load(weights, &format!("{p}.self_attn.v_proj"), hidden, kv_width, bias)?,
            ])?,
            o_proj: Linear::load(weights, &format!("{p}.self_attn.o_proj"), q_width, hidden, bias)?,
            attention_scale: weights.get_as(
                &format!("{p}.self_attn_layer_scale.scale"),
                &[hidden],
                Kind::Float,
            )?,
            post_attention_norm: RmsNorm::load(
                weights,
                &format!("{p}.post_attention_layernorm"),
                hidden,
                eps,
            )?,
            gate_up_proj: Linear::stacked(&[
                Linear::load(
                    weights,
                    &format!("{p}.mlp.gate_proj"),
                    hidden,
                    config.intermediate_size,
                    false,
                )?,
                Linear::load(
                    weights,
                    &format!("{p}.mlp.up_proj"),
                    hidden,
                    config.intermediate_size,
                    false,
                )?,
            ])?,
            down_proj: Linear::load(
                weights,
                &format!("{p}.mlp.down_proj"),
                config.intermediate_size,
                hidden,
                false,
            )?,
            mlp_scale: weights.get_as(&format!("{p}.mlp_layer_scale.scale"), &[hidden], Kind::Float)?,
        })
    }

    /// `x`: [1, T, hidden]. Updates this layer's KV window in `keys`/`values`; `mask` is
    /// [T, slots + T], the window mask with the empty slots' bias added.
    fn forward(
        &self,
        x: &Tensor,
        config: &DecoderConfig,
        tables: &StepTables,
        mask: &Tensor,
        keys: &mut Tensor,
        values: &mut Tensor,
    ) -> TorchResult<Tensor> {
        let steps = x.size()[1];
        let head_dim = config.head_dim as i64;
        let heads = config.num_attention_heads as i64;
        let kv_heads = config.num_key_value_heads as i64;

        let h = self.input_norm.forward(x)?;
        let split_heads = |t: Tensor, n: i64| t.f_view([1, steps, n, head_dim])?.f_transpose(1, 2);
        let qkv = self.qkv_proj.forward(&h)?;
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let q = split_heads(qkv.f_narrow(2, 0, q_width)?, heads)?;
        let k = split_heads(qkv.f_narrow(2, q_width, kv_width)?, kv_heads)?;
        let v = split_heads(qkv.f_narrow(2, q_width + kv_width, kv_width)?, kv_heads)?;

        let slots = keys.size()[2];
        let all_keys = Tensor::f_cat(&[&*keys, &k], 2)?;
        let all_values = Tensor::f_cat(&[&*values, &v], 2)?;
        keys.f_copy_(&all_keys.f_narrow(2, steps, slots)?)?;
        values.f_copy_(&all_values.f_narrow(2, steps, slots)?)?;

        let q = apply_rope(&q, &tables.query_cos, &tables.query_sin)?;
        let k = apply_rope(&all_keys, &tables.key_cos, &tables.key_sin)?;
        // Each key/value head serves `groups` query heads (grouped-query attention). As a
        // broadcast, not repeat_interleave, which asks the device for its output size.
        let groups = heads / kv_heads;
        let share = |t: Tensor| -> TorchResult<Tensor> {
            if groups == 1 {
                return Ok(t);
            }
            let positions = t.size()[2];
            t.f_unsqueeze(2)?
                .f_expand([1, kv_heads, groups, positions, head_dim], false)?
                .f_reshape([1, heads, positions, head_dim])
        };
        let k = share(k)?;
        let v = share(all_values)?;
        let scores = q
            .f_matmul(&k.f_transpose(2, 3)?)?
            .f_mul_scalar((head_dim as f64).powf(-0.5))?
            .f_add(mask)?;
        let probs = scores.f_softmax(-1, ACTIVATION_KIND)?;
        let attended = probs
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_reshape([1, steps, heads * head_dim])?;
        let x = x.f_add(&self.o_proj.forward(&attended)?.f_mul(&self.attention_scale)?)?;

        let h = self.post_attention_norm.forward(&x)?;
        let gate_up = self.gate_up_proj.forward(&h)?;
        let width = gate_up.size()[2] / 2;
        let gated = gate_up
            .f_narrow(2, 0, width)?
            .f_silu()?
            .f_mul(&gate_up.f_narrow(2, width, width)?)?;
        x.f_add(&self.down_proj.forward(&gated)?.f_mul(&self.mlp_scale)?)
    }
}

fn rotate_half(x: &Tensor) -> TorchResult<Tensor> {
    let half = x.size()[3] / 2;
    let first = x.f_narrow(3, 0, half)?;
    let second = x.f_narrow(3, half, half)?;
    Tensor::f_cat(&[&second.f_neg()?, &first], 3)
}

fn apply_rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> TorchResult<Tensor> {
    x.f_mul(cos)?.f_add(&rotate_half(x)?.f_mul(sin)?)
}

/// ConvNeXt block of the upsampler: depthwise causal conv, LayerNorm, MLP, gamma, residual.
struct ConvNeXt {
    dwconv: CausalConv,
    norm_weight: Tensor,
    norm_bias: Tensor,
    pwconv1: Linear,
    pwconv2: Linear,
    gamma: Tensor,
    channels: i64,
}

impl ConvNeXt {
    fn load(
        weights: &WeightFile,
        layout: &mut StateLayout,
        prefix: &str,
        channels: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            dwconv: CausalConv::load(
                weights,
                layout,
                &format!("{prefix}.dwconv"),
                channels,
                channels,
                7,
                1,
                channels,
            )?,
            norm_weight: weights.get_as(&format!("{prefix}.norm.weight"), &[channels], Kind::Float)?,
            norm_bias: weights.get_as(&format!("{prefix}.norm.bias"), &[channels], Kind::Float)?,
            pwconv1: Linear::load(
                weights,
                &format!("{prefix}.pwconv1"),
                channels,
                4 * channels,
                true,
            )?,
            pwconv2: Linear::load(
                weights,
                &format!("{prefix}.pwconv2"),
                4 * channels,
                channels,
                true,
            )?,
            gamma: weights.get_as(&format!("{prefix}.gamma"), &[channels], Kind::Float)?,
            channels: channels as i64,
        })
    }

    fn forward(&self, x: &Tensor, state: &mut StreamState) -> TorchResult<Tensor> {
        let h = self.dwconv.forward(x, state)?.f_transpose(1, 2)?;
        let h = h.f_layer_norm(
            [self.channels],
            Some(&self.norm_weight),
            Some(&self.norm_bias),
            1e-6,
            false,
        )?;
        let h = self.pwconv1.forward(&h)?.f_gelu("none")?;
        let h = self.pwconv2.forward(&h)?.f_mul(&self.gamma)?;
        x.f_add(&h.f_transpose(1, 2)?)
    }
}

struct ResidualUnit {
    act1: SnakeBeta,
    conv1: CausalConv,
    act2: SnakeBeta,
    conv2: CausalConv,
}

impl ResidualUnit {
    fn forward(&self, x: &Tensor, state: &mut StreamState) -> TorchResult<Tensor> {
        let h = self.conv1.forward(&self.act1.forward(x)?, state)?;
        let h = self.conv2.forward(&self.act2.forward(&h)?, state)?;
        x.f_add(&h)
    }
}

struct DecoderBlock {
    act: SnakeBeta,
    upsample: CausalTransConv,
    units: Vec<ResidualUnit>,
}

impl DecoderBlock {
    fn load(
        weights: &WeightFile,
        layout: &mut StateLayout,
        prefix: &str,
        in_channels: usize,
        rate: usize,
    ) -> Result<Self, ModelError> {
        let out_channels = in_channels / 2;
        let act = SnakeBeta::load(weights, &format!("{prefix}.block.0"), in_channels)?;
        let upsample = CausalTransConv::load(
            weights,
            layout,
            &format!("{prefix}.block.1"),
            in_channels,
            out_channels,
            2 * rate,
            rate,
        )?;
        let units = [1, 3, 9]
            .into_iter()
            .enumerate()
            .map(|(i, dilation)| {
                let p = format!("{prefix}.block.{}", i + 2);
                let conv = |layout: &mut StateLayout, name: &str, kernel, dilation| {
                    CausalConv::load(
                        weights,
                        layout,
                        &format!("{p}.{name}"),
                        out_channels,
                        out_channels,
                        kernel,
                        dilation,
                        1,
                    )
                };
                Ok(ResidualUnit {
                    act1: SnakeBeta::load(weights, &format!("{p}.act1"), out_channels)?,
                    conv1: conv(layout, "conv1", 7, dilation)?,
                    act2: SnakeBeta::load(weights, &format!("{p}.act2"), out_channels)?,
                    conv2: conv(layout, "conv2", 1, 1)?,
                })
            })
            .collect::<Result<_, ModelError>>()?;
        Ok(Self { act, upsample, units })
    }

    fn forward(&self, x: &Tensor, state: &mut StreamState) -> TorchResult<Tensor> {
        let mut h = self.upsample.forward(&self.act.forward(x)?, state)?;
        for unit in &self.units {
            h = unit.forward(&h, state)?;
        }
        Ok(h)
    }
}

/// The loaded decoder. Immutable after loading, so one copy serves every stream.
pub struct Network {
    config: DecoderConfig,
    device: Device,
    /// Every codebook's entries already passed through its group's output projection,
    /// stacked: row `q * codebook_size + code` is codebook `q`'s contribution.
    codebook_table: Tensor,
    codebook_offsets: Tensor,
    pre_conv: CausalConv,
    input_proj: Linear,
    layers: Vec<TransformerLayer>,
    final_norm: RmsNorm,
    output_proj: Linear,
    upsample: Vec<(CausalTransConv, ConvNeXt)>,
    decoder_in: CausalConv,
    blocks: Vec<DecoderBlock>,
    final_act: SnakeBeta,
    final_conv: CausalConv,
    inv_freq: Vec<f64>,
    layout: StateLayout,
}

// SAFETY: libtorch tensors may be read from several threads at once; the network's tensors
// are written only while loading, before the network is shared, and only read afterwards
// (every op here allocates its result, none works in place on a weight).
unsafe impl Sync for Network {}

impl Network {
    pub fn load(weights: &WeightFile, config: &DecoderConfig) -> Result<Self, ModelError> {
        let c = config;
        let mut layout = StateLayout::default();

        let codebook_table = load_codebook_table(weights, c)?;
        let codebook_offsets = (Tensor::f_arange(c.num_quantizers as i64, (Kind::Int64, weights.device()))?
            .f_mul_scalar(c.codebook_size as i64))?;

        let pre_conv = CausalConv::load(
            weights,
            &mut layout,
            "pre_conv",
            c.codebook_dim,
            c.latent_dim,
            3,
            1,
            1,
        )?;
        let t = "pre_transformer";
        let input_proj = Linear::load(
            weights,
            &format!("{t}.input_proj"),
            c.latent_dim,
            c.hidden_size,
            true,
        )?;
        let layers = (0..c.num_hidden_layers)
            .map(|layer| TransformerLayer::load(weights, c, layer))
            .collect::<Result<_, _>>()?;
        let final_norm = RmsNorm::load(weights, &format!("{t}.norm"), c.hidden_size, c.rms_norm_eps)?;
        let output_proj = Linear::load(
            weights,
            &format!("{t}.output_proj"),
            c.hidden_size,
            c.latent_dim,
            true,
        )?;

        let upsample = c
            .upsampling_ratios
            .iter()
            .enumerate()
            .map(|(i, &ratio)| {
                let p = format!("upsample.{i}");
                Ok((
                    CausalTransConv::load(
                        weights,
                        &mut layout,
                        &format!("{p}.0"),
                        c.latent_dim,
                        c.latent_dim,
                        ratio,
                        ratio,
                    )?,
                    ConvNeXt::load(weights, &mut layout, &format!("{p}.1"), c.latent_dim)?,
                ))
            })
            .collect::<Result<_, ModelError>>()?;

        let decoder_in = CausalConv::load(
            weights,
            &mut layout,
            "decoder.0",
            c.latent_dim,
            c.decoder_dim,
            7,
            1,
            1,
        )?;
        let blocks = c
            .upsample_rates
            .iter()
            .enumerate()
            .map(|(i, &rate)| {
                DecoderBlock::load(
                    weights,
                    &mut layout,
                    &format!("decoder.{}", i + 1),
                    c.decoder_dim >> i,
                    rate,
                )
            })
            .collect::<Result<_, _>>()?;
        let n = c.upsample_rates.len();
        let output_channels = c.decoder_dim >> n;
        let final_act = SnakeBeta::load(weights, &format!("decoder.{}", n + 1), output_channels)?;
        let final_conv = CausalConv::load(
            weights,
            &mut layout,
            &format!("decoder.{}", n + 2),
            output_channels,
            1,
            7,
            1,
            1,
        )?;

        let half = c.head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| 1.0 / c.rope_theta.powf((2 * i) as f64 / c.head_dim as f64))
            .collect();

        Ok(Self {
            config: c.clone(),
            device: weights.device(),
            codebook_table,
            codebook_offsets,
            pre_conv,
            input_proj,
            layers,
            final_norm,
            output_proj,
            upsample,
            decoder_in,
            blocks,
            final_act,
            final_conv,
            inv_freq,
            layout,
        })
    }

    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    pub fn device(&self) -> Device {
        self.device
    }

    /// A fresh stream's state: silence in every context, an empty KV window.
    pub fn new_state(&self) -> TorchResult<StreamState> {
        let options = (ACTIVATION_KIND, self.device);
        let contexts = self
            .layout
            .contexts
            .iter()
            .map(|&shape| Tensor::f_zeros(shape, options))
            .collect::<TorchResult<_>>()?;
        let empty_kv = || {
            Tensor::f_zeros(
                [
                    1,
                    self.config.num_key_value_heads as i64,
                    self.config.sliding_window as i64 - 1,
                    self.config.head_dim as i64,
                ],
                options,
            )
        };
        let layers = self.config.num_hidden_layers;
        Ok(StreamState {
            contexts,
            keys: (0..layers).map(|_| empty_kv()).collect::<TorchResult<_>>()?,
            values: (0..layers).map(|_| empty_kv()).collect::<TorchResult<_>>()?,
            key_bias: Tensor::f_full([self.key_slots()], f64::NEG_INFINITY, options)?,
        })
    }

    /// Positions the KV window keeps from step to step.
    fn key_slots(&self) -> i64 {
        self.config.sliding_window as i64 - 1
    }

    /// Decodes the next frames of a stream. `codes`: [T, Q] int64 on the network's device,
    /// already checked to lie in `0..codebook_size`; `tables` made for T frames. Returns
    /// [T * samples_per_frame] audio. Every step of T frames launches the same kernels on
    /// tensors of the same shapes, whatever the stream's past.
    pub fn step(&self, codes: &Tensor, state: &mut StreamState, tables: &StepTables) -> TorchResult<Tensor> {
        let _no_grad = tch::no_grad_guard();
        let c = &self.config;
        let frames = codes.size()[0];
        assert_eq!(frames, tables.frames, "step tables made for another step size");

        // RVQ: one lookup per codebook in the stacked table, summed: [1, codebook_dim, T].
        let rows = codes.f_add(&self.codebook_offsets)?.f_flatten(0, 1)?;
        let quantized = self
            .codebook_table
            .f_index_select(0, &rows)?
            .f_view([frames, c.num_quantizers as i64, c.codebook_dim as i64])?
            .f_sum_dim_intlist(1, false, ACTIVATION_KIND)?
            .f_transpose(0, 1)?
            .f_unsqueeze(0)?;

        let h = self.pre_conv.forward(&quantized, state)?.f_transpose(1, 2)?;
        let mut h = self.input_proj.forward(&h)?;
        // The empty slots' bias moves along with the keys, as the layers shift their windows.
        let key_bias = Tensor::f_cat(&[&state.key_bias, &tables.new_key_bias], 0)?;
        state
            .key_bias
            .f_copy_(&key_bias.f_narrow(0, frames, self.key_slots())?)?;
        let mask = tables.window_mask.f_add(&key_bias)?;
        for (layer, (keys, values)) in self
            .layers
            .iter()
            .zip(state.keys.iter_mut().zip(&mut state.values))
        {
            h = layer.forward(&h, c, tables, &mask, keys, values)?;
        }
        let h = self.output_proj.forward(&self.final_norm.forward(&h)?)?;
        let mut h = h.f_transpose(1, 2)?;
        for (upsample, convnext) in &self.upsample {
            h = upsample.forward(&h, state)?;
            h = convnext.forward(&h, state)?;
        }
        let mut h = self.decoder_in.forward(&h, state)?;
        for block in &self.blocks {
            h = block.forward(&h, state)?;
        }
        let wav = self.final_conv.forward(&self.final_act.forward(&h)?, state)?;
        wav.f_clamp(-1.0, 1.0)?.f_flatten(0, -1)
    }

    /// RoPE tables and the sliding-window mask for steps of `frames` frames. Keys are the
    /// window's slots then the new positions, numbered from the oldest slot, so positions stay
    /// below the window size however long the stream runs; attention only sees position
    /// differences, which are unchanged. Angles in float64, as upstream's positions are exact.
    pub fn step_tables(&self, frames: usize) -> TorchResult<StepTables> {
        let frames = frames as i64;
        let slots = self.key_slots();
        let total = slots + frames;
        let half = self.inv_freq.len();
        let mut angles = Vec::with_capacity(total as usize * half * 2);
        for position in 0..total {
            for _ in 0..2 {
                angles.extend(self.inv_freq.iter().map(|f| position as f64 * f));
            }
        }
        let angles = Tensor::f_from_slice(&angles)?.f_view([total, 2 * half as i64])?;
        let table = |t: Tensor| t.f_to_device(self.device)?.f_to_kind(ACTIVATION_KIND);
        let cos = table(angles.f_cos()?)?;
        let sin = table(angles.f_sin()?)?;

        let window = self.config.sliding_window as i64;
        let mask: Vec<f32> = (slots..total)
            .flat_map(|query| {
                (0..total).map(move |key| {
                    if key <= query && key > query - window {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
            })
            .collect();
        Ok(StepTables {
            frames,
            query_cos: cos.f_narrow(0, slots, frames)?,
            query_sin: sin.f_narrow(0, slots, frames)?,
            key_cos: cos,
            key_sin: sin,
            window_mask: table(Tensor::f_from_slice(&mask)?.f_view([frames, total])?)?,
            new_key_bias: Tensor::f_zeros([frames], (ACTIVATION_KIND, self.device))?,
        })
    }
}

/// Per codebook: `embedding_sum / clamp(cluster_usage, 1e-5)`, then its group's 1x1
/// `output_proj` (codebook 0: `rvq_first`, the rest: `rvq_rest`). Computed in float64, stored
/// in the compute kind, as rows of one table.
fn load_codebook_table(weights: &WeightFile, c: &DecoderConfig) -> Result<Tensor, ModelError> {
    let dim = c.codebook_dim / 2;
    let mut tables = Vec::with_capacity(c.num_quantizers);
    for (group, count) in [("rvq_first", 1), ("rvq_rest", c.num_quantizers - 1)] {
        let prefix = format!("quantizer.{group}");
        let projection = weights
            .get_as(
                &format!("{prefix}.output_proj.weight"),
                &[c.codebook_dim, dim, 1],
                Kind::Double,
            )?
            .f_squeeze_dim(2)?;
        for layer in 0..count {
            let p = format!("{prefix}.vq.layers.{layer}._codebook");
            let sum = weights.get_as(
                &format!("{p}.embedding_sum"),
                &[c.codebook_size, dim],
                Kind::Double,
            )?;
            let usage = weights.get_as(&format!("{p}.cluster_usage"), &[c.codebook_size], Kind::Double)?;
            let entries = sum.f_div(&usage.f_clamp_min(1e-5)?.f_unsqueeze(1)?)?;
            tables.push(entries.f_matmul(&projection.f_transpose(0, 1)?)?);
        }
    }
    Ok(Tensor::f_cat(&tables, 0)?.f_to_kind(weights.kind())?)
}
