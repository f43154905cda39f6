#ifndef KFA_DETAIL_ATTENTION_FORWARD_KERNEL_HPP
#define KFA_DETAIL_ATTENTION_FORWARD_KERNEL_HPP

#include <kfa/detail/common/compat.hpp>
#include <kfa/detail/common/team_launch.hpp>
#include <kfa/detail/attention/mask.hpp>
#include <kfa/detail/attention/online_softmax.hpp>
#include <kfa/detail/attention/sequences.hpp>
#include <kfa/detail/attention/traits.hpp>
#include <kfa/detail/attention/variant.hpp>

#include <sstream>
#include <stdexcept>

namespace kfa {
namespace Impl {

/// Picks a team size the policy accepts for `functor`: the request (or the
/// traits' default), clamped to team_size_max.
template <class Policy, class Functor>
int clamp_team_size(const Policy& policy, const Functor& functor, int requested) {
  const int max = policy.team_size_max(functor, Kokkos::ParallelForTag());
  return requested < 1 ? 1 : (requested > max ? max : requested);
}

/// Launches a team kernel of the portable path: `team_size` threads per team
/// (0 = `default_team`, clamped to what the backend accepts), the kernel's
/// scratch checked against the backend's limit, then parallel_for.
template <class Traits, class Kernel, class ExecSpace>
void launch_team_kernel(const ExecSpace& space, const char* label, const Kernel& kernel,
                        int league, int team_size, int default_team) {
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  if (league == 0) return;
  policy_t probe(space, league, 1, Traits::kVectorLength);
  const int team = clamp_team_size(probe, kernel, team_size > 0 ? team_size : default_team);
  policy_t policy(space, league, team, Traits::kVectorLength);
  constexpr int level = Traits::kScratchLevel;
  check_scratch<policy_t>(label, level, Kernel::scratch_bytes(), Kernel::kBlockM,
                          Kernel::kBlockN, Traits::kHeadDim);
  policy.set_scratch_size(level, Kokkos::PerTeam(Kernel::scratch_bytes()));
  Kokkos::parallel_for(label, policy, kernel);
}

/// Forward kernel: one team per (sequence, query head, query block). The team
/// keeps its query block and the partial output in scratch and streams the
/// key/value blocks its rows can see through scratch (tiles before and after
/// a window are skipped), updating the online softmax; only O and lse are
/// written to device memory. Grouped-query attention reads key/value head
/// h / group. VariantT selects softcap, dropout and a score modifier.
template <class ExecSpace, int HeadDim, class VariantT, class QView, class KView, class VView,
          class OView, class LseView>
class FlashForwardKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using traits = KernelTraits<ExecSpace, value_type, HeadDim>;
  using acc_t = typename traits::acc_type;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  using softmax = OnlineSoftmax<acc_t>;
  using params_t = KernelParams<acc_t, typename QView::memory_space>;
  using pipeline_t = ScorePipeline<VariantT, acc_t>;

  static constexpr int kHeadDim = traits::kHeadDim;
  static constexpr int kBlockM = traits::kBlockM;
  static constexpr int kBlockN = traits::kBlockN;
  static constexpr int kBlockNPad = traits::kBlockNPad;
  static constexpr int kLevel = traits::kScratchLevel;

  using TileQ = typename traits::template Tile<kBlockM, kHeadDim>;
  using TileKt = typename traits::template Tile<kHeadDim, kBlockNPad>;
  using TileV = typename traits::template Tile<kBlockN, kHeadDim>;
  using TileP = typename traits::template Tile<kBlockM, kBlockNPad>;
  using TileO = typename traits::template Tile<kBlockM, kHeadDim>;
  using RowVec = typename traits::template Column<kBlockM>;

  FlashForwardKernel(const QView& q, const KView& k, const VView& v, const OView& o,
                     const LseView& lse, const params_t& params,
                     const typename VariantT::score_mod_type& score_mod)
      : m_q(q),
        m_k(k),
        m_v(v),
        m_o(o),
        m_lse(lse),
        m_seq(params.seq),
        m_pipeline(params, score_mod),
        m_scale(params.scale),
        m_batch(params.seq.batch),
        m_heads(params.heads),
        m_group(params.group()),
        m_head_dim(params.head_dim),
        m_window_left(params.window_left),
        m_window_right(params.window_right),
        m_num_q_blocks((params.seq.max_seqlen_q + kBlockM - 1) / kBlockM) {}

  void launch(const ExecSpace& space, int team_size) const {
    launch_team_kernel<traits>(space, "kfa::fwd::main_loop", *this,
                               m_num_q_blocks * m_batch * m_heads, team_size, traits::kTeamSize);
  }

