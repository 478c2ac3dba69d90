//! What a request answers does not depend on what the generator's KV cache held:
//! a prompt that shares a prefix with the last one (a chat template's head, an
//! earlier turn with its answer, the same prompt again) gives the logits and
//! tokens it gives on an empty cache, bit for bit, on the CPU. The decode
//! kernels compute a token in other arithmetic than the prefill kernels (int8
//! activations round differently downstream; on SmolLM2-135M Q4_1 the last
//! prompt token's logits moved by 2.7% of their scale), so the generator reuses
//! only positions a prefill computed and never leaves one token to a pass.

use ktune::generate::{Generator, GeneratorSettings, Limits, Output, ProfileChoice};
use ktune::kernels::DType;
use ktune::kernels::sample::SamplerParams;
use ktune::session::{ModelSettings, ModelSource};

use crate::common::{fixture, gguf_dir, ktune, read_json, tempdir};

fn open(chunk: usize) -> Generator {
    open_as("smollm2-tiny-q8_0.gguf", chunk, 1)
}

/// The context a fixture runs in: 256 positions, or the model's own (a few
/// fixtures hold 32).
fn context_of(file: &str) -> Option<usize> {
    (file == "smollm2-tiny-q8_0.gguf").then_some(256)
}

fn open_as(file: &str, chunk: usize, parallel: usize) -> Generator {
    open_with(file, chunk, Some(parallel), None)
}

/// [`open_with`] with a KV cache of `kv` (`--kv-dtype`).
fn open_kv(file: &str, parallel: usize, kv: DType) -> Generator {
    open_choice(file, 512, Some(parallel), ProfileChoice { kv_dtype: kv, ..ProfileChoice::uncached() })
}

/// [`open_as`] with `--profile FILE` (`parallel` None: the profile's).
fn open_with(file: &str, chunk: usize, parallel: Option<usize>, profile: Option<std::path::PathBuf>) -> Generator {
    let choice = match profile {
        Some(p) => ProfileChoice { profile: Some(p), no_profile: false, ..ProfileChoice::uncached() },
        None => ProfileChoice::uncached(),
    };
    open_choice(file, chunk, parallel, choice)
}

fn open_choice(file: &str, chunk: usize, parallel: Option<usize>, choice: ProfileChoice) -> Generator {
    open_on("cpu", file, chunk, parallel, choice)
}

/// [`open_choice`] on the device `selector` names (`--device`).
fn open_on(selector: &str, file: &str, chunk: usize, parallel: Option<usize>, choice: ProfileChoice) -> Generator {
    let s = GeneratorSettings {
        model: ModelSettings {
            source: ModelSource::Gguf(if file.contains('/') { file.into() } else { gguf_dir().join(file) }),
            mmproj: None,
            layers: None,
            weight_dtype: file.contains("-k-").then_some(DType::F32),
            seed: 0,
            trusted_shaders: false,
        },
        choice,
        context: context_of(file),
        prefill_chunk: chunk,
        chat_template: file.starts_with("smollm2").then(|| fixture("chat_templates/smollm2.jinja")),
        command: "serve",
        template_required: false,
        parallel,
    };
    Generator::open(Some(selector), &s).expect("the fixture opens")
}

/// A CPU profile of the tiny SmolLM2 fixture in `dir`, named `name`: Q8_0
/// weights repacked into X8 records for the lone decode
/// (`execution.cpuRepack`), then `rest` (more top-level sections).
fn q8_profile(dir: &std::path::Path, name: &str, rest: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let text = format!(
        "name: {name}\nmodel: smollm2-tiny\nversion: 1\ndevice: {{backend: cpu}}\n\
         execution: {{weightDtype: q8_0, cpuRepack: [q8_0]}}\n{rest}"
    );
    std::fs::write(&path, text).expect("profile written");
    path
}

/// Greedy ids after `prompt`, and the logits the prompt's last token gave.
fn answer(g: &mut Generator, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let limits = Limits { max_tokens: 6, stop: Vec::new(), ignore_eos: true };
    let mut sink = |_: &str| true;
    let c = g.complete(prompt, SamplerParams::GREEDY, Output { limits: &limits, cancel: None, stream: &mut sink }).expect("completes");
    (c.decoded.generated, g.prompt_logits().expect("the prompt's logits").to_vec())
}

#[test]
fn a_request_answers_alike_whatever_the_cache_held() {
    let mut fresh = open(512);
    let mut warm = open(512);
    // A chunk of 3 cuts every prompt into passes (never one of a single token).
    let mut chunked = open(3);
    let hello = warm.prompter.render(&[("user", "hello")]).unwrap();
    let other = warm.prompter.render(&[("user", "what is the capital of France?")]).unwrap();
    let (first, _) = answer(&mut fresh, &hello);
    let said = warm.prompter.tokenizer.decode(&first).unwrap();
    // A chat's second turn: the first turn and its answer as the prefix.
    let second = warm.prompter.render(&[("user", "hello"), ("assistant", &said), ("user", "and then?")]).unwrap();
    let plain = warm.prompter.encode("Once upon a time", false).unwrap();
    let single = vec![plain[0]];
    let order = [&hello, &other, &hello, &second, &plain, &hello, &second, &single, &plain, &other, &second];
    for (i, prompt) in order.into_iter().enumerate() {
        fresh.reset();
        let want = answer(&mut fresh, prompt);
        let got = answer(&mut warm, prompt);
        assert_eq!(got.0, want.0, "request {i}: the ids differ from an empty cache's");
        let moved = got.1.iter().zip(&want.1).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(moved, 0, "request {i}: {moved} logits differ from an empty cache's");
        let split = answer(&mut chunked, prompt);
        assert_eq!(split.0, want.0, "request {i}: the ids differ in passes of 3");
        assert!(split.1.iter().zip(&want.1).all(|(a, b)| a.to_bits() == b.to_bits()), "request {i}: the logits differ in passes of 3");
    }
}

/// The last prompt token's logits (`run --dump-logits`) of `tokens` prefilled in
/// passes of `chunk` on the CPU.
fn last_logits(model: &str, tokens: &[String], chunk: usize) -> Vec<u32> {
    let tmp = tempdir();
    let dump = tmp.path().join("logits.json");
    let out = ktune()
        .args(["run", "--device", "cpu", "--gguf"])
        .arg(gguf_dir().join(model))
        .args(["--tokens", &tokens.join(","), "--max-tokens", "1", "--format", "json", "--prefill-chunk", &chunk.to_string()])
        .arg("--dump-logits")
        .arg(&dump)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let d = read_json(&dump);
    let last = d["logits"].as_array().and_then(|l| l.last()).and_then(|l| l.as_array()).expect("logits");
    last.iter().map(|v| (v.as_f64().expect("f64") as f32).to_bits()).collect()
}

