#!/usr/bin/env python3
"""Builds tests/fixtures/gemma3-vision-tiny: a tiny random Gemma3ForConditionalGeneration
(SigLIP tower and multimodal projector included) and what transformers computes
from it, in float32 with eager attention:

    config.json, model.safetensors   as save_pretrained writes them (transformers 5
                                     names: model.language_model.*, model.vision_tower.*,
                                     model.multi_modal_projector.*)
    image.png                        a 32x32 RGB image (the tower's own size: no resize)
    image_odd.png                    a 45x37 RGBA image (alpha composited over white,
                                     resized by the PIL image processor)
    vision_expected.json  (not expected.json: the text-only fixtures of tests/common are those)
        pixel_values       the PIL image processor's output for image.png, [3*32*32]
        pixel_values_odd   the same for image_odd.png
        features           the tower's last hidden state (after post_layernorm), [16][32]
        projected          the projector's soft tokens (get_image_features), [4][64]
        tokens             the prompt, the image expanded as the processor does
                           (<start_of_image>, 4 image tokens, <end_of_image>), 20 ids
        logits             model(input_ids, pixel_values) at every position, [20][256]
                           (no token_type_ids: causal attention over the image tokens too)
        generated          8 greedy ids (generate, KV cache, end-of-sequence ignored)
        generated_logits   the logits each was picked from, [8][256]
        token_type_ids_max_logit_change
                           how far the logits move when token_type_ids (the processor's
                           bidirectional attention inside the image block) are passed
        tt_logits          model(input_ids, pixel_values, token_type_ids) at every position,
                           [20][256]: what a user of Gemma 3's processor gets (it returns
                           token_type_ids, 1 at the image tokens)
        tt_generated       8 greedy ids continuing that prompt (the new tokens are text,
                           token type 0; each step recomputes the whole sequence)
        tt_generated_logits the logits each was picked from, [8][256]

Needs the packages of tools/requirements.txt and pillow:

    python3 -m venv target/venv-py && target/venv-py/bin/pip install -r tools/requirements.txt pillow
    target/venv-py/bin/python tools/make_vision_fixture.py           # writes the fixture
    target/venv-py/bin/python tools/make_vision_fixture.py --check   # recomputes, compares
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, GenerationConfig

SEED = 16
PROMPT_LEN = 20
NEW_TOKENS = 8
MIN_MARGIN = 0.01
IMAGE_TOKEN, BOI, EOI = 250, 251, 252
MM_TOKENS = 4
NAME = "gemma3-vision-tiny"


def config():
    text = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rms_norm_eps=1e-6,
        max_position_embeddings=131072,
        hidden_activation="gelu_pytorch_tanh",
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        final_logit_softcapping=2.0,
        attn_logit_softcapping=None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        initializer_range=0.25,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_channels=3,
        image_size=32,
        patch_size=8,
        layer_norm_eps=1e-6,
        hidden_act="gelu_pytorch_tanh",
        vision_use_head=False,
    )
    return Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=MM_TOKENS,
        image_token_index=IMAGE_TOKEN,
        boi_token_index=BOI,
        eoi_token_index=EOI,
        initializer_range=0.25,
    )


def build():
    torch.manual_seed(SEED)
    cfg = config()
    model = Gemma3ForConditionalGeneration._from_config(cfg, attn_implementation="eager", dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(SEED + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "vision_tower" in name or "multi_modal_projector" in name:
                if "norm" in name or name.endswith(".bias"):
                    # Gains near 1 (LayerNorm) or near 0 ((1 + w) RMSNorm), biases small.
                    p.add_(torch.randn(p.shape, generator=g) * 0.15)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
            elif name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.15)
        lm = model.model.language_model
        # As tools/make_fixtures.py's gemma3-tiny: small embeddings (the sqrt(hidden)
        # scale), a final-norm gain near 5 so the soft cap bends the logits.
        lm.embed_tokens.weight.mul_(0.02 / 0.25)
        lm.norm.weight.add_(4.0)
        # The soft tokens at the scale of the scaled text embeddings.
        model.model.multi_modal_projector.mm_input_projection_weight.mul_(0.3)
    return model


def make_images(out_dir):
    rng = np.random.default_rng(SEED)
    # Smooth gradients plus noise: a resize that reads the wrong pixels shows.
    yy, xx = np.mgrid[0:32, 0:32]
    base = np.stack([xx * 8, yy * 8, (xx + yy) * 4], axis=-1).astype(np.float64)
    img = np.clip(base + rng.integers(-20, 21, size=base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img, "RGB").save(out_dir / "image.png")
    yy, xx = np.mgrid[0:37, 0:45]
    odd = np.stack([xx * 5, yy * 6, 255 - xx * 5, 128 + (xx * yy) % 128], axis=-1)
    odd = np.clip(odd + rng.integers(-10, 11, size=odd.shape), 0, 255).astype(np.uint8)
    Image.fromarray(odd, "RGBA").save(out_dir / "image_odd.png")


def pixel_values(path):
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    proc = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    return proc(images=Image.open(path), return_tensors="pt")["pixel_values"]


def g7(x):
    return float(f"{x:.7g}")


def expected(model, out_dir):
    pv = pixel_values(out_dir / "image.png")
    pv_odd = pixel_values(out_dir / "image_odd.png")
    g = torch.Generator().manual_seed(SEED + 2000)
    text = torch.randint(3, 240, (PROMPT_LEN,), generator=g).tolist()
    text[0] = 2
    tokens = text[:5] + [BOI] + [IMAGE_TOKEN] * MM_TOKENS + [EOI] + text[5 : PROMPT_LEN - MM_TOKENS - 2]
    assert len(tokens) == PROMPT_LEN
    ids = torch.tensor([tokens])
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        vis = model.model.vision_tower(pixel_values=pv).last_hidden_state[0]
        proj = model.model.get_image_features(pv).pooler_output[0]
        logits = model(input_ids=ids, pixel_values=pv).logits[0]
        tt = (ids == IMAGE_TOKEN).long()
        logits_tt = model(input_ids=ids, pixel_values=pv, token_type_ids=tt).logits[0]
        gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=None, pad_token_id=0, bos_token_id=None)
        out = model.generate(
            input_ids=ids,
            pixel_values=pv,
            attention_mask=torch.ones_like(ids),
            generation_config=gen_cfg,
            output_logits=True,
            return_dict_in_generate=True,
            use_cache=True,
        )
        generated = out.sequences[0, PROMPT_LEN:].tolist()
        gen_logits = torch.stack([l[0] for l in out.logits])
        # Greedy with token_type_ids, without a cache: the whole sequence each step.
        seq, tt_gen, tt_gen_logits = ids, [], []
        for _ in range(NEW_TOKENS):
            tts = torch.cat([tt, torch.zeros((1, seq.shape[1] - PROMPT_LEN), dtype=torch.long)], dim=1)
            last = model(input_ids=seq, pixel_values=pv, token_type_ids=tts).logits[0, -1]
            nxt = int(last.argmax())
            tt_gen.append(nxt)
            tt_gen_logits.append(last)
            seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
        tt_gen_logits = torch.stack(tt_gen_logits)
    top2 = torch.cat([gen_logits, tt_gen_logits]).topk(2, dim=1).values
    margin = float((top2[:, 0] - top2[:, 1]).min())
    if margin < MIN_MARGIN:
        sys.exit(f"greedy choice too close to call (top-2 margin {margin:.4f}): change the seed")
    if len(set(generated)) < 3:
        sys.exit(f"degenerate continuation {generated}: change the seed or the init")
    return {
        "about": "tiny random Gemma3ForConditionalGeneration: SigLIP tower 32x32 image, patch 8 (16 patches), "
        "hidden 32, 2 heads, 2 layers; projector pooling 4x4 patches to 2x2 = 4 soft tokens of width 64; "
        "text model as gemma3-tiny with 2 layers (sliding window 8, global)",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "image_token_id": IMAGE_TOKEN,
        "pixel_values": [g7(v) for v in pv.flatten().tolist()],
        "pixel_values_odd": [g7(v) for v in pv_odd.flatten().tolist()],
        "features": [[g7(v) for v in row] for row in vis.tolist()],
        "projected": [[g7(v) for v in row] for row in proj.tolist()],
        "tokens": tokens,
        "logits": [[g7(v) for v in row] for row in logits.tolist()],
        "generated": generated,
        "generated_logits": [[g7(v) for v in row] for row in gen_logits.tolist()],
        "token_type_ids_max_logit_change": g7(float((logits - logits_tt).abs().max())),
        "tt_logits": [[g7(v) for v in row] for row in logits_tt.tolist()],
        "tt_generated": tt_gen,
        "tt_generated_logits": [[g7(v) for v in row] for row in tt_gen_logits.tolist()],
        "greedy_margin": g7(margin),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / NAME))
    ap.add_argument("--check", action="store_true", help="recompute and compare with the files, write nothing")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    out_dir = Path(args.out)
    model = build()
    if args.check:
        exp = expected(model, out_dir)
        old = json.loads((out_dir / "vision_expected.json").read_text())
        worst = max(abs(a - b) for ra, rb in zip(old["logits"], exp["logits"]) for a, b in zip(ra, rb))
        same = old["tokens"] == exp["tokens"] and old["generated"] == exp["generated"] and worst < 1e-4
        if "tt_logits" in old:
            worst = max(worst, max(abs(a - b) for ra, rb in zip(old["tt_logits"], exp["tt_logits"]) for a, b in zip(ra, rb)))
            same = same and old["tt_generated"] == exp["tt_generated"] and worst < 1e-4
        print(f"{NAME}: {'ok' if same else 'DIFFERENT'} (worst logit difference {worst:.2e})")
        sys.exit(0 if same else 1)
    out_dir.mkdir(parents=True, exist_ok=True)
    make_images(out_dir)
    model.save_pretrained(out_dir)
    for f in out_dir.iterdir():
        if f.name not in {"config.json", "model.safetensors", "image.png", "image_odd.png"}:
            f.unlink()
    exp = expected(model, out_dir)
    (out_dir / "vision_expected.json").write_text(json.dumps(exp) + "\n")
    print(f"{NAME}: generated {exp['generated']}, margin {exp['greedy_margin']}, "
          f"token_type_ids change the logits by up to {exp['token_type_ids_max_logit_change']}")


if __name__ == "__main__":
    main()
