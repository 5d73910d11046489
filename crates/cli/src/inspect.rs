//! `needle inspect`: what a `.cact` holds — geometry, tensor table, size by kind, tokenizer — and,
//! with `--verify`, whether every tensor decodes to finite values.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use needle_engine::cact::reader::VerifyReport;
use needle_engine::cact::CactFile;
use needle_engine::cact::{Header, Record};
use needle_engine::generation::Generation;
use serde::Serialize;

/// Describe a .cact file.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The .cact file to inspect
    pub file: PathBuf,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// Dequantize every tensor and check codebooks, norms, finiteness and the tokenizer blob
    #[arg(long)]
    pub verify: bool,
}

#[derive(Serialize)]
struct Tensor<'a> {
    #[serde(flatten)]
    record: &'a Record,
    /// CQ width as the reference writes it (2, 3, 4 or 1.58); absent for other kinds.
    bits: Option<String>,
}

#[derive(Serialize)]
struct Summary<'a> {
    file: String,
    bytes: usize,
    header: &'a Header,
    tensors: Vec<Tensor<'a>>,
    /// Blob bytes per storage kind (padding excluded).
    size_by_kind: BTreeMap<&'static str, u64>,
    tokenizer_pieces: Option<u32>,
    /// The probe heads the file carries (`confidence_head`, `router_head`, …).
    heads: Vec<&'a str>,
    verify: Option<VerifyReport>,
}

fn summarise<'a>(args: &Args, cact: &'a CactFile, verify: Option<VerifyReport>) -> Summary<'a> {
    let mut size_by_kind = BTreeMap::new();
    for r in &cact.records {
        *size_by_kind.entry(r.kind.label()).or_insert(0) += r.nbytes;
    }
    Summary {
        file: args.file.display().to_string(),
        bytes: cact.size(),
        header: &cact.header,
        tensors: cact
            .records
            .iter()
            .map(|record| Tensor { record, bits: record.bits().map(|b| b.to_string()) })
            .collect(),
        size_by_kind,
        tokenizer_pieces: cact.tokenizer_pieces(),
        heads: cact.probe_heads(),
        verify,
    }
}