/// A prompt cut into passes anywhere gives the logits of one pass, bit for bit:
/// Gemma 3's sliding windows (8 positions in the fixture) and a global layer,
/// longer than one key tile of the tiled prefill attention (64), whose tiles
/// start at multiples of the tile from key 0 wherever a pass starts; and every
/// pass of two tokens or more (a pass of one runs the decode kernels).
#[test]
fn a_prompt_gives_the_same_logits_however_it_is_cut_into_passes() {
    let tokens: Vec<String> = (0..150).map(|i| (3 + (i * 37) % 200).to_string()).collect();
    for model in ["gemma3-tiny-q8_0.gguf", "smollm2-tiny-q8_0.gguf"] {
        let whole = last_logits(model, &tokens, 512);
        for chunk in [149, 37, 5, 2] {
            let moved = last_logits(model, &tokens, chunk).iter().zip(&whole).filter(|(a, b)| a != b).count();
            assert_eq!(moved, 0, "{model}: passes of {chunk}: {moved} logits differ from one pass's");
        }
    }
}

/// Sequences decoded together in one batch ([`Generator::advance_batch`]: the
/// matrices once over every row, RoPE, the KV write and attention a row at a
/// time over each sequence's own cache) give the ids each gives alone: greedy
/// and seeded sampling, prompts of different lengths (the batch's positions
/// differ every step), Gemma 3's sliding windows of 8 passed; sequences end at
/// different steps and the batch shrinks, to one decoded alone. Fixtures: Q8_0
/// weights (int8 activations: per 32 in both paths), Phi-3's sliding window,
/// Qwen3-MoE's experts, and a K-quant Llama loaded as f32: the decode dots of
/// Q4_K/Q6_K quantize activations per 256 where the batch's GEMM does per 32,
/// so there a batch's ids may part from the lone ones at a near tie (as the
/// prefill's do from llama.cpp's, `greedy_up_to_a_near_tie`).
#[test]
fn a_decode_batch_gives_every_sequence_its_answer_alone() {
    use ktune::kernels::sample::SamplerParams as P;
    for file in ["smollm2-tiny-q8_0.gguf", "phi3-tiny-q8_0.gguf", "llama-k-q4_k_m.gguf", "qwen3moe-tiny-q8_0.gguf"] {
        let mut alone = open_as(file, 512, 1);
        let mut batch = open_as(file, 512, 4);
        // Lengths and budgets within the fixture's context (phi3's: 32 positions).
        let room = batch.context;
        let lengths = [5usize, 13, 30.min(room / 2), 2];
        let prompts: Vec<Vec<u32>> = lengths.iter().map(|&n| (0..n).map(|i| 3 + ((i * 31 + n) % 90) as u32).collect()).collect();
        let seeded = P { temperature: 0.9, top_p: 0.95, repeat_penalty: 1.1, seed: 11, ..P::GREEDY };
        let params = [P::GREEDY, seeded, P::GREEDY, seeded];
        let budgets: Vec<usize> = [16usize, 9, 20, 12].iter().zip(&lengths).map(|(&b, &n)| b.min(room - n - 1)).collect();
        let mut batched_steps = 0;
        batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &budgets, None, file, |_, _| batched_steps += 1);
        assert!(batched_steps >= 8, "{file}: {batched_steps} batched steps");
    }
}

/// Prompts prefilled in chunks inside the decode batch's pass
/// ([`Engine::batch_pass`]: each weight read once for the chunks' rows and the
/// decode tokens', a chunk's attention the paged kernel's prefill form, the LM
/// head over each sequence's last row) give the ids each request gives alone:
/// greedy and seeded, prompts of 5 to 37 tokens prefilled 6 tokens a pass and
/// 24 (several prompts' chunks in one pass: the budget is the pass's), a chunk never leaving one token alone, Phi-3's sliding window and
/// the K-quant Llama loaded as f32.
#[test]
fn prompt_chunks_in_the_decode_pass_answer_as_alone() {
    use ktune::kernels::sample::SamplerParams as P;
    for file in ["smollm2-tiny-q8_0.gguf", "phi3-tiny-q8_0.gguf", "llama-k-q4_k_m.gguf"] {
        let mut alone = open_as(file, 512, 1);
        let mut batch = open_as(file, 512, 4);
        assert!(batch.engine.kv_blocks().is_some(), "{file}: a paged KV cache");
        // Lengths within the fixture's context (phi3's: 32 positions).
        let room = batch.context;
        let seeded = P { temperature: 0.9, top_p: 0.95, seed: 5, ..P::GREEDY };
        for (chunk, lengths) in [(6, [9usize, 23, 37, 14]), (24, [9, 5, 7, 30])] {
            let lengths = lengths.map(|n| n.min(room / 2));
            let prompts: Vec<Vec<u32>> = lengths.iter().map(|&n| (0..n).map(|i| 3 + ((i * 29 + n) % 90) as u32).collect()).collect();
            let budgets: Vec<usize> = [20usize, 9, 12, 16].iter().zip(&lengths).map(|(&b, &n)| b.min(room - n - 1)).collect();
            let before = batch.engine.mixed_passes();
            let params = [P::GREEDY, seeded, P::GREEDY, seeded];
            batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &budgets, Some(chunk), file, |_, _| {});
            let (passes, chunks) = (batch.engine.mixed_passes().0 - before.0, batch.engine.mixed_passes().1 - before.1);
            assert!(passes >= 2, "{file}, chunks of {chunk}: {passes} passes mixed prompts' chunks into the decode batch");
            if chunk == 24 {
                assert!(chunks > passes, "{file}: {chunks} chunks in {passes} passes: none held two prompts'");
            }
        }
    }
}

