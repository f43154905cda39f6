#ifndef KFA_DETAIL_BACKEND_HOST_FORWARD_HPP
#define KFA_DETAIL_BACKEND_HOST_FORWARD_HPP

// Forward kernel of the host backends (KernelFamily::host_tiled): the
// portable kernel's tiling, one thread per (sequence, query head, query
// block) instead of a team. The thread transposes its query block once
// (scale folded in) and, for each key block it sees, forms Sᵀ = K·Qᵀ with
// the register-blocked product (K read in place where the View allows),
// so that the online softmax runs along keys on whole vectors of query
// rows; P·V then reads Pᵀ as a transposed operand and adds into the output
// tile.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>
#include <kfa/detail/backend/host/micro_kernel.hpp>
#include <kfa/detail/backend/host/tiles.hpp>
#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/common/team_launch.hpp>

namespace kfa {
namespace Impl {
namespace Host {

/// Launches `kernel` with one single-thread team per work item, largest
/// items first where the kernel orders them so, dynamically scheduled, each
/// with `bytes` of scratch for its tiles.
template <class ExecSpace, class Kernel>
void launch_per_thread(const ExecSpace& space, const char* label, const Kernel& kernel, int items,
                       std::size_t bytes) {
  using policy_t = Kokkos::TeamPolicy<ExecSpace, Kokkos::Schedule<Kokkos::Dynamic>>;
  if (items == 0) return;
  constexpr int level = 1;
  check_scratch<policy_t>(label, level, bytes, Kernel::traits::kBlockM, Kernel::traits::kBlockN,
                          kernel.head_dim());
  policy_t policy(space, items, 1);
  policy.set_scratch_size(level, Kokkos::PerTeam(bytes));
  policy.set_chunk_size(1);
  Kokkos::parallel_for(label, policy, kernel);
}

template <class ExecSpace, class VariantT, class QView, class KView, class VView, class OView,
          class LseView>
class ForwardKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using acc_t = typename LseView::non_const_value_type;
  using traits = ForwardTileTraits<acc_t>;
  using member_t = typename Kokkos::TeamPolicy<ExecSpace>::member_type;
  using softmax = OnlineSoftmax<acc_t>;
  using params_t = KernelParams<acc_t, typename QView::memory_space>;
  using pipeline_t = ScorePipeline<VariantT, acc_t>;
  static constexpr int kBlockM = traits::kBlockM;
  static constexpr int kBlockN = traits::kBlockN;

  ForwardKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                const LseView& lse, const params_t& params,
                const typename VariantT::score_mod_type& score_mod)
      : m_q(q),
        m_k(k),
        m_v(v),
        m_o(o),
        m_lse(lse),
        m_params(params),
        m_pipeline(params, score_mod),
        m_head_dim(params.head_dim),
        m_dpad(traits::padded_head_dim(params.head_dim)),
        m_num_q_blocks((params.seq.max_seqlen_q + kBlockM - 1) / kBlockM) {}

  int head_dim() const { return m_head_dim; }

  void launch(const ExecSpace& space) const {
    launch_per_thread(space, "kfa::fwd::host_tiled", *this,
                      m_num_q_blocks * m_params.seq.batch * m_params.heads, scratch_bytes());
  }

  /// sQt [d][M]; acc_o [M][Dp]; sK, sV [N][Dp] (copies where K, V are not
  /// read in place); sSt [N][M]; row max, sum, shift and rescale factor;
  /// dropout row keys.
  std::size_t scratch_bytes() const {
    const std::size_t a = sizeof(acc_t);
    return TileArena::bytes({a * m_head_dim * kBlockM, a * kBlockM * m_dpad,
                             2 * a * kBlockN * m_dpad, a * kBlockN * kBlockM, 4 * a * kBlockM,
                             sizeof(std::uint64_t) * kBlockM});
  }