/// Writes the human-readable report; errors (a closed pipe) are returned, never a panic.
fn print_tables(s: &Summary, out: &mut impl Write) -> std::io::Result<()> {
    let h = s.header;
    writeln!(out, "{}: {} .cact, {} bytes, {} tensors", s.file, h.generation, s.bytes, h.num_tensors)?;
    writeln!(
        out,
        "  geometry   vocab {}  d_model {}  heads {}/{}  head_dim {}  layers {}  max_seq_len {}  hada_n {}  mhc_lanes {}",
        h.vocab_size, h.d_model, h.num_heads, h.num_kv_heads, h.head_dim, h.num_layers, h.max_seq_len, h.hada_n, h.mhc_lanes
    )?;
    writeln!(
        out,
        "  engram     slots {}  sub_dim {}  tables {}  conv taps {} dilation {}  orders {:?}  sites {:?}",
        h.engram_slots,
        h.engram_sub_dim,
        h.num_engram_tables,
        h.engram_conv_taps,
        h.engram_conv_dilation,
        h.engram_orders,
        h.engram_layers
    )?;
    // A v2 header has none of Needle 3's fields.
    if let Generation::Needle3 = h.generation {
        let global: Vec<u32> = (0..64).filter(|l| h.global_layers >> l & 1 == 1).collect();
        writeln!(
            out,
            "  needle 3   v head_dim {}  out_vocab {}  sliding_window {}  global layers {global:?}  qkv conv taps {}  engram seed heads {}",
            h.v_head_dim, h.out_vocab, h.sliding_window, h.qkv_conv_taps, h.engram_seed_heads
        )?;
    }
    writeln!(out, "  runtime    kv_window {}  kv_bits {}  rope_theta {}", h.kv_window, h.kv_bits, h.rope_theta)?;
    let heads = if s.heads.is_empty() { "none".to_string() } else { s.heads.join(", ") };
    writeln!(out, "  heads      {heads}")?;
    writeln!(out, "\n  {:>4}  {:<26} {:<5} {:<16} {:>4} {:>12}", "#", "name", "dtype", "shape", "bits", "bytes")?;
    for (i, t) in s.tensors.iter().enumerate() {
        let r = t.record;
        writeln!(
            out,
            "  {i:>4}  {:<26} {:<5} {:<16} {:>4} {:>12}",
            r.name,
            r.kind.label(),
            format!("{:?}", r.shape),
            t.bits.as_deref().unwrap_or("-"),
            r.nbytes
        )?;
    }
    writeln!(out)?;
    for (kind, bytes) in &s.size_by_kind {
        writeln!(out, "  {kind:<5} {:>10.2} MB", *bytes as f64 / 1e6)?;
    }
    match s.tokenizer_pieces {
        Some(n) => writeln!(out, "  tokenizer  {n} pieces")?,
        None => writeln!(out, "  tokenizer  none")?,
    }
    if let Some(v) = &s.verify {
        writeln!(
            out,
            "  verify     ok: {} tensors decoded, {} CQ groups, all finite, max |value| {}",
            v.tensors, v.cq_groups, v.max_abs
        )?;
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    let cact = CactFile::open(&args.file)?;
    let verify = if args.verify {
        Some(cact.verify().map_err(|e| anyhow::anyhow!("{}: verify failed: {e}", args.file.display()))?)
    } else {
        None
    };
    let summary = summarise(&args, &cact, verify);
    if args.json {
        writeln!(std::io::stdout().lock(), "{}", serde_json::to_string_pretty(&summary)?)?;
    } else {
        print_tables(&summary, &mut std::io::stdout().lock())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/golden/tiny_f32/w4.cact");

    #[test]
    fn the_report_lists_geometry_every_tensor_sizes_and_tokenizer() {
        let args = Args { file: GOLDEN.into(), json: false, verify: true };
        let cact = CactFile::open(&args.file).unwrap();
        let summary = summarise(&args, &cact, Some(cact.verify().unwrap()));
        let mut text = Vec::new();
        print_tables(&summary, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("d_model 96"), "{text}");
        assert!(text.contains("layer02.q_proj"), "{text}");
        assert!(text.contains("confidence_head.bias"), "{text}");
        assert!(text.contains("tokenizer  512 pieces"), "{text}");
        assert!(text.contains("verify     ok"), "{text}");
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(json["heads"], serde_json::json!(["contrastive_head", "confidence_head"]));
        assert_eq!(json["tensors"][0]["name"], "embedding");
        assert_eq!(json["tensors"][0]["bits"], "4");
        assert_eq!(json["tensors"].as_array().unwrap().len(), json["header"]["num_tensors"].as_u64().unwrap() as usize);
    }

    #[test]
    fn a_needle3_report_names_its_generation_its_own_geometry_and_heads() {
        let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/golden/needle3_heads/layers3.cact");
        let args = Args { file: file.into(), json: false, verify: true };
        let cact = CactFile::open(&args.file).unwrap();
        let summary = summarise(&args, &cact, Some(cact.verify().unwrap()));
        let mut text = Vec::new();
        print_tables(&summary, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("Needle 3 .cact"), "{text}");
        assert!(
            text.contains("v head_dim 16  out_vocab 508  sliding_window 16  global layers []  qkv conv taps 3"),
            "{text}"
        );
        assert!(
            text.contains("layer02.v_taps") && text.contains("hada_p2") && text.contains("router_head.calibration"),
            "{text}"
        );
        assert!(text.contains("verify     ok"), "{text}");
    }

    #[test]
    fn a_tuned_build_lists_the_trained_confidence_head_it_ships() {
        let golden =
            |name: &str| format!("{}/../../tests/fixtures/golden/needle3_heads/{name}", env!("CARGO_MANIFEST_DIR"));
        for (name, heads) in [
            ("lora.cact", "heads      embedding_head, router_head"),
            ("lora_head.cact", "heads      embedding_head, confidence_head, router_head"),
        ] {
            let args = Args { file: golden(name).into(), json: false, verify: false };
            let cact = CactFile::open(&args.file).unwrap();
            let mut text = Vec::new();
            print_tables(&summarise(&args, &cact, None), &mut text).unwrap();
            let text = String::from_utf8(text).unwrap();
            assert!(text.contains(heads), "{name}: {text}");
        }
    }
}