/// On a GPU (lavapipe in CI; skipped loudly without one unless required) with
/// `serve --parallel`: the sequences share the GPU's paged KV cache, and a batch
/// pass mixing prompts' chunks and decode tokens of sequences of different
/// lengths (RoPE and the KV write at each row's own position, attention through
/// each sequence's table) gives every sequence, greedy and seeded, the ids it
/// gets alone on the same GPU with the plan's own kernels (its head-major cache,
/// decode steps chained and picked on the GPU); and a prompt's logits through
/// the paged passes stay within 1e-4 of the lone engine's (the paged attention
/// kernel sums in another order than the plan's). SmolLM2, Qwen3 (the fused q/k
/// norm + RoPE) and Phi-3 (a sliding window).
#[test]
fn a_gpu_batch_answers_as_alone() {
    use ktune::kernels::sample::SamplerParams as P;
    if ktune::testing::test_gpu().is_none() {
        return;
    }
    for file in ["smollm2-tiny-q8_0.gguf", "qwen3-tiny-q8_0.gguf", "phi3-tiny-q8_0.gguf"] {
        let mut alone = open_on("vulkan", file, 512, Some(1), ProfileChoice::uncached());
        let mut batch = open_on("vulkan", file, 512, Some(4), ProfileChoice::uncached());
        assert!(alone.engine.is_gpu() && batch.engine.is_gpu(), "{file}: on the GPU");
        assert!(alone.engine.kv_blocks().is_none(), "{file}: alone, the plan's own cache");
        assert!(batch.engine.kv_blocks().is_some(), "{file}: a paged KV cache on the GPU");
        let room = batch.context;
        let lengths = [9usize, 23, 37, 14].map(|n| n.min(room / 2));
        let prompts: Vec<Vec<u32>> = lengths.iter().map(|&n| (0..n).map(|i| 3 + ((i * 29 + n) % 90) as u32).collect()).collect();
        let budgets: Vec<usize> = [14usize, 9, 12, 11].iter().zip(&lengths).map(|(&b, &n)| b.min(room - n - 1)).collect();
        let seeded = P { temperature: 0.9, top_p: 0.95, seed: 5, ..P::GREEDY };
        let before = batch.engine.mixed_passes();
        let mut batched = 0;
        batch_answers_as_alone(
            &mut batch,
            &mut alone,
            &prompts,
            &[P::GREEDY, seeded, P::GREEDY, seeded],
            &budgets,
            Some(6),
            file,
            |_, n| batched += n,
        );
        assert!(batched >= 6, "{file}: {batched} batch passes");
        assert!(batch.engine.mixed_passes().0 - before.0 >= 2, "{file}: prompts' chunks in the decode passes");
        // A prompt's logits through the paged passes (a lone sequence's, on the
        // batch engine) against the lone engine's.
        alone.reset();
        batch.reset();
        let (want_ids, want) = answer(&mut alone, &prompts[2]);
        let (got_ids, got) = answer(&mut batch, &prompts[2]);
        assert_eq!(got_ids, want_ids, "{file}: a lone sequence through the paged passes");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-4 * scale, "{file}: the paged passes moved a logit by {worst} (the logits' scale {scale})");
    }
}

/// A q8_0 KV cache (`--kv-dtype q8_0`, llama.cpp's `-ctk/-ctv q8_0`): a decode
/// batch over the paged pool of q8_0 blocks gives every sequence the ids it gets
/// alone over its own head-major q8_0 cache (greedy and seeded, lengths apart);
/// and a prompt's logits stay near the f32 cache's (each cached row rounds to
/// 8 bits a value with a scale per 32), but are not the f32 cache's: the cache
/// is quantized. Fixtures whose head_dim is whole blocks: Qwen3 (32, per-head
/// q/k norms) and the K-quant Llama loaded as f32 (64).
#[test]
fn a_q8_0_kv_cache_batch_answers_as_alone_and_near_the_f32_cache() {
    use ktune::kernels::sample::SamplerParams as P;
    for file in ["qwen3-tiny-q8_0.gguf", "llama-k-q4_k_m.gguf"] {
        let mut alone = open_kv(file, 1, DType::Q8_0);
        let mut batch = open_kv(file, 4, DType::Q8_0);
        let prompts: Vec<Vec<u32>> =
            [7usize, 19, 3, 26].iter().map(|&n| (0..n).map(|i| 5 + ((i * 23 + n) % 85) as u32).collect()).collect();
        let seeded = P { temperature: 0.9, top_k: 30, seed: 3, ..P::GREEDY };
        let params = [P::GREEDY, seeded, seeded, P::GREEDY];
        let mut batched_steps = 0;
        batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &[12, 8, 16, 10], None, file, |_, _| batched_steps += 1);
        assert!(batched_steps >= 6, "{file}: {batched_steps} batched steps");

        q8_0_near_f32(&mut alone, &mut open_kv(file, 1, DType::F32), &prompts[3], file);
    }
}

/// A prompt's logits through the q8_0 cache of `q8` near those through
/// `f32_cache`, and not the same (the rows were quantized).
fn q8_0_near_f32(q8: &mut Generator, f32_cache: &mut Generator, prompt: &[u32], file: &str) {
    let (_, want) = answer(f32_cache, prompt);
    q8.reset();
    let (_, got) = answer(q8, prompt);
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst > 0.0, "{file}: a q8_0 cache gave the f32 cache's logits bit for bit: was it quantized?");
    assert!(worst < 0.03 * scale, "{file}: a q8_0 cache moved a logit by {worst} (the logits' scale {scale})");
}

/// A q8_0 KV cache on a GPU (lavapipe in CI): a batch of sequences over the
/// paged pool of q8_0 blocks (`serve --parallel`: `kv_write_rows_q8`, the
/// paged kernels), prompts' chunks beside decode tokens, gives each the ids it
/// gets alone over the plan's own head-major q8_0 cache (`kv_write_q8`, the
/// decode stream and prefill kernels that read q8_0, decode steps chained),
/// greedy and seeded; a prompt's logits stay near the f32 cache's and are not
/// the same (the rows were quantized). Qwen3's head_dim of 32: one block a row,
/// so neighbouring rows' scales share a word (the writes' atomic halves); the
/// kernels' parity covers 64 and 128.
#[test]
fn a_gpu_q8_0_kv_cache_batch_answers_as_alone_and_near_the_f32_cache() {
    use ktune::kernels::sample::SamplerParams as P;
    if ktune::testing::test_gpu().is_none() {
        return;
    }
    let file = "qwen3-tiny-q8_0.gguf";
    let on_gpu = |parallel: usize, kv: DType| {
        let g = open_on("vulkan", file, 512, Some(parallel), ProfileChoice { kv_dtype: kv, ..ProfileChoice::uncached() });
        assert!(g.engine.is_gpu(), "{file}: on the GPU");
        assert_eq!(g.engine.kv_blocks().is_some(), parallel > 1, "{file}: paged with --parallel {parallel}");
        g
    };
    let (mut alone, mut batch) = (on_gpu(1, DType::Q8_0), on_gpu(4, DType::Q8_0));
    let room = batch.context;
    let lengths = [7usize, 19, 3, 26].map(|n| n.min(room / 2));
    let prompts: Vec<Vec<u32>> = lengths.iter().map(|&n| (0..n).map(|i| 5 + ((i * 23 + n) % 85) as u32).collect()).collect();
    let budgets: Vec<usize> = [12usize, 8, 16, 10].iter().zip(&lengths).map(|(&b, &n)| b.min(room - n - 1)).collect();
    let seeded = P { temperature: 0.9, top_k: 30, seed: 3, ..P::GREEDY };
    let mut batched = 0;
    let params = [P::GREEDY, seeded, seeded, P::GREEDY];
    batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &budgets, Some(6), file, |_, n| batched += n);
    assert!(batched >= 6, "{file}: {batched} batch passes");

    q8_0_near_f32(&mut alone, &mut on_gpu(1, DType::F32), &prompts[3], file);
}

