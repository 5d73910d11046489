//! The instruction sets a W4A8 product can run on, and which this CPU runs: asked at run time, as the
//! training kernels ask.

/// The instruction set a product runs on. Every one computes the same values, bit for bit: the
/// group products are exact integers, and the float epilogue is the same code in the same order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 with VNNI (`vpdpbusd`): Ice Lake and later Intel, Zen 4 and later AMD.
    Vnni,
    /// AVX2 (`vpmaddubsw`): every x86-64 of the last decade.
    Avx2,
    /// Plain Rust, vectorized by the compiler: any other CPU (aarch64 included).
    Portable,
}

impl Isa {
    /// Every instruction set, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Vnni, Isa::Avx2, Isa::Portable];

    /// The fastest this CPU runs, asked at run time.
    pub fn detect() -> Self {
        Self::ALL.into_iter().find(|isa| isa.supported()).unwrap_or(Isa::Portable)
    }

    /// Whether this CPU can run it.
    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Vnni | Isa::Avx2 => false,
            Isa::Portable => true,
        }
    }
}