  static std::size_t scratch_bytes() {
    return TileQ::shmem_size() + TileKt::shmem_size() + TileV::shmem_size() +
           TileP::shmem_size() + TileO::shmem_size() + 3 * RowVec::shmem_size();
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& member) const {
    using tag = typename traits::backend_tag;
    const QueryBlock qb =
        query_block(m_seq, member.league_rank(), m_heads, m_num_q_blocks, kBlockM);
    if (qb.rows <= 0) return;
    const SequenceInfo seq = qb.seq;
    const int b = qb.b, h = qb.h, h_kv = h / m_group, row_begin = qb.row_begin, rows = qb.rows;
    const int vb = seq.view_batch, q0 = seq.q_begin, k0 = seq.k_begin;
    const AttentionMask mask(seq.seqlen_q, seq.seqlen_k, m_window_left, m_window_right);

    TileQ sQ(member.team_scratch(int(kLevel)));
    TileKt sKt(member.team_scratch(int(kLevel)));
    TileV sV(member.team_scratch(int(kLevel)));
    TileP sP(member.team_scratch(int(kLevel)));
    TileO acc_o(member.team_scratch(int(kLevel)));
    RowVec row_max(member.team_scratch(int(kLevel)));
    RowVec row_sum(member.team_scratch(int(kLevel)));
    RowVec row_alpha(member.team_scratch(int(kLevel)));

    // Load the query block, scale folded in, zero-padded past seqlen_q and
    // head_dim; start the online softmax of every row.
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
      const bool row_ok = i < rows;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim), [&](const int d) {
        sQ(i, d) = row_ok && d < m_head_dim
                       ? to_acc<acc_t>(m_q(vb, q0 + row_begin + i, h, d)) * m_scale
                       : acc_t(0);
        acc_o(i, d) = 0;
      });
      Kokkos::single(Kokkos::PerThread(member), [&]() {
        row_max(i) = math::neg_inf<acc_t>();
        row_sum(i) = 0;
      });
    });

    int kv_block_begin = 0, kv_block_end = 0;
    mask.key_blocks(row_begin, row_begin + rows, kBlockN, kv_block_begin, kv_block_end);
    for (int kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
      // The modifier's block predicate skips fully masked tiles (the same
      // answer in every thread, so the barriers below stay matched).
      if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols))
        continue;
      // Every thread is done reading the previous sKt and sV.
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockN), [&](const int j) {
        const bool col_ok = j < cols;
        Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim), [&](const int d) {
          const bool ok = col_ok && d < m_head_dim;
          sKt(d, j) = ok ? to_acc<acc_t>(m_k(vb, k0 + key_begin + j, h_kv, d)) : acc_t(0);
          sV(j, d) = ok ? to_acc<acc_t>(m_v(vb, k0 + key_begin + j, h_kv, d)) : acc_t(0);
        });
      });
      // sQ (first block), sKt and sV are visible to every thread.
      member.team_barrier();

      const bool needs_mask =
          VariantT::kScoreMod ||
          mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
      const bool element_pass = needs_mask || m_pipeline.modifies_scores();
      // False where the modifier leaves the tile unchanged: it is not called.
      const bool modify =
          !m_pipeline.unchanged(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
        acc_t* scores = &sP(i, 0);
        const int row = row_begin + i;
        // Read before the product: its vector loop ends in a warp barrier,
        // which orders every lane's read before lane 0 writes row_max(i).
        const acc_t m_old = row_max(i);
        row_times_tile_t<kBlockN, kHeadDim>(tag{}, member, &sQ(i, 0), &sKt(0, 0), kBlockNPad,
                                            scores);
        if (element_pass) {
          Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kBlockN), [&](const int j) {
            if (needs_mask && mask.masked(row, key_begin + j)) {
              scores[j] = math::neg_inf<acc_t>();
            } else if constexpr (VariantT::kModifiers || VariantT::kScoreMod) {
              acc_t unused;
              scores[j] = m_pipeline.template score<false>(seq, b, h, row, key_begin + j,
                                                           scores[j], unused, modify);
            }
          });
        }
        acc_t block_max;
        Kokkos::parallel_reduce(
            Kokkos::ThreadVectorRange(member, kBlockN),
            [&](const int j, acc_t& m) { m = scores[j] > m ? scores[j] : m; },
            Kokkos::Max<acc_t>(block_max));
        const acc_t m_new = block_max > m_old ? block_max : m_old;
        const acc_t shift = softmax::shift(m_new);
        acc_t block_sum = 0;
        if (m_pipeline.dropout()) {
          // The row sum (hence lse) takes the undropped P; P·V the dropped
          // one, scaled by 1/(1-p).
          const std::uint64_t dropout_row = m_pipeline.dropout_row(b, h, row);
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, kBlockN),
              [&](const int j, acc_t& s) {
                const acc_t p = math::exp(scores[j] - shift);
                scores[j] = p * m_pipeline.keep_factor(dropout_row, key_begin + j);
                s += p;
              },
              block_sum);
        } else {
          Kokkos::parallel_reduce(
              Kokkos::ThreadVectorRange(member, kBlockN),
              [&](const int j, acc_t& s) {
                const acc_t p = math::exp(scores[j] - shift);
                scores[j] = p;
                s += p;
              },
              block_sum);
        }
        const acc_t alpha = softmax::rescale(m_old, m_new);
        Kokkos::single(Kokkos::PerThread(member), [&]() {
          row_max(i) = m_new;
          row_sum(i) = alpha * row_sum(i) + block_sum;
          row_alpha(i) = alpha;
        });
      });
      // Whole rows of P and their rescale factors are visible for P·V.
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
        coeffs_times_tile<kHeadDim>(tag{}, member, row_alpha(i), &sP(i, 0), 1, &sV(0, 0),
                                    kBlockN, &acc_o(i, 0));
      });
    }
    // The partial outputs and row statistics of every row are final.
    member.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](const int i) {
      const acc_t l = row_sum(i);
      const acc_t inv = l > acc_t(0) ? acc_t(1) / l : acc_t(0);
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, m_head_dim), [&](const int d) {
        m_o(vb, q0 + row_begin + i, h, d) = from_acc<value_type>(acc_o(i, d) * inv);
      });
      Kokkos::single(Kokkos::PerThread(member), [&]() {
        m_lse(vb, h, q0 + row_begin + i) = softmax::lse(row_max(i), l);
      });
    });
  }

 private:
  QView m_q;
  KView m_k;
  VView m_v;
  OView m_o;
  LseView m_lse;
  Sequences<typename QView::memory_space> m_seq;
  pipeline_t m_pipeline;
  acc_t m_scale;
  int m_batch, m_heads, m_group, m_head_dim, m_window_left, m_window_right, m_num_q_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