/// A profile's attention choices hold for the sequences of a paged KV cache:
/// its tiled prefill's tiles (`block_q`, `block_kv`) are the paged kernel's, so
/// a batch of sequences (prompt chunks and decode tokens over the pool) answers
/// as each alone over its own cache with the profile's kernels, prompts longer
/// than a tile of 16 keys. A choice the paged kernel does not compute as (the
/// split-KV decode) is said, not dropped silently. (The matrices in X8
/// records: with AVX2 alone, no SIMD int8 GEMM, a batch's matrices get the
/// lone decode's arithmetic through the dots over them.)
#[test]
fn a_paged_cache_takes_the_profiles_attention_tiles() {
    use ktune::kernels::sample::SamplerParams as P;
    let tmp = tempdir();
    let profile = |name: &str, decode: &str| {
        let kernels = format!(
            "kernels:\n  attention:\n    prefill: {{kernel: attention_prefill_tiled_cpu, params: {{block_q: 4, block_kv: 16}}}}\n    decode: {decode}\n"
        );
        q8_profile(tmp.path(), name, &kernels)
    };
    let file = "smollm2-tiny-q8_0.gguf";
    let tiles = profile("tiles.yaml", "attention_decode_heads_cpu");
    let mut batch = open_with(file, 512, Some(4), Some(tiles.clone()));
    let (id, params) = batch.engine.paged_attention().expect("a paged KV cache");
    assert_eq!(id, "attention_paged_cpu");
    assert_eq!((params.get("block_q"), params.get("block_kv")), (Some(&4), Some(&16)), "{params:?}");
    assert!(!batch.warnings.iter().any(|w| w.contains("paged")), "{:?}", batch.warnings);
    let mut alone = open_with(file, 512, Some(1), Some(tiles));
    assert!(alone.engine.paged_attention().is_none());
    let prompts: Vec<Vec<u32>> = [40usize, 23, 9, 33].iter().map(|&n| (0..n).map(|i| 4 + ((i * 17 + n) % 80) as u32).collect()).collect();
    let seeded = P { temperature: 0.7, top_k: 40, seed: 9, ..P::GREEDY };
    batch_answers_as_alone(
        &mut batch,
        &mut alone,
        &prompts,
        &[P::GREEDY, seeded, P::GREEDY, seeded],
        &[10, 14, 8, 12],
        None,
        "tiles",
        |_, _| {},
    );

    let split = open_with(file, 512, Some(4), Some(profile("split.yaml", "attention_decode_splitkv_cpu")));
    assert!(split.warnings.iter().any(|w| w.contains("attention_decode_splitkv_cpu") && w.contains("not used")), "{:?}", split.warnings);
}

/// Prefills `prompts` into slots of `batch` (each with its sampling `params`
/// and token `budgets`), decodes them together (`advance_batch`; the last one
/// standing alone) until each ends, telling `step` of every batch step (its
/// sequences, and the batch passes the engine ran for it), and asserts every
/// sequence's ids are those `alone` gives the same request. With `chunk`, every
/// prompt but the first is started later (`start_later`) and prefilled `chunk`
/// tokens a step in the batch steps (with a paged cache, in the others' pass).
#[allow(clippy::too_many_arguments)]
fn batch_answers_as_alone(
    batch: &mut Generator,
    alone: &mut Generator,
    prompts: &[Vec<u32>],
    params: &[SamplerParams],
    budgets: &[usize],
    chunk: Option<usize>,
    what: &str,
    mut step: impl FnMut(usize, u64),
) {
    let limits = |i: usize| Limits { max_tokens: budgets[i], stop: Vec::new(), ignore_eos: true };
    let mut slots: Vec<_> = (0..prompts.len()).map(|_| batch.new_slot().expect("a slot")).collect();
    let mut runs = Vec::new();
    for (i, slot) in slots.iter_mut().enumerate() {
        batch.swap_slot(slot).unwrap();
        let run = match chunk {
            Some(b) if i > 0 => batch.start_later(&prompts[i], params[i], &limits(i), b),
            _ => batch.start(&prompts[i], params[i], &limits(i), usize::MAX, &mut |_| true),
        };
        runs.push(run.expect("prefills"));
        batch.swap_slot(slot).unwrap();
    }
    loop {
        let going: Vec<usize> = (0..runs.len()).filter(|&i| runs[i].going()).collect();
        if going.len() < 2 {
            for &i in &going {
                batch.swap_slot(&mut slots[i]).unwrap();
                while batch.advance(&mut runs[i], &mut |_| true).unwrap() {}
                batch.swap_slot(&mut slots[i]).unwrap();
            }
            break;
        }
        let before = batch.engine.batch_passes();
        let mut ss: Vec<_> = slots.iter_mut().enumerate().filter(|(i, _)| going.contains(i)).map(|(_, s)| s).collect();
        let mut rs: Vec<_> = runs.iter_mut().enumerate().filter(|(i, _)| going.contains(i)).map(|(_, r)| r).collect();
        batch.advance_batch(&mut ss, &mut rs, &mut |_, _| true).expect("a batch step");
        step(going.len(), batch.engine.batch_passes() - before);
    }
    for (i, (run, slot)) in runs.into_iter().zip(&mut slots).enumerate() {
        batch.swap_slot(slot).unwrap();
        let got = batch.end(run, &mut |_| true).expect("ends").decoded.generated;
        batch.swap_slot(slot).unwrap();
        alone.reset();
        let mut sink = |_: &str| true;
        let want = alone.complete(&prompts[i], params[i], Output { limits: &limits(i), cancel: None, stream: &mut sink }).unwrap();
        assert_eq!(got, want.decoded.generated, "{what}: sequence {i} in a batch");
    }
}

