//! The multimodal fixture (`tests/fixtures/gemma3-vision-tiny`) the vision tests
//! share: its directory, transformers' expected values, the loaded model.

use std::path::PathBuf;

use ktune::session::{LoadedModel, load_model};

use super::{fixture, read_json};

pub fn dir() -> PathBuf {
    fixture("gemma3-vision-tiny")
}

/// `vision_expected.json`: transformers' features, soft tokens, logits and ids.
pub fn expected() -> serde_json::Value {
    read_json(dir().join("vision_expected.json"))
}

pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().expect("array").iter().map(|x| x.as_f64().expect("number") as f32).collect()
}

pub fn load() -> LoadedModel {
    load_model(None, Some(&dir()), None, 0).expect("the multimodal fixture loads")
}

/// `tests/fixtures/gemma3-vision-gguf`: the same model as llama.cpp's converter
/// writes it, a text GGUF and its vision projector (tools/make_mmproj_fixture.py).
pub fn gguf_pair() -> (PathBuf, PathBuf) {
    let d = fixture("gemma3-vision-gguf");
    (d.join("text.gguf"), d.join("mmproj.gguf"))
}

pub fn load_gguf_pair() -> LoadedModel {
    let (text, mmproj) = gguf_pair();
    ktune::session::load_gguf_mmproj(&text, &mmproj, None).expect("the GGUF pair loads")
}
