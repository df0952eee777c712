//! The pre-transformer: sliding-window causal attention with RoPE, whose window of keys and
//! values each stream keeps from step to step.

use tch::{Device, Kind, Tensor};

use super::attention::{Attention, Heads, Rope};
use super::ops::{Linear, LinearWeights};
use super::rms_norm::RmsNorm;
use super::{ACTIVATION_KIND, State, TorchResult};
use crate::model::ModelError;
use crate::model::checkpoint::Weights;
use crate::model::config::DecoderConfig;

/// What a step of a given number of frames needs besides codes and state, the same for every
/// such step of every stream: RoPE tables and the sliding-window mask. Made once per step size
/// (uploaded once, and the fixed inputs of a captured CUDA graph).
///
/// Keys are the window's slots then the new positions, numbered from the oldest slot, so
/// positions stay below the window size however long a stream runs and are the same for every
/// stream (attention only sees position differences, which are unchanged); where a stream's
/// window is not full yet, its own bias in the state hides the empty slots.
pub struct StepTables {
    pub(super) frames: i64,
    query_cos: Tensor,
    query_sin: Tensor,
    key_cos: Tensor,
    key_sin: Tensor,
    /// [frames, slots + frames]: 0 where a new position may see a key, -inf elsewhere.
    window_mask: Tensor,
    /// [1, frames] zeros: the new positions' own keys always count.
    new_key_bias: Tensor,
}

impl StepTables {
    pub fn frames(&self) -> usize {
        self.frames as usize
    }

    fn rope(&self) -> Rope<'_> {
        Rope {
            query_cos: &self.query_cos,
            query_sin: &self.query_sin,
            key_cos: &self.key_cos,
            key_sin: &self.key_sin,
        }
    }

    /// The same tables (tensors share their memory).
    pub fn shallow_clone(&self) -> Self {
        Self {
            frames: self.frames,
            query_cos: self.query_cos.shallow_clone(),
            query_sin: self.query_sin.shallow_clone(),
            key_cos: self.key_cos.shallow_clone(),
            key_sin: self.key_sin.shallow_clone(),
            window_mask: self.window_mask.shallow_clone(),
            new_key_bias: self.new_key_bias.shallow_clone(),
        }
    }

    /// Angles in float64, as upstream's positions are exact.
    fn new(config: &DecoderConfig, device: Device, frames: usize) -> TorchResult<Self> {
        let frames = frames as i64;
        let slots = key_slots(config);
        let total = slots + frames;
        let head_dim = config.head_dim;
        let inv_freq: Vec<f64> = (0..head_dim / 2)
            .map(|i| 1.0 / config.rope_theta.powf((2 * i) as f64 / head_dim as f64))
            .collect();
        let mut angles = Vec::with_capacity(total as usize * head_dim);
        for position in 0..total {
            for _ in 0..2 {
                angles.extend(inv_freq.iter().map(|f| position as f64 * f));
            }
        }
        let angles = Tensor::f_from_slice(&angles)?.f_view([total, head_dim as i64])?;
        let table = |t: Tensor| t.f_to_device(device)?.f_to_kind(ACTIVATION_KIND);
        let cos = table(angles.f_cos()?)?;
        let sin = table(angles.f_sin()?)?;

        let window = config.sliding_window as i64;
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
        Ok(Self {
            frames,
            query_cos: cos.f_narrow(0, slots, frames)?,
            query_sin: sin.f_narrow(0, slots, frames)?,
            key_cos: cos,
            key_sin: sin,
            window_mask: table(Tensor::f_from_slice(&mask)?.f_view([frames, total])?)?,
            new_key_bias: Tensor::f_zeros([1, frames], (ACTIVATION_KIND, device))?,
        })
    }
}

/// Positions the KV window keeps from step to step.
pub fn key_slots(config: &DecoderConfig) -> i64 {
    config.sliding_window as i64 - 1
}

/// `input_proj`, the layers, the final norm and `output_proj`.
pub struct Transformer {
    input_proj: Linear,
    layers: Vec<TransformerLayer>,
    final_norm: RmsNorm,
    output_proj: Linear,
    config: DecoderConfig,
    device: Device,
}

impl Transformer {
    pub fn load(weights: &Weights, c: &DecoderConfig) -> Result<Self, ModelError> {
        Ok(Self {
            input_proj: Linear::load(&weights.at("input_proj"), c.latent_dim, c.hidden_size, true)?,
            layers: (0..c.num_hidden_layers)
                .map(|layer| TransformerLayer::load(&weights.at("layers").at(layer), c))
                .collect::<Result<_, _>>()?,
            final_norm: RmsNorm::load(&weights.at("norm"), c.hidden_size, c.rms_norm_eps)?,
            output_proj: Linear::load(&weights.at("output_proj"), c.hidden_size, c.latent_dim, true)?,
            config: c.clone(),
            device: weights.device(),
        })
    }

