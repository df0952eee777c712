//! Our CPU kernels: C++ on libtorch's tensors, each `.cpp` beside the Rust that calls it, where
//! libtorch's ops cost more (README.md here says what each replaces and where it runs). Nothing
//! here knows the network: the layers in `network/` choose between a kernel and libtorch's ops
//! (the path CUDA takes), and `shim` says which kernels this CPU runs.

pub mod attention;
pub mod conv_amx;
pub mod direct_conv;
pub mod overlap_add;
pub mod pointwise;
pub mod rms_norm;
pub mod shim;
pub mod skinny_gemm;
pub mod snake_beta;
pub mod winograd;

#[cfg(test)]
use tch::{Kind, Tensor};

/// The largest difference between `got` and `expected` (float64) and the largest magnitude of
/// `expected`: the kernels' tests bound the first by a fraction of the second.
#[cfg(test)]
pub(crate) fn max_error_and_scale(got: &Tensor, expected: &Tensor) -> (f64, f64) {
    let error = (got.to_kind(Kind::Double) - expected)
        .abs()
        .max()
        .double_value(&[]);
    (error, expected.abs().max().double_value(&[]))
}

/// A kernel test's own random inputs, from a generator seeded by the test: tests run on
/// parallel threads, and libtorch's process-global generator (`tch::manual_seed`) would make a
/// test's inputs depend on which other tests drew numbers first.
#[cfg(test)]
pub(crate) struct Inputs(rand::rngs::StdRng);

#[cfg(test)]
impl Inputs {
    pub(crate) fn new(seed: u64) -> Self {
        use rand::SeedableRng;
        Self(rand::rngs::StdRng::seed_from_u64(seed))
    }

    fn tensor(values: Vec<f32>, shape: &[i64], options: (Kind, tch::Device)) -> Tensor {
        Tensor::from_slice(&values)
            .reshape(shape)
            .to_kind(options.0)
            .to_device(options.1)
    }

    /// Standard normal values (Box-Muller).
    pub(crate) fn normal(&mut self, shape: impl AsRef<[i64]>, options: (Kind, tch::Device)) -> Tensor {
        use rand::Rng;
        let shape = shape.as_ref();
        let count = shape.iter().product::<i64>() as usize;
        let values = (0..count)
            .map(|_| {
                let (u, v): (f64, f64) = (self.0.random::<f64>().max(f64::MIN_POSITIVE), self.0.random());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect();
        Self::tensor(values, shape, options)
    }

    /// Values uniform in [0, 1).
    pub(crate) fn uniform(&mut self, shape: impl AsRef<[i64]>, options: (Kind, tch::Device)) -> Tensor {
        use rand::Rng;
        let shape = shape.as_ref();
        let count = shape.iter().product::<i64>() as usize;
        let values = (0..count).map(|_| self.0.random::<f32>()).collect();
        Self::tensor(values, shape, options)
    }
}
