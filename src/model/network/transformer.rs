//! The pre-transformer: sliding-window causal attention with RoPE, whose window of keys and
//! values each stream keeps from step to step. Op by op: libtorch's, and on the CPU our kernels
//! for the few-row products, attention and RMSNorm where they run.

use tch::{Device, Kind, Tensor};

use super::attention::{Attention, Heads, Rope};
use super::ops::{Linear, LinearWeights};
use super::rms_norm::RmsNorm;
use super::state::{ACTIVATION_KIND, State, key_slots};
use crate::model::checkpoint::Weights;
use crate::model::config::DecoderConfig;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;

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
        let layer = Self {
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
        };
        Ok(layer)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::checkpoint::{CheckpointFiles, WeightFile};
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// The layer written out in float64 from its own weights (float16 ones as stored), as
    /// upstream's modules compute it: RMSNorm, the q/k/v products, attention (its float64
    /// formula), o_proj times its LayerScale added, RMSNorm, SiLU(gate) times up, down_proj
    /// times its LayerScale added. The window is not moved here.
    fn float64_layer(
        layer: &TransformerLayer,
        x: &Tensor,
        attention: &Attention,
        keys: &Tensor,
        values: &Tensor,
    ) -> Tensor {
        let double = |t: &Tensor| t.to_kind(Kind::Double);
        let norm = |x: &Tensor, norm: &RmsNorm| {
            let (weight, eps) = norm.parts();
            double(weight) * x / (x.square().mean_dim(-1, true, Kind::Double) + eps).sqrt()
        };
        let product = |x: &Tensor, linear: &Linear| {
            let (weight, bias) = linear
                .stored_weights()
                .expect("the pre-transformer's weights are not packed");
            let y = x.matmul(&double(weight).tr());
            match bias {
                Some(bias) => y + double(bias).view([-1]),
                None => y,
            }
        };
        let x = double(x);
        let qkv = product(&norm(&x, &layer.input_norm), &layer.qkv_proj);
        let attended = attention.float64(&qkv, keys, values);
        let x = &x + product(&attended, &layer.o_proj) * double(&layer.attention_scale);
        let gate_up = product(&norm(&x, &layer.post_attention_norm), &layer.gate_up_proj);
        let width = gate_up.size()[2] / 2;
        let gated = gate_up.narrow(2, 0, width).silu() * gate_up.narrow(2, width, width);
        &x + product(&gated, &layer.down_proj) * double(&layer.mlp_scale)
    }

    /// A layer against its formula in float64, on the fixtures' geometries (grouped heads with
    /// biases; the release's), with float32 and float16 weights, one row and several, one
    /// position and several, windows partly empty: what the layer adds to its input close, the
    /// window moved. With the kernels this CPU and the environment allow (`make test` runs it
    /// under `avx2` and `off` too).
    #[test]
    fn a_layer_matches_its_formula_in_float64() {
        let mut random = Inputs::new(7);
        let options = (Kind::Float, Device::Cpu);
        for fixture in ["gqa-bias", "release-tiny"] {
            let folder = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(fixture);
            let files = CheckpointFiles::locate(&folder).unwrap();
            let config = DecoderConfig::from_file(&files.config).unwrap();
            let slots = key_slots(&config);
            let (kv_heads, head_dim) = (config.num_key_value_heads as i64, config.head_dim as i64);
            for rounding in [None, Some(Kind::Half), Some(Kind::BFloat16)] {
                let file = WeightFile::open(&files.weights, Device::Cpu, Kind::Float, rounding).unwrap();
                let transformer = Transformer::load(&file.root().at("pre_transformer"), &config).unwrap();
                let layer = &transformer.layers[0];
                for (batch, frames) in [(1, 1), (3, 1), (2, 4)] {
                    let case = format!(
                        "{fixture}, weights rounded to {rounding:?}, {batch} rows of {frames} frames"
                    );
                    let tables = transformer.step_tables(frames as usize).unwrap();
                    // Row b's first 2b slots empty, as in a stream younger than the window.
                    let empty = Tensor::arange(slots, options)
                        .unsqueeze(0)
                        .lt_tensor(&(Tensor::arange(batch, options).unsqueeze(1) * 2.0));
                    let key_bias = Tensor::cat(
                        &[
                            Tensor::zeros([batch, slots], options).masked_fill(&empty, f64::NEG_INFINITY),
                            Tensor::zeros([batch, frames], options),
                        ],
                        1,
                    );
                    let mask = (&tables.window_mask + key_bias.unsqueeze(1)).unsqueeze(1);
                    let attention = Attention {
                        heads: Heads {
                            heads: config.num_attention_heads as i64,
                            kv_heads,
                            head_dim,
                        },
                        rope: tables.rope(),
                        mask: &mask,
                    };
                    let x = random.normal([batch, frames, config.hidden_size as i64], options);
                    let mut window = || random.normal([batch, kv_heads, slots, head_dim], options);
                    let (keys, values) = (window(), window());

                    let (mut moved_keys, mut moved_values) = (keys.copy(), values.copy());
                    let got = layer
                        .forward(&x, &attention, &mut moved_keys, &mut moved_values)
                        .unwrap();
                    let added =
                        float64_layer(layer, &x, &attention, &keys, &values) - x.to_kind(Kind::Double);
                    assert_eq!(got.size(), x.size(), "{case}");
                    let (error, scale) = max_error_and_scale(&(got - &x), &added);
                    // About twice the most measured (docs/testing.md).
                    assert!(
                        scale > 0.0 && error <= 1e-6 * scale,
                        "{case}: off by {error:e} of {scale:e}"
                    );
                    assert!(!moved_keys.equal(&keys), "{case}: the window moved");
                    assert!(!moved_values.equal(&values), "{case}: the window moved");
                }
            }
        }
    }
}
