#ifndef KFA_DETAIL_ATTENTION_BACKWARD_KERNEL_HPP
#define KFA_DETAIL_ATTENTION_BACKWARD_KERNEL_HPP

// FlashAttention-2 backward. P is recomputed tile by tile from q, k and the
// saved lse, never stored:
//   D = rowsum(dO ∘ O)                          (preprocess kernel)
//   S = pipeline(Q·Kᵀ·scale), P = exp(S - lse), dP = dO·Vᵀ, dS = P ∘ (dP - D)
//   dV += Pᵀ·dO, dK += dSᵀ·Q·scale, dQ += dS·K·scale
// with the score pipeline's derivative (softcap, modifier) folded into dS.
// Dropout: with Z the keep mask regenerated from the seed, dV takes the
// dropped P̃ = Z∘P/(1-p) and dS = P ∘ (dP∘Z/(1-p) - D); D = rowsum(dO∘O) is
// still Σ_j P_ij·dP̃_ij because O = P̃·V.
// dK and dV are accumulated in the scratch of the team that owns a key block
// (and, for grouped-query attention, its key/value head: the team loops over
// the query heads of the group, so dK and dV are summed without atomics).
// dQ is either added with atomics by those teams, or (deterministic mode)
// accumulated by a second kernel in which one team owns a query block.

#include <kfa/detail/attention/forward_kernel.hpp>

namespace kfa {
namespace Impl {

/// D[vb][h][r] = sum_d dO[vb][r][h][d] * O[vb][r][h][d] over every row of the
/// (fixed-length or packed) tensors, in the accumulator type. A team thread
/// per row and its vector lanes over the head dims: on GPUs 8 rows per team
/// and a warp's lanes on consecutive values of a row (coalesced loads); on
/// host backends one row per team, the head dims in order.
template <class ExecSpace, class OView, class DOView, class DeltaView>
struct BackwardPreprocess {
  using acc_t = typename DeltaView::non_const_value_type;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  static constexpr bool kGpu = is_gpu_space<ExecSpace>::value;
  static constexpr int kRowsPerTeam = kGpu ? 8 : 1;
  static constexpr int kVector = kGpu ? 32 : 1;
  OView m_o;
  DOView m_do;
  DeltaView m_delta;
  int m_rows, m_heads, m_head_dim;

  void launch(const ExecSpace& space) const {
    const std::size_t rows = m_o.extent(0) * m_o.extent(1) * m_o.extent(2);
    if (rows == 0) return;
    const int league = static_cast<int>((rows + kRowsPerTeam - 1) / kRowsPerTeam);
    Kokkos::parallel_for("kfa::bwd::preprocess", policy_t(space, league, kRowsPerTeam, kVector),
                         *this);
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& member) const {
    const std::size_t row =
        std::size_t(member.league_rank()) * kRowsPerTeam + std::size_t(member.team_rank());
    if (row >= m_o.extent(0) * m_o.extent(1) * m_o.extent(2)) return;
    const int h = static_cast<int>(row % m_heads);
    const int i = static_cast<int>(row / m_heads % m_rows);
    const int b = static_cast<int>(row / m_heads / m_rows);
    acc_t sum = 0;
    Kokkos::parallel_reduce(
        Kokkos::ThreadVectorRange(member, m_head_dim),
        [&](const int d, acc_t& s) {
          s += to_acc<acc_t>(m_do(b, i, h, d)) * to_acc<acc_t>(m_o(b, i, h, d));
        },
        sum);
    Kokkos::single(Kokkos::PerThread(member), [&] { m_delta(b, h, i) = sum; });
  }
};

/// Tiles and per-row work shared by the two backward kernels.
template <class Traits, int BlockM, int BlockN>
struct BackwardTiles {
  using acc_t = typename Traits::acc_type;
  using softmax = OnlineSoftmax<acc_t>;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockNPad = BlockN + 1;

