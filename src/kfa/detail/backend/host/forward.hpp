#ifndef KFA_DETAIL_BACKEND_HOST_FORWARD_HPP
#define KFA_DETAIL_BACKEND_HOST_FORWARD_HPP

// Forward kernel of the host backends (KernelFamily::host_tiled): the
// portable kernel's tiling, one thread per (sequence, query head, query
// block) instead of a team. The thread converts its query block (scale folded
// in) and each key/value block it sees into padded tiles of the accumulator
// type, forms the scores with the register-blocked product, updates the
// online softmax on whole rows, and adds P·V into its output tile.

#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/variant.hpp>
#include <kfa/detail/backend/host/micro_kernel.hpp>
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

/// Rows [row0, row0 + count) of head h of a [vb][rows][heads][d] View into
/// the tile dst [count_pad][ld], converted and times `scale`; head dims from
/// head_dim to ld and rows from count to count_pad are 0 (they reach the
/// register blocks, so they must be finite).
template <class Acc, class View>
void load_rows(const View& src, int vb, int row0, int h, int count, int count_pad, int head_dim,
               Acc scale, Acc* dst, int ld) {
  for (int i = 0; i < count_pad; ++i) {
    Acc* row = dst + std::size_t(i) * ld;
    for (int d = 0; d < ld; ++d)
      row[d] = i < count && d < head_dim ? to_acc<Acc>(src(vb, row0 + i, h, d)) * scale : Acc(0);
  }
}

template <class ExecSpace, class VariantT, class QView, class KView, class VView, class OView,
          class LseView>
class ForwardKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using acc_t = typename LseView::non_const_value_type;
  using traits = TileTraits<acc_t>;
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

  /// sQ, acc_o [M][Dp]; sKt [d][N]; sV [N][Dp]; sS [M][N]; row max and sum.
  std::size_t scratch_bytes() const {
    const std::size_t a = sizeof(acc_t);
    return TileArena::bytes({2 * a * kBlockM * m_dpad, a * m_head_dim * kBlockN,
                             a * kBlockN * m_dpad, a * kBlockM * kBlockN, 2 * a * kBlockM});
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
    acc_t* sQ = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    acc_t* acc_o = arena.take<acc_t>(std::size_t(kBlockM) * dpad);
    acc_t* sKt = arena.take<acc_t>(std::size_t(m_head_dim) * kBlockN);
    acc_t* sV = arena.take<acc_t>(std::size_t(kBlockN) * dpad);
    acc_t* sS = arena.take<acc_t>(std::size_t(kBlockM) * kBlockN);
    acc_t* row_max = arena.take<acc_t>(kBlockM);
    acc_t* row_sum = arena.take<acc_t>(kBlockM);

    // The query block, scale folded in, zero-padded to whole register blocks.
    load_rows(m_q, vb, q0 + row_begin, h, rows, rows_pad, m_head_dim, m_params.scale, sQ, dpad);
    for (int i = 0; i < rows_pad; ++i) {
      for (int d = 0; d < dpad; ++d) acc_o[std::size_t(i) * dpad + d] = 0;
      row_max[i] = math::neg_inf<acc_t>();
      row_sum[i] = 0;
    }

    int kv_block_begin = 0, kv_block_end = 0;
    mask.key_blocks(row_begin, row_begin + rows, kBlockN, kv_block_begin, kv_block_end);
    for (int kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
      if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols))
        continue;
      // Kᵀ (padded keys 0) and V (padded head dims 0: they reach acc_o).
      for (int j = 0; j < kBlockN; ++j) {
        const bool col_ok = j < cols;
        for (int d = 0; d < m_head_dim; ++d)
          sKt[std::size_t(d) * kBlockN + j] =
              col_ok ? to_acc<acc_t>(m_k(vb, k0 + key_begin + j, h_kv, d)) : acc_t(0);
      }
      load_rows(m_v, vb, k0 + key_begin, h_kv, cols, cols, m_head_dim, acc_t(1), sV, dpad);
      tile_product(rows_pad, kBlockN, m_head_dim, sQ, dpad, sKt, kBlockN, sS, kBlockN, false);

      const bool needs_mask =
          VariantT::kScoreMod ||
          mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
      for (int i = 0; i < rows_pad; ++i) {
        acc_t* scores = sS + std::size_t(i) * kBlockN;
        const int row = row_begin + i;
        if (needs_mask || m_pipeline.modifies_scores())
          apply_mask_and_pipeline(mask, needs_mask, seq, b, h, row, key_begin, scores);
        acc_t block_max = math::neg_inf<acc_t>();
        KFA_HOST_SIMD_REDUCTION(max, block_max)
        for (int j = 0; j < kBlockN; ++j) block_max = scores[j] > block_max ? scores[j] : block_max;
        const acc_t m_old = row_max[i];
        const acc_t m_new = block_max > m_old ? block_max : m_old;
        const acc_t shift = softmax::shift(m_new);
        acc_t block_sum = 0;
        KFA_HOST_SIMD_REDUCTION(+, block_sum)
        for (int j = 0; j < kBlockN; ++j) {
          const acc_t p = Host::exp(scores[j] - shift);
          scores[j] = p;
          block_sum += p;
        }
        if (m_pipeline.dropout()) {
          // The row sum (hence lse) takes the undropped P; P·V the dropped one.
          const std::uint64_t dropout_row = m_pipeline.dropout_row(b, h, row);
          for (int j = 0; j < cols; ++j)
            scores[j] *= m_pipeline.keep_factor(dropout_row, key_begin + j);
        }
        const acc_t alpha = softmax::rescale(m_old, m_new);
        row_max[i] = m_new;
        row_sum[i] = alpha * row_sum[i] + block_sum;
        if (alpha != acc_t(1)) {
          acc_t* o = acc_o + std::size_t(i) * dpad;
          KFA_HOST_SIMD
          for (int d = 0; d < dpad; ++d) o[d] *= alpha;
        }
      }
      tile_product(rows_pad, dpad, cols, sS, kBlockN, sV, dpad, acc_o, dpad, true);
    }

    for (int i = 0; i < rows; ++i) {
      const acc_t l = row_sum[i];
      const acc_t inv = l > acc_t(0) ? acc_t(1) / l : acc_t(0);
      const acc_t* o = acc_o + std::size_t(i) * dpad;
      for (int d = 0; d < m_head_dim; ++d)
        m_o(vb, q0 + row_begin + i, h, d) = from_acc<value_type>(o[d] * inv);
      m_lse(vb, h, q0 + row_begin + i) = softmax::lse(row_max[i], l);
    }
  }

 private:
  /// Masked scores become -inf; the others go through softcap and the score
  /// modifier (the pipeline's order). The plain variant only masks, with the
  /// row's visible key range so that the loop vectorises.
  void apply_mask_and_pipeline(const AttentionMask& mask, bool needs_mask,
                               const SequenceInfo& seq, int b, int h, int row, int key_begin,
                               acc_t* scores) const {
    if constexpr (VariantT::kModifiers || VariantT::kScoreMod) {
      for (int j = 0; j < kBlockN; ++j) {
        if (needs_mask && mask.masked(row, key_begin + j)) {
          scores[j] = math::neg_inf<acc_t>();
        } else {
          acc_t unused;
          scores[j] =
              m_pipeline.template score<false>(seq, b, h, row, key_begin + j, scores[j], unused);
        }
      }
    } else {
      int first, last;
      mask.visible_keys(row, first, last);
      first -= key_begin;
      last -= key_begin;
      KFA_HOST_SIMD
      for (int j = 0; j < kBlockN; ++j)
        scores[j] = j < first || j > last ? math::neg_inf<acc_t>() : scores[j];
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
