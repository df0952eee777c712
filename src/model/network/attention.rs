//! A transformer layer's sliding-window attention for one step: RoPE on the queries and the
//! window's keys, masked softmax, the values' weighted sum, and the KV window moved on. On the
//! CPU one call of `kernels/attention.cpp`; on CUDA, where graphs capture it, libtorch's ops.

use tch::{Device, Tensor};

use super::state::ACTIVATION_KIND;
use crate::model::error::TorchResult;
use crate::model::kernels;
use crate::model::kernels::shim::{self, CpuKernels, Kernel};

/// RoPE's tables for a step: [T, head_dim] for the step's queries, [slots + T, head_dim] for
/// the window's keys and the step's.
pub struct Rope<'a> {
    pub query_cos: &'a Tensor,
    pub query_sin: &'a Tensor,
    pub key_cos: &'a Tensor,
    pub key_sin: &'a Tensor,
}

/// Heads of a layer: `heads` query heads share `kv_heads` key/value heads (grouped-query
/// attention), each `head_dim` wide.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
}

/// What every layer's attention shares in a step: the heads, RoPE's tables and `mask` ([B, 1,
/// T, slots + T], added to the scores: the window mask with each row's empty-slot bias).
pub struct Attention<'a> {
    pub heads: Heads,
    pub rope: Rope<'a>,
    pub mask: &'a Tensor,
}

impl Attention<'_> {
    /// `qkv`: [B, T, (heads + 2 kv_heads) head_dim], the step's queries, keys and values side
    /// by side; `keys`, `values`: a layer's window, [B, kv_heads, slots, head_dim] un-rotated,
    /// moved on by T positions in place. Returns [B, T, heads head_dim].
    pub fn attend(&self, qkv: &Tensor, keys: &mut Tensor, values: &mut Tensor) -> TorchResult<Tensor> {
        // libtorch's ops on CUDA, and on the CPU where our kernels are off (CUDA's path, run here).
        if qkv.device() != Device::Cpu || shim::kernel(Kernel::Attention) == CpuKernels::Off {
            return self.by_ops(qkv, keys, values);
        }
        let rope = &self.rope;
        let tables = kernels::attention::Tables {
            query_cos: rope.query_cos,
            query_sin: rope.query_sin,
            key_cos: rope.key_cos,
            key_sin: rope.key_sin,
            mask: self.mask,
        };
        kernels::attention::attention(qkv, keys, values, &tables, self.heads.heads, self.heads.kv_heads)
    }

    /// [`Self::attend`] by libtorch's ops, as upstream computes it.
    fn by_ops(&self, qkv: &Tensor, keys: &mut Tensor, values: &mut Tensor) -> TorchResult<Tensor> {
        let Heads {
            heads,
            kv_heads,
            head_dim,
        } = self.heads;
        let (batch, steps) = (qkv.size()[0], qkv.size()[1]);
        let split_heads = |t: Tensor, n: i64| t.f_view([batch, steps, n, head_dim])?.f_transpose(1, 2);
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let q = split_heads(qkv.f_narrow(2, 0, q_width)?, heads)?;
        let k = split_heads(qkv.f_narrow(2, q_width, kv_width)?, kv_heads)?;
        let v = split_heads(qkv.f_narrow(2, q_width + kv_width, kv_width)?, kv_heads)?;

        let slots = keys.size()[2];
        let all_keys = Tensor::f_cat(&[&*keys, &k], 2)?;
        let all_values = Tensor::f_cat(&[&*values, &v], 2)?;
        keys.f_copy_(&all_keys.f_narrow(2, steps, slots)?)?;
        values.f_copy_(&all_values.f_narrow(2, steps, slots)?)?;

        let q = apply_rope(&q, self.rope.query_cos, self.rope.query_sin)?;
        let k = apply_rope(&all_keys, self.rope.key_cos, self.rope.key_sin)?;
        // Each key/value head serves `groups` query heads. As a broadcast, not
        // repeat_interleave, which asks the device for its output size.
        let groups = heads / kv_heads;
        let share = |t: Tensor| -> TorchResult<Tensor> {
            if groups == 1 {
                return Ok(t);
            }
            let positions = t.size()[2];
            t.f_unsqueeze(2)?
                .f_expand([batch, kv_heads, groups, positions, head_dim], false)?
                .f_reshape([batch, heads, positions, head_dim])
        };
        let k = share(k)?;
        let v = share(all_values)?;
        let scores = q
            .f_matmul(&k.f_transpose(2, 3)?)?
            .f_mul_scalar((head_dim as f64).powf(-0.5))?
            .f_add(self.mask)?;
        let probs = scores.f_softmax(-1, ACTIVATION_KIND)?;
        probs
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_reshape([batch, steps, heads * head_dim])
    }
}