  using TileRows = typename Traits::template Tile<BlockM, kHeadDim>;    // sQ, sdO
  using TileKeys = typename Traits::template Tile<BlockN, kHeadDim>;    // sK, acc_dk, acc_dv
  using TileKeysT = typename Traits::template Tile<kHeadDim, kBlockNPad>;  // sKt, sVt
  using TileScores = typename Traits::template Tile<BlockM, kBlockNPad>;   // sP, sdS
  using RowVec = typename Traits::template Column<BlockM>;

  /// Row i of P and dS for one (query block, key block) tile:
  /// P = exp(pipeline(q·kᵀ·scale) - lse), dS = P ∘ (dO·vᵀ - D) ∘ pipeline'.
  /// With dropout sP receives the dropped P (for dV). Masked entries and rows
  /// that saw no key in the forward pass (lse = -inf) get P = dS = 0.
  /// GradOut: hand a modifier with add_grad its gradient (the dK/dV
  /// kernel; the dQ kernel sees the same elements again).
  template <bool GradOut, class Member, class Pipeline>
  KOKKOS_FORCEINLINE_FUNCTION static void p_and_ds_row(
      const Member& member, int i, const TileRows& sQ, const TileRows& sdO,
      const TileKeysT& sKt, const TileKeysT& sVt, const RowVec& s_lse,
      const RowVec& s_delta, const TileScores& sP, const TileScores& sdS, acc_t scale,
      bool needs_mask, const AttentionMask& mask, const Pipeline& pipeline,
      const SequenceInfo& seq, int b, int h, int row, int key_begin, bool modify) {
    using tag = typename Traits::backend_tag;
    acc_t* p = &sP(i, 0);
    acc_t* ds = &sdS(i, 0);
    row_times_tile_t<BlockN, kHeadDim>(tag{}, member, &sQ(i, 0), &sKt(0, 0), kBlockNPad, p);
    row_times_tile_t<BlockN, kHeadDim>(tag{}, member, &sdO(i, 0), &sVt(0, 0), kBlockNPad, ds);
    const acc_t lse = s_lse(i), delta = s_delta(i);
    if constexpr (Pipeline::kModifiers || Pipeline::kScoreMod) {
      const std::uint64_t dropout_row = pipeline.dropout() ? pipeline.dropout_row(b, h, row) : 0;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, BlockN), [&](const int j) {
        pipeline.template p_and_ds<GradOut>(seq, b, h, row, key_begin + j,
                                            needs_mask && mask.masked(row, key_begin + j),
                                            dropout_row, p[j] * scale, lse, delta, ds[j], p[j],
                                            ds[j], modify);
      });
    } else {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, BlockN), [&](const int j) {
        const bool off = needs_mask && mask.masked(row, key_begin + j);
        const acc_t pj = off ? acc_t(0) : softmax::probability(p[j] * scale, lse);
        p[j] = pj;
        ds[j] = pj * (ds[j] - delta);
      });
    }
  }

  /// Loads rows [row_begin, row_begin + rows) of head h of a [vb][r][h][d]
  /// View (starting at row r0) into a scratch tile, converted and zero-padded.
  template <class Member, class View>
  KOKKOS_FORCEINLINE_FUNCTION static void load_rows(const Member& member, const View& src,
                                                    int vb, int r0, int h, int row_begin,
                                                    int rows, int head_dim,
                                                    const TileRows& dst) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, BlockM), [&](const int i) {
      const bool row_ok = i < rows;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim), [&](const int d) {
        dst(i, d) = row_ok && d < head_dim ? to_acc<acc_t>(src(vb, r0 + row_begin + i, h, d))
                                           : acc_t(0);
      });
    });
  }

  /// Loads keys [key_begin, key_begin + cols) transposed (and, if asked,
  /// row-major too), converted and zero-padded.
  template <class Member, class View>
  KOKKOS_FORCEINLINE_FUNCTION static void load_keys(const Member& member, const View& src,
                                                    int vb, int k0, int h, int key_begin,
                                                    int cols, int head_dim,
                                                    const TileKeysT& dst_t,
                                                    const TileKeys* dst) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, BlockN), [&](const int j) {
      const bool col_ok = j < cols;
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim), [&](const int d) {
        const acc_t x = col_ok && d < head_dim
                            ? to_acc<acc_t>(src(vb, k0 + key_begin + j, h, d))
                            : acc_t(0);
        dst_t(d, j) = x;
        if (dst) (*dst)(j, d) = x;
      });
    });
  }

  template <class Member, class LseView, class DeltaView>
  KOKKOS_FORCEINLINE_FUNCTION static void load_row_stats(
      const Member& member, const LseView& lse, const DeltaView& delta, int vb, int r0, int h,
      int row_begin, int rows, const RowVec& s_lse, const RowVec& s_delta) {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, BlockM), [&](const int i) {
      Kokkos::single(Kokkos::PerThread(member), [&]() {
        s_lse(i) = i < rows ? acc_t(lse(vb, h, r0 + row_begin + i)) : math::neg_inf<acc_t>();
        s_delta(i) = i < rows ? acc_t(delta(vb, h, r0 + row_begin + i)) : acc_t(0);
      });
    });
  }
};

