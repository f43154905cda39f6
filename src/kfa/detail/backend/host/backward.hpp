#ifndef KFA_DETAIL_BACKEND_HOST_BACKWARD_HPP
#define KFA_DETAIL_BACKEND_HOST_BACKWARD_HPP

// Backward kernel of the host backends (KernelFamily::host_tiled): the
// FlashAttention-2 backward of attention/backward_kernel.hpp, one thread per
// (sequence, key/value head, chunk of key blocks). For each key block the
// thread keeps Kᵀ, Vᵀ and the dK, dV accumulators in its tiles and visits
// the query blocks (of every query head of the group) that see it,
// recomputing P from the saved lse; Q and dO are read in place where the
// Views allow (else converted once per tile):
//   S = Q·Kᵀ, dP = dO·Vᵀ, P and dS elementwise along keys (scale folded
//   into dS), dV += Pᵀ·dO, dK += dSᵀ·Q (Pᵀ, dSᵀ read as transposed
//   operands), dQ_chunk += dS·K.
// dK and dV have one owner, so no atomics. dQ is summed per chunk into its
// own accumulator and the chunks are added in a fixed order afterwards: the
// result does not depend on the thread schedule (deterministic).

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>
#include <kfa/detail/backend/host/forward.hpp>
#include <kfa/detail/backend/host/micro_kernel.hpp>
#include <kfa/detail/backend/host/tiles.hpp>
#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/common/workspace.hpp>

#include <limits>

namespace kfa {
namespace Impl {
namespace Host {

/// Chunks of key blocks per (sequence, key/value head): enough work items
/// for twice the threads, at most one chunk per key block and kMaxKeyChunks.
/// Each chunk costs a dQ accumulator the size of dq, so there is one where
/// the heads alone keep the threads busy.
constexpr int kMaxKeyChunks = 4;
inline int key_chunks(int concurrency, int batch_heads, int kv_blocks) {
  const int want = (2 * concurrency + batch_heads - 1) / (batch_heads > 0 ? batch_heads : 1);
  return iclamp(want, 1, imin(kv_blocks > 0 ? kv_blocks : 1, kMaxKeyChunks));
}

/// DQAccView: indexed (chunk * view_batch + vb, row, h, d); dq itself where
/// there is one chunk and dq holds the accumulator type.
template <class ExecSpace, class VariantT, class QView, class KView, class VView, class DOView,
          class LseView, class DeltaView, class DQAccView, class DKView, class DVView>
class BackwardKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using acc_t = typename DeltaView::non_const_value_type;
  using traits = BackwardTileTraits<acc_t>;
  using member_t = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using params_t = KernelParams<acc_t, typename QView::memory_space>;
  using pipeline_t = ScorePipeline<VariantT, acc_t>;
  static constexpr int kBlockM = traits::kBlockM;
  static constexpr int kBlockN = traits::kBlockN;

  BackwardKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                 const LseView& lse, const DeltaView& delta, const DQAccView& dq_acc,
                 const DKView& dk, const DVView& dv, const params_t& params,
                 const typename VariantT::score_mod_type& score_mod, int chunks)
      : m_q(q),
        m_k(k),
        m_v(v),
        m_do(d_o),
        m_lse(lse),
        m_delta(delta),
        m_dq_acc(dq_acc),
        m_dk(dk),
        m_dv(dv),
        m_params(params),
        m_pipeline(params, score_mod),
        m_scale(params.scale),
        m_view_batch(static_cast<int>(q.extent(0))),
        m_head_dim(params.head_dim),
        m_dpad(traits::padded_head_dim(params.head_dim)),
        m_chunks(chunks),
        m_blocks_per_chunk(((params.seq.max_seqlen_k + kBlockN - 1) / kBlockN + chunks - 1) /
                           chunks) {}

  int head_dim() const { return m_head_dim; }

  void launch(const ExecSpace& space) const {
    launch_per_thread(space, "kfa::bwd::host_tiled", *this,
                      m_chunks * m_params.seq.batch * m_params.heads_kv, scratch_bytes());
  }

  /// sKt, sVt [d][N]; sK, acc_dk, acc_dv [N][Dp]; sQ, sdO, acc_dq [M][Dp];
  /// sS, sdS [M][N] (S, then P; dP, then dS); lse and D rows.
  std::size_t scratch_bytes() const {
    const std::size_t a = sizeof(acc_t);
    return TileArena::bytes({2 * a * m_head_dim * kBlockN, 3 * a * kBlockN * m_dpad,
                             3 * a * kBlockM * m_dpad, 2 * a * kBlockM * kBlockN,
                             2 * a * kBlockM});
  }

