//! `y = x·Mᵀ` for a batch of activation rows: the group products from the kernel this CPU runs
//! fastest, combined with the float scales in one order on every CPU.

use rayon::prelude::*;

use super::activations::Activations;
use super::error::W4a8Error;
use super::isa::Isa;
use super::matrix::CqMatrix;
use super::portable;
#[cfg(target_arch = "x86_64")]
use super::x86;
use crate::quant::GROUP;
use crate::simd::widest;

/// Multiply-adds a thread takes on at the least: below this rayon's hand-off costs more.
const PARALLEL_MIN: usize = 1 << 16;

/// Rows from which the VNNI kernel takes outputs a tile at a time: a tile's transposition costs
/// about what one row's horizontal sums do, and every further row gains.
const TILE_ROWS: usize = 2;

/// Outputs a task takes a multiple of: whole tiles of the VNNI kernel (`x86::TILE`).
const TASK_OUTPUTS: usize = 16;

impl Isa {
    /// Outputs `first..` of `x·Mᵀ`, as many as `y` holds rows of `x.rows()` (`y` is output-major).
    /// The caller has checked that this CPU runs `self`.
    fn block(self, m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32]) {
        match self {
            // SAFETY: the caller checked `supported`, which is each function's target features.
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni if x.rows() >= TILE_ROWS => unsafe { vnni_tiles(m, x, first, y) },
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => unsafe { vnni_block(m, x, first, y) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { avx2_block(m, x, first, y) },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Vnni | Isa::Avx2 => portable_block(m, x, first, y),
            Isa::Portable => portable_block(m, x, first, y),
        }
    }
}

/// Runs `dots` on every group of outputs `first..` and sums the groups' products, scaled, into
/// `y` (output-major: `y[(o − first)·rows + r]`). `dots(codes, g, acc)` puts into `acc[r]` the
/// exact integer product of a group's codes with group `g` of activation row `r`.
#[inline(always)]
fn drive(m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32], mut dots: impl FnMut(&[u8], usize, &mut [i32])) {
    let rows = x.rows();
    let mut acc = vec![0i32; rows];
    for (o, y) in (first..).zip(y.chunks_exact_mut(rows)) {
        y.fill(0.0);
        for g in 0..m.groups() {
            dots(m.group_codes(o, g), g, &mut acc);
            let weight_scale = m.norm(o, g) * m.levels().scale;
            for (r, (y, &a)) in y.iter_mut().zip(&acc).enumerate() {
                *y += a as f32 * weight_scale * x.scale(r, g);
            }
        }
    }
}

fn portable_block(m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32]) {
    let (levels, packing) = (&m.levels().int8, m.packing());
    widest(
        #[inline(always)]
        || drive(m, x, first, y, |codes, g, acc| portable::group_dots(levels, packing, codes, x, g, acc)),
    )
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn avx2_block(m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32]) {
    let (levels, packing) = (&m.levels().int8, m.packing());
    drive(m, x, first, y, |codes, g, acc| x86::avx2_group_dots(levels, packing, codes, x, g, acc))
}

