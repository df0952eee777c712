//! The vocoder (upstream's `decoder`): a causal conv, upsampling blocks of SnakeBeta,
//! transposed conv and dilated residual units, then SnakeBeta and a conv to one channel.

use std::ffi::CString;

use tch::Tensor;

use super::conv::{CausalConv, CausalTransConv, ConvShape};
use super::precision::Tiles;
use super::snake_beta::SnakeBeta;
use super::state::{State, StateLayout};
use crate::model::checkpoint::Weights;
use crate::model::config::DecoderConfig;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;
use crate::model::op_profiler::Scope;

pub struct Vocoder {
    input_name: CString,
    input_conv: CausalConv,
    blocks: Vec<DecoderBlock>,
    /// The final SnakeBeta's name: its stage holds the final conv too.
    final_name: CString,
    final_act: SnakeBeta,
    final_conv: CausalConv,
}

impl Vocoder {
    pub fn load(weights: &Weights, layout: &mut StateLayout, c: &DecoderConfig) -> Result<Self, ModelError> {
        let input_conv = CausalConv::load(
            &weights.at(0),
            layout,
            ConvShape::dense(c.latent_dim, c.decoder_dim, 7),
        )?;
        let blocks = c
            .upsample_rates
            .iter()
            .enumerate()
            .map(|(i, &rate)| {
                let columns = weights.columns_per_frame() * c.upsample_rates[..i].iter().product::<usize>();
                DecoderBlock::load(
                    &weights.at(i + 1).at_rate(columns),
                    layout,
                    c.decoder_dim >> i,
                    rate,
                )
            })
            .collect::<Result<_, _>>()?;
        let n = c.upsample_rates.len();
        let output_rate = weights.columns_per_frame() * c.upsample_rates.iter().product::<usize>();
        let output_channels = c.decoder_dim >> n;
        Ok(Self {
            input_name: weights.at(0).module_name(),
            input_conv,
            blocks,
            final_name: weights.at(n + 1).module_name(),
            final_act: SnakeBeta::load(&weights.at(n + 1), output_channels)?,
            final_conv: CausalConv::load(
                &weights.at(n + 2).at_rate(output_rate),
                layout,
                ConvShape::dense(output_channels, 1, 7),
            )?,
        })
    }

    /// `x`: [B, latent, T'] -> [B, 1, T' * product of the rates], unclamped.
    pub fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        let mut h = {
            let _stage = Scope::enter(&self.input_name);
            self.input_conv.forward(x, state)?
        };
        for block in &self.blocks {
            h = block.forward(&h, state)?;
        }
        let _stage = Scope::enter(&self.final_name);
        self.final_conv.forward(&self.final_act.forward(&h)?, state)
    }
}

struct DecoderBlock {
    name: CString,
    act: SnakeBeta,
    upsample: CausalTransConv,
    units: Vec<ResidualUnit>,
}

impl DecoderBlock {
    /// `block.0` SnakeBeta, `block.1` the transposed conv (kernel 2 * rate), `block.2..4` the
    /// residual units of dilation 1, 3 and 9; channels halve.
    fn load(
        weights: &Weights,
        layout: &mut StateLayout,
        in_channels: usize,
        rate: usize,
    ) -> Result<Self, ModelError> {
        let name = weights.module_name();
        let weights = weights.at("block");
        let out_channels = in_channels / 2;
        let act = SnakeBeta::load(&weights.at(0), in_channels)?;
        let upsample =
            CausalTransConv::load(&weights.at(1), layout, in_channels, out_channels, 2 * rate, rate)?;
        let upsampled = weights.columns_per_frame() * rate;
        let units = [1, 3, 9]
            .into_iter()
            .enumerate()
            .map(|(i, dilation)| {
                ResidualUnit::load(
                    &weights.at(i + 2).at_rate(upsampled),
                    layout,
                    out_channels,
                    dilation,
                )
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name,
            act,
            upsample,
            units,
        })
    }

    fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        let _stage = Scope::enter(&self.name);
        let mut h = self.upsample.forward(&self.act.forward(x)?, state)?;
        for unit in &self.units {
            h = unit.forward(&h, state)?;
        }
        Ok(h)
    }
}

struct ResidualUnit {
    act1: SnakeBeta,
    conv1: CausalConv,
    act2: SnakeBeta,
    conv2: CausalConv,
}

impl ResidualUnit {
    fn load(
        weights: &Weights,
        layout: &mut StateLayout,
        channels: usize,
        dilation: usize,
    ) -> Result<Self, ModelError> {
        let dilated = ConvShape {
            dilation,
            tiles: Tiles::Fast,
            ..ConvShape::dense(channels, channels, 7)
        };
        Ok(Self {
            act1: SnakeBeta::load(&weights.at("act1"), channels)?,
            conv1: CausalConv::load(&weights.at("conv1"), layout, dilated)?,
            act2: SnakeBeta::load(&weights.at("act2"), channels)?,
            conv2: CausalConv::load(
                &weights.at("conv2"),
                layout,
                ConvShape::dense(channels, channels, 1),
            )?,
        })
    }

    fn forward(&self, x: &Tensor, state: &mut State) -> TorchResult<Tensor> {
        let h = self.conv1.forward(&self.act1.forward(x)?, state)?;
        let mut h = self.conv2.forward(&self.act2.forward(&h)?, state)?;
        h.f_add_(x)
    }
}