  void operator()(const member_t& member) const {
    // Causal: the first key blocks are seen by the most rows; chunk 0 first.
    const int item = member.league_rank(), heads_kv = m_params.heads_kv,
              group = m_params.group();
    const int bh = item % (m_params.seq.batch * heads_kv);
    const int chunk = item / (m_params.seq.batch * heads_kv);
    const int b = bh / heads_kv, h_kv = bh % heads_kv;
    const SequenceInfo seq = m_params.seq(b);
    const int vb = seq.view_batch, k0 = seq.k_begin;
    const int kv_block_begin = chunk * m_blocks_per_chunk;
    const int kv_block_end = imin(kv_block_begin + m_blocks_per_chunk,
                                  (seq.seqlen_k + kBlockN - 1) / kBlockN);
    const int dpad = m_dpad;
    const AttentionMask mask(seq.seqlen_q, seq.seqlen_k, m_params.window_left,
                             m_params.window_right);

    TileArena arena(member.team_scratch(1).get_shmem(scratch_bytes()));
    Tiles t;
    t.sKt = arena.take<acc_t>(std::size_t(m_head_dim) * kBlockN);
    t.sVt = arena.take<acc_t>(std::size_t(m_head_dim) * kBlockN);
    t.sK = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    t.acc_dk = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    t.acc_dv = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    t.sQ = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    t.sdO = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    t.acc_dq = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    t.sS = arena.take<acc_t>(std::size_t(kBlockM) * kBlockN);
    t.sdS = arena.take<acc_t>(std::size_t(kBlockM) * kBlockN);
    t.s_lse = arena.take<acc_t>(kBlockM);
    t.s_delta = arena.take<acc_t>(kBlockM);

    for (int kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
      const int cols_pad = traits::round_up(cols, traits::kRows);
      // Kᵀ and Vᵀ (keys past the sequence 0), K rows for dQ; fresh dK, dV.
      load_transposed(m_k, vb, k0 + key_begin, h_kv, cols, m_head_dim, acc_t(1), t.sKt, kBlockN);
      load_transposed(m_v, vb, k0 + key_begin, h_kv, cols, m_head_dim, acc_t(1), t.sVt, kBlockN);
      t.gK = row_tile(m_k, vb, k0 + key_begin, h_kv, cols, cols, m_head_dim, dpad, t.sK, dpad);
      for (std::size_t x = 0; x < std::size_t(cols_pad) * dpad; ++x) {
        t.acc_dk[x] = 0;
        t.acc_dv[x] = 0;
      }
      // Rows that see this key block; the blocks before and after are skipped.
      const int row_lo = mask.row_begin(key_begin);
      const int row_hi = mask.row_end(key_begin + cols);
      const int q_block_end = (row_hi + kBlockM - 1) / kBlockM;
      for (int g = 0; g < group; ++g) {
        const int h = h_kv * group + g;
        for (int q_block = row_lo / kBlockM; q_block < q_block_end; ++q_block) {
          const int row_begin = q_block * kBlockM;
          const int rows = imin(kBlockM, seq.seqlen_q - row_begin);
          if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin,
                                  key_begin + cols))
            continue;
          tile(t, mask, seq, b, h, chunk, row_begin, rows, key_begin, cols, cols_pad);
        }
      }
      // The scale is in dS already.
      for (int j = 0; j < cols; ++j)
        for (int d = 0; d < m_head_dim; ++d) {
          m_dk(vb, k0 + key_begin + j, h_kv, d) =
              from_acc<value_type>(t.acc_dk[std::size_t(j) * dpad + d]);
          m_dv(vb, k0 + key_begin + j, h_kv, d) =
              from_acc<value_type>(t.acc_dv[std::size_t(j) * dpad + d]);
        }
    }
  }

 private:
  struct Tiles {
    acc_t *sKt, *sVt, *sK, *acc_dk, *acc_dv, *sQ, *sdO, *acc_dq, *sS, *sdS, *s_lse, *s_delta;
    RowTile<acc_t> gK;
  };

  /// One (query block, key block) tile: recomputes P and dS from Q, dO and
  /// the saved lse and D, and adds the tile's share of dV, dK and dQ.
  void tile(const Tiles& t, const AttentionMask& mask, const SequenceInfo& seq, int b, int h,
            int chunk, int row_begin, int rows, int key_begin, int cols, int cols_pad) const {
    const int vb = seq.view_batch, q0 = seq.q_begin, dpad = m_dpad;
    const int rows_pad = traits::round_up(rows, traits::kRows);
    // Q and dO rows, zero-padded to whole register blocks; padded rows'
    // lse +inf gives them P = 0.
    const RowTile<acc_t> gQ =
        row_tile(m_q, vb, q0 + row_begin, h, rows, rows_pad, m_head_dim, dpad, t.sQ, dpad);
    const RowTile<acc_t> gdO =
        row_tile(m_do, vb, q0 + row_begin, h, rows, rows_pad, m_head_dim, dpad, t.sdO, dpad);
    for (int i = 0; i < rows_pad; ++i) {
      const bool row_ok = i < rows;
      const int r = q0 + row_begin + i;
      const acc_t lse = row_ok ? acc_t(m_lse(vb, h, r)) : math::neg_inf<acc_t>();
      // exp(s - (+inf)) = 0: rows that saw no key (lse = -inf) get P = 0.
      t.s_lse[i] = lse == math::neg_inf<acc_t>() ? std::numeric_limits<acc_t>::infinity() : lse;
      t.s_delta[i] = row_ok ? acc_t(m_delta(vb, h, r)) : acc_t(0);
    }
    tile_product<ALayout::row_major, false>(rows_pad, kBlockN, m_head_dim, gQ.ptr, gQ.ld, t.sKt,
                                            kBlockN, t.sS, kBlockN);
    tile_product<ALayout::row_major, false>(rows_pad, kBlockN, m_head_dim, gdO.ptr, gdO.ld, t.sVt,
                                            kBlockN, t.sdS, kBlockN);

    // A tile the modifier leaves unchanged takes the plain path unless
    // softcap, dropout or the modifier's add_grad need each element.
    const bool modify =
        !m_pipeline.unchanged(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols);
    const bool per_element = (VariantT::kScoreMod && (modify || pipeline_t::kGradOut)) ||
                             m_pipeline.softcap_on() || m_pipeline.dropout();
    const bool needs_mask =
        (VariantT::kScoreMod && modify) ||
        mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
    for (int i = 0; i < rows_pad; ++i) {
      acc_t* p = t.sS + std::size_t(i) * kBlockN;
      acc_t* ds = t.sdS + std::size_t(i) * kBlockN;
      const int row = row_begin + i;
      const acc_t lse = t.s_lse[i], delta = t.s_delta[i];
      if (per_element) {
        const std::uint64_t dropout_row =
            m_pipeline.dropout() ? m_pipeline.dropout_row(b, h, row) : 0;
        const acc_t row_lse =
            lse == std::numeric_limits<acc_t>::infinity() ? math::neg_inf<acc_t>() : lse;
        for (int j = 0; j < kBlockN; ++j) {
          const int key = key_begin + j;
          m_pipeline.p_and_ds(seq, b, h, row, key, needs_mask && mask.masked(row, key),
                              dropout_row, p[j] * m_scale, row_lse, delta, ds[j], p[j], ds[j],
                              modify);
          ds[j] *= m_scale;
        }
      } else {
        int first = 0, last = kBlockN - 1;
        if (needs_mask) {
          mask.visible_keys(row, first, last);
          first -= key_begin;
          last -= key_begin;
        }
        KFA_HOST_SIMD
        for (int j = 0; j < kBlockN; ++j) {
          const acc_t pj =
              j < first || j > last ? acc_t(0) : Host::exp(p[j] * m_scale - lse);
          p[j] = pj;
          ds[j] = pj * (ds[j] - delta) * m_scale;
        }
      }
    }
    tile_product<ALayout::transposed, true>(cols_pad, dpad, rows, t.sS, kBlockN, gdO.ptr, gdO.ld,
                                            t.acc_dv, dpad);
    tile_product<ALayout::transposed, true>(cols_pad, dpad, rows, t.sdS, kBlockN, gQ.ptr, gQ.ld,
                                            t.acc_dk, dpad);
    tile_product<ALayout::row_major, false>(rows_pad, dpad, cols, t.sdS, kBlockN, t.gK.ptr, t.gK.ld,
                                            t.acc_dq, dpad);
    const int slot = chunk * m_view_batch + vb;
    const bool unit_stride = m_dq_acc.stride(3) == 1;
    for (int i = 0; i < rows; ++i) {
      const acc_t* src = t.acc_dq + std::size_t(i) * dpad;
      if (unit_stride) {
        acc_t* dq = &m_dq_acc(slot, q0 + row_begin + i, h, 0);
        KFA_HOST_SIMD
        for (int d = 0; d < m_head_dim; ++d) dq[d] += src[d];
      } else {
        for (int d = 0; d < m_head_dim; ++d) m_dq_acc(slot, q0 + row_begin + i, h, d) += src[d];
      }
    }
  }

  QView m_q;
  KView m_k;
  VView m_v;
  DOView m_do;
  LseView m_lse;
  DeltaView m_delta;
  DQAccView m_dq_acc;
  DKView m_dk;
  DVView m_dv;
  params_t m_params;
  pipeline_t m_pipeline;
  acc_t m_scale;
  int m_view_batch, m_head_dim, m_dpad, m_chunks, m_blocks_per_chunk;
};