/// dK/dV kernel: one team per (sequence, key/value head, key block), looping
/// over the query heads of its group and the query blocks that see the key
/// block. With m_dq_atomic set it also adds dS·K·scale into the dQ
/// accumulator with atomics.
template <class ExecSpace, int HeadDim, class VariantT, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQAccView, class DKView,
          class DVView>
class FlashBackwardKVKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using traits = KernelTraits<ExecSpace, value_type, HeadDim>;
  using acc_t = typename traits::acc_type;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  using params_t = KernelParams<acc_t, typename QView::memory_space>;
  using pipeline_t = ScorePipeline<VariantT, acc_t>;
  static constexpr int kHeadDim = traits::kHeadDim;
  static constexpr int kBlockM = traits::kBwdBlockM;
  static constexpr int kBlockN = traits::kBwdBlockN;
  static constexpr int kLevel = traits::kScratchLevel;
  using tiles = BackwardTiles<traits, kBlockM, kBlockN>;

  FlashBackwardKVKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                        const LseView& lse, const DeltaView& delta, const DQAccView& dq_acc,
                        const DKView& dk, const DVView& dv, const params_t& params,
                        const typename VariantT::score_mod_type& score_mod, bool dq_atomic)
      : m_q(q),
        m_k(k),
        m_v(v),
        m_do(d_o),
        m_lse(lse),
        m_delta(delta),
        m_dq_acc(dq_acc),
        m_dk(dk),
        m_dv(dv),
        m_seq(params.seq),
        m_pipeline(params, score_mod),
        m_scale(params.scale),
        m_dq_atomic(dq_atomic),
        m_batch(params.seq.batch),
        m_heads_kv(params.heads_kv),
        m_group(params.group()),
        m_head_dim(params.head_dim),
        m_window_left(params.window_left),
        m_window_right(params.window_right),
        m_num_kv_blocks((params.seq.max_seqlen_k + kBlockN - 1) / kBlockN) {}

  void launch(const ExecSpace& space, int team_size) const {
    launch_team_kernel<traits>(space, "kfa::bwd::dk_dv", *this,
                               m_num_kv_blocks * m_batch * m_heads_kv, team_size,
                               traits::kBwdTeamSize);
  }

  static std::size_t scratch_bytes() {
    return 2 * tiles::TileRows::shmem_size() + 2 * tiles::TileKeysT::shmem_size() +
           2 * tiles::TileScores::shmem_size() + 2 * tiles::TileKeys::shmem_size() +
           2 * tiles::RowVec::shmem_size();
  }

  KOKKOS_INLINE_FUNCTION void operator()(const member_t& member) const {
    using tag = typename traits::backend_tag;
    // Causal: the first key blocks are seen by the most query rows; start them first.
    const int league = member.league_rank();
    const int bh = league % (m_batch * m_heads_kv);
    const int kv_block = league / (m_batch * m_heads_kv);
    const int b = bh / m_heads_kv, h_kv = bh % m_heads_kv;
    const SequenceInfo seq = m_seq(b);
    const int key_begin = kv_block * kBlockN;
    // Packed sequences shorter than the longest have fewer blocks.
    if (key_begin >= seq.seqlen_k) return;
    const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
    const int vb = seq.view_batch, q0 = seq.q_begin, k0 = seq.k_begin;
    const AttentionMask mask(seq.seqlen_q, seq.seqlen_k, m_window_left, m_window_right);

    typename tiles::TileRows sQ(member.team_scratch(int(kLevel)));
    typename tiles::TileRows sdO(member.team_scratch(int(kLevel)));
    typename tiles::TileKeysT sKt(member.team_scratch(int(kLevel)));
    typename tiles::TileKeysT sVt(member.team_scratch(int(kLevel)));
    typename tiles::TileScores sP(member.team_scratch(int(kLevel)));
    typename tiles::TileScores sdS(member.team_scratch(int(kLevel)));
    typename tiles::TileKeys acc_dk(member.team_scratch(int(kLevel)));
    typename tiles::TileKeys acc_dv(member.team_scratch(int(kLevel)));
    typename tiles::RowVec s_lse(member.team_scratch(int(kLevel)));
    typename tiles::RowVec s_delta(member.team_scratch(int(kLevel)));

    tiles::load_keys(member, m_k, vb, k0, h_kv, key_begin, cols, m_head_dim, sKt, nullptr);
    tiles::load_keys(member, m_v, vb, k0, h_kv, key_begin, cols, m_head_dim, sVt, nullptr);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockN), [&](const int j) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim), [&](const int d) {
        acc_dk(j, d) = 0;
        acc_dv(j, d) = 0;
      });
    });

    // Rows that see this key block; the tiles before and after are skipped.
    const int row_lo = mask.row_begin(key_begin);
    const int row_hi = mask.row_end(key_begin + cols);
    const int q_block_end = (row_hi + kBlockM - 1) / kBlockM;
    for (int g = 0; g < m_group; ++g) {
      const int h = h_kv * m_group + g;
      for (int q_block = row_lo / kBlockM; q_block < q_block_end; ++q_block) {
        const int row_begin = q_block * kBlockM;
        const int rows = imin(kBlockM, seq.seqlen_q - row_begin);
        if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols))
          continue;
        // Every thread is done with the previous query block's tiles.
        member.team_barrier();
        tiles::load_rows(member, m_q, vb, q0, h, row_begin, rows, m_head_dim, sQ);
        tiles::load_rows(member, m_do, vb, q0, h, row_begin, rows, m_head_dim, sdO);
        tiles::load_row_stats(member, m_lse, m_delta, vb, q0, h, row_begin, rows, s_lse,
                              s_delta);
        // sQ, sdO, lse, D (and on the first pass sKt, sVt) are visible.
        member.team_barrier();
        const bool needs_mask =
            VariantT::kScoreMod ||
            mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
        const bool modify =
            !m_pipeline.unchanged(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
          tiles::template p_and_ds_row<true>(member, i, sQ, sdO, sKt, sVt, s_lse, s_delta, sP,
                                             sdS, m_scale, needs_mask, mask, m_pipeline, seq,
                                             b, h, row_begin + i, key_begin, modify);
        });
        // P and dS of the whole tile are visible: the key rows read them by column.
        member.team_barrier();
        Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockN), [&](const int j) {
          coeffs_times_tile<kHeadDim>(tag{}, member, acc_t(1), &sP(0, j), tiles::kBlockNPad,
                                      &sdO(0, 0), kBlockM, &acc_dv(j, 0));
          coeffs_times_tile<kHeadDim>(tag{}, member, acc_t(1), &sdS(0, j), tiles::kBlockNPad,
                                      &sQ(0, 0), kBlockM, &acc_dk(j, 0));
        });
        if (m_dq_atomic) {
          Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](const int i) {
            Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, m_head_dim), [&](const int d) {
              acc_t sum = 0;
              for (int j = 0; j < kBlockN; ++j) sum += sdS(i, j) * sKt(d, j);
              Kokkos::atomic_add(&m_dq_acc(vb, q0 + row_begin + i, h, d), sum * m_scale);
            });
          });
        }
      }
    }
    // acc_dk and acc_dv are final.
    member.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, cols), [&](const int j) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, m_head_dim), [&](const int d) {
        m_dk(vb, k0 + key_begin + j, h_kv, d) = from_acc<value_type>(acc_dk(j, d) * m_scale);
        m_dv(vb, k0 + key_begin + j, h_kv, d) = from_acc<value_type>(acc_dv(j, d));
      });
    });
  }

 private:
  QView m_q;
  KView m_k;
  VView m_v;
  DOView m_do;
  LseView m_lse;
  DeltaView m_delta;
  DQAccView m_dq_acc;
  DKView m_dk;
  DVView m_dv;
  Sequences<typename QView::memory_space> m_seq;
  pipeline_t m_pipeline;
  acc_t m_scale;
  bool m_dq_atomic;
  int m_batch, m_heads_kv, m_group, m_head_dim, m_window_left, m_window_right,
      m_num_kv_blocks;
};

