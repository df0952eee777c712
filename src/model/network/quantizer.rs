//! The residual vector quantizer's decode: codes to the sum of their codebook entries.

use tch::{Kind, Tensor};

use super::state::ACTIVATION_KIND;
use crate::model::checkpoint::Weights;
use crate::model::config::DecoderConfig;
use crate::model::error::ModelError;
use crate::model::error::TorchResult;

pub struct Quantizer {
    /// Every codebook's entries already passed through its group's output projection,
    /// stacked: row `q * codebook_size + code` is codebook `q`'s contribution.
    table: Tensor,
    /// [Q]: where each codebook's rows start in `table`.
    offsets: Tensor,
    codebooks: i64,
    dim: i64,
}

impl Quantizer {
    /// Per codebook: `embedding_sum / clamp(cluster_usage, 1e-5)`, then its group's 1x1
    /// `output_proj` (codebook 0: `rvq_first`, the rest: `rvq_rest`). Computed in float64,
    /// stored in the compute kind.
    pub fn load(weights: &Weights, c: &DecoderConfig) -> Result<Self, ModelError> {
        let dim = c.codebook_dim / 2;
        let mut tables = Vec::with_capacity(c.num_quantizers);
        for (group, count) in [("rvq_first", 1), ("rvq_rest", c.num_quantizers - 1)] {
            let group = weights.at(group);
            let projection = group
                .at("output_proj")
                .get_as("weight", &[c.codebook_dim, dim, 1], Kind::Double)?
                .f_squeeze_dim(2)?;
            for layer in 0..count {
                let codebook = group.at("vq.layers").at(layer).at("_codebook");
                let sum = codebook.get_as("embedding_sum", &[c.codebook_size, dim], Kind::Double)?;
                let usage = codebook.get_as("cluster_usage", &[c.codebook_size], Kind::Double)?;
                let entries = sum.f_div(&usage.f_clamp_min(1e-5)?.f_unsqueeze(1)?)?;
                tables.push(entries.f_matmul(&projection.f_transpose(0, 1)?)?);
            }
        }
        let offsets = Tensor::f_arange(c.num_quantizers as i64, (Kind::Int64, weights.device()))?
            .f_mul_scalar(c.codebook_size as i64)?;
        Ok(Self {
            table: Tensor::f_cat(&tables, 0)?.f_to_kind(weights.kind())?,
            offsets,
            codebooks: c.num_quantizers as i64,
            dim: c.codebook_dim as i64,
        })
    }

    /// `codes`: [B, T, Q] int64 -> [B, codebook_dim, T]: one lookup per codebook in the
    /// stacked table, summed.
    pub fn forward(&self, codes: &Tensor) -> TorchResult<Tensor> {
        let (batch, frames) = (codes.size()[0], codes.size()[1]);
        let rows = codes.f_add(&self.offsets)?.f_flatten(0, -1)?;
        self.table
            .f_index_select(0, &rows)?
            .f_view([batch, frames, self.codebooks, self.dim])?
            .f_sum_dim_intlist(2, false, ACTIVATION_KIND)?
            .f_transpose(1, 2)
    }
}