/// The kernels (with their `strategy` or `rows_per_task`) of `slot`'s steps
/// in the pass over sequences of `counts` rows
/// ([`ktune::plan::Plan::pass_steps`]), with the storage type of each.
fn pass_kernels(g: &Generator, counts: &[usize], slot: ktune::plan::Slot) -> Vec<(String, DType)> {
    use ktune::plan::StepKind;
    let steps = g.engine.plan.pass_steps(counts).expect("a batch plan");
    steps
        .iter()
        .filter(|s| s.slot == slot)
        .filter_map(|s| match &s.kind {
            StepKind::Kernel { kernel, params, dtype, .. } => {
                Some((format!("{}{:?}", kernel.id, params.get("strategy").or(params.get("rows_per_task"))), *dtype))
            }
            _ => None,
        })
        .collect()
}

/// [`pass_kernels`]' kernel, the same in every step.
fn pass_kernel(g: &Generator, counts: &[usize], slot: ktune::plan::Slot) -> String {
    let ids: Vec<String> = pass_kernels(g, counts, slot).into_iter().map(|(id, _)| id).collect();
    assert!(!ids.is_empty() && ids.iter().all(|i| *i == ids[0]), "{slot:?} in a pass of {counts:?}: {ids:?}");
    ids[0].clone()
}

/// Without a profile, a CPU server's engine (`--parallel` above 1) keeps
/// every block-format matrix it can in X8 records (AVX2 or better), and a pass
/// of decode tokens only runs its projections through the batched decode dots
/// over them (each token its lone decode's arithmetic, each record decoded
/// once for a few tokens): up to 8 rows on AVX-512 VNNI (Q4_0 and Q8_0 up
/// to 2 on a CPU that lists AMX-INT8, IQ4_NL up to 5), where a pass of more
/// rows, or holding a prompt's chunk, takes the int8 GEMM; every pass with
/// AVX2 alone, chunks and whole prompts too (no SIMD int8 GEMM there: its f32
/// panel GEMM dequantizes every pass). A server of one sequence keeps these
/// formats in rows on VNNI, in X8 records with AVX2 alone. Q8_0, and Q4_K with
/// its Q6_K matrices (X8 records of their own on a server). Every sequence of
/// a batch answers as alone on such an engine, greedy and seeded.
#[test]
fn a_cpu_server_decodes_its_batches_through_x8_dots() {
    use ktune::kernels::cpu::Isa;
    use ktune::kernels::quant::QFormat;
    use ktune::kernels::sample::SamplerParams as P;
    use ktune::plan::Slot;
    let tmp = tempdir();
    // The K-quant fixture in its own block formats (the other tests load it as f32).
    let k4 = tmp.path().join("llama-q4km.gguf");
    std::fs::copy(gguf_dir().join("llama-k-q4_k_m.gguf"), &k4).expect("copied");
    let k4 = k4.to_str().expect("a UTF-8 path").to_string();
    let (avx2, vnni, amx) = (Isa::best().avx2(), Isa::best().vnni(), ktune::kernels::cpu::features().amx_int8);
    // The prefill's GEMM: the int8 one where it has SIMD tiles, else the f32 panels.
    let gemm = if vnni { "gemm_q_i8_cpu" } else { "gemm_q_panel_cpu" };
    for (file, format) in [("smollm2-tiny-q8_0.gguf", QFormat::Q8_0), (k4.as_str(), QFormat::Q4_K)] {
        let lone = open_as(file, 512, 1);
        let lone_repack = &lone.engine.plan.options.cpu_repack;
        assert_eq!(lone_repack.contains(&format), avx2 && !vnni, "{file}: one sequence's layout ({lone_repack:?})");
        drop(lone);
        let mut batch = open_as(file, 512, 20);
        if !avx2 {
            eprintln!(
                "a_cpu_server_decodes_its_batches_through_x8_dots: this CPU lacks AVX2: no X8 records by default (nothing more checked)"
            );
            assert!(batch.engine.plan.options.cpu_repack.is_empty(), "{file}");
            continue;
        }
        assert!(batch.engine.plan.options.cpu_repack.contains(&format), "{file}: {:?}", batch.engine.plan.options.cpu_repack);
        // Every projection (in the file's format, or Q6_K, repacked too) takes
        // the dots in a pass of decode tokens only.
        let repacked = batch.engine.plan.options.cpu_repack.clone();
        let takes = |counts: &[usize], slot: Slot, dots: bool| {
            let ks = pass_kernels(&batch, counts, slot);
            assert!(ks.iter().any(|(_, d)| *d == DType::from(format)), "{file} {slot:?}: {ks:?}");
            for (id, dtype) in ks {
                let x8 = dtype.quant().is_some_and(|f| repacked.contains(&f));
                assert!(x8 || !vnni, "{file} {slot:?}: a {dtype} matrix left in rows on a server ({repacked:?})");
                let want = if dots { "gemm_q_dots_cpu" } else { gemm };
                assert!(id.starts_with(want), "{file} {slot:?} in a pass of {counts:?}: {id} ({dtype}), not {want}");
            }
        };
        // Up to 8 rows (Q8_0 up to 2 where the CPU lists AMX-INT8, whose
        // 512-bit int8 GEMM tiles outrun the dots from 3).
        let most = ktune::plan::select::x8_batch_rows(DType::from(format));
        assert_eq!(
            most,
            if !vnni {
                usize::MAX
            } else if format == QFormat::Q4_K || !amx {
                8
            } else {
                2
            },
            "{file}"
        );
        for rows in [2, 4, 8] {
            takes(&vec![1; rows], Slot::MatmulQkv, rows <= most);
            takes(&vec![1; rows], Slot::MatmulDown, rows <= most);
        }
        takes(&[1; 9], Slot::MatmulQkv, !vnni);
        takes(&[1; 17], Slot::MatmulDown, !vnni);
        if format == QFormat::Q8_0 {
            // Its LM head (Q8_0 too) over each sequence's row.
            takes(&[1; 2], Slot::MatmulLmHead, true);
            takes(&[1; 4], Slot::MatmulLmHead, 4 <= most);
        }
        // A prompt's chunk in the pass: the GEMM for the projections on VNNI,
        // the dots with AVX2 alone (every pass there: a prompt's rows get the
        // decode's arithmetic, the K-quants' activations rounded per 256).
        takes(&[1, 5, 1], Slot::MatmulQkv, !vnni);
        let mut alone = open_as(file, 512, 20);
        let room = batch.context;
        let lengths = [5usize, 13, 30.min(room / 2), 2];
        let prompts: Vec<Vec<u32>> = lengths.iter().map(|&n| (0..n).map(|i| 3 + ((i * 37 + n) % 90) as u32).collect()).collect();
        let seeded = P { temperature: 0.9, top_p: 0.95, seed: 3, ..P::GREEDY };
        let params = [P::GREEDY, seeded, P::GREEDY, seeded];
        let budgets: Vec<usize> = [16usize, 9, 20, 12].iter().zip(&lengths).map(|(&b, &n)| b.min(room - n - 1)).collect();
        let mut batched_steps = 0;
        batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &budgets, None, file, |_, _| batched_steps += 1);
        assert!(batched_steps >= 8, "{file}: {batched_steps} batched steps");
    }
}

