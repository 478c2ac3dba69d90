//! An image file as a vision tower reads it, prepared as Gemma 3's image
//! processor prepares it: converted to RGB (grayscale replicated, an alpha channel
//! composited over white as transformers' `convert_to_rgb` does), resized to
//! `size x size` with a bilinear (triangle) filter unless it already has that
//! size, rescaled by 1/255 and normalized with mean and std 0.5, channels first.
//!
//! The header is read before any pixel is decoded: an empty image, one larger
//! than [`MAX_SIDE`] on a side or than [`MAX_PIXELS`] in all, is refused with the
//! reason, and the decoder runs under an allocation limit, so a hostile file
//! costs bounded memory.

use std::path::Path;

use image::{DynamicImage, ImageReader, Limits, RgbImage, imageops::FilterType};

/// Widest or tallest image accepted, in pixels.
pub const MAX_SIDE: u32 = 16_384;
/// Most pixels accepted (a 64-megapixel photo).
pub const MAX_PIXELS: u64 = 64 << 20;
/// Most bytes the decoder may allocate.
const MAX_ALLOC: u64 = 1 << 30;

/// Why an image cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{}: {msg}", path.display())]
    Bad { path: std::path::PathBuf, msg: String },
}

/// The image at `path` as `[3, size, size]` normalized pixels.
pub fn load_image(path: &Path, size: usize) -> Result<Vec<f32>, ImageError> {
    let bad = |msg: String| ImageError::Bad { path: path.to_path_buf(), msg };
    // A PNG or JPEG of a photo is a few MB; a device or a directory is refused.
    let bytes = crate::input::read_limited(path, 256 << 20, "an image").map_err(|e| bad(format!("cannot read the image: {e}")))?;
    decode(&bytes, size).map_err(bad)
}

/// [`load_image`] of a file's bytes in memory.
pub fn decode(bytes: &[u8], size: usize) -> Result<Vec<f32>, String> {
    let header = || ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(|e| format!("cannot read: {e}"));
    if header()?.format().is_none() {
        return Err("not an image ktune can read (PNG or JPEG)".into());
    }
    let (w, h) = header()?.into_dimensions().map_err(|e| format!("not a readable PNG or JPEG header: {e}"))?;
    if w == 0 || h == 0 {
        return Err(format!("the image is empty ({w}x{h} pixels)"));
    }
    if w > MAX_SIDE || h > MAX_SIDE || w as u64 * h as u64 > MAX_PIXELS {
        return Err(format!("the image is {w}x{h} pixels, over the limit of {MAX_SIDE} pixels a side and {} megapixels", MAX_PIXELS >> 20));
    }
    let mut reader = header()?;
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    limits.max_alloc = Some(MAX_ALLOC);
    reader.limits(limits);
    let img = reader.decode().map_err(|e| format!("cannot decode the image (truncated or corrupt?): {e}"))?;
    Ok(normalize(&resize(to_rgb(img), size)))
}

/// RGB as transformers' `convert_to_rgb`: an image with alpha composited over an
/// opaque white background (PIL's `alpha_composite`: `(v + 128) / 255` of the
/// blended sum), grayscale
/// replicated to three channels.
fn to_rgb(img: DynamicImage) -> RgbImage {
    if !img.color().has_alpha() {
        return img.to_rgb8();
    }
    let rgba = img.to_rgba8();
    let (w, h) = rgba.dimensions();
    let mut out = RgbImage::new(w, h);
    for (o, p) in out.pixels_mut().zip(rgba.pixels()) {
        let a = p.0[3] as u32;
        for (o, &s) in o.0.iter_mut().zip(&p.0[..3]) {
            // src * a + white * (1 - a), divided by 255 as PIL does.
            *o = ((s as u32 * a + 255 * (255 - a) + 128) / 255) as u8;
        }
    }
    out
}

/// Resized to `size x size` (bilinear, antialiased when shrinking, as PIL's
/// `BILINEAR`), unless it already is.
fn resize(img: RgbImage, size: usize) -> RgbImage {
    let s = size as u32;
    if img.dimensions() == (s, s) { img } else { image::imageops::resize(&img, s, s, FilterType::Triangle) }
}

/// `[3, h, w]` values `(v / 255 - 0.5) / 0.5`.
fn normalize(img: &RgbImage) -> Vec<f32> {
    let (w, h) = img.dimensions();
    let plane = (w * h) as usize;
    let mut out = vec![0f32; 3 * plane];
    for (i, p) in img.pixels().enumerate() {
        for c in 0..3 {
            out[c * plane + i] = (p.0[c] as f32 * (1.0 / 255.0) - 0.5) / 0.5;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, color: image::ColorType) -> Vec<u8> {
        let mut bytes = Vec::new();
        let data = vec![200u8; (w * h) as usize * color.bytes_per_pixel() as usize];
        image::write_buffer_with_format(&mut std::io::Cursor::new(&mut bytes), &data, w, h, color, image::ImageFormat::Png).unwrap();
        bytes
    }

    #[test]
    fn gray_and_rgba_become_rgb_and_sizes_are_kept() {
        for color in [image::ColorType::L8, image::ColorType::Rgb8, image::ColorType::Rgba8, image::ColorType::La8] {
            let v = decode(&png(8, 8, color), 8).unwrap();
            assert_eq!(v.len(), 3 * 64);
            // 200 opaque everywhere except the alpha images, whose alpha is 200 too.
            let want = if color.has_alpha() { (200 * 200 + 255 * 55 + 128) / 255 } else { 200 };
            let want = (want as f32 / 255.0 - 0.5) / 0.5;
            assert!(v.iter().all(|x| (x - want).abs() < 1e-6), "{color:?}: {}", v[0]);
        }
        assert_eq!(decode(&png(13, 5, image::ColorType::Rgb8), 8).unwrap().len(), 3 * 64);
    }

    #[test]
    fn bad_images_are_refused_with_a_reason() {
        let ok = png(8, 8, image::ColorType::Rgb8);
        let cut = &ok[..ok.len() / 2];
        assert!(decode(cut, 8).unwrap_err().contains("decode"), "{:?}", decode(cut, 8));
        assert!(decode(b"not an image at all", 8).is_err());
        assert!(decode(&[], 8).is_err());
        // A valid header claiming 100000 x 60000 pixels is refused before decoding;
        // so is one claiming 20000 x 1 (wider than a side may be), and 0 x 8.
        for (w, h, why) in [(100_000u32, 60_000u32, "over the limit"), (20_000, 1, "over the limit"), (0, 8, "")] {
            let e = decode(&with_size(&ok, w, h), 8).unwrap_err();
            assert!(e.contains(why), "{w}x{h}: {e}");
        }
    }

    /// `png` with its IHDR width and height replaced (and the chunk's CRC fixed).
    fn with_size(png: &[u8], w: u32, h: u32) -> Vec<u8> {
        let mut b = png.to_vec();
        b[16..20].copy_from_slice(&w.to_be_bytes());
        b[20..24].copy_from_slice(&h.to_be_bytes());
        // CRC-32 (IEEE) over the chunk type and data: bytes 12..29.
        let mut crc = !0u32;
        for &byte in &b[12..29] {
            crc ^= byte as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        b[29..33].copy_from_slice(&(!crc).to_be_bytes());
        b
    }
}