/// Deterministic dQ kernel: one team per (sequence, query head, query block),
/// looping over the key blocks it sees and accumulating dS·K in scratch, in a
/// fixed order, with no atomics.
template <class ExecSpace, int HeadDim, class VariantT, class QView, class KView, class VView,
          class DOView, class LseView, class DeltaView, class DQView>
class FlashBackwardQKernel {
 public:
  using value_type = typename QView::non_const_value_type;
  using traits = KernelTraits<ExecSpace, value_type, HeadDim>;
  using acc_t = typename traits::acc_type;
  using policy_t = Kokkos::TeamPolicy<ExecSpace>;
  using member_t = typename policy_t::member_type;
  using params_t = KernelParams<acc_t, typename QView::memory_space>;
  using pipeline_t = ScorePipeline<VariantT, acc_t>;
  static constexpr int kHeadDim = traits::kHeadDim;
  static constexpr int kBlockM = traits::kBwdBlockM;
  static constexpr int kBlockN = traits::kBwdBlockN;
  static constexpr int kLevel = traits::kScratchLevel;
  using tiles = BackwardTiles<traits, kBlockM, kBlockN>;

  FlashBackwardQKernel(const QView& q, const KView& k, const VView& v, const DOView& d_o,
                       const LseView& lse, const DeltaView& delta, const DQView& dq,
                       const params_t& params,
                       const typename VariantT::score_mod_type& score_mod)
      : m_q(q),
        m_k(k),
        m_v(v),
        m_do(d_o),
        m_lse(lse),
        m_delta(delta),
        m_dq(dq),
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
    launch_team_kernel<traits>(space, "kfa::bwd::dq", *this, m_num_q_blocks * m_batch * m_heads,
                               team_size, traits::kBwdTeamSize);
  }

  static std::size_t scratch_bytes() {
    return 3 * tiles::TileRows::shmem_size() + 2 * tiles::TileKeysT::shmem_size() +
           2 * tiles::TileScores::shmem_size() + tiles::TileKeys::shmem_size() +
           2 * tiles::RowVec::shmem_size();
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

    typename tiles::TileRows sQ(member.team_scratch(int(kLevel)));
    typename tiles::TileRows sdO(member.team_scratch(int(kLevel)));
    typename tiles::TileRows acc_dq(member.team_scratch(int(kLevel)));
    typename tiles::TileKeysT sKt(member.team_scratch(int(kLevel)));
    typename tiles::TileKeysT sVt(member.team_scratch(int(kLevel)));
    typename tiles::TileScores sP(member.team_scratch(int(kLevel)));
    typename tiles::TileScores sdS(member.team_scratch(int(kLevel)));
    typename tiles::TileKeys sK(member.team_scratch(int(kLevel)));
    typename tiles::RowVec s_lse(member.team_scratch(int(kLevel)));
    typename tiles::RowVec s_delta(member.team_scratch(int(kLevel)));

    tiles::load_rows(member, m_q, vb, q0, h, row_begin, rows, m_head_dim, sQ);
    tiles::load_rows(member, m_do, vb, q0, h, row_begin, rows, m_head_dim, sdO);
    tiles::load_row_stats(member, m_lse, m_delta, vb, q0, h, row_begin, rows, s_lse, s_delta);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, kHeadDim),
                           [&](const int d) { acc_dq(i, d) = 0; });
    });

    int kv_block_begin = 0, kv_block_end = 0;
    mask.key_blocks(row_begin, row_begin + rows, kBlockN, kv_block_begin, kv_block_end);
    for (int kv_block = kv_block_begin; kv_block < kv_block_end; ++kv_block) {
      const int key_begin = kv_block * kBlockN;
      const int cols = imin(kBlockN, seq.seqlen_k - key_begin);
      if (!m_pipeline.visible(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols))
        continue;
      // Every thread is done with the previous key block's tiles.
      member.team_barrier();
      tiles::load_keys(member, m_k, vb, k0, h_kv, key_begin, cols, m_head_dim, sKt, &sK);
      tiles::load_keys(member, m_v, vb, k0, h_kv, key_begin, cols, m_head_dim, sVt, nullptr);
      // sK, sKt, sVt (and on the first pass sQ, sdO, lse, D) are visible.
      member.team_barrier();
      const bool needs_mask =
          VariantT::kScoreMod ||
          mask.tile_needs_mask(row_begin, row_begin + rows, key_begin, key_begin + kBlockN);
      const bool modify =
          !m_pipeline.unchanged(b, h, row_begin, row_begin + rows, key_begin, key_begin + cols);
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
        tiles::template p_and_ds_row<false>(member, i, sQ, sdO, sKt, sVt, s_lse, s_delta, sP,
                                            sdS, m_scale, needs_mask, mask, m_pipeline, seq, b,
                                            h, row_begin + i, key_begin, modify);
      });
      // Whole rows of dS are visible to every vector lane.
      member.team_barrier();
      Kokkos::parallel_for(Kokkos::TeamThreadRange(member, kBlockM), [&](const int i) {
        coeffs_times_tile<kHeadDim>(tag{}, member, acc_t(1), &sdS(i, 0), 1, &sK(0, 0), kBlockN,
                                    &acc_dq(i, 0));
      });
    }
    // acc_dq is final.
    member.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(member, rows), [&](const int i) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(member, m_head_dim), [&](const int d) {
        m_dq(vb, q0 + row_begin + i, h, d) = from_acc<value_type>(acc_dq(i, d) * m_scale);
      });
    });
  }

 private:
  QView m_q;
  KView m_k;
  VView m_v;
  DOView m_do;
  LseView m_lse;
  DeltaView m_delta;
  DQView m_dq;
  Sequences<typename QView::memory_space> m_seq;
  pipeline_t m_pipeline;
  acc_t m_scale;
  int m_batch, m_heads, m_group, m_head_dim, m_window_left, m_window_right, m_num_q_blocks;
};

}  // namespace Impl
}  // namespace kfa

#endif