/// A profile's `serve.batches` (what `tune --serve-batches` writes) switches a
/// decode batch's kernels with its size: batches of 2 and 3 sequences run the
/// projections through `gemm_q_rows_cpu` (f32 activations) and the norms one
/// way, batches of 4 or more through the int8 GEMM and another; a slot the
/// tables leave out keeps the plan's own choice. Then, with tables that switch
/// within the lone decode's int8 arithmetic (the GEMM's row tiles, the norm's
/// split), a batch shrinking from four sequences through both regimes gives
/// every sequence, greedy and seeded, its lone answer. (The rows kernel's f32
/// activations are nearer the f32 reference than the decode's int8 ones, and a
/// near-tie of this random fixture tells them apart after ten tokens.) The
/// matrices stay rows (`serve.cpuRepack: []`), as the tables were written for.
#[test]
fn a_profiles_batch_regimes_switch_kernels_as_the_batch_shrinks() {
    use ktune::kernels::sample::SamplerParams as P;
    use ktune::plan::Slot;
    let tmp = tempdir();
    let profile = |name: &str, two: &str, four: &str| {
        let path = tmp.path().join(name);
        let text = format!(
            "name: batches\nmodel: smollm2-tiny\nversion: 1\ndevice: {{backend: cpu}}\n\
             execution: {{weightDtype: q8_0, fusedQkv: true, fusedGateUp: true}}\n\
             serve:\n  cpuRepack: []\n  batches:\n    \"2\": {two}\n    \"4\": {four}\n"
        );
        std::fs::write(&path, text).expect("profile written");
        path
    };
    // The int8 GEMM's SIMD tiles need AVX-512 VNNI; elsewhere its portable
    // loops (`isa: 1`, the same arithmetic), and a slot the tables leave out
    // takes the prefill's f32 panel GEMM.
    let vnni = ktune::kernels::cpu::qgemm::i8_gemm_simd(ktune::kernels::cpu::Isa::best());
    let isa = if vnni { "" } else { ", isa: 1" };
    let switching = profile(
        "kernels.yaml",
        "{matmul: {qkv_proj: {prefill: gemm_q_rows_cpu}, o_proj: {prefill: gemm_q_rows_cpu}, down_proj: {prefill: gemm_q_rows_cpu}}, \
         norm: {prefill: {kernel: rms_norm_rows_cpu, params: {strategy: 2}}}}",
        &format!(
            "{{matmul: {{qkv_proj: {{prefill: {{kernel: gemm_q_i8_cpu, params: {{rows_per_task: 16{isa}}}}}}}, \
             down_proj: {{prefill: {{kernel: gemm_q_i8_cpu, params: {{rows_per_task: 32{isa}}}}}}}}}, \
             norm: {{prefill: {{kernel: rms_norm_rows_cpu, params: {{strategy: 1}}}}}}}}"
        ),
    );
    let file = "smollm2-tiny-q8_0.gguf";
    // Without --parallel a server runs the profile's largest batch size.
    assert_eq!(open_with(file, 512, None, Some(switching.clone())).batch_rows(), 4);
    let g = open_with(file, 512, Some(4), Some(switching));
    let kernel_of = |g: &Generator, rows: usize, slot: Slot| pass_kernel(g, &vec![1; rows], slot);
    for rows in [2, 3] {
        assert!(kernel_of(&g, rows, Slot::MatmulDown).starts_with("gemm_q_rows_cpu"), "{rows}");
        assert!(kernel_of(&g, rows, Slot::MatmulO).starts_with("gemm_q_rows_cpu"), "{rows}");
        assert_eq!(kernel_of(&g, rows, Slot::Norm), "rms_norm_rows_cpuSome(2)");
    }
    assert_eq!(kernel_of(&g, 4, Slot::MatmulQkv), "gemm_q_i8_cpuSome(16)");
    assert!(kernel_of(&g, 4, Slot::MatmulDown).starts_with("gemm_q_i8_cpu"));
    assert_eq!(kernel_of(&g, 4, Slot::Norm), "rms_norm_rows_cpuSome(1)");
    // Left out at 4: the plan's own choice, the GEMM of the prefill (with AVX2
    // alone, a decode pass's dots over the rows).
    let prefill_gemm = if vnni { "gemm_q_i8_cpu" } else { "gemm_q_dots_cpu" };
    assert!(kernel_of(&g, 4, Slot::MatmulO).starts_with(prefill_gemm), "{}", kernel_of(&g, 4, Slot::MatmulO));
    drop(g);

    let tables = |qkv: u32, down: u32, strategy: u32| {
        format!(
            "{{matmul: {{qkv_proj: {{prefill: {{kernel: gemm_q_i8_cpu, params: {{rows_per_task: {qkv}{isa}}}}}}}, \
             down_proj: {{prefill: {{kernel: gemm_q_i8_cpu, params: {{rows_per_task: {down}{isa}}}}}}}}}, \
             norm: {{prefill: {{kernel: rms_norm_rows_cpu, params: {{strategy: {strategy}}}}}}}}}"
        )
    };
    if !vnni {
        // A lone prompt's prefill there takes the f32 panel GEMM (f32
        // activations), which no int8 table of a batch's passes matches.
        eprintln!(
            "a_profiles_batch_regimes_switch_kernels_as_the_batch_shrinks: no AVX-512 VNNI: the lone prefill is the f32 panel GEMM; \
             the batches' answers against it not checked"
        );
        return;
    }
    let int8 = profile("int8.yaml", &tables(16, 16, 2), &tables(64, 128, 1));
    let mut batch = open_with(file, 512, Some(4), Some(int8.clone()));
    let mut alone = open_with(file, 512, Some(1), Some(int8));
    assert_eq!(kernel_of(&batch, 2, Slot::MatmulDown), "gemm_q_i8_cpuSome(16)");
    assert_eq!(kernel_of(&batch, 4, Slot::MatmulDown), "gemm_q_i8_cpuSome(128)");
    let prompts: Vec<Vec<u32>> = [6usize, 11, 3, 17].iter().map(|&n| (0..n).map(|i| 4 + ((i * 29 + n) % 80) as u32).collect()).collect();
    let seeded = P { temperature: 0.8, top_k: 20, seed: 5, ..P::GREEDY };
    let params = [P::GREEDY, seeded, seeded, P::GREEDY];
    // Budgets that end one sequence after another: 4, 3, 2 sequences, then one alone.
    let budgets = [6usize, 10, 14, 18];
    let mut sizes = Vec::new();
    batch_answers_as_alone(&mut batch, &mut alone, &prompts, &params, &budgets, None, "switching tables", |n, _| sizes.push(n));
    for n in [4, 3, 2] {
        assert!(sizes.contains(&n), "no batch of {n}: {sizes:?}");
    }
}

