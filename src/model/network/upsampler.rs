//! The upsampler between the transformer and the vocoder: per ratio, a transposed convolution
//! and a ConvNeXt block.

use std::ffi::CString;

use tch::{Kind, Tensor};

use super::conv::{CausalConv, CausalTransConv, ConvShape};
use super::ops::Linear;
use super::state::{State, StateLayout};
use crate::model::checkpoint::Weights;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::op_profiler::Scope;

pub struct UpsampleStage {
    name: CString,
    upsample: CausalTransConv,
    convnext: ConvNeXt,
}

impl UpsampleStage {
    /// `upsample.<i>` of upstream: `0` the transposed conv (kernel = stride = ratio), `1` the
    /// ConvNeXt block.
    pub fn load(
        weights: &Weights,
        layout: &mut StateLayout,
        channels: usize,
        ratio: usize,
    ) -> Result<Self, ModelError> {
        Ok(Self {
            name: weights.module_name(),
            upsample: CausalTransConv::load(&weights.at(0), layout, channels, channels, ratio, ratio)?,
            convnext: ConvNeXt::load(
                &weights.at(1).at_rate(weights.columns_per_frame() * ratio),
                layout,
                channels,
            )?,
        })
    }

    /// `x`: [B, channels, T] -> [B, channels, T * ratio].
    pub fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        let _stage = Scope::enter(&self.name);
        self.convnext.forward(&self.upsample.forward(x, state)?, state)
    }
}

/// ConvNeXt block: depthwise causal conv, LayerNorm, MLP, gamma, residual.
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
    fn load(weights: &Weights, layout: &mut StateLayout, channels: usize) -> Result<Self, ModelError> {
        let depthwise = ConvShape {
            groups: channels,
            ..ConvShape::dense(channels, channels, 7)
        };
        let norm = weights.at("norm");
        Ok(Self {
            dwconv: CausalConv::load(&weights.at("dwconv"), layout, depthwise)?,
            norm_weight: norm.get_as("weight", &[channels], Kind::Float)?,
            norm_bias: norm.get_as("bias", &[channels], Kind::Float)?,
            pwconv1: Linear::load(&weights.at("pwconv1"), channels, 4 * channels, true)?,
            pwconv2: Linear::load(&weights.at("pwconv2"), 4 * channels, channels, true)?,
            gamma: weights.get_as("gamma", &[channels], Kind::Float)?,
            channels: channels as i64,
        })
    }

    fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
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
