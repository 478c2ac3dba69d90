//! `QMatrix::quantize` is byte-identical to llama.cpp's reference quantizers as
//! the `gguf` Python package implements them (`gguf.quants.quantize`), for Q8_0,
//! Q4_0 and Q4_1, on inputs with zero, constant, one-signed, tiny and outlier
//! blocks and values on rounding boundaries. Fixture: tests/fixtures/quant/, made
//! by tools/make_quant_fixture.py.

mod common;

use ktune::kernels::quant::{QFormat, QMatrix};

#[test]
fn quantize_matches_gguf_python_byte_for_byte() {
    let dir = common::fixture("quant");
    let meta = common::read_json(dir.join("meta.json"));
    let (rows, cols) = (meta["rows"].as_u64().expect("rows") as usize, meta["cols"].as_u64().expect("cols") as usize);
    let raw = std::fs::read(dir.join("input.f32")).expect("input.f32");
    let x: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(x.len(), rows * cols);
    for f in QFormat::ALL {
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
