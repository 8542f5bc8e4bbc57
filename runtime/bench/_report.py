"""`warmstart bench`'s result: the measurements summarized into one flat object (what
`--json` prints) and rendered as the lines a person reads."""

from __future__ import annotations

from typing import Any


def summarize(
    ours: dict[str, Any],
    disk: dict[str, Any],
    lcp_cold: dict[str, Any],
    lcp: dict[str, Any],
    disk_bytes: int,
    lcp_bytes: int,
    asks: dict[str, Any],
) -> dict[str, Any]:
    kvb = ours["kv_bytes_per_token"]
    anchor = ours["anchor_tokens"]
    ideal = kvb * (anchor + sum(n - anchor for n in ours["final_tokens"]))
    ram = ours["ram"]["report"]
    restored = ram["restored"]["ram"]
    return {
        "prompt_tokens": ours["cold"]["report"]["prompt_tokens"],
        "decode_tok_s": ours["decode_tok_s"],
        "decode_tok_s_1_thread": ours["decode_tok_s_1_thread"],
        "decode_tok_s_4_resident": ours["decode_tok_s_4_resident"],
        "resident_during_4_resident": ours["resident_during_4_resident"],
        "other_question_ttft_s": ours["other_question"]["ttft_s"],
        "other_question_cached_tokens": sum(ours["other_question"]["report"]["restored"].values()),
        "one_step_s": ours["one_step_s"],
        "cold_ttft_s": ours["cold"]["ttft_s"],
        "live_ttft_s": ours["live"]["ttft_s"],
        "ram_ttft_s": ours["ram"]["ttft_s"],
        "disk_ttft_s": disk["ttft_s"],
        "disk_restored_tokens": disk["report"]["restored"]["disk"],
        "disk_restore_ms": disk["report"]["restore_ms"],
        "disk_decode_ms": disk["report"]["prefill_ms"],
        "ram_restored_tokens": restored,
        "lcp_cold_ttft_s": lcp_cold["cold_ttft_s"],
        "lcp_ram_ttft_s": lcp["ram_ttft_s"],
        "lcp_disk_ttft_s": lcp["disk_ttft_s"],
        "set_data_gbps": ours["set_data_gbps"],
        "restore_gbps": restored * kvb / max(ram["restore_ms"], 1e-6) / 1e6,
        "restore_ms": ram["restore_ms"],
        "disk_bytes": disk_bytes,
        "ideal_bytes": ideal,
        "lcp_disk_bytes": lcp_bytes,
        "conversations": len(ours["final_tokens"]),
        "greedy_same_reply": ours["cold"]["text"] == ours["ram"]["text"] == disk["text"],
        "threshold": ours["threshold"],
        "tuning": {k: v["value"] for k, v in ours["tuning"].items()},
        "extra_buffers": ours["extra_buffers"],
        "loader": ours["loader"],
        "process_start_to_first_token_s": asks["repeat"]["process_start_to_first_token_s"],
        "ask": asks,
    }


def render(r: dict[str, Any]) -> str:
    cold = r["cold_ttft_s"]
    th = r["threshold"]

    def vs_cold(key: str) -> str:
        return f"TTFT {r[key]:8.3f} s   cold/{cold / r[key]:.0f}"

    lines = [
        f"workload: a {r['prompt_tokens']}-token prompt (shared system prompt), "
        f"{r['conversations']} conversations x 2 turns",
        f"  cold                  TTFT {cold:8.3f} s",
        f"  live hit              {vs_cold('live_ttft_s')}",
        f"  RAM hit               {vs_cold('ram_ttft_s')}"
        f"   ({r['ram_restored_tokens']} tokens restored in {r['restore_ms']:.1f} ms)",
        f"  disk, fresh process   {vs_cold('disk_ttft_s')}"
        f"   ({r['disk_restored_tokens']} tokens from disk in {r['disk_restore_ms']:.1f} ms, "
        f"last token {r['disk_decode_ms']:.1f} ms)",
        f"  other question        {vs_cold('other_question_ttft_s')}"
        f"   ({r['other_question_cached_tokens']} tokens cached)",
        f"  one decode step       {r['one_step_s']:8.3f} s  (two tokens at that length: "
        f"the floor of a RAM or disk hit; hits / step: "
        f"live {r['live_ttft_s'] / r['one_step_s']:.2f}, "
        f"RAM {r['ram_ttft_s'] / r['one_step_s']:.2f}, "
        f"disk {r['disk_ttft_s'] / r['one_step_s']:.2f})",
        f"decode {r['decode_tok_s']:.1f} tok/s; one thread {r['decode_tok_s_1_thread']:.1f} "
        f"tok/s ({r['decode_tok_s'] / r['decode_tok_s_1_thread']:.2f}x); with "
        f"{r['resident_during_4_resident']} long conversations resident "
        f"{r['decode_tok_s_4_resident']:.1f} tok/s",
        "llama-cpp-python, same prompts:",
        f"  cold                  TTFT {r['lcp_cold_ttft_s']:8.3f} s",
        f"  LlamaRAMCache hit     TTFT {r['lcp_ram_ttft_s']:8.3f} s   "
        f"warmstart RAM is {r['lcp_ram_ttft_s'] / r['ram_ttft_s']:.1f}x faster",
        f"  LlamaDiskCache, fresh TTFT {r['lcp_disk_ttft_s']:8.3f} s   "
        f"warmstart disk is {r['lcp_disk_ttft_s'] / r['disk_ttft_s']:.1f}x faster",
        f"restore {r['restore_gbps']:.2f} GB/s vs raw llama_state_seq_set_data "
        f"{r['set_data_gbps']:.2f} GB/s (same run)",
        f"disk: {r['disk_bytes'] / 1e6:.1f} MB for {r['conversations']} conversations; "
        f"ideal (system prompt once + own turns) {r['ideal_bytes'] / 1e6:.1f} MB "
        f"= {r['disk_bytes'] / r['ideal_bytes']:.2f}x; "
        f"LlamaDiskCache {r['lcp_disk_bytes'] / 1e6:.1f} MB for ONE conversation",
        f"greedy reply identical cold / RAM / disk: {r['greedy_same_reply']}",
        f"`warmstart ask`, a repeated question: process start to first token "
        f"{r['process_start_to_first_token_s']:.2f} s ({r['ask']['repeat']['summary']})",
        f"swap-in threshold {th['threshold_tokens']} tokens: restore "
        f"{th['restore_ms_at_threshold']:.2f} ms vs recompute "
        f"{th['recompute_ms_at_threshold']:.2f} ms; below it: "
        + ("restores (!)" if th["restores_below"] else "recomputes"),
    ]
    for n, row in th["sweep"].items():
        lines.append(
            f"    {n:>5} tokens: restore {row['restore_ms']:7.2f} ms, "
            f"recompute {row['recompute_ms']:8.2f} ms"
        )
    return "\n".join(lines)