/// The host backward after the preprocess (D in `delta`): dK, dV written,
/// dQ summed over the key chunks in chunk order.
template <class ExecSpace, class VariantT, class Q, class K, class V, class DO, class Lse,
          class Delta, class DQ, class DK, class DV>
void backward(const ExecSpace& space, const Q& q, const K& k, const V& v, const DO& d_o,
              const Lse& lse, const Delta& delta, const DQ& dq, const DK& dk, const DV& dv,
              const KernelParams<typename Delta::non_const_value_type, typename Q::memory_space>&
                  params,
              const typename VariantT::score_mod_type& score_mod) {
  using acc_t = typename Delta::non_const_value_type;
  using value_type = typename DQ::non_const_value_type;
  using memory_space = typename ExecSpace::memory_space;
  constexpr int kBlockN = BackwardTileTraits<acc_t>::kBlockN;
  const int kv_blocks = (params.seq.max_seqlen_k + kBlockN - 1) / kBlockN;
  const int chunks =
      key_chunks(space.concurrency(), params.seq.batch * params.heads_kv, kv_blocks);
  auto run = [&](const auto& dq_acc) {
    BackwardKernel<ExecSpace, VariantT, Q, K, V, DO, Lse, Delta, std::decay_t<decltype(dq_acc)>,
                   DK, DV>(q, k, v, d_o, lse, delta, dq_acc, dk, dv, params, score_mod, chunks)
        .launch(space);
  };
  if constexpr (std::is_same<value_type, acc_t>::value) {
    if (chunks == 1) {
      Kokkos::deep_copy(space, dq, value_type(0));
      run(dq);
      return;
    }
  }
  using AccView = Kokkos::View<acc_t****, Kokkos::LayoutRight, memory_space,
                               Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const std::size_t view_batch = dq.extent(0), rows = dq.extent(1), heads = dq.extent(2),
                    head_dim = dq.extent(3);
  const auto bytes = workspace(space, WorkspaceSlot::dq_accum,
                               workspace_bytes<acc_t>(chunks * dq.size()), "kfa::bwd::dq_accum");
  const auto dq_acc = workspace_view<AccView>(bytes, chunks * view_batch, rows, heads, head_dim);
  Kokkos::deep_copy(space, dq_acc, acc_t(0));
  run(dq_acc);
  const std::size_t chunk_stride = dq.size();
  const acc_t* const acc = dq_acc.data();
  Kokkos::parallel_for(
      "kfa::bwd::host_tiled::sum_dq",
      Kokkos::MDRangePolicy<ExecSpace, Kokkos::Rank<3>>(space, {0, 0, 0},
                                                        {view_batch, rows, heads}),
      KOKKOS_LAMBDA(const std::size_t b, const std::size_t i, const std::size_t h) {
        const std::size_t at = ((b * rows + i) * heads + h) * head_dim;
        for (std::size_t d = 0; d < head_dim; ++d) {
          acc_t sum = 0;
          for (int c = 0; c < chunks; ++c) sum += acc[c * chunk_stride + at + d];
          dq(b, i, h, d) = from_acc<value_type>(sum);
        }
      });
}

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