/// Outputs `first..` in tiles of [`x86::TILE`] ([`x86::vnni_tile`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni_tiles(m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32]) {
    let rows = x.rows();
    for (t, y) in y.chunks_mut(x86::TILE * rows).enumerate() {
        x86::vnni_tile(m, x, first + t * x86::TILE, y.len() / rows, y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni_block(m: &CqMatrix, x: &Activations, first: usize, y: &mut [f32]) {
    let (levels, packing) = (&m.levels().int8, m.packing());
    drive(m, x, first, y, |codes, g, acc| x86::vnni_group_dots(levels, packing, codes, x, g, acc))
}

impl CqMatrix {
    /// `x·Mᵀ`, `[x.rows(), out]` row-major, on the fastest kernel this CPU has.
    pub fn product(&self, x: &Activations) -> Result<Vec<f32>, W4a8Error> {
        self.product_on(Isa::detect(), x)
    }

    /// `x·Mᵀ` on the kernel `isa`.
    pub fn product_on(&self, isa: Isa, x: &Activations) -> Result<Vec<f32>, W4a8Error> {
        if !isa.supported() {
            return Err(W4a8Error::Unsupported { isa });
        }
        if x.in_dim() != self.in_dim() {
            return Err(W4a8Error::Width { found: x.in_dim(), expected: self.in_dim() });
        }
        let (rows, out) = (x.rows(), self.out());
        if rows == 0 || out == 0 {
            return Ok(Vec::new());
        }
        let mut by_output = vec![0f32; out * rows];
        let per_task = PARALLEL_MIN.div_ceil((self.groups() * GROUP * rows).max(1)).next_multiple_of(TASK_OUTPUTS);
        by_output
            .par_chunks_mut(per_task * rows)
            .enumerate()
            .for_each(|(task, y)| isa.block(self, x, task * per_task, y));
        if rows == 1 {
            return Ok(by_output);
        }
        let mut y = vec![0f32; rows * out];
        for (o, column) in by_output.chunks_exact(rows).enumerate() {
            column.iter().enumerate().for_each(|(r, &v)| y[r * out + o] = v);
        }
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::quant::{cq_encode, cq_split, Bits};
    use crate::w4a8::layout::lane;

    const WIDTHS: [Bits; 4] = [Bits::Four, Bits::Three, Bits::Two, Bits::Ternary];

    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
    }

    impl Isa {
        /// For each activation row `r`, the exact integer product of group `g` of row `o` of `m`
        /// with row `r`'s group `g`. Dispatches per call.
        fn group_dots(self, m: &CqMatrix, x: &Activations, o: usize, g: usize, acc: &mut [i32]) {
            let (levels, packing, codes) = (&m.levels().int8, m.packing(), m.group_codes(o, g));
            match self {
                // SAFETY: only called for an instruction set this CPU supports.
                #[cfg(target_arch = "x86_64")]
                Isa::Vnni => unsafe { x86::vnni_group_dots(levels, packing, codes, x, g, acc) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { x86::avx2_group_dots(levels, packing, codes, x, g, acc) },
                _ => portable::group_dots(levels, packing, codes, x, g, acc),
            }
        }
    }

    /// Shapes that pad a group, fill one, span several; batches of one row and of odd counts.
    const SHAPES: [(usize, usize, usize); 5] = [(1, 1, 128), (3, 7, 200), (5, 33, 384), (16, 65, 768), (2, 300, 1000)];

    /// Each kernel's integer group products are the codebook's int8 levels times the activation
    /// codes, summed, exactly: computed here from the blob's own indices, not from the kernels'
    /// packing, at every width, and then each kernel's products equal bit for bit.
    #[test]
    fn every_kernel_computes_the_exact_integer_group_products() {
        let supported: Vec<Isa> = Isa::ALL.into_iter().filter(|isa| isa.supported()).collect();
        eprintln!("kernels this CPU runs: {supported:?}");
        for bits in WIDTHS {
            for (seed, &(rows, out, in_dim)) in SHAPES.iter().enumerate() {
                let blob = cq_encode(&random(out * in_dim, seed as u64), in_dim, bits);
                let m = CqMatrix::from_blob(&blob, out, in_dim, bits).unwrap();
                let indices = cq_split(&blob, out, in_dim, bits).unwrap().indices;
                let mut xs = random(rows * in_dim, 100 + seed as u64);
                // Extremes: a row whose groups hold ±127 codes, against the largest levels.
                xs[..in_dim].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 3 == 0 { -1.0 } else { 1.0 });
                let x = Activations::quantize(&xs, rows, in_dim).unwrap();
                let mut acc = vec![0i32; rows];
                for o in 0..out {
                    for g in 0..m.groups() {
                        let group = &indices[(o * m.groups() + g) * GROUP..][..GROUP];
                        let want: Vec<i32> = (0..rows)
                            .map(|r| {
                                let codes = x.group(r, g);
                                (0..GROUP)
                                    .map(|i| {
                                        i32::from(m.levels().int8[usize::from(group[i])]) * i32::from(codes[lane(i)])
                                    })
                                    .sum()
                            })
                            .collect();
                        for &isa in &supported {
                            isa.group_dots(&m, &x, o, g, &mut acc);
                            assert_eq!(acc, want, "{isa:?}, {bits} bits, [{out}, {in_dim}], row {o}, group {g}");
                        }
                    }
                }
                let want = m.product_on(Isa::Portable, &x).unwrap();
                for &isa in &supported {
                    let got = m.product_on(isa, &x).unwrap();
                    assert!(
                        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?}, {bits} bits, {rows} × [{out}, {in_dim}]"
                    );
                }
            }
        }
    }

    /// A batch's rows are each the product of that row alone.
    #[test]
    fn a_batch_is_its_rows_one_at_a_time() {
        let (rows, out, in_dim) = (5, 70, 300);
        let m = CqMatrix::from_blob(&cq_encode(&random(out * in_dim, 7), in_dim, Bits::Four), out, in_dim, Bits::Four)
            .unwrap();
        let xs = random(rows * in_dim, 8);
        let batch = m.product(&Activations::quantize(&xs, rows, in_dim).unwrap()).unwrap();
        for (r, x) in xs.chunks_exact(in_dim).enumerate() {
            let alone = m.product(&Activations::quantize(x, 1, in_dim).unwrap()).unwrap();
            assert_eq!(alone, batch[r * out..][..out], "row {r}");
        }
    }

    #[test]
    fn a_width_mismatch_is_an_error() {
        let m = CqMatrix::from_blob(&cq_encode(&random(256, 9), 128, Bits::Four), 2, 128, Bits::Four).unwrap();
        let x = Activations::quantize(&random(129, 10), 1, 129).unwrap();
        let err = m.product(&x).unwrap_err();
        assert!(err.to_string().contains("129 wide"), "{err}");
    }
}