#[cfg(test)]
impl Attention<'_> {
    /// [`Self::attend`] written out in float64 head by head, as upstream's formula reads
    /// (written apart from [`Self::by_ops`]): the window's keys and values then the step's,
    /// RoPE on the queries and every key at its position, scaled dot products plus the mask,
    /// softmax, each query head reading the key/value head of its group. `qkv` [B, T, (H + 2
    /// KV) D]; the window as [`Self::attend`] takes it (not moved here). [B, T, H D], float64.
    pub fn float64(&self, qkv: &Tensor, keys: &Tensor, values: &Tensor) -> Tensor {
        use tch::{IndexOp, Kind};
        let double = |t: &Tensor| t.to_kind(Kind::Double);
        let Heads {
            heads,
            kv_heads,
            head_dim,
        } = self.heads;
        let rotated = |x: &Tensor, cos: &Tensor, sin: &Tensor| {
            let half = head_dim / 2;
            let turned = Tensor::cat(&[-x.narrow(1, half, half), x.narrow(1, 0, half)], 1);
            x * double(cos) + turned * double(sin)
        };
        let qkv = double(qkv);
        let rows: Vec<Tensor> = (0..qkv.size()[0])
            .map(|row| {
                let outputs: Vec<Tensor> = (0..heads)
                    .map(|head| {
                        let group = head / (heads / kv_heads);
                        let query = qkv.i((row, .., head * head_dim..(head + 1) * head_dim));
                        let key_at = (heads + group) * head_dim;
                        let value_at = (heads + kv_heads + group) * head_dim;
                        let key = Tensor::cat(
                            &[
                                double(&keys.i((row, group))),
                                qkv.i((row, .., key_at..key_at + head_dim)),
                            ],
                            0,
                        );
                        let value = Tensor::cat(
                            &[
                                double(&values.i((row, group))),
                                qkv.i((row, .., value_at..value_at + head_dim)),
                            ],
                            0,
                        );
                        let query = rotated(&query, self.rope.query_cos, self.rope.query_sin);
                        let key = rotated(&key, self.rope.key_cos, self.rope.key_sin);
                        let scores = query.matmul(&key.tr()) / (head_dim as f64).sqrt()
                            + double(&self.mask.i((row, 0)));
                        scores.softmax(-1, Kind::Double).matmul(&value)
                    })
                    .collect();
                Tensor::cat(&outputs, 1)
            })
            .collect();
        Tensor::stack(&rows, 0)
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

#[cfg(test)]
mod tests {
    use tch::Kind;

    use super::*;
    use crate::model::kernels::{Inputs, max_error_and_scale};

    /// The kernel (this process's path) and libtorch's ops against the formula in float64 on
    /// the same inputs, the windows moved alike: grouped and plain heads, one position and
    /// several, more positions than the window holds, rows of their own.
    #[test]
    fn the_kernel_matches_libtorch_and_moves_the_window_alike() {
        let mut random = Inputs::new(11);
        for (heads, kv_heads, head_dim, slots, steps, batch) in [
            (4, 2, 8, 5, 1, 2),
            (4, 2, 8, 5, 3, 1),
            (4, 4, 16, 5, 7, 2),
            (16, 16, 64, 71, 1, 1),
            (16, 16, 64, 71, 4, 3),
        ] {
            let options = (Kind::Float, Device::Cpu);
            let heads = Heads {
                heads,
                kv_heads,
                head_dim,
            };
            let qkv = random.normal([batch, steps, (heads.heads + 2 * kv_heads) * head_dim], options);
            let mut window = || random.normal([batch, kv_heads, slots, head_dim], options);
            let (keys, values) = (window(), window());
            let mut table = |rows: i64| random.uniform([rows, head_dim], options) * 2.0 - 1.0;
            let (query_cos, query_sin) = (table(steps), table(steps));
            let (key_cos, key_sin) = (table(slots + steps), table(slots + steps));
            let rope = Rope {
                query_cos: &query_cos,
                query_sin: &query_sin,
                key_cos: &key_cos,
                key_sin: &key_sin,
            };
            // Causal over the window and the step, each row's first slots empty (a young
            // stream).
            let position = Tensor::arange(slots + steps, options);
            let query = Tensor::arange(steps, options).unsqueeze(1) + slots as f64;
            let causal = position.unsqueeze(0).gt_tensor(&query);
            let empty = Tensor::arange(batch, options)
                .unsqueeze(1)
                .gt_tensor(&position.unsqueeze(0));
            let hidden = causal.unsqueeze(0).logical_or(&empty.unsqueeze(1));
            let mask = Tensor::zeros([batch, steps, slots + steps], options)
                .masked_fill(&hidden, f64::NEG_INFINITY)
                .unsqueeze(1);

            let attention = Attention {
                heads,
                rope,
                mask: &mask,
            };
            let (mut kernel_keys, mut kernel_values) = (keys.copy(), values.copy());
            let got = attention
                .attend(&qkv, &mut kernel_keys, &mut kernel_values)
                .unwrap();
            let (mut ops_keys, mut ops_values) = (keys.copy(), values.copy());
            let by_ops = attention.by_ops(&qkv, &mut ops_keys, &mut ops_values).unwrap();
            let expected = attention.float64(&qkv, &keys, &values);

            let case = format!("{heads:?} heads, {slots} slots, {steps} steps, {batch} rows");
            assert_eq!(got.size(), [batch, steps, heads.heads * head_dim], "{case}");
            for (path, got) in [("this process's", &got), ("libtorch's ops", &by_ops)] {
                let (error, scale) = max_error_and_scale(got, &expected);
                // About twice the most measured (docs/testing.md).
                assert!(
                    error <= 1e-6 * scale,
                    "{case}, {path}: off by {error:e} of {scale:e}"
                );
            }
            // The window keeps the last `slots` of its keys and the step's, as they came.
            let kv_width = kv_heads * head_dim;
            let step_part = |at: i64| {
                qkv.narrow(2, at, kv_width)
                    .view([batch, steps, kv_heads, head_dim])
                    .transpose(1, 2)
            };
            let moved =
                |window: &Tensor, at: i64| Tensor::cat(&[window, &step_part(at)], 2).narrow(2, steps, slots);
            assert!(
                ops_keys.equal(&moved(&keys, heads.heads * head_dim)),
                "{case}: keys by ops"
            );
            assert!(
                ops_values.equal(&moved(&values, heads.heads * head_dim + kv_width)),
                "{case}: values by ops"
            );
            assert!(kernel_keys.equal(&ops_keys), "{case}: keys");
            assert!(kernel_values.equal(&ops_values), "{case}: values");
            assert!(!kernel_keys.equal(&keys), "{case}: the window moved");
        }
    }
}
