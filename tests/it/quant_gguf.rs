//! `QMatrix::quantize` is byte-identical to llama.cpp's reference quantizers as
//! the `gguf` Python package implements them (`gguf.quants.quantize`), for Q8_0,
//! Q4_0 and Q4_1, on inputs with zero, constant, one-signed, tiny and outlier
//! blocks and values on rounding boundaries. Fixture: tests/fixtures/quant/, made
//! by tools/make_quant_fixture.py.
//!
//! And every block format ktune reads dequantizes bit for bit as
//! `gguf.quants.dequantize` does: tests/fixtures/gguf/blocks.gguf (made by
//! tools/make_block_fixture.py) holds, per format, random blocks and the gguf
//! package's f32 values of them.

use ktune::kernels::quant::{QFormat, QMatrix};

#[test]
fn quantize_matches_gguf_python_byte_for_byte() {
    let dir = crate::common::fixture("quant");
    let meta = crate::common::read_json(dir.join("meta.json"));
    let (rows, cols) = (meta["rows"].as_u64().expect("rows") as usize, meta["cols"].as_u64().expect("cols") as usize);
    let raw = std::fs::read(dir.join("input.f32")).expect("input.f32");
    let x: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(x.len(), rows * cols);
    for f in [QFormat::Q8_0, QFormat::Q4_0, QFormat::Q4_1] {
        let want = std::fs::read(dir.join(format!("{}.bin", f.name()))).expect("fixture");
        let got = QMatrix::quantize(f, rows, cols, &x).expect("quantize").to_ggml();
        assert_eq!(got.len(), want.len(), "{f}: stream length");
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let b = i / f.block_bytes();
            panic!(
                "{f}: first difference at byte {i} (block {b}, row {}, byte {} of the block): ours {:02x?}, gguf {:02x?}",
                b / (cols / 32),
                i % f.block_bytes(),
                &got[b * f.block_bytes()..(b + 1) * f.block_bytes()],
                &want[b * f.block_bytes()..(b + 1) * f.block_bytes()]
            );
        }
        // And the file's blocks read back as the same matrix.
        let back = QMatrix::from_ggml(f, rows, cols, &want).expect("from_ggml");
        assert_eq!(back.dequantize(), QMatrix::quantize(f, rows, cols, &x).expect("quantize").dequantize(), "{f}");
    }
}

#[test]
fn every_block_format_dequantizes_as_gguf_python_bit_for_bit() {
    use ktune::kernels::cpu::Isa;
    use ktune::kernels::cpu::qdot::{dequantize, dot_q, qrow};
    use ktune::model::Stored;
    use ktune::model::WeightFile;
    use ktune::model::gguf::GgufFile;

    let f = GgufFile::open(&crate::common::gguf_dir().join("blocks.gguf")).expect("blocks.gguf");
    for format in QFormat::ALL {
        let name = format.name();
        let t = f.tensor(name).unwrap_or_else(|| panic!("blocks.gguf lacks `{name}`"));
        assert_eq!(f.stored(t).expect("a type ktune reads"), Stored::Quant(format), "{name}");
        let e = f.tensor(&format!("{name}.expected")).unwrap_or_else(|| panic!("blocks.gguf lacks `{name}.expected`"));
        let (rows, cols) = (t.rows(), t.cols());
        let want: Vec<f32> = f.data(e).chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(want.len(), rows * cols, "{name}: expected values");
        // The reader's row decoding and the split layout's dequantization.
        let m = QMatrix::from_ggml(format, rows, cols, f.data(t)).expect("whole blocks");
        let got = m.dequantize();
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            f.decode_row(t, r, &mut row).expect("row");
            for c in 0..cols {
                let (a, b, w) = (got[r * cols + c], row[c], want[r * cols + c]);
                assert!(
                    a.to_bits() == w.to_bits() && b.to_bits() == w.to_bits(),
                    "{name} row {r} col {c}: ktune {a:e} / reader {b:e}, gguf {w:e}"
                );
            }
            // The SIMD paths agree with the reference (up to a fused multiply-add's
            // single rounding in the 32-element formats' loops; the dot product
            // to rounding of the sum order).
            let mut simd = vec![0f32; cols];
            dequantize(Isa::best(), qrow(m.view(), r, cols), &mut simd);
            for (c, (a, w)) in simd.iter().zip(&want[r * cols..(r + 1) * cols]).enumerate() {
                assert!((a - w).abs() <= 1e-6 * (1.0 + w.abs()), "{name} SIMD row {r} col {c}: {a:e} vs {w:e}");
            }
            let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            let exact: f64 = x.iter().zip(&want[r * cols..]).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = x.iter().zip(&want[r * cols..]).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let d = dot_q(Isa::best(), &x, qrow(m.view(), r, cols)) as f64;
            assert!((d - exact).abs() <= 1e-5 * scale.max(1e-30), "{name} row {r}: dot {d} vs {exact}");
        }
        // The split layout round-trips to the file's bytes.
        assert_eq!(m.to_ggml(), f.data(t), "{name}: to_ggml");
    }
}