    pub fn step_tables(&self, frames: usize) -> TorchResult<StepTables> {
        StepTables::new(&self.config, self.device, frames)
    }

    /// `x`: [B, T, latent] -> [B, T, latent]; moves each row's KV window on by T positions.
    pub fn forward(&self, x: &Tensor, state: &mut State, tables: &StepTables) -> TorchResult<Tensor> {
        let (batch, frames) = (x.size()[0], x.size()[1]);
        let slots = key_slots(&self.config);
        // The empty slots' bias moves along with the keys, as the layers shift their windows.
        let key_bias = Tensor::f_cat(
            &[
                &state.key_bias,
                &tables.new_key_bias.f_expand([batch, frames], false)?,
            ],
            1,
        )?;
        state.key_bias.f_copy_(&key_bias.f_narrow(1, frames, slots)?)?;
        // [B, 1, T, slots + T]
        let mask = tables
            .window_mask
            .f_add(&key_bias.f_unsqueeze(1)?)?
            .f_unsqueeze(1)?;
        let c = &self.config;
        let attention = Attention {
            heads: Heads {
                heads: c.num_attention_heads as i64,
                kv_heads: c.num_key_value_heads as i64,
                head_dim: c.head_dim as i64,
            },
            rope: tables.rope(),
            mask: &mask,
        };
        let mut h = self.input_proj.forward(x)?;
        for (layer, (keys, values)) in self
            .layers
            .iter()
            .zip(state.keys.iter_mut().zip(&mut state.values))
        {
            h = layer.forward(&h, &attention, keys, values)?;
        }
        self.output_proj.forward(&self.final_norm.forward(&h)?)
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
    fn load(weights: &Weights, config: &DecoderConfig) -> Result<Self, ModelError> {
        let hidden = config.hidden_size;
        let q_width = config.num_attention_heads * config.head_dim;
        let kv_width = config.num_key_value_heads * config.head_dim;
        let intermediate = config.intermediate_size;
        let bias = config.attention_bias;
        let eps = config.rms_norm_eps;
        let attention = weights.at("self_attn");
        let mlp = weights.at("mlp");
        Ok(Self {
            input_norm: RmsNorm::load(&weights.at("input_layernorm"), hidden, eps)?,
            qkv_proj: Linear::new(LinearWeights::stacked(&[
                LinearWeights::load(&attention.at("q_proj"), hidden, q_width, bias)?,
                LinearWeights::load(&attention.at("k_proj"), hidden, kv_width, bias)?,
                LinearWeights::load(&attention.at("v_proj"), hidden, kv_width, bias)?,
            ])?)?,
            o_proj: Linear::load(&attention.at("o_proj"), q_width, hidden, bias)?,
            attention_scale: weights
                .at("self_attn_layer_scale")
                .get_as("scale", &[hidden], Kind::Float)?,
            post_attention_norm: RmsNorm::load(&weights.at("post_attention_layernorm"), hidden, eps)?,
            gate_up_proj: Linear::new(LinearWeights::stacked(&[
                LinearWeights::load(&mlp.at("gate_proj"), hidden, intermediate, false)?,
                LinearWeights::load(&mlp.at("up_proj"), hidden, intermediate, false)?,
            ])?)?,
            down_proj: Linear::load(&mlp.at("down_proj"), intermediate, hidden, false)?,
            mlp_scale: weights
                .at("mlp_layer_scale")
                .get_as("scale", &[hidden], Kind::Float)?,
        })
    }

    /// `x`: [B, T, hidden]. Updates this layer's KV window in `keys`/`values` ([B, kv heads,
    /// slots, head_dim]).
    fn forward(
        &self,
        x: &Tensor,
        attention: &Attention,
        keys: &mut Tensor,
        values: &mut Tensor,
    ) -> TorchResult<Tensor> {
        let h = self.input_norm.forward(x)?;
        let attended = attention.attend(&self.qkv_proj.forward(&h)?, keys, values)?;
        // Each residual branch scaled by its LayerScale and added in one op.
        let x = x.f_addcmul(&self.o_proj.forward(&attended)?, &self.attention_scale)?;

        let h = self.post_attention_norm.forward(&x)?;
        let gate_up = self.gate_up_proj.forward(&h)?;
        let width = gate_up.size()[2] / 2;
        let gated = gate_up
            .f_narrow(2, 0, width)?
            .f_silu()?
            .f_mul(&gate_up.f_narrow(2, width, width)?)?;
        x.f_addcmul(&self.down_proj.forward(&gated)?, &self.mlp_scale)
    }
}