/// A server of several sequences loads its matrices in the layouts of the
/// profile's `serve.cpuRepack` (what `tune --serve-batches` checked its tables
/// over), else in the runtime's default for a server, never the lone decode's
/// `execution.cpuRepack` (on a VNNI CPU a long-row model's plain rows, whose
/// batches decoded 8–11% slower than a server without the profile); a server
/// of one sequence keeps `execution.cpuRepack`.
#[test]
fn a_server_loads_the_profiles_server_layouts() {
    use ktune::kernels::quant::QFormat;
    let tmp = tempdir();
    let profile = |name: &str, serve: &str| q8_profile(tmp.path(), name, serve);
    let file = "smollm2-tiny-q8_0.gguf";
    let layout = |g: Generator| g.engine.plan.options.cpu_repack.clone();
    let plain = profile("plain.yaml", "serve: {cpuRepack: []}\n");
    assert_eq!(layout(open_with(file, 512, Some(4), Some(plain.clone()))), Vec::<QFormat>::new());
    assert_eq!(layout(open_with(file, 512, Some(1), Some(plain))), vec![QFormat::Q8_0]);
    let unsaid = profile("unsaid.yaml", "");
    assert_eq!(layout(open_with(file, 512, Some(4), Some(unsaid))), layout(open_as(file, 512, 4)), "the runtime's default for a server");
    let named = profile("named.yaml", "serve: {cpuRepack: [q8_0]}\n");
    assert_eq!(layout(open_with(file, 512, Some(4), Some(named))), vec![QFormat::Q8_0]);
}

/// A profile's `serve.minBatch` (where the tuner found lone steps faster):
/// fewer sequences than it take lone decode steps, no batch pass, and give
/// exactly their lone ids; as many as it decode in one pass.
#[test]
fn fewer_sequences_than_the_profiles_min_batch_decode_alone() {
    use ktune::kernels::sample::SamplerParams as P;
    let tmp = tempdir();
    let profile = q8_profile(tmp.path(), "min.yaml", "serve: {minBatch: 3}\n");
    let file = "smollm2-tiny-q8_0.gguf";
    // Without --parallel: below minBatch 3 is 2 sequences.
    assert_eq!(open_with(file, 512, None, Some(profile.clone())).batch_rows(), 2);
    let mut g = open_with(file, 512, Some(3), Some(profile.clone()));
    let mut alone = open_with(file, 512, Some(1), Some(profile));
    let prompts: Vec<Vec<u32>> = [5usize, 9, 14].iter().map(|&n| (0..n).map(|i| 6 + ((i * 17 + n) % 70) as u32).collect()).collect();
    let seeded = P { temperature: 0.9, top_p: 0.9, seed: 3, ..P::GREEDY };
    let budgets = [4usize, 12, 12];
    let (mut threes, mut twos) = (0, 0);
    batch_answers_as_alone(&mut g, &mut alone, &prompts, &[seeded; 3], &budgets, None, "minBatch 3", |n, passes| {
        if n == 3 {
            assert_eq!(passes, 1, "three sequences: one batch pass");
            threes += 1;
        } else {
            assert_eq!(passes, 0, "two sequences, fewer than minBatch: lone steps");
            twos += 1;
        }
    });
    assert!(threes >= 2 && twos >= 5, "{threes} batches of 3, {twos} steps of 2");
}

/// Decode batches of a real model (`KTUNE_REAL_GGUF`, e.g. SmolLM2-135M): tokens
/// a second at 1 (the lone decode step), 2, 4, 8 and 16 sequences (or `KTUNE_BATCH_SIZES`), interleaved
/// rounds, and where a batch's time goes by slot. A measurement, not a check:
/// `KTUNE_REAL_GGUF=target/real/SmolLM2-135M-Instruct.Q4_1.gguf cargo test
/// --release --test it batch_decode_timing -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement on a real model file"]
fn batch_decode_timing() {
    let Some(path) = std::env::var_os("KTUNE_REAL_GGUF") else { return };
    // KTUNE_PROFILE: a profile's kernels (its batch tables) instead of the defaults.
    let profile = std::env::var_os("KTUNE_PROFILE").map(std::path::PathBuf::from);
    let prompt: Vec<u32> = (0..24).map(|i| 100 + i).collect();
    // KTUNE_BATCH_SIZES: the batch sizes timed (comma-separated; default 1,2,4,8,16).
    let sizes: Vec<usize> = std::env::var("KTUNE_BATCH_SIZES")
        .map(|v| v.split(',').map(|b| b.trim().parse().expect("a batch size")).collect())
        .unwrap_or_else(|_| vec![1, 2, 4, 8, 16]);
    let mut g = open_with(path.to_str().expect("utf-8 path"), 512, Some(sizes.iter().copied().max().unwrap_or(1).max(2)), profile);
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
    for _round in 0..3 {
        for (si, &b) in sizes.iter().enumerate() {
            let mut slots: Vec<_> = (0..b).map(|_| g.new_slot().unwrap()).collect();
            let limits = Limits { max_tokens: 40, stop: Vec::new(), ignore_eos: true };
            let mut runs = Vec::new();
            for slot in slots.iter_mut() {
                g.swap_slot(slot).unwrap();
                runs.push(g.start(&prompt, SamplerParams::GREEDY, &limits, usize::MAX, &mut |_| true).unwrap());
                g.swap_slot(slot).unwrap();
            }
            let steps = 32;
            let t0 = std::time::Instant::now();
            for _ in 0..steps {
                if b == 1 {
                    g.swap_slot(&mut slots[0]).unwrap();
                    g.advance(&mut runs[0], &mut |_| true).unwrap();
                    g.swap_slot(&mut slots[0]).unwrap();
                } else {
                    let mut ss: Vec<_> = slots.iter_mut().collect();
                    let mut rs: Vec<_> = runs.iter_mut().collect();
                    g.advance_batch(&mut ss, &mut rs, &mut |_, _| true).unwrap();
                }
            }
            rates[si].push((steps * b) as f64 / t0.elapsed().as_secs_f64());
            if b >= 8 {
                let mut t: Vec<_> = g.engine.last_pass_times().seconds.iter().map(|(k, v)| (*v, format!("{k:?}"))).collect();
                t.sort_by(|a, b| b.0.total_cmp(&a.0));
                eprintln!("batch of {b}, ms by slot: {:?}", t.iter().map(|(v, k)| format!("{k} {:.2}", v * 1e3)).collect::<Vec<_>>());
            }
        }
    }
    for (b, r) in sizes.iter().zip(&mut rates) {
        r.sort_by(f64::total_cmp);
        eprintln!("{b:>2} sequences: {:.1} tok/s (median of {}; {:.1}-{:.1})", r[r.len() / 2], r.len(), r[0], r[r.len() - 1]);
    }
}