  void operator()(const member_t& member) const {
    const QueryBlock qb = query_block(m_params.seq, member.league_rank(), m_params.heads,
                                      m_num_q_blocks, kBlockM);
    if (qb.rows <= 0) return;
    const SequenceInfo seq = qb.seq;
    const int b = qb.b, h = qb.h, h_kv = h / m_params.group(), row_begin = qb.row_begin,
              rows = qb.rows;
    const int rows_pad = traits::round_up(rows, traits::kRows);
    const int vb = seq.view_batch, q0 = seq.q_begin, k0 = seq.k_begin;
    const int dpad = m_dpad;
    const AttentionMask mask(seq.seqlen_q, seq.seqlen_k, m_params.window_left,
                             m_params.window_right);

    TileArena arena(member.team_scratch(1).get_shmem(scratch_bytes()));
    acc_t* sQt = arena.take<acc_t>(std::size_t(m_head_dim) * kBlockM);
    acc_t* acc_o = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    acc_t* sK = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    acc_t* sV = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    acc_t* sSt = arena.take<acc_t>(std::size_t(kBlockN) * kBlockM);
    RowStats stats;
    stats.max = arena.take<acc_t>(kBlockM);
    stats.sum = arena.take<acc_t>(kBlockM);
    stats.shift = arena.take<acc_t>(kBlockM);
    stats.alpha = arena.take<acc_t>(kBlockM);
    std::uint64_t* dropout_rows = arena.take<std::uint64_t>(kBlockM);

    // Qᵀ, scale folded in; the query rows past the block are 0, so their
    // scores are finite (and never stored).
    load_transposed(m_q, vb, q0 + row_begin, h, rows, m_head_dim, m_params.scale, sQt, kBlockM);
    for (int i = 0; i < kBlockM; ++i) {
      stats.max[i] = math::neg_inf<acc_t>();
      stats.sum[i] = 0;
      if (m_pipeline.dropout()) dropout_rows[i] = m_pipeline.dropout_row(b, h, row_begin + i);
    }
    for (std::size_t x = 0; x < std::size_t(rows_pad) * dpad; ++x) acc_o[x] = 0;

    int kv_block_begin = 0, kv_block_end = 0;
    mask.key_blocks(row_begin, row_begin + rows, kBlockN, kv_block_begin, kv_block_end);
    for (int kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
      const int cols_pad = traits::round_up(cols, traits::kRows);
      if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols))
        continue;
      // Query rows before `skip` (whole register blocks) see no key of this
      // block, on a causal or windowed diagonal: the products leave them
      // out and the mask below sets their scores to -inf.
      const int skip = imax(mask.row_begin(key_begin) - row_begin, 0) / traits::kCols *
                       traits::kCols;
      // Sᵀ [keys][query rows] = K·Qᵀ; keys past the sequence are never read below.
      const RowTile<acc_t> gK = row_tile(m_k, vb, k0 + key_begin, h_kv, cols, cols_pad,
                                         m_head_dim, m_head_dim, sK, dpad);
      tile_product<ALayout::row_major, false>(cols_pad, kBlockM - skip, m_head_dim, gK.ptr, gK.ld,
                                              sQt + skip, kBlockM, sSt + skip, kBlockM);

      // A tile the modifier leaves unchanged takes the plain path unless
      // the softcap is on.
      const bool modify = !m_pipeline.unchanged(b, h, row_begin, row_begin + rows, key_begin,
                                                key_begin + cols);
      const bool needs_mask =
          (VariantT::kScoreMod && modify) ||
          mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
      const bool per_element = (VariantT::kScoreMod && modify) || m_pipeline.softcap_on();
      if (needs_mask || per_element)
        apply_mask_and_pipeline(mask, needs_mask, per_element, modify, seq, b, h, row_begin,
                                key_begin, cols, sSt);
      softmax_update(sSt, cols, stats);
      if (m_pipeline.dropout()) {
        // The row sum (hence lse) takes the undropped P; P·V the dropped one.
        for (int j = 0; j < cols; ++j)
          for (int i = 0; i < kBlockM; ++i)
            sSt[std::size_t(j) * kBlockM + i] *=
                m_pipeline.keep_factor(dropout_rows[i], key_begin + j);
      }
      for (int i = 0; i < rows_pad; ++i) {
        const acc_t alpha = stats.alpha[i];
        if (alpha == acc_t(1)) continue;
        acc_t* o = acc_o + std::size_t(i) * dpad;
        KFA_HOST_SIMD
        for (int d = 0; d < dpad; ++d) o[d] *= alpha;
      }
      // O += P·V, P read from Sᵀ as a transposed operand.
      const RowTile<acc_t> gV =
          row_tile(m_v, vb, k0 + key_begin, h_kv, cols, cols, m_head_dim, dpad, sV, dpad);
      tile_product<ALayout::transposed, true>(rows_pad - skip, dpad, cols, sSt + skip, kBlockM,
                                              gV.ptr, gV.ld, acc_o + std::size_t(skip) * dpad,
                                              dpad);
    }

