"""What warmstart changes in llama.cpp's source before it compiles it (installers/
llama_wheel.py applies these; each upstream text must be in the pinned sdist exactly
once). Standard library only, like llama_wheel.py."""

from __future__ import annotations

# warmstart's llama.cpp differs from upstream's in four places.
# 1. Short batches in flash-attention tiles. Its CPU flash attention computes a batch of
# 64 query tokens or more in tiles of 64 rows, and a shorter one a row at a time, which
# costs about a decode step a token: a chat's new message (10 to 60 tokens) took 0.27 s
# for 12 tokens and 1.4 s for 63 after 1,900 tokens of context, a 64-token batch 0.31 s.
# Built here, a batch of 8 to 63 goes in tiles of 16 rows by the same code: 12 tokens
# took 0.09 s and 63 tokens 0.31 s, and a token's result is the same bytes as in a batch
# of 64 or more (a tile's rows do not touch each other), which the calibration proves
# (batch kinds from 8: runtime/hardware/_calibrate.py). A tiled batch's rows go to the
# threads a tile of one head at a time: upstream's runs of nr/(4*nth) rows cut heads in
# two, and every tile is a pass over all the KV cells (12 tokens of the default model's
# 9 heads: 16 passes, not 9). Bare decodes at 6,397 cells of context, this against the
# build before: 12 tokens 172-216 against 301 ms, 64 tokens 533-663 against 701-992;
# at 1,907 cells 83-85 against 93-112 and 306 against 407 ms.
# 2. Decode steps of several replies in one batch give each reply the bits it gets
# alone (batched decode, proven by runtime/engine/_decode_probe.py). Upstream, a batch
# of N rows takes other matrix kernels than a lone row (llamafile's sgemm from 2 rows,
# the tiled K-quant kernels from 8, the repacked weights' gemm by 4), and its flash
# attention splits a lone stream's cells by thread count from 512 cells but a batch of
# streams not at all: 2 to 8 replies in one batch differed from each alone from the
# first step (logits up to 1.02 apart). Built here, llama.cpp marks the products of a
# batch holding one token of each sequence rowwise, and the CPU backend computes each
# row by the lone row's kernel (vec_dot, or the repacked gemv); a one-token query row
# attends in fixed chunks of 256 cells reduced in order, whatever the threads or the
# other streams. A thread computes one run of consecutive items, each a chunk of one KV
# head for all the query heads that share it (upstream: a run of cells for all heads):
# taking items one at a time from a shared counter instead made a long context's step
# bimodal across processes (27 or 31-33 ms at 6,400 cells of the default model, the
# build before exact decode 26-27 ms), the heads of a KV head then reading its cells from
# the other core or from memory.
# 3. A sequence's state for a range of positions (llama_state_seq_get_data_range). A
# capture keeps the chunks a turn added, but upstream exports a sequence's state only
# whole, and with one KV stream per conversation (kv_unified=false) the spare-sequence
# trick (seq_cp of a range, then export the spare) aborts: a partial seq_cp across
# streams is unsupported. So a capture read the whole conversation to cut its new
# chunks, and its cost grew with the conversation (about 90 ms for 2,000 tokens of a
# 1B model). Built here, the export takes [p0, p1) and writes only the cells whose
# position is in it, in the same format and cell order: the same bytes as those cells
# of a whole export (tests/engine/test_range_capture.py). KV caches only; a recurrent
# state ignores the range and is exported whole.
# 4. A weight row's blocks read once for all the rows of a product. With the rowwise hint
# (2.) every row of a decode step took a pass over the weights of its own (one reply
# 8.9 ms a step, four 23 ms, eight 41 ms; default model, 300 tokens of context), and on
# x86 a Q4_1 product has no kernel but vec_dot, so a prompt batch of the default model
# was also computed a dot product at a time. Built here, the CPU backend (x86 with AVX2)
# computes a rowwise Q4_1 or Q8_0 product, and any Q4_1 product of two rows or more, by
# loading and unpacking each block of a weight row once for up to eight rows (four
# without AVX-512's 32 registers), each row's sums in the lone vec_dot's order: the same
# bits (the decode probe; a Q4_1 prompt batch as before), with independent chains of
# sums where the lone kernel waits on one. A step of four replies 18 ms, eight 28 ms; a
# cold prefill of 1,500 tokens 0.69 of the build before. Other weight types and CPUs
# keep the kernels of 2. The hint now marks only a batch of several sequences: a
# one-stream context's prompt batch (split_simple: one token per entry, one sequence)
# was marked too, and took vec_dot where a context of several streams took sgemm or the
# tiled kernels.
# The tag goes into the version (0.3.36+warmstart.<tag>), so into the fingerprint every
# stored KV carries, and into the wheel cache's key.
PATCH_TAG = "decoderows1"
_OPS = "vendor/llama.cpp/ggml/src/ggml-cpu/ops.cpp"
_CPU = "vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu.c"
_REPACK = "vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp"
_SHORT_TILES: tuple[tuple[str, str, str], ...] = (  # (file, upstream's text, ours)
    (_OPS, "static void ggml_compute_forward_flash_attn_ext_tiled(\n",
     "template <int Q_TILE_SZ>\nstatic void ggml_compute_forward_flash_attn_ext_tiled(\n"),
    (_OPS, "    static constexpr int Q_TILE_SZ  = ggml_fa_tile_config::Q;\n"
           "    static constexpr int KV_TILE_SZ = ggml_fa_tile_config::KV;\n",
     "    static constexpr int KV_TILE_SZ = ggml_fa_tile_config::KV;\n"),
    (_OPS, "neq1 >= Q_TILE_SZ);", "neq1 >= 8);"),
    (_OPS, "                ggml_compute_forward_flash_attn_ext_tiled(params, dst, ir0, ir1);\n",
     "                if (neq1 >= Q_TILE_SZ) {\n"
     "                    ggml_compute_forward_flash_attn_ext_tiled<Q_TILE_SZ>"
     "(params, dst, ir0, ir1);\n"
     "                } else {\n"
     "                    ggml_compute_forward_flash_attn_ext_tiled<16>(params, dst, ir0, ir1);\n"
     "                }\n"),
    (_OPS,
     "        int current_chunk = ith;\n"
     "\n"
     "        while (current_chunk < nchunk) {\n"
     "            const int64_t ir0 = dr * current_chunk;\n"
     "            const int64_t ir1 = MIN(ir0 + dr, nr);\n",
     "        // warmstart: a tiled batch goes in units of one head's tile of rows (a short\n"
     "        // batch's: all its rows of one head, in tiles of 16), so that no tile stops at a\n"
     "        // chunk's end: upstream's chunks of nr/(4*nth) rows cut heads in two (12 tokens\n"
     "        // of 9 heads: 16 tiles, each a pass over every KV cell, for 9 heads); a row's\n"
     "        // bits do not depend on the rows beside it in its tile\n"
     "        const int64_t qt    = neq1 >= Q_TILE_SZ ? Q_TILE_SZ : neq1;\n"
     "        const int64_t tph   = (neq1 + qt - 1)/qt; // tiles of a head\n"
     "        const int64_t n_run = use_tiled ? (nr/neq1)*tph : nchunk;\n"
     "        int current_chunk = ith;\n"
     "\n"
     "        while (current_chunk < n_run) {\n"
     "            const int64_t row0 = (current_chunk/tph)*neq1; // the head's first row\n"
     "            const int64_t t    = current_chunk%tph;\n"
     "            const int64_t ir0 = use_tiled ? row0 + t*qt : dr*current_chunk;\n"
     "            const int64_t ir1 = use_tiled ? row0 + MIN((t + 1)*qt, neq1) : "
     "MIN(ir0 + dr, nr);\n"),
)  # fmt: skip
_ROWWISE: tuple[tuple[str, str, str], ...] = (
    ("vendor/llama.cpp/ggml/include/ggml.h",
     "        GGML_HINT_SRC0_IS_HADAMARD = 1,\n",
     "        GGML_HINT_SRC0_IS_HADAMARD = 1,\n"
     "        GGML_HINT_ROWWISE          = 2, // warmstart: each src1 row as a batch of one\n"),
    ("vendor/llama.cpp/src/llama-context.cpp",
     "        if (!ggml_backend_sched_alloc_graph(sched.get(), gf)) {\n"
     '            LLAMA_LOG_ERROR("%s: failed to allocate graph\\n", __func__);',
     "        if (ubatch.n_seq_tokens == 1 && ubatch.n_seqs_unq > 1) {\n"
     "            // warmstart: a token of each of several sequences (a decode step of several\n"
     "            // replies): every product computes each token's row as a batch of one does\n"
     "            // (a one-stream context's prompt batch, cut by split_simple, also has one\n"
     "            // token per sequence entry, but of one sequence: it is not marked)\n"
     "            for (int i = 0; i < ggml_graph_n_nodes(gf); ++i) {\n"
     "                ggml_tensor * node = ggml_graph_node(gf, i);\n"
     "                if (node->op == GGML_OP_MUL_MAT && node->op_params[1] == GGML_HINT_NONE) {\n"
     "                    ggml_mul_mat_set_hint(node, GGML_HINT_ROWWISE);\n"
     "                }\n"
     "            }\n"
     "        }\n"
     "\n"
     "        if (!ggml_backend_sched_alloc_graph(sched.get(), gf)) {\n"
     '            LLAMA_LOG_ERROR("%s: failed to allocate graph\\n", __func__);'),
    (_CPU,
     "    // If tiled is supported, it will execute the full op here and we return\n"
     "    if (ggml_compute_forward_mul_mat_tiled(params, dst)) {",
     "    // warmstart: each row of src1 by the kernel a batch of one row takes (vec_dot)\n"
     "    const bool rowwise = hint == GGML_HINT_ROWWISE;\n"
     "\n"
     "    // If tiled is supported, it will execute the full op here and we return\n"
     "    if (!rowwise && ggml_compute_forward_mul_mat_tiled(params, dst)) {"),
    (_CPU,
     "    if (src1_cont) {\n        for (int64_t i13 = 0; i13 < ne13; i13++)",
     "    if (src1_cont && !rowwise) {\n        for (int64_t i13 = 0; i13 < ne13; i13++)"),
    (_CPU,
     "    if (src1->type != vec_dot_type) {\n"
     "        const void* wdata = (src1->type == vec_dot_type) ? src1->data : params->wdata;",
     "    if (src1->type != vec_dot_type && !rowwise) {\n"
     "        const void* wdata = (src1->type == vec_dot_type) ? src1->data : params->wdata;"),
    (_CPU, "        if ((nr0 % 2 != 0) || (ne11 % 2 != 0) ||",
     "        if (rowwise || (nr0 % 2 != 0) || (ne11 % 2 != 0) ||"),
    (_REPACK,
     "        // If there are more than three rows in src1, use gemm; otherwise, use gemv.\n"
     "        if (nrows > 3) {\n"
     "            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + "
     "src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * "
     "nb01, src1_ptr,\n"
     "                                                             nrows - (nrows % 4), ncols);\n"
     "        }\n"
     "        for (int iter = nrows - (nrows % 4); iter < nrows; iter++) {",
     "        // If there are more than three rows in src1, use gemm; otherwise, use gemv.\n"
     "        // warmstart: every row by gemv, as a batch of one, where the op says rowwise\n"
     "        const bool    rowwise = ggml_get_op_params_i32(op, 1) == GGML_HINT_ROWWISE;\n"
     "        const int64_t nrows4  = rowwise ? 0 : nrows - (nrows % 4);\n"
     "        if (nrows4 > 0) {\n"
     "            gemm<BLOC_TYPE, INTER_SIZE, NB_COLS, PARAM_TYPE>(ne00, (float *) (dst_ptr) + "
     "src0_start, nb1 / nb0,\n"
     "                                                             src0_ptr + src0_start * "
     "nb01, src1_ptr,\n"
     "                                                             nrows4, ncols);\n"
     "        }\n"
     "        for (int64_t iter = nrows4; iter < nrows; iter++) {"),
    (_REPACK,
     "        for (int64_t i12 = 0; i12 < ne12; i12++) {\n"
     "            char * data_ptr  = (char *) src1->data + i12 * nb12;\n"
     "            char * wdata_ptr = wdata + i12 * nbw2;\n"
     "\n"
     "            for (int64_t i11 = ith * 4; i11 < ne11 - ne11 % 4; i11 += nth * 4) {",
     "        // warmstart: rows of a rowwise op are quantized one by one, for gemv\n"
     "        const int64_t ne11_4 = ggml_get_op_params_i32(op, 1) == GGML_HINT_ROWWISE ? 0 : "
     "ne11 - ne11 % 4;\n"
     "        for (int64_t i12 = 0; i12 < ne12; i12++) {\n"
     "            char * data_ptr  = (char *) src1->data + i12 * nb12;\n"
     "            char * wdata_ptr = wdata + i12 * nbw2;\n"
     "\n"
     "            for (int64_t i11 = ith * 4; i11 < ne11_4; i11 += nth * 4) {"),
    (_REPACK,
     "            const int64_t i11_processed = ne11 - ne11 % 4;\n",
     "            const int64_t i11_processed = ne11_4;\n"),
    ("vendor/llama.cpp/ggml/src/ggml-cpu/common.h",
     "#define GGML_FA_TILE_KV 64\n",
     "#define GGML_FA_TILE_KV 64\n"
     "// warmstart: a decode row attends in chunks of this many KV cells, whatever the threads\n"
     "#define GGML_FA_DECODE_CHUNK 256\n"),
    (_CPU,
     "                        size_t n_chunks = n_tasks;\n"
     "                        size_t decode   = sizeof(float)*(neq2*n_chunks*(2+DV) + "
     "n_tasks*(DK + 2*DV));",
     "                        // warmstart: per row of every stream, chunks of "
     "GGML_FA_DECODE_CHUNK cells\n"
     "                        const int64_t neq3 = node->src[0]->ne[3];\n"
     "                        size_t n_chunks = (node->src[1]->ne[1] + GGML_FA_DECODE_CHUNK - "
     "1)/GGML_FA_DECODE_CHUNK;\n"
     "                        size_t decode   = sizeof(float)*(neq2*neq3*n_chunks*(2+DV) + "
     "n_tasks*(DK + 2*DV + CACHE_LINE_SIZE/sizeof(float)));"),
    (_OPS,
     "    const bool use_split_kv_path = !use_ref && (neq1 == 1 && neq3 == 1) && "
     "kv_is_f32_or_f16 && (k->type == v->type) && q->type == GGML_TYPE_F32 && nek1 >= 512;\n"
     "\n"
     "    if (use_split_kv_path) {",
     "    // warmstart: a query row of one token (a decode step, of one stream or of several in\n"
     "    // one batch) attends in chunks of GGML_FA_DECODE_CHUNK cells at fixed places, reduced\n"
     "    // in their order, so that its bits depend neither on the thread count nor on the\n"
     "    // other streams of its batch (upstream splits a lone stream's cells by thread count\n"
     "    // from 512 cells, and a batch of streams not at all)\n"
     "    const bool use_split_kv_path = !use_ref && neq1 == 1 && kv_is_f32_or_f16 && (k->type "
     "== v->type) && q->type == GGML_TYPE_F32;\n"
     "\n"
     "    if (use_split_kv_path) {\n"
     "        ggml_compute_forward_flash_attn_ext_f16_fixed_chunks(params, dst);\n"
     "    } else if (false) {  // upstream's split by thread count, unused"),
    (_OPS,
     "static void ggml_compute_forward_flash_attn_ext_f16(\n"
     "        const ggml_compute_params * params,\n"
     "        ggml_tensor * dst) {\n",
     "// warmstart: the decode rows of all streams, each in fixed chunks of KV cells (see below)\n"
     "static void ggml_compute_forward_flash_attn_ext_f16_fixed_chunks(\n"
     "        const ggml_compute_params * params,\n"
     "        ggml_tensor * dst) {\n"
     "    const ggml_tensor * q = dst->src[0];\n"
     "    const ggml_tensor * k = dst->src[1];\n"
     "    const ggml_tensor * v = dst->src[2];\n"
     "\n"
     "    const int64_t DK       = k->ne[0];\n"
     "    const int64_t DV       = v->ne[0];\n"
     "    const int64_t nek1     = k->ne[1];\n"
     "    const int64_t nr       = q->ne[2]*q->ne[3]; // one row per head and stream\n"
     "    const int64_t n_chunks = (nek1 + GGML_FA_DECODE_CHUNK - 1)/GGML_FA_DECODE_CHUNK;\n"
     "    // an item is a chunk of one KV head for all the query heads that share it, so\n"
     "    // that they read its cells from this core's cache, whichever thread takes it\n"
     "    const int64_t rk2      = q->ne[2]/k->ne[2];\n"
     "    const int64_t n_items  = (nr/rk2)*n_chunks;\n"
     "\n"
     "    const int ith = params->ith;\n"
     "    const int nth = params->nth;\n"
     "\n"
     "    const int64_t partial_size   = 2 + DV;\n"
     "    const int64_t partial_stride = n_chunks*partial_size;\n"
     "    float * partials = (float *) params->wdata + nth*(DK + 2*DV + CACHE_LINE_SIZE_F32);\n"
     "\n"
     "    // each thread a run of consecutive items, as upstream gives each a run of cells\n"
     "    // (an item's bits do not depend on which thread computes it)\n"
     "    const int64_t item0 = n_items*ith/nth;\n"
     "    const int64_t item1 = n_items*(ith + 1)/nth;\n"
     "    for (int64_t item = item0; item < item1; ++item) {\n"
     "        const int64_t ir = (item/n_chunks)*rk2;\n"
     "        const int64_t c  = item%n_chunks;\n"
     "        ggml_compute_forward_flash_attn_ext_f16_one_chunk(params, dst, ir, ir + rk2,\n"
     "            c*GGML_FA_DECODE_CHUNK, std::min<int64_t>((c + 1)*GGML_FA_DECODE_CHUNK, nek1),\n"
     "            partials + c*partial_size, partial_stride);\n"
     "    }\n"
     "    ggml_barrier(params->threadpool);\n"
     "\n"
     "    float * VKQ = (float *) params->wdata + ith*(DK + 2*DV + CACHE_LINE_SIZE_F32);\n"
     "    for (int64_t ir = ith; ir < nr; ir += nth) {\n"
     "        float M = -INFINITY;\n"
     "        float S = 0.0f;\n"
     "        memset(VKQ, 0, DV*sizeof(float));\n"
     "        for (int64_t c = 0; c < n_chunks; ++c) {\n"
     "            const float * partial = partials + ir*partial_stride + c*partial_size;\n"
     "            if (partial[1] == 0.0f) {\n"
     "                continue; // no cell of this row's stream in the chunk\n"
     "            }\n"
     "            const float M_new     = fmaxf(M, partial[0]);\n"
     "            const float scale_old = expf(M - M_new);\n"
     "            const float scale_new = expf(partial[0] - M_new);\n"
     "            for (int64_t d = 0; d < DV; ++d) {\n"
     "                VKQ[d] = VKQ[d]*scale_old + partial[2 + d]*scale_new;\n"
     "            }\n"
     "            S = S*scale_old + partial[1]*scale_new;\n"
     "            M = M_new;\n"
     "        }\n"
     "        if (S != 0.0f) {\n"
     "            ggml_vec_scale_f32(DV, VKQ, 1.0f/S);\n"
     "        }\n"
     "        const int64_t iq3 = ir/q->ne[2];\n"
     "        const int64_t iq2 = ir%q->ne[2];\n"
     "        memcpy((char *) dst->data + (iq3*dst->ne[2]*dst->ne[1] + iq2)*dst->nb[1], VKQ, "
     "dst->nb[1]);\n"
     "    }\n"
     "}\n"
     "\n"
     "static void ggml_compute_forward_flash_attn_ext_f16(\n"
     "        const ggml_compute_params * params,\n"
     "        ggml_tensor * dst) {\n"),
)  # fmt: skip
_QUANTS_X86 = "vendor/llama.cpp/ggml/src/ggml-cpu/arch/x86/quants.c"
_ROWS_SIGNATURE = (
    "(int n, float * GGML_RESTRICT s, size_t bs, const void * GGML_RESTRICT vx, size_t bx, "
    "const void * GGML_RESTRICT vy, size_t by, int nrc)"
)
_ROWS_KERNELS = r"""#if defined(__AVX2__)
// warmstart: the lone vec_dot of one row of x against nr rows of y (by bytes apart), into
// s[r*bs]: a block of x is loaded and unpacked once for all the rows, and each row's sums
// are the lone kernel's, in its order, so its bits (a decode step of several replies).
// Up to eight rows at a time (nr) where AVX-512 gives 32 vector registers, four with AVX2's
// 16, so that the accumulators stay in registers (the grouping changes no row's bits)
#if defined(__AVX512VL__)
#define WS_ROWS_AT_ONCE 8
#else
#define WS_ROWS_AT_ONCE 4
#endif
#if defined(_MSC_VER) && !defined(__clang__)
#define WS_INLINE static __forceinline
#else
#define WS_INLINE static inline __attribute__((always_inline))
#endif
WS_INLINE void ws_q4_1_rows(const int nr, const int nb,
        float * GGML_RESTRICT s, const size_t bs, const block_q4_1 * GGML_RESTRICT x,
        const char * GGML_RESTRICT vy, const size_t by) {
    __m256 acc[8];
    float  summs[8];
    for (int r = 0; r < nr; ++r) {
        acc[r]   = _mm256_setzero_ps();
        summs[r] = 0;
    }
    for (int ib = 0; ib < nb; ++ib) {
        const float   m0  = GGML_CPU_FP16_TO_FP32(x[ib].m);
        const __m256  d0v = _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(x[ib].d));
        const __m256i qx  = bytes_from_nibbles_32(x[ib].qs);
        for (int r = 0; r < nr; ++r) {
            const block_q8_1 * GGML_RESTRICT y = (const block_q8_1 *) (vy + r*by) + ib;
            summs[r] += m0 * GGML_CPU_FP16_TO_FP32(y->s);
            const __m256  d0d1 = _mm256_mul_ps(d0v, _mm256_set1_ps(GGML_CPU_FP16_TO_FP32(y->d)));
            const __m256i qy   = _mm256_loadu_si256((const __m256i *) y->qs);
            const __m256  xy   = mul_sum_us8_pairs_float(qx, qy);
            acc[r] = _mm256_fmadd_ps(d0d1, xy, acc[r]);
        }
    }
    for (int r = 0; r < nr; ++r) {
        s[r*bs] = hsum_float_8(acc[r]) + summs[r];
    }
}

WS_INLINE void ws_q8_0_rows(const int nr, const int nb,
        float * GGML_RESTRICT s, const size_t bs, const block_q8_0 * GGML_RESTRICT x,
        const char * GGML_RESTRICT vy, const size_t by) {
    __m256 acc[8];
    for (int r = 0; r < nr; ++r) {
        acc[r] = _mm256_setzero_ps();
    }
    for (int ib = 0; ib < nb; ++ib) {
        const float   dx = GGML_CPU_FP16_TO_FP32(x[ib].d);
        const __m256i qx = _mm256_loadu_si256((const __m256i *) x[ib].qs);
        for (int r = 0; r < nr; ++r) {
            const block_q8_0 * GGML_RESTRICT y = (const block_q8_0 *) (vy + r*by) + ib;
            const __m256  d  = _mm256_set1_ps(dx * GGML_CPU_FP16_TO_FP32(y->d));
            const __m256i qy = _mm256_loadu_si256((const __m256i *) y->qs);
            const __m256  q  = mul_sum_i8_pairs_float(qx, qy);
            acc[r] = _mm256_fmadd_ps(d, q, acc[r]);
        }
    }
    for (int r = 0; r < nr; ++r) {
        s[r*bs] = hsum_float_8(acc[r]);
    }
}

// a lone row by vec_dot itself; a constant count for each group, so that its loops unroll
#define WS_ROWS(name, lone, rows, block_x, qk)                                          \
void name SIGNATURE {                                                              \
    UNUSED(bx);                                                                         \
    const block_x * GGML_RESTRICT x = vx;                                               \
    const int nb = n / qk;                                                              \
    for (int r = 0; r < nrc; r += WS_ROWS_AT_ONCE) {                                    \
        const char * y = (const char *) vy + r*by;                                      \
        float *      o = s + r*bs;                                                      \
        switch (MIN(nrc - r, WS_ROWS_AT_ONCE)) {                                        \
            case 1:  lone(n, o, 0, vx, 0, y, 0, 1);  break;                             \
            case 2:  rows(2, nb, o, bs, x, y, by);   break;                             \
            case 3:  rows(3, nb, o, bs, x, y, by);   break;                             \
            case 4:  rows(4, nb, o, bs, x, y, by);   break;                             \
            case 5:  rows(5, nb, o, bs, x, y, by);   break;                             \
            case 6:  rows(6, nb, o, bs, x, y, by);   break;                             \
            case 7:  rows(7, nb, o, bs, x, y, by);   break;                             \
            default: rows(8, nb, o, bs, x, y, by);   break;                             \
        }                                                                               \
    }                                                                                   \
}
WS_ROWS(ggml_vec_dot_q4_1_q8_1_rows, ggml_vec_dot_q4_1_q8_1, ws_q4_1_rows, block_q4_1, QK8_1)
WS_ROWS(ggml_vec_dot_q8_0_q8_0_rows, ggml_vec_dot_q8_0_q8_0, ws_q8_0_rows, block_q8_0, QK8_0)
#undef WS_ROWS
#undef WS_ROWS_AT_ONCE
#undef WS_INLINE
#endif

""".replace(" SIGNATURE", _ROWS_SIGNATURE)
_ROWS: tuple[tuple[str, str, str], ...] = (
    (_QUANTS_X86, "void ggml_vec_dot_mxfp4_q8_0(int n,",
     _ROWS_KERNELS + "void ggml_vec_dot_mxfp4_q8_0(int n,"),
    ("vendor/llama.cpp/ggml/src/ggml-cpu/quants.h",
     "void ggml_vec_dot_q8_0_q8_0" + _ROWS_SIGNATURE + ";\n",
     "void ggml_vec_dot_q8_0_q8_0" + _ROWS_SIGNATURE + ";\n"
     "// warmstart: nrc rows of vy against one row of vx, s[r*bs] (x86 with AVX2)\n"
     "void ggml_vec_dot_q4_1_q8_1_rows" + _ROWS_SIGNATURE + ";\n"
     "void ggml_vec_dot_q8_0_q8_0_rows" + _ROWS_SIGNATURE + ";\n"),
    (_CPU,
     "    float tmp[32];\n\n    for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n",
     "    float tmp[32];\n"
     "\n"
     "#if defined(__AVX2__)\n"
     "    // warmstart: each block of a weight row once for all the rows of src1, each row's\n"
     "    // sums in the lone vec_dot's order: a rowwise product (a decode step of several\n"
     "    // replies), and any Q4_1 product that comes here (x86 has no other kernel for it:\n"
     "    // a prompt batch took vec_dot row by row, the same bits); a lone row as before\n"
     "    const bool rows_hint = ggml_get_op_params_i32(dst, 1) == GGML_HINT_ROWWISE;\n"
     "    ggml_vec_dot_t const vec_dot_rows = ne12 != 1 || ne13 != 1 || ne11 < 2 ? NULL :\n"
     "        type == GGML_TYPE_Q4_1 ? ggml_vec_dot_q4_1_q8_1_rows :\n"
     "        type == GGML_TYPE_Q8_0 && rows_hint ? ggml_vec_dot_q8_0_q8_0_rows : NULL;\n"
     "    if (vec_dot_rows != NULL) {\n"
     "        for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n"
     "            const int64_t n1   = MIN(iir1 + blck_1, ir1_end) - iir1;\n"
     "            const char *  cols = (const char *) wdata + iir1*src1_col_stride;\n"
     "            float *       out  = (float *) ((char *) dst->data + iir1*nb1);\n"
     "            for (int64_t ir0 = ir0_start; ir0 < ir0_end; ++ir0) {\n"
     "                const char * w = (const char *) src0->data + ir0*nb01;\n"
     "                vec_dot_rows(ne00, out + ir0, nb1/nb0, w, 0, cols, src1_col_stride, n1);\n"
     "            }\n"
     "        }\n"
     "        return;\n"
     "    }\n"
     "#endif\n"
     "\n"
     "    for (int64_t iir1 = ir1_start; iir1 < ir1_end; iir1 += blck_1) {\n"),
)  # fmt: skip
_CONTEXT = "vendor/llama.cpp/src/llama-context.cpp"
_RANGE_EXPORT: tuple[tuple[str, str, str], ...] = (
    ("vendor/llama.cpp/include/llama.h",
     "    LLAMA_API size_t llama_state_seq_get_data_ext(\n"
     "            struct llama_context * ctx,\n"
     "                         uint8_t * dst,\n"
     "                          size_t   size,\n"
     "                    llama_seq_id   seq_id,\n"
     "           llama_state_seq_flags   flags);\n",
     "    LLAMA_API size_t llama_state_seq_get_data_ext(\n"
     "            struct llama_context * ctx,\n"
     "                         uint8_t * dst,\n"
     "                          size_t   size,\n"
     "                    llama_seq_id   seq_id,\n"
     "           llama_state_seq_flags   flags);\n"
     "\n"
     "    // warmstart: as llama_state_seq_get_data, with only the cells of seq_id at positions\n"
     "    // [p0, p1) (p1 < 0: to the end), so that a capture reads only the new cells\n"
     "    LLAMA_API size_t llama_state_seq_get_data_range(\n"
     "            struct llama_context * ctx,\n"
     "                         uint8_t * dst,\n"
     "                          size_t   size,\n"
     "                    llama_seq_id   seq_id,\n"
     "                       llama_pos   p0,\n"
     "                       llama_pos   p1);\n"),
    ("vendor/llama.cpp/src/llama-io.h",
     "    void write_string(const std::string & str);\n};\n",
     "    void write_string(const std::string & str);\n"
     "\n"
     "    // warmstart: a sequence's state holds its cells at positions [range_p0, range_p1)\n"
     "    // only (range_p1 < 0: to the end)\n"
     "    int32_t range_p0 = 0;\n"
     "    int32_t range_p1 = -1;\n"
     "};\n"),
    ("vendor/llama.cpp/src/llama-context.h",
     "    size_t state_seq_get_data(llama_seq_id seq_id,       uint8_t * dst, size_t size, "
     "llama_state_seq_flags flags);\n",
     "    size_t state_seq_get_data(llama_seq_id seq_id,       uint8_t * dst, size_t size, "
     "llama_state_seq_flags flags,\n"
     "                              llama_pos p0 = 0, llama_pos p1 = -1); "
     "// warmstart: [p0, p1)\n"),
    (_CONTEXT,
     "size_t llama_context::state_seq_get_data(llama_seq_id seq_id, uint8_t * dst, size_t size, "
     "llama_state_seq_flags flags) {\n"
     "    std::unique_ptr<llama_io_write_i> io;\n"
     "    if (flags & LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) {\n"
     "        io = std::make_unique<llama_io_write_device>(dst, size, mem_storage[seq_id]);\n"
     "    } else {\n"
     "        io = std::make_unique<llama_io_write_host>(dst, size);\n"
     "    }\n",
     "size_t llama_context::state_seq_get_data(llama_seq_id seq_id, uint8_t * dst, size_t size, "
     "llama_state_seq_flags flags, llama_pos p0, llama_pos p1) {\n"
     "    std::unique_ptr<llama_io_write_i> io;\n"
     "    if (flags & LLAMA_STATE_SEQ_FLAGS_ON_DEVICE) {\n"
     "        io = std::make_unique<llama_io_write_device>(dst, size, mem_storage[seq_id]);\n"
     "    } else {\n"
     "        io = std::make_unique<llama_io_write_host>(dst, size);\n"
     "    }\n"
     "    io->range_p0 = p0;\n"
     "    io->range_p1 = p1;\n"),
    (_CONTEXT,
     "    return ctx->state_seq_get_data(seq_id, dst, size, flags);\n}\n",
     "    return ctx->state_seq_get_data(seq_id, dst, size, flags);\n}\n"
     "\n"
     "size_t llama_state_seq_get_data_range(llama_context * ctx, uint8_t * dst, size_t size, "
     "llama_seq_id seq_id, llama_pos p0, llama_pos p1) {\n"
     "    ctx->synchronize();\n"
     "\n"
     "    return ctx->state_seq_get_data(seq_id, dst, size, 0, p0, p1);\n"
     "}\n"),
    ("vendor/llama.cpp/src/llama-kv-cache.cpp",
     "            add_cell = add_cell && (seq_id == -1 || cells.seq_has(i, seq_id));\n",
     "            add_cell = add_cell && (seq_id == -1 || cells.seq_has(i, seq_id));\n"
     "\n"
     "            // warmstart: only the positions asked for (a capture of the new chunks)\n"
     "            add_cell = add_cell && cells.pos_get(i) >= io.range_p0 &&\n"
     "                (io.range_p1 < 0 || cells.pos_get(i) < io.range_p1);\n"),
)  # fmt: skip
SOURCE_PATCHES = _SHORT_TILES + _ROWWISE + _ROWS + _RANGE_EXPORT
