//! The one list of storage formats. Each row of the [`formats!`] invocation below
//! is one format: its name (in profiles, on the command line and in kernel ids),
//! for a float its ggml type id and bytes, for a block format the type that is
//! the format ([`BlockFormat`], in [`super::block`]: ggml type id, geometry,
//! values, quantizer, kernels).
//! From that list come [`DType`] (f32, f16, then every block format, in the list's
//! order), [`QFormat`] (the block formats) with its geometry,
//! [`DType::ALL`] / [`QFormat::ALL`], the conversions between them, the ggml type
//! ids both ways, and the WGSL format number ([`QFormat::wgsl_id`], a block
//! format's row among the block formats: the `QFMT` override the quantized shaders
//! switch on, `shaders/qgeom.wgsl` lists them). The profile's storage dtype names
//! and their JSON Schema are [`DType::ALL`]'s names.

use serde::{Deserialize, Serialize};

use super::block::{BlockFormat, FormatOps, iq4xs, kquant, q32};

/// Defines [`DType`] and [`QFormat`] from the list of formats: float rows
/// (`Variant = "name", ggml ID, bytes N;`), then block rows (`Variant "name"
/// Type`: `Type` the format's [`BlockFormat`], which holds everything else about
/// it, its layout documented there) in groups by the module of [`super::block`]
/// that holds their types (`q32 { … } kquant { … }`; the rows' order is the
/// formats' order, so a module may head more than one group). The variant is
/// ggml's type name, the string the name in files.
macro_rules! formats {
    (
        floats { $($(#[doc = $fdoc:literal])* $fv:ident = $fname:literal, ggml $fid:literal, bytes $fbytes:literal;)* }
        blocks {
            $($m:ident { $($v:ident $name:literal $ty:ident),* })*
        }
    ) => {
        /// Storage type of a variant's weight and cache buffers (activations are f32).
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, strum::IntoStaticStr, strum::EnumIter, strum::Display,
        )]
        #[allow(non_camel_case_types)] // ggml's type names (Q4_K, IQ4_XS)
        pub enum DType {
            $($(#[doc = $fdoc])* #[serde(rename = $fname)] #[strum(serialize = $fname)] $fv,)*
            $($(#[doc = concat!("ggml ", stringify!($v), " blocks (weights only), laid out as [`", stringify!($m), "::", stringify!($ty), "`] says.")] #[serde(rename = $name)] #[strum(serialize = $name)] $v,)*)*
        }

        /// A block-quantized storage format.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[allow(non_camel_case_types)] // ggml's type names (Q4_K, IQ4_XS)
        pub enum QFormat {
            $($(#[doc = concat!("ggml ", stringify!($v), " (", stringify!($m), "::", stringify!($ty), ").")] #[serde(rename = $name)] $v,)*)*
        }

        impl DType {
            /// Every storage type, floats first.
            pub const ALL: [DType; [$($fname,)* $($($name,)*)*].len()] = [$(DType::$fv,)* $($(DType::$v,)*)*];
            /// The float storage types.
            pub const FLOAT: &'static [DType] = &[$(DType::$fv),*];
            /// The block-quantized storage types (every one after the floats).
            pub const QUANT: &'static [DType] = DType::ALL.split_at(DType::FLOAT.len()).1;

            /// The block format of a quantized type.
            pub fn quant(self) -> Option<QFormat> {
                match self {
                    $(DType::$fv => None,)*
                    $($(DType::$v => Some(QFormat::$v),)*)*
                }
            }
            /// The ggml type id (GGUF tensor info `type`).
            pub fn ggml_type(self) -> u32 {
                match self {
                    $(DType::$fv => $fid,)*
                    $($(DType::$v => <$m::$ty as BlockFormat>::LAYOUT.ggml,)*)*
                }
            }
            /// ggml's name of the type (`F16`, `Q4_K`).
            pub fn ggml_name(self) -> &'static str {
                match self {
                    $(DType::$fv => stringify!($fv),)*
                    $($(DType::$v => stringify!($v),)*)*
                }
            }
            /// Elements per block and bytes per block on disk (ggml layout; a float
            /// type's block is one element).
            pub fn ggml_block(self) -> (usize, usize) {
                match self {
                    $(DType::$fv => (1, $fbytes),)*
                    $($(DType::$v => (<$m::$ty as BlockFormat>::LAYOUT.elems, <$m::$ty as BlockFormat>::LAYOUT.bytes),)*)*
                }
            }
        }

        impl From<QFormat> for DType {
            fn from(f: QFormat) -> DType {
                match f {
                    $($(QFormat::$v => DType::$v,)*)*
                }
            }
        }

        impl QFormat {
            pub const ALL: [QFormat; [$($($name,)*)*].len()] = [$($(QFormat::$v,)*)*];

            /// The format's name (in profiles, on the command line, in kernel ids).
            pub fn name(self) -> &'static str {
                match self {
                    $($(QFormat::$v => $name,)*)*
                }
            }

            /// Everything about the format ([`BlockFormat`]) as one table: the only
            /// place the formats' behaviour is chosen by variant.
            #[inline]
            pub fn ops(self) -> &'static FormatOps {
                match self {
                    $($(QFormat::$v => &<$m::$ty as BlockFormat>::OPS,)*)*
                }
            }
        }
    };
}

formats! {
    floats {
        F32 = "f32", ggml 0, bytes 4;
        F16 = "f16", ggml 1, bytes 2;
    }
    blocks {
        q32 { Q8_0 "q8_0" BlockQ8_0, Q4_0 "q4_0" BlockQ4_0, Q4_1 "q4_1" BlockQ4_1, Q5_0 "q5_0" BlockQ5_0, Q5_1 "q5_1" BlockQ5_1 }
        kquant { Q2_K "q2_k" BlockQ2K, Q3_K "q3_k" BlockQ3K, Q4_K "q4_k" BlockQ4K, Q5_K "q5_k" BlockQ5K, Q6_K "q6_k" BlockQ6K }
        q32 { IQ4_NL "iq4_nl" BlockIQ4NL }
        iq4xs { IQ4_XS "iq4_xs" BlockIQ4XS }
    }
}

impl DType {
    /// The storage type of ggml type id `t`, if ktune stores that type.
    pub fn from_ggml_type(t: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.ggml_type() == t)
    }
}

impl QFormat {
    /// The WGSL format number: the format's row among the block formats (the
    /// `QFMT` override of the quantized shaders).
    pub fn wgsl_id(self) -> u32 {
        self as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The float rows and the block rows agree: every block format is the
    /// `DType` of the same name, ids are unique, and a format's WGSL number is its
    /// position in `QFormat::ALL`.
    #[test]
    fn the_list_agrees_with_itself() {
        for (i, f) in QFormat::ALL.into_iter().enumerate() {
            let d = DType::from(f);
            assert_eq!(
                (d.quant(), d.name(), d.ggml_type(), d.ggml_name().to_lowercase()),
                (Some(f), f.name(), f.ggml_type(), f.name().to_string())
            );
            assert_eq!(f.wgsl_id() as usize, i);
            assert_eq!(d.ggml_block(), (f.block_elems(), f.block_bytes()));
        }
        for (i, d) in DType::ALL.into_iter().enumerate() {
            assert_eq!(DType::from_ggml_type(d.ggml_type()), Some(d));
            assert_eq!(d.name().parse::<DType>(), Ok(d));
            assert!(DType::ALL[..i].iter().all(|e| e.ggml_type() != d.ggml_type() && e.name() != d.name()));
        }
        assert_eq!(DType::QUANT.iter().map(|d| d.quant()).collect::<Vec<_>>(), QFormat::ALL.map(Some).to_vec());
    }

    /// The shaders switch on bare format numbers and name them in legends
    /// (`0 q8_0, 1 q4_0, …`, in `qgeom.wgsl` and the files that switch on `QFMT`):
    /// every "number name" pair in a shader's text is the format's
    /// [`QFormat::wgsl_id`], and at least one legend lists every format, so a
    /// reordered or extended list fails here until the shaders follow it.
    #[test]
    fn shader_legends_number_the_formats_as_the_list_does() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
        let mut full_legends = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("the shaders folder") {
            let path = entry.expect("a shader file").path();
            if path.extension().is_none_or(|e| e != "wgsl") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a readable shader");
            // A pair is `[(]N[u] name[,;:)]` (`4 (q8_0)` and `pad 4; q4_k` are counts).
            let words: Vec<&str> = text.split_whitespace().collect();
            let mut named = Vec::new();
            for pair in words.windows(2) {
                let number = pair[0].trim_start_matches('(').trim_end_matches('u');
                let name = pair[1].trim_end_matches(|c: char| ",;:)".contains(c));
                let (Ok(n), Ok(f)) = (number.parse::<u32>(), name.parse::<QFormat>()) else { continue };
                assert_eq!(n, f.wgsl_id(), "{}: `{n} {f}`, but the format list numbers {f} {}", path.display(), f.wgsl_id());
                named.push(f);
            }
            if QFormat::ALL.iter().all(|f| named.contains(f)) {
                full_legends.push(path);
            }
        }
        assert!(!full_legends.is_empty(), "no shader lists every format's number");
    }
}