    for (int i = 0; i < rows; ++i) {
      const acc_t l = stats.sum[i];
      const acc_t inv = l > acc_t(0) ? acc_t(1) / l : acc_t(0);
      const acc_t* o = acc_o + std::size_t(i) * dpad;
      for (int d = 0; d < m_head_dim; ++d)
        m_o(vb, q0 + row_begin + i, h, d) = from_acc<value_type>(o[d] * inv);
      m_lse(vb, h, q0 + row_begin + i) = softmax::lse(stats.max[i], l);
    }
  }

 private:
  /// Running max and sum of each query row, and this key block's shift
  /// (subtracted before exp) and rescale factor of what was accumulated.
  struct RowStats {
    acc_t *max, *sum, *shift, *alpha;
  };

  /// The online-softmax step of one key block on Sᵀ [cols][kBlockM]: the
  /// new row maxima, P = exp(S - shift) in place, the rescaled row sums.
  /// Each loop runs along a row of Sᵀ, a vector of query rows.
  void softmax_update(acc_t* sSt, int cols, const RowStats& stats) const {
    acc_t block_max[kBlockM];
    for (int i = 0; i < kBlockM; ++i) block_max[i] = stats.max[i];
    for (int j = 0; j < cols; ++j) {
      const acc_t* s = sSt + std::size_t(j) * kBlockM;
      KFA_HOST_SIMD
      for (int i = 0; i < kBlockM; ++i) block_max[i] = s[i] > block_max[i] ? s[i] : block_max[i];
    }
    for (int i = 0; i < kBlockM; ++i) {
      const acc_t m_old = stats.max[i], m_new = block_max[i];
      stats.alpha[i] = m_new == m_old ? acc_t(1) : softmax::rescale(m_old, m_new);
      stats.shift[i] = softmax::shift(m_new);
      stats.max[i] = m_new;
      stats.sum[i] *= stats.alpha[i];
    }
    for (int j = 0; j < cols; ++j) {
      acc_t* s = sSt + std::size_t(j) * kBlockM;
      KFA_HOST_SIMD
      for (int i = 0; i < kBlockM; ++i) {
        const acc_t p = Host::exp(s[i] - stats.shift[i]);
        s[i] = p;
        stats.sum[i] += p;
      }
    }
  }

  /// Masked scores of Sᵀ become -inf; with `per_element` the others go
  /// through softcap and (where `modify`) the score modifier, the
  /// pipeline's order. Else it only masks, with each key's visible row range
  /// so that the loop vectorises.
  void apply_mask_and_pipeline(const AttentionMask& mask, bool needs_mask, bool per_element,
                               bool modify, const SequenceInfo& seq, int b, int h,
                               int row_begin, int key_begin, int cols, acc_t* sSt) const {
    for (int j = 0; j < cols; ++j) {
      acc_t* s = sSt + std::size_t(j) * kBlockM;
      const int key = key_begin + j;
      if (per_element) {
        for (int i = 0; i < kBlockM; ++i) {
          const int row = row_begin + i;
          if (needs_mask && mask.masked(row, key)) {
            s[i] = math::neg_inf<acc_t>();
          } else {
            acc_t unused;
            s[i] = m_pipeline.template score<false>(seq, b, h, row, key, s[i], unused, modify);
          }
        }
      } else {
        int first, last;
        mask.visible_rows(key, first, last);
        first -= row_begin;
        last -= row_begin;
        KFA_HOST_SIMD
        for (int i = 0; i < kBlockM; ++i)
          s[i] = i < first || i > last ? math::neg_inf<acc_t>() : s[i];
      }
    }
  }

  QView m_q;
  KView m_k;
  VView m_v;
  OView m_o;
  LseView m_lse;
  params_t m_params;
  pipeline_t m_pipeline;
  int m_head_dim, m_dpad, m_num_q_blocks;
};

}  // namespace Host
}  // namespace Impl
}  // namespace kfa

#endif