/// A prefix one sequence prefilled, copied into another's cache
/// ([`Generator::share_prefix`], `serve --parallel`'s shared system prompt),
/// the rest of the second prompt prefilled a few tokens a step (`--step-tokens`):
/// its logits and ids are an empty cache's, bit for bit, and only its own
/// tokens are prefilled; with an f32 cache, and with a q8_0 one (its blocks
/// shared and copied on write as its codes and scales).
#[test]
fn a_shared_prefix_answers_as_computed() {
    shared_prefix_answers_as_computed("cpu", "smollm2-tiny-q8_0.gguf", DType::F32);
    shared_prefix_answers_as_computed("cpu", "qwen3-tiny-q8_0.gguf", DType::Q8_0);
}

/// [`a_shared_prefix_answers_as_computed`] on a GPU's paged KV cache (lavapipe in
/// CI; skipped loudly without one unless required): the shared block is copied
/// on the GPU at the first write into it (f32, f16 and q8_0 pools); the ids are
/// an empty cache's, the logits within 1e-4 of them (a prompt in chunks of 3
/// runs other GEMM shapes than one pass over it).
#[test]
fn a_shared_prefix_answers_as_computed_on_a_gpu() {
    if ktune::testing::test_gpu().is_none() {
        return;
    }
    shared_prefix_answers_as_computed("vulkan", "smollm2-tiny-q8_0.gguf", DType::F32);
    shared_prefix_answers_as_computed("vulkan", "qwen3-tiny-q8_0.gguf", DType::F16);
    // q8_0 pools: a block's codes and its scales copied.
    shared_prefix_answers_as_computed("vulkan", "qwen3-tiny-q8_0.gguf", DType::Q8_0);
}

fn shared_prefix_answers_as_computed(device: &str, file: &str, kv: DType) {
    let open = |parallel| open_on(device, file, 512, Some(parallel), ProfileChoice { kv_dtype: kv, ..ProfileChoice::uncached() });
    let mut g = open(4);
    // The fresh engine is a server's of as many sequences too: its passes
    // compute as g's (on a GPU paged; on a CPU its matrices in the same
    // layout, X8 records, whose one-row dots round otherwise than the rows').
    let mut fresh = open(4);
    let system: Vec<u32> = (0..40).map(|i| 5 + (i * 13) % 80).collect();
    let first: Vec<u32> = system.iter().copied().chain([7, 9, 11]).collect();
    let second: Vec<u32> = system.iter().copied().chain([8, 10, 12, 14]).collect();
    // As `answer` decodes.
    let limits = Limits { max_tokens: 6, stop: Vec::new(), ignore_eos: true };
    let (mut a, mut b) = (g.new_slot().unwrap(), g.new_slot().unwrap());
    g.swap_slot(&mut a).unwrap();
    let run = g.start(&first, SamplerParams::GREEDY, &limits, usize::MAX, &mut |_| true).unwrap();
    g.end(run, &mut |_| true).unwrap();
    g.swap_slot(&mut a).unwrap();
    assert_eq!(Generator::reusable(&a, &second), 40);
    // Sequences of their own share one paged KV cache: the prefix is a's
    // blocks held by b too, nothing copied.
    let page = ktune::runtime::KV_PAGE;
    let held = |g: &Generator| g.engine.kv_blocks().expect("a paged KV cache").0;
    let a_blocks = a.kv_written().div_ceil(page);
    assert_eq!(held(&g), a_blocks);
    g.share_prefix(&mut b, &a, 40).unwrap();
    assert_eq!(held(&g), a_blocks, "sharing takes no block");
    g.swap_slot(&mut b).unwrap();
    // Prefilled 3 tokens a step (chunks never leave one alone): the same values.
    let mut run = g.start(&second, SamplerParams::GREEDY, &limits, 3, &mut |_| true).unwrap();
    let mut chunks = 1;
    while run.prefilling() {
        g.advance(&mut run, &mut |_| true).unwrap();
        chunks += 1;
    }
    assert!(chunks >= 2, "{chunks} chunks");
    let logits = g.prompt_logits().unwrap().to_vec();
    while g.advance(&mut run, &mut |_| true).unwrap() {}
    let got = g.end(run, &mut |_| true).unwrap();
    g.swap_slot(&mut b).unwrap();
    // b's first write fell in the shared block holding position 40: b wrote
    // into a copy of its own, and holds the blocks before it with a.
    assert_eq!(held(&g), a_blocks + b.kv_written().div_ceil(page) - 40 / page);
    assert_eq!(got.prefilled, second.len() - 40, "only the new tokens prefilled");
    let want = answer(&mut fresh, &second);
    assert_eq!(got.decoded.generated, want.0, "{file} {kv}");
    if device == "cpu" {
        assert!(
            logits.iter().zip(&want.1).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{file} {kv}: the prompt's logits are an empty cache's"
        );
    } else {
        let scale = want.1.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = logits.iter().zip(&want.1).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-4 * scale, "{file} {kv} on {device}: a logit moved by {worst} (the logits' scale {scale})");
    }
}
