//! Matrix products on host slices through the `gemm` crate — the kernels candle's CPU backend
//! calls, built with AVX-512 where the CPU has it — viewed with strides, so that a column block of
//! a wider buffer or a transposed matrix is a view, never a copy.

use gemm::Parallelism;

/// A read-only matrix view: element (i, j) is `data[i·row_stride + j·col_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct Mat<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> Mat<'a> {
    /// `rows × cols`, row-major and dense.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    /// `rows × cols`, row-major, rows `row_stride` apart (a column block of a wider matrix).
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        let view = Self { data, rows, cols, row_stride, col_stride: 1 };
        assert!(fits(data.len(), rows, cols, row_stride, 1), "matrix view {rows}×{cols} outside its buffer");
        view
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The transpose, as a view.
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }
}

/// A writable matrix view, laid out as [`Mat`].
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
}

impl<'a> MatMut<'a> {
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self::strided(data, rows, cols, cols)
    }

    pub fn strided(data: &'a mut [f32], rows: usize, cols: usize, row_stride: usize) -> Self {
        assert!(fits(data.len(), rows, cols, row_stride, 1), "matrix view {rows}×{cols} outside its buffer");
        Self { data, rows, cols, row_stride }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The same view, borrowed again (to write it in one product and keep it for the next).
    pub fn reborrow(&mut self) -> MatMut<'_> {
        MatMut { data: &mut *self.data, ..*self }
    }

    /// The view, read-only.
    pub fn as_mat(&self) -> Mat<'_> {
        Mat::strided(self.data, self.rows, self.cols, self.row_stride)
    }
}

/// Whether a `rows × cols` view with these strides stays inside `len` elements; a view whose last
/// offset overflows `usize` does not.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    let last = |n: usize, stride: usize| n.checked_sub(1).map(|n| n.checked_mul(stride));
    match (last(rows, row_stride), last(cols, col_stride)) {
        (None, _) | (_, None) => true,
        (Some(Some(row)), Some(Some(col))) => row.checked_add(col).is_some_and(|end| end < len),
        _ => false,
    }
}

/// Whether a product may spread over the thread pool: the big products of a layer do; the small
/// ones inside tasks that are themselves spread (attention blocks) do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    All,
    One,
}

/// `dst = alpha·a·b`, or `dst += alpha·a·b` when `accumulate`.
pub fn matmul(dst: MatMut, a: Mat, b: Mat, alpha: f32, accumulate: bool, threads: Threads) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(
        b.rows == k && dst.rows == m && dst.cols == n,
        "product {m}×{k} · {}×{n} into {}×{}",
        b.rows,
        dst.rows,
        dst.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|i| dst.data[i * dst.row_stride..][..n].fill(0.0));
        }
        return;
    }
    let parallelism = match threads {
        Threads::All => Parallelism::Rayon(0),
        Threads::One => Parallelism::None,
    };
    // SAFETY: every view was checked to lie inside its slice (`fits`), the destination is borrowed
    // mutably and so aliases neither operand, and gemm reads and writes only within the m×n, m×k
    // and k×n views it is given.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
            1,
            dst.row_stride as isize,
            accumulate,
            a.data.as_ptr(),
            a.col_stride as isize,
            a.row_stride as isize,
            b.data.as_ptr(),
            b.col_stride as isize,
            b.row_stride as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        (0..m).flat_map(|i| (0..n).map(move |j| (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum())).collect()
    }

    #[test]
    fn strided_and_transposed_views_multiply_as_dense_matrices() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i % 11) as f32 - 5.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.5).collect();
        let want = naive(&a, &b, m, k, n);
        // The product written into columns 2..5 of a 5×6 buffer, then accumulated with alpha 2.
        let mut wide = vec![1.0f32; m * 6];
        matmul(
            MatMut::strided(&mut wide[2..], m, n, 6),
            Mat::new(&a, m, k),
            Mat::new(&b, k, n),
            1.0,
            false,
            Threads::All,
        );
        for i in 0..m {
            assert_eq!(&wide[i * 6 + 2..i * 6 + 5], &want[i * n..(i + 1) * n]);
            assert_eq!((wide[i * 6], wide[i * 6 + 5]), (1.0, 1.0), "outside the block untouched");
        }
        // bᵀ stored as n×k, viewed transposed; a's rows 1..4 only.
        let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
        let mut out = vec![1.0f32; 3 * n];
        let a_rows = Mat::new(&a[k..], 3, k);
        matmul(MatMut::new(&mut out, 3, n), a_rows, Mat::new(&bt, n, k).t(), 2.0, true, Threads::One);
        for (i, row) in out.chunks(n).enumerate() {
            for (j, v) in row.iter().enumerate() {
                assert_eq!(*v, 1.0 + 2.0 * want[(i + 1) * n + j]);
            }
        }
        // k = 0 clears, or leaves an accumulation alone.
        let mut zero = vec![3.0f32; 4];
        matmul(MatMut::new(&mut zero, 2, 2), Mat::new(&[], 2, 0), Mat::new(&[], 0, 2), 1.0, false, Threads::One);
        assert_eq!(zero, [0.0; 4]);
    }

    #[test]
    fn a_view_fits_only_when_its_last_offset_is_inside_and_does_not_overflow() {
        assert!(fits(15, 3, 5, 5, 1) && !fits(14, 3, 5, 5, 1));
        assert!(fits(0, 0, 5, 5, 1) && fits(0, 3, 0, 5, 1), "an empty view reads nothing");
        // (rows − 1)·row_stride wraps round `usize`: refused, not let through as a small offset.
        assert!(!fits(16, 3, 1, usize::MAX / 2 + 1, 1));
        assert!(!fits(16, 2, 2, usize::MAX, 1), "the sum of the two offsets overflows");
    }
}
